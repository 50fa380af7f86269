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
one AMD EPYC, faster on others) and on the shape, so ``to_torch`` times the candidates at
compile time on random inputs of the node's shape, once per distinct shape and activation
per process, and keeps the fastest (:class:`KernelChoice`, listed in the compile report). Under a
symbolic ``M`` (dynamic shapes) the candidates are timed at the example's ``M``, and the packed
kernels pack once per ``M`` met at run time (:class:`gawee.backend.onednn.PackedPerSize`).
``TorchOptions(linear_kernel="aten" | "mkl" | "onednn")`` forces one where it applies.
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
from gawee.errors import GaweeError
from gawee.ir.symbolic import at_example, has_symbols
from gawee.ir.types import DType
from gawee.ops.nn import apply_act

LINEAR_KERNELS = ("aten", "mkl", "onednn")
"""The candidate kernels of a linear, in the order they are tried (and preferred on a tie)."""

CHOICES = ("measure", *LINEAR_KERNELS)
"""Values of ``TorchOptions.linear_kernel``."""


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

    @property
    def shape(self) -> str:
        act = f"+{self.act}" if self.act else ""
        return f"{self.m}x{self.k}->{self.n}{'+bias' if self.bias else ''}{act}"

    def __str__(self) -> str:
        timed = ", ".join(f"{k} {v:.3g} ms" for k, v in self.ms.items())
        how = f" ({timed})" if timed else " (forced)"
        return f"{self.op} {self.shape} x{self.nodes}: {self.kernel}{how}"


_MEASURED: dict[tuple, KernelChoice] = {}
"""Per process: (m, k, n, bias, act, act_params, threads, candidates) → the measured choice."""
_FORCED: dict[tuple, KernelChoice] = {}
_SECONDS = [0.0]


def measuring_seconds() -> float:
    """Wall time this process has spent timing kernels so far (for compile reports)."""
    return _SECONDS[0]


@cache
def _has_mkl_linear() -> bool:
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


@cache
def _has_onednn_linear(act: str | None) -> bool:
    """Whether oneDNN's fused linear runs here with this post-op (probed once on a tiny matrix)."""
    if not (onednn.available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
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
    """The kernels that can run a linear of this dtype and activation here (``aten`` always can)."""
    found = ["aten"]
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


def measure_linear(
    m: int,
    k: int,
    n: int,
    bias: bool,
    act: str | None,
    params: tuple = (),
    candidates: list[str] | None = None,
    *,
    min_rounds: int = 3,
    max_rounds: int = 15,
    budget_s: float = 0.25,
) -> KernelChoice:
    """Time every candidate on random ``m x k`` inputs and a random ``n x k`` weight: calls interleaved
    round by round (so a burst of load elsewhere hits them all), each candidate's best call kept;
    at least ``min_rounds`` rounds, then more until ``budget_s`` is spent. The fastest wins; results are
    cached per shape for the process. Outputs are checked against the reference first: a candidate that
    computes something else is dropped."""
    key = (m, k, n, bias, act, tuple(params), torch.get_num_threads(), tuple(candidates or ()))
    hit = _MEASURED.get(key)
    if hit is not None:
        return hit
    t_start = time.perf_counter()
    candidates = candidates or linear_candidates(act, DType.f32)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    b = torch.randn(n, generator=g) if bias else None
    expected = apply_act(F.linear(x, w, b), act, params)
    runners = {}
    for kernel in candidates:
        fn = _Linear(kernel, w, b, m, act, params)
        try:
            with torch.no_grad():
                got = fn(x)
        except RuntimeError:
            continue
        if got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-4):
            runners[kernel] = fn
    best = {kernel: math.inf for kernel in runners}
    start = time.perf_counter()
    with torch.no_grad():
        for rounds in range(1, max_rounds + 1):
            for kernel, fn in runners.items():
                t0 = time.perf_counter()
                fn(x)
                best[kernel] = min(best[kernel], (time.perf_counter() - t0) * 1e3)
            if rounds >= min_rounds and time.perf_counter() - start > budget_s:
                break
    kernel = min(best, key=lambda c: (best[c], LINEAR_KERNELS.index(c))) if best else "aten"
    choice = KernelChoice("linear", m, k, n, bias, act, kernel, {c: round(t, 4) for c, t in best.items()})
    _MEASURED[key] = choice
    _SECONDS[0] += time.perf_counter() - t_start
    return choice


def lower_linear(ctx) -> torch.fx.Node:
    """``OpDef.lower_torch`` of ``linear``: the input as an ``M x K`` matrix, the kernel that
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
        choice = measure_linear(m, k, n, b is not None, act, params, candidates) if len(candidates) > 1 else None
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
