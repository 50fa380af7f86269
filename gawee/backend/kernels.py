"""Kernels chosen by measurement: each ``linear`` runs on whichever candidate is fastest on this machine.

Candidates for ``act(input @ weight.T + bias)`` with a constant float32 weight, the input
flattened to an ``M x K`` matrix (N-d inputs after a permute would otherwise take torch's
batched-matmul path, which expands the weight per batch):

* ``aten``: ``torch.nn.functional.linear`` (torch's GEMM: MKL's sgemm on x86 builds), then the
  activation in place on its freshly allocated output;
* ``mkl``: MKL's sgemm on a weight packed once for this ``M`` (``mkl._mkl_linear``), then the
  activation in place — what TorchInductor's freezing emits for float32 linear on x86
  (``torch/_inductor/fx_passes/mkldnn_fusion.py``, ``pack_linear``);
* ``onednn``: oneDNN's matmul on a weight reordered once for this ``M``, with the bias and the
  activation as fused post-ops (``mkldnn._linear_pointwise``) — Inductor's path for bf16/f16.

Which one wins depends on the CPU (oneDNN's prepacked linear was slower than torch's GEMM on
some machines, faster on others) and on the shape, so ``to_torch`` times the candidates at
compile time on random inputs of the node's shape, once per distinct shape and activation
per process, and keeps the fastest (:class:`KernelChoice`, listed in the compile report). Under a
symbolic ``M`` (dynamic shapes) the candidates are timed at the example's ``M``, and the packed
kernels pack once per ``M`` met at run time (:class:`gawee.backend.onednn.PackedPerSize`).
``TorchOptions(linear_kernel="aten" | "mkl" | "onednn")`` forces one where it applies.

A 1×1 convolution (stride 1, no padding, one group) is a GEMM too: ``W[Cout, C] @ x[C, H·W]`` per
image on NCHW activations, ``x[N·H·W, C] @ W^T`` on channels-last ones, both without a copy. Its
candidates are oneDNN's fused convolution (``onednn``: the weight packed once, the NCHW input
reordered to oneDNN's blocked layout and back inside every call) and that GEMM (``gemm``: torch's
``addmm``/``matmul``, MKL's sgemm, then the residual and the activation in place). On small
spatial sizes the reorders dominate: mobilenet_v3_large's squeeze-excitation 1×1 convolutions on
1×1 maps ran several times faster as a GEMM, timed alone, though the whole model gained only a few
percent (almost all of its 1×1 convolutions chose the GEMM). They are timed
the same way (:func:`measure_conv1x1`), and ``TorchOptions(conv1x1_kernel=...)`` forces one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial

import torch
import torch.nn.functional as F

from gawee.backend import onednn
from gawee.backend.measure import surely_not_faster
from gawee.errors import GaweeError
from gawee.ir.symbolic import at_example, has_symbols
from gawee.ir.types import DType
from gawee.ops.nn import apply_act

LINEAR_KERNELS = ("aten", "mkl", "onednn")
"""The candidate kernels of a linear, in the order they are tried (and preferred on a tie)."""

CHOICES = ("measure", *LINEAR_KERNELS)
"""Values of ``TorchOptions.linear_kernel``."""

CONV1X1_KERNELS = ("onednn", "gemm")
"""The candidate kernels of a 1×1 convolution, in the order they are preferred on a tie."""

CONV1X1_CHOICES = ("measure", *CONV1X1_KERNELS)
"""Values of ``TorchOptions.conv1x1_kernel``."""


def _gelu_(y: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch.ops.aten.gelu_(y, approximate=approximate)


INPLACE_ACTS: dict[str, Callable[..., torch.Tensor]] = {
    "relu": torch.relu_,
    "sigmoid": torch.sigmoid_,
    "tanh": torch.tanh_,
    "silu": torch.ops.aten.silu_.default,
    "hardswish": torch.ops.aten.hardswish_.default,
    "hardsigmoid": torch.ops.aten.hardsigmoid_.default,
    "gelu": torch.ops.aten.gelu_.default,
    "hardtanh": torch.ops.aten.hardtanh_.default,
    "leaky_relu": torch.ops.aten.leaky_relu_.default,
}
"""A fused activation run in place on a GEMM's output (which owns its memory): no second allocation."""


def act_inplace(y: torch.Tensor, act: str | None, params: tuple = ()) -> torch.Tensor:
    """``apply_act(y, act, params)`` written into ``y`` (a tensor nobody else reads)."""
    if act is None:
        return y
    if act == "gelu_tanh":
        return torch.ops.aten.gelu_.default(y, approximate="tanh")
    return INPLACE_ACTS[act](y, *params)


@dataclass
class KernelChoice:
    """The kernel picked for one linear shape, and what each candidate measured (best of several calls)."""

    op: str
    m: int
    k: int
    n: int
    bias: bool
    act: str | None
    kernel: str
    ms: dict[str, float] = field(default_factory=dict)
    """Candidate → its fastest call in milliseconds; empty when the kernel was forced, not measured."""
    nodes: int = 0
    """How many nodes of the graph run with this choice."""
    residual: bool = False
    """A convolution's fused residual add (``act(conv + r)``)."""
    unmeasured: str = "forced"
    """Why ``ms`` is empty: the kernel was forced, or it is the only one the op has."""

    @property
    def shape(self) -> str:
        act = f"+{self.act}" if self.act else ""
        residual = "+residual" if self.residual else ""
        return f"{self.m}x{self.k}->{self.n}{'+bias' if self.bias else ''}{residual}{act}"

    def __str__(self) -> str:
        timed = ", ".join(f"{k} {v:.3g} ms" for k, v in self.ms.items())
        how = f" ({timed})" if timed else f" ({self.unmeasured})"
        return f"{self.op} {self.shape} x{self.nodes}: {self.kernel}{how}"


_MEASURED: dict[tuple, KernelChoice] = {}
"""Per process: (m, k, n, bias, act, act_params, threads, candidates) → the measured choice."""
_FORCED: dict[tuple, KernelChoice] = {}
_SECONDS = [0.0]


def measuring_seconds() -> float:
    """Wall time this process has spent timing kernels so far (for compile reports)."""
    return _SECONDS[0]


def add_measuring_seconds(seconds: float) -> None:
    """Count ``seconds`` spent choosing a kernel elsewhere (:mod:`gawee.backend.attention`) in
    :func:`measuring_seconds`."""
    _SECONDS[0] += seconds


@cache
def _has_mkl_linear() -> bool:
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


@cache
def _has_onednn_linear(act: str | None) -> bool:
    """Whether oneDNN's fused linear runs here with this post-op (probed once on a tiny matrix)."""
    if onednn.unavailable() is not None or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    post = onednn.post_op(act, (0.0, 6.0) if act == "hardtanh" else (0.01,) if act == "leaky_relu" else ())
    if post is None:
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(3, 2), 4)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(4, 2), w, torch.zeros(3), *post)
    except RuntimeError:
        return False
    return tuple(y.shape) == (4, 3)


def linear_candidates(act: str | None, dtype: DType) -> list[str]:
    """The kernels that can run a linear of this dtype and activation here (``aten`` always can): in bf16, oneDNN's
    prepacked linear too where it runs bf16 convolutions (:func:`gawee.backend.onednn.supports`)."""
    found = ["aten"]
    if dtype is DType.bf16 and onednn.supports(dtype) and _has_onednn_linear(act):
        return [*found, "onednn"]
    if dtype is not DType.f32:
        return found
    if _has_mkl_linear():
        found.append("mkl")
    if _has_onednn_linear(act):
        found.append("onednn")
    return found


class _Linear:
    """One candidate built for one shape: packs the weight once, then calls on an ``M x K`` matrix."""

    def __init__(self, kernel: str, weight: torch.Tensor, bias: torch.Tensor | None, m: int, act, params):
        self.kernel, self.weight, self.bias, self.m = kernel, weight, bias, m
        self.act, self.params = act, tuple(params)
        if kernel == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
        elif kernel == "onednn":
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, m)
            self.post = onednn.post_op(act, params)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "aten":
            return act_inplace(F.linear(x, self.weight, self.bias), self.act, self.params)
        if self.kernel == "mkl":
            y = torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.m)
            return act_inplace(y, self.act, self.params)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, *self.post)


def gemm_flops_per_s(n: int = 1024, repeats: int = 5) -> dict[str, float]:
    """Each linear kernel's float32 FLOP/s on an ``n x n x n`` product (its fastest of ``repeats`` calls, after two
    untimed ones; torch's current threads): what the machine's GEMMs reach here."""
    from gawee.machine import time_call

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    rates = {}
    with torch.no_grad():
        for kernel in linear_candidates(None, DType.f32):
            fn = _Linear(kernel, w, None, n, None, ())
            rates[kernel] = 2 * n**3 / min(time_call(lambda fn=fn: fn(x), warmup=2, repeats=repeats).samples)
    return rates


CLEAR_WIN = 1.25
"""After ``min_rounds``, a kernel whose fastest call is this many times slower than the leader's slowest
cannot win: it is timed no more, and measuring ends when one kernel is left."""
DECISIVE = 1.5
"""The same from the first timed round on (the correctness check before it warmed every kernel up): oneDNN
against torch's GEMM on vit_b_16's linears here is 2.1-2.6x, so one round decides them."""
BEHIND = 1.1
"""After ``min_rounds``, a kernel whose fastest call is this many times the leader's fastest is dropped too: the
rounds left go to telling the close ones apart."""
TIE = 1.03
"""After ``min_rounds``, kernels whose fastest calls are all within this factor of the leader's are a tie: measuring
ends, the leader wins. Which of them runs changes the call by less than that; telling them apart would take the
rounds left (Winograd's chunkings of one convolution, oneDNN's jit and brgemm kernels of another). A kernel whose
calls divided by the leader's in the same rounds show it at most that much faster
(:func:`gawee.backend.measure.surely_not_faster`: their spread small beside the difference) is dropped too."""


def best_calls(
    runners: dict[str, Callable], args: tuple, min_rounds: int, max_rounds: int, budget_s: float
) -> dict[str, float]:
    """Each runner's fastest call on ``args`` in milliseconds: calls interleaved round by round (a burst of
    load elsewhere hits them all) until ``budget_s`` is spent or ``max_rounds`` are run. A runner whose
    fastest call is slower than the leader's slowest by DECISIVE (or, after ``min_rounds``, CLEAR_WIN, or than
    the leader's fastest by BEHIND, or it is surely no more than a :data:`TIE` faster) has lost and is dropped:
    measuring ends when one is left, or when those left are a :data:`TIE`."""
    best = {kernel: math.inf for kernel in runners}
    worst = dict.fromkeys(runners, 0.0)
    live = dict(runners)
    calls: list[dict] = []  # per round, each live kernel's call
    start = time.perf_counter()
    with torch.no_grad():
        for rounds in range(1, max_rounds + 1):
            calls.append({})
            for kernel, fn in live.items():
                t0 = time.perf_counter()
                fn(*args)
                ms = (time.perf_counter() - t0) * 1e3
                best[kernel], worst[kernel] = min(best[kernel], ms), max(worst[kernel], ms)
                calls[-1][kernel] = max(ms, 1e-9)  # a ratio's operand
            leader = min(live, key=best.__getitem__)
            factor = CLEAR_WIN if rounds >= min_rounds else DECISIVE
            live = {k: fn for k, fn in live.items() if k == leader or best[k] < factor * worst[leader]}
            if rounds >= min_rounds:
                live = {
                    k: fn
                    for k, fn in live.items()
                    if k == leader
                    or (
                        best[k] <= BEHIND * best[leader]
                        and not (rounds > 1 and surely_not_faster([c[k] / c[leader] for c in calls], 1 - 1 / TIE))
                    )
                }
            tied = rounds >= min_rounds and all(best[k] <= TIE * best[leader] for k in live)
            if len(live) == 1 or tied or time.perf_counter() - start > budget_s:
                break
    return best


def measure_linear(
    m: int,
    k: int,
    n: int,
    bias: bool,
    act: str | None,
    params: tuple = (),
    candidates: list[str] | None = None,
    *,
    dtype: DType = DType.f32,
    min_rounds: int = 3,
    max_rounds: int = 15,
    budget_s: float = 0.25,
) -> KernelChoice:
    """Time every candidate on random ``m x k`` inputs and a random ``n x k`` weight of ``dtype``: calls interleaved
    round by round (so a burst of load elsewhere hits them all), each candidate's best call kept, until
    one is clearly fastest or ``budget_s`` is spent (:func:`best_calls`). The fastest wins; results are
    cached per shape for the process. Outputs are checked against the reference first: a candidate that
    computes something else is dropped."""
    key = (m, k, n, bias, act, tuple(params), torch.get_num_threads(), tuple(candidates or ()), dtype)
    hit = _MEASURED.get(key)
    if hit is not None:
        return hit
    t_start = time.perf_counter()
    candidates = candidates or linear_candidates(act, dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(dtype.torch)
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).to(dtype.torch)
    b = torch.randn(n, generator=g).to(dtype.torch) if bias else None
    expected = apply_act(F.linear(x, w, b), act, params)
    tol = 1e-4 if dtype is DType.f32 else 2e-2  # bf16: float32 sums in another order, one bf16 rounding
    runners = {}
    for kernel in candidates:
        fn = _Linear(kernel, w, b, m, act, params)
        if kernel == "aten":  # the reference itself (which warmed it up)
            runners[kernel] = fn
            continue
        try:
            with torch.no_grad():
                got = fn(x)
        except RuntimeError:
            continue
        if got.shape == expected.shape and torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol):
            runners[kernel] = fn
    best = best_calls(runners, (x,), min_rounds, max_rounds, budget_s)
    kernel = min(best, key=lambda c: (best[c], LINEAR_KERNELS.index(c))) if best else "aten"
    choice = KernelChoice("linear", m, k, n, bias, act, kernel, {c: round(t, 4) for c, t in best.items()})
    _MEASURED[key] = choice
    _SECONDS[0] += time.perf_counter() - t_start
    return choice


def lower_linear(ctx) -> torch.fx.Node:
    """The torch lowering of ``linear``: the input as an ``M x K`` matrix, the kernel that
    ``ctx.options.linear_kernel`` names or that measured fastest, the result viewed back to N-d."""
    x, w, b = (ctx.type(i) for i in range(3))
    out = ctx.node.output.type
    a = ctx.attrs
    act, params = a.get("act"), tuple(a.get("act_params", ()))
    weight = ctx.const(1)
    forced = ctx.options.linear_kernel
    if forced not in CHOICES:
        raise GaweeError(
            f"unknown linear kernel {forced!r}", hint=f"TorchOptions.linear_kernel is one of {', '.join(CHOICES)}"
        )
    m = math.prod(x.shape[:-1]) if x.rank >= 1 else 1
    dynamic = has_symbols(m)
    if dynamic:  # M varies at run time: timed at the example, packed weights packed per M met (PackedPerSize)
        m = at_example(m)
    if x.rank <= 1 or m == 0 or at_example(out.numel) == 0 or has_symbols((x.shape[-1], out.shape[-1])):
        return ctx.reference()
    k, n = x.shape[-1], out.shape[-1]
    plain = b is None or (b.rank == 1 and b.shape[0] == n)
    candidates = ["aten"]
    if ctx.options.fused_kernels and weight is not None and w.rank == 2 and plain and x.dtype == w.dtype:
        candidates = linear_candidates(act, x.dtype)
        if b is not None and b.dtype != x.dtype:
            candidates = ["aten"]
    if forced == "measure":
        shape = (m, k, n, b is not None, act, params, candidates)
        choice = measure_linear(*shape, dtype=x.dtype) if len(candidates) > 1 else None
        kernel = choice.kernel if choice else "aten"
    else:
        kernel = forced if forced in candidates else "aten"
        key = (m, k, n, b is not None, act, params, kernel)
        choice = _FORCED.setdefault(key, KernelChoice("linear", m, k, n, b is not None, act, kernel))
    if choice is not None:
        ctx.record_kernel(choice)
    xm = ctx.arg(0) if x.rank == 2 else ctx.call_method("reshape", ctx.arg(0), [-1 if dynamic else m, k])
    if kernel == "aten":
        y = ctx.call(F.linear, xm, ctx.arg(1), ctx.arg(2))
        if act is not None:
            y = _emit_act_inplace(ctx, y, act, params)
    elif kernel == "mkl":
        packed = _packed(ctx, partial(_pack_mkl, weight), xm, m, k, dynamic, "mkl_packed_weight")
        rows = ctx.call_method("size", xm, 0) if dynamic else m
        y = ctx.call(torch.ops.mkl._mkl_linear.default, xm, packed, ctx.arg(1), ctx.arg(2), rows)
        if act is not None:
            y = _emit_act_inplace(ctx, y, act, params)
    else:
        packed = _packed(ctx, partial(_pack_onednn, weight), xm, m, k, dynamic, "packed_weight")
        y = ctx.call(torch.ops.mkldnn._linear_pointwise.default, xm, packed, ctx.arg(2), *onednn.post_op(act, params))
    return y if x.rank == 2 else ctx.call_method("view", y, list(ctx.dims(out.shape)))


def _pack_mkl(weight: torch.Tensor, *, input_shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, input_shape[0])


def _pack_onednn(weight: torch.Tensor, *, input_shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, input_shape[0])


def _packed(ctx, pack, xm: torch.fx.Node, m: int, k: int, dynamic: bool, suffix: str) -> torch.fx.Node:
    """The weight packed for the ``M x K`` input ``xm``: once, for a static M; per M met, for a symbolic one."""
    if not dynamic:
        return ctx.buffer(pack(input_shape=(m, k)), suffix)
    per_size = onednn.PackedPerSize(ctx.node.name, pack)
    per_size.for_size((m, k))  # the example's M, packed now
    return ctx.call(per_size, xm)


def _emit_act_inplace(ctx, y, act: str, params: tuple):
    if act == "gelu_tanh":
        return ctx.call(torch.ops.aten.gelu_.default, y, approximate="tanh")
    return ctx.call(INPLACE_ACTS[act], y, *params)


# -- 1x1 convolutions ----------------------------------------------------------------------------------


def conv1x1_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    act: str | None = None,
    params: tuple = (),
) -> torch.Tensor:
    """``act(conv2d(x, weight[:, :, None, None], bias) + residual)`` for a 1×1, stride-1, unpadded, one-group
    convolution, as one GEMM on ``x``'s own memory: ``weight`` is the ``Cout x C`` matrix. A channels-last
    ``x`` is an ``N·H·W x C`` matrix and gives a channels-last result; an NCHW one gives NCHW. The residual
    and the activation run in place on the GEMM's fresh output."""
    n, c, h, w = x.shape
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        rows = x.permute(0, 2, 3, 1).reshape(n * h * w, c)  # a view
        y = torch.addmm(bias, rows, weight.t()) if bias is not None else torch.mm(rows, weight.t())
        y = y.view(n, h, w, -1).permute(0, 3, 1, 2)
    elif n == 1:
        cols = x.reshape(c, h * w)
        y = torch.addmm(bias.view(-1, 1), weight, cols) if bias is not None else torch.mm(weight, cols)
        y = y.view(1, -1, h, w)
    else:
        y = torch.matmul(weight, x.reshape(n, c, h * w))
        if bias is not None:
            y.add_(bias.view(-1, 1))
        y = y.view(n, -1, h, w)
    if residual is not None:
        y.add_(residual)
    return act_inplace(y, act, params)


class _Conv1x1:
    """One candidate for one shape: oneDNN's fused convolution on a packed weight, or :func:`conv1x1_gemm`."""

    def __init__(self, kernel: str, weight: torch.Tensor, bias, input_shape, channels_last: bool, act, params):
        self.kernel, self.bias, self.act, self.params = kernel, bias, act, tuple(params)
        if kernel == "gemm":
            self.matrix = weight.reshape(weight.shape[0], -1).contiguous()
        else:
            geometry = {"padding": (0, 0), "stride": (1, 1), "dilation": (1, 1), "groups": 1}
            self.packed = onednn.pack_conv_weight(
                weight, **geometry, input_shape=input_shape, channels_last=channels_last
            )
            self.post = onednn.post_op(act, params)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if self.kernel == "gemm":
            return conv1x1_gemm(x, self.matrix, self.bias, residual, self.act, self.params)
        mkldnn = torch.ops.mkldnn
        geometry = ([0, 0], [1, 1], [1, 1], 1)
        if residual is None:
            return mkldnn._convolution_pointwise(x, self.packed, self.bias, *geometry, *self.post)
        fused = self.act if self.act in onednn.BINARY_POST_OPS else None
        y = mkldnn._convolution_pointwise.binary(
            x, residual, self.packed, self.bias, *geometry, "add", 1.0, fused, [], None
        )
        return y if fused == self.act else apply_act(y, self.act, self.params)


def measure_conv1x1(
    shape: tuple[int, int, int, int],
    cout: int,
    bias: bool,
    residual: bool,
    act: str | None,
    params: tuple = (),
    channels_last: bool = False,
    *,
    min_rounds: int = 3,
    max_rounds: int = 15,
    budget_s: float = 0.25,
) -> KernelChoice:
    """The faster of oneDNN and the GEMM for a 1×1 convolution of an input of ``shape`` (N, C, H, W) to
    ``cout`` channels, timed like :func:`measure_linear` on random data after both were checked against
    the reference; cached per shape for the process."""
    key = ("conv1x1", shape, cout, bias, residual, act, tuple(params), channels_last, torch.get_num_threads())
    hit = _MEASURED.get(key)
    if hit is not None:
        return hit
    t_start = time.perf_counter()
    n, c, h, w = shape
    g = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
    weight = torch.randn(cout, c, 1, 1, generator=g) / math.sqrt(c)
    b = torch.randn(cout, generator=g) if bias else None
    r = torch.randn(n, cout, h, w, generator=g).contiguous(memory_format=fmt) if residual else None
    expected = F.conv2d(x, weight, b)
    expected = apply_act(expected + r if r is not None else expected, act, params)
    runners = {}
    for kernel in CONV1X1_KERNELS:
        fn = _Conv1x1(kernel, weight, b, shape, channels_last, act, params)
        try:
            with torch.no_grad():
                got = fn(x, r)  # neither candidate writes into the residual here
        except RuntimeError:
            continue
        if got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-4):
            runners[kernel] = fn
    best = best_calls(runners, (x, r), min_rounds, max_rounds, budget_s)
    kernel = min(best, key=lambda k: (best[k], CONV1X1_KERNELS.index(k))) if best else "onednn"
    ms = {k: round(t, 4) for k, t in best.items()}
    choice = KernelChoice("conv1x1", n * h * w, c, cout, bias, act, kernel, ms, residual=residual)
    _MEASURED[key] = choice
    _SECONDS[0] += time.perf_counter() - t_start
    return choice


def forced_conv1x1(
    shape: tuple[int, int, int, int], cout: int, bias: bool, residual: bool, act: str | None, kernel: str
) -> KernelChoice:
    """The record of a 1×1 convolution's kernel forced by ``TorchOptions.conv1x1_kernel`` (nothing measured)."""
    n, c, h, w = shape
    key = ("conv1x1", shape, cout, bias, residual, act, kernel)
    return _FORCED.setdefault(key, KernelChoice("conv1x1", n * h * w, c, cout, bias, act, kernel, residual=residual))
