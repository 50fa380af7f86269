"""oneDNN Graph as a runtime: the rewritten graph traced into TorchScript and compiled into fused partitions.

The torch lowering calls one oneDNN primitive per node through torch's operator, which rebuilds the
primitive's descriptor on every call: several times oneDNN's own execution of a small convolution
(``ONEDNN_VERBOSE``) and of ONNX Runtime's whole call of a one-convolution session
(``benchmarks/conv_overhead.py``). On a small CNN that fixed cost is a third of the time
(mobilenet_v3_large has 62 convolutions). TorchScript's oneDNN Graph fuser (``torch.jit.enable_onednn_fusion``)
instead compiles each fusible subgraph (convolution + activation + add, pools, ...) once, after two
profiling runs, and executes the compiled partitions: the per-call cost is gone and whole models run close
to ONNX Runtime. gawee traces its reference interpreter over the rewritten graph (every op's torch
semantics), freezes it, and runs the profiling calls with the fuser on (the flag is restored afterwards: the
compiled plan stays with the module). Static shapes and float32 only; ``backend="auto"`` measures it against
the torch lowering and ONNX Runtime (:func:`gawee.backend.compiler.compile`).

The fuser maps a fixed set of ATen ops onto oneDNN Graph ops (``torch/csrc/jit/codegen/onednn/graph_helper.cpp``);
any other op is a "wildcard" that splits the graph, runs unfused, and makes the partitions around it convert their
blocked outputs back to strided tensors. While tracing, :data:`SPELLINGS` writes the ops gawee's graphs commonly
hold that the fuser lacks (``hardsigmoid``, ``adaptive_avg_pool2d`` to a size dividing the input's, spatial
``mean``) in ops it maps, with torch's semantics; what still runs outside a partition is ``module.unfused``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import re
import signal
import subprocess
import sys
import warnings
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gawee import cache as gawee_cache
from gawee.backend.host import InputSignature, arrange, as_structure
from gawee.backend.runtime import Runtime
from gawee.errors import GaweeError
from gawee.ir.core import Graph
from gawee.ir.types import DType

PROFILING_RUNS = 3
"""Calls made while fusion is on: TorchScript's profiling executor records shapes on the first two and
compiles the fused partitions on the next."""


TRIAL = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)).eval()
x = torch.randn(1, 3, 8, 8)


def compiled(module, *xs):
    scripted = torch.jit.freeze(torch.jit.trace(module.eval(), xs))
    for _ in range(3):
        scripted(*xs)
    return scripted(*xs)


class Attend(torch.nn.Module):
    def forward(self, q, k, v, m):
        return torch.matmul(torch.softmax(torch.matmul(q, k.permute(0, 1, 3, 2)) * 0.125 + m, -1), v)


torch.jit.enable_onednn_fusion(True)
with torch.no_grad():
    torch.testing.assert_close(compiled(net, x), net(x), rtol=1e-4, atol=1e-4)
    print("partitions ok", flush=True)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    m = torch.zeros(2, 1, 16, 16).masked_fill_(torch.rand(2, 1, 16, 16) < 0.25, float("-inf"))
    m[..., 0] = 0.0
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, m, scale=0.125)
    torch.testing.assert_close(compiled(Attend(), q, k, v, m), expected, rtol=1e-4, atol=1e-4)
    print("attention ok", flush=True)
"""
"""A small traced network, then a masked attention, compiled and run by the fuser in a child process: each part
prints ``<part> ok`` once it computed torch's result."""


@cache
def _trial() -> frozenset[str]:
    """The parts of :data:`TRIAL` that passed here (empty where the fuser is missing, crashed or computed wrongly),
    kept for later processes on this machine and torch (:mod:`gawee.cache`): the trial takes about 2 s. A trial
    that did not finish (timed out, could not start, was killed from outside) is not kept: the next process tries
    again. A crash is kept: native code that crashes on this CPU does so every time."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.jit, "enable_onednn_fusion")):
        return frozenset()
    kept = gawee_cache.recall("onednn-graph-trial", TRIAL)
    if kept is not None:
        return frozenset(kept.split())
    try:
        trial = subprocess.run([sys.executable, "-c", TRIAL], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    passed = frozenset(line[: -len(" ok")] for line in trial.stdout.splitlines() if line.endswith(" ok"))
    if trial.returncode not in (-signal.SIGKILL, -signal.SIGTERM):  # killed from outside (OOM): say nothing
        gawee_cache.keep("onednn-graph-trial", TRIAL, " ".join(sorted(passed)))
    return passed


def unavailable(part: str = "partitions") -> str | None:
    """Why TorchScript's oneDNN Graph fuser cannot be used here, or None where this torch has it (x86 and Arm
    builds with MKLDNN) and it runs here: ``"partitions"`` for convolutions and elementwise ops, ``"attention"``
    for the attention partition too.

    The fuser is native code on a path torch itself no longer exercises much: it is first tried on a small
    network and a masked attention in a child process (about 2 s, once per machine and torch: the answer is
    kept, :mod:`gawee.cache`), so that a CPU on which it crashes or computes wrongly loses a candidate kernel or
    runtime instead of the process."""
    passed = _trial()
    if "partitions" not in passed:
        return "this torch has no oneDNN Graph fuser, or it failed its trial run on this machine"
    if part not in passed:
        return f"oneDNN Graph's fuser failed the {part} part of its trial run on this machine"
    return None


def supports(graph: Graph) -> str | None:
    """Why ``graph`` cannot run on oneDNN Graph here, or None: static shapes, float32 tensors only."""
    why = unavailable()
    if why is not None:
        return why
    values = [*graph.inputs, *(o for n in graph for o in n.outputs)]
    if any(v.type.symbolic for v in values):
        return "oneDNN Graph compiles static shapes only"
    if any(v.type.dtype.is_float and v.type.dtype is not DType.f32 for v in values):
        return "oneDNN Graph is used for float32 graphs only"
    if any(v is not None and v.dtype in (DType.i8, DType.u8) for n in graph for v in n.inputs):
        return "oneDNN Graph is used for float32 graphs only (this one has int8 weights: a precision phase's)"
    return None


_THREE, _SIX = torch.tensor([3.0]), torch.tensor([6.0])
"""Constants of the trace: a Python number would become a tensor again on every call, outside the partition."""


def _hardsigmoid(x, inplace=False):
    """torch's own formula, ``min(max(x + 3, 0), 6) / 6``, as Add, Clamp and Divide."""
    if inplace or x.dim() == 0 or x.dtype != torch.float32:
        return NotImplemented
    return torch.clamp(x + _THREE, 0.0, 6.0) / _SIX


def _pool_window(x: torch.Tensor, output_size) -> list[int] | None:
    """The kernel (= stride) of the plain average pool equal to adaptive pooling of ``x`` to ``output_size``: each
    spatial size a multiple of its output size; None otherwise."""
    sizes = [int(s) for s in x.shape[-2:]]  # constants in the trace: the module is compiled for static shapes
    outs = [output_size] * 2 if isinstance(output_size, int) else list(output_size)
    outs = [size if o is None else int(o) for o, size in zip(outs, sizes)]
    if x.dim() != 4 or any(o <= 0 or size % o for o, size in zip(outs, sizes)):
        return None
    return [size // o for o, size in zip(outs, sizes)]


def _adaptive_avg_pool2d(x, output_size):
    window = _pool_window(x, output_size)
    return NotImplemented if window is None else F.avg_pool2d(x, window, window, 0)


def _mean(x, dim=None, keepdim=False, *, dtype=None):
    """The mean over the two spatial dims of an NCHW tensor, kept as 1 x 1, is a global average pool."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim or ())
    if dtype is not None or not keepdim or x.dim() != 4 or sorted(d % 4 for d in dims) != [2, 3]:
        return NotImplemented
    return _adaptive_avg_pool2d(x, 1)


def _on_vectors(func):
    """``func`` on two 0-d tensors computed on 1-element vectors: oneDNN Graph fails to compile a partition in
    which a binary op joins two 0-d tensors ("partition compile failed"); the reshapes keep it out of one."""

    def spelled(a, b, *args, **kwargs):
        if not all(isinstance(t, torch.Tensor) and t.dim() == 0 for t in (a, b)):
            return NotImplemented
        return func(a.reshape(1), b.reshape(1), *args, **kwargs).reshape(())

    return spelled


def _attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    plan: dict[tuple, torch.Tensor | None],
):
    """``softmax(query @ key^T * scale + attn_mask) @ value``, which oneDNN Graph compiles into one attention
    partition, for the calls :func:`_attention_plan` chose it for (their key → the mask's term); NotImplemented
    (aten's kernel) for the others."""
    key_ = _call_key((query.shape, key.shape, value.shape), scale, attn_mask, is_causal)
    if dropout_p or enable_gqa or key_ not in plan:
        return NotImplemented
    return written_attention(query, key, value, plan[key_], scale)


def _call_key(shapes, scale, constant, is_causal) -> tuple:
    """What tells an attention call of the traced graph apart: shapes, scale, its constant mask (by identity: the
    interpreter passes the value's own tensor) and causality."""
    dims = tuple(tuple(int(d) for d in s) for s in shapes)  # a traced call's sizes are 0-d tensors
    return (dims, scale, None if constant is None else id(constant), is_causal)


def _attention_plan(graph: Graph) -> tuple[dict[tuple, torch.Tensor | None], list]:
    """The attentions of ``graph`` oneDNN Graph's partition runs faster than aten's kernel here, measured per shape
    as the torch lowering measures them (:func:`gawee.backend.attention.choose`), where it is torch's result and
    the mask is none or constant (a run-time mask needs a check per call, which a trace cannot hold; grouped-query
    attention is folded by the torch lowering only): each call's key → its mask's term; and every choice made.
    Measuring each shape alone replaces compiling and timing the whole graph twice, with and without the
    written-out attention (swin_t was much slower written out, because of its strided mask:
    :func:`additive_mask`)."""
    from gawee.backend import attention

    plan, choices, nodes = {}, {}, collections.Counter()
    for node in graph:
        if node.op != "scaled_dot_product_attention":
            continue
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        constant = mask.data if mask is not None else None
        types = [v.type for v in node.inputs[:3]]
        found = attention.problem(types, mask.type if mask is not None else None, constant, node.attrs)
        if found is None or found.groups > 1 or isinstance(found.mask, tuple):
            continue
        choice, partition = attention.choose(found.shapes, found.scale, found.mask, dtype=found.dtype)
        choices[id(choice)] = choice
        nodes[id(choice)] += 1
        if partition is not None:
            key = _call_key(found.shapes, found.scale, constant, node.attrs["is_causal"])
            plan[key] = found.mask
    return plan, [dataclasses.replace(c, nodes=nodes[key]) for key, c in choices.items()]


def written_attention(query, key, value, mask=None, scale=None):
    """``softmax(query @ key^T * scale + mask) @ value`` in the ops oneDNN Graph compiles into its attention
    partition (4-D operands, a float ``mask`` added to the scores: a contiguous one, see :func:`additive_mask`)."""
    factor = float(scale) if scale is not None else int(query.shape[-1]) ** -0.5
    scores = torch.matmul(query, key.permute(0, 1, 3, 2)) * factor
    if mask is not None:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, -1), value)


def additive_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """The float32 term :func:`written_attention` adds to the scores to compute what torch's attention computes
    with ``mask``, or None where it cannot: a bool mask (True attends) becomes 0 / -inf; a float32 one is itself.
    None where a query row attends to no key (torch's CPU kernel gives 0 there, a softmax NaN) or the mask holds
    NaN or +inf, and for other dtypes. The term is contiguous and 4-D, as the fuser needs: swin_t's permuted bias
    (strides 3, 1, 147, 3) made its attention (64 windows x 3 heads x 49 x 32) hundreds of times slower than a
    contiguous one, and a 3-D mask of 3 x 5 x 5 added to 2 x 3 x 5 x 5 scores gave another result than its
    1 x 3 x 5 x 5 view (the partition broadcasts a lower-rank operand otherwise than torch)."""
    if mask.dim() > 4 or mask.dtype not in (torch.bool, torch.float32):
        return None
    if mask.dtype == torch.bool:
        term = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    elif bool((mask.isnan() | (mask == float("inf"))).any()):
        return None
    else:
        term = mask
    if not bool((term > float("-inf")).any(-1).all()):  # a row attends to no key
        return None
    return term.contiguous().reshape((1,) * (4 - term.dim()) + tuple(term.shape))


def _gelu(x, approximate="none"):
    """The fuser maps ``aten::gelu`` to oneDNN's GELU without its ``approximate`` argument, so the tanh form would
    run as the erf form (GPT-2's outputs differed from the model's by 3e-4 of their scale): it is written out,
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, as torch computes it. A 0-d ``x`` (which the fuser's
    partitions mishandle, see :func:`_on_vectors`) is computed by aten in float64, a dtype the fuser leaves alone."""
    if approximate != "tanh":
        return NotImplemented
    if x.dim() == 0:
        return F.gelu(x.double(), approximate="tanh").to(x.dtype)
    return x * 0.5 * (torch.tanh((x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)) + 1.0)


def _add(a, b, *, alpha=1):
    """The fuser maps ``aten::add`` to oneDNN's Add without its ``alpha``: ``a + alpha * b`` is written out."""
    if alpha != 1:
        return _add(a, b * alpha)
    return _on_vectors(torch.add)(a, b)


def _div(a, b, rounding_mode=None):
    """The fuser maps ``aten::div`` to oneDNN's Divide without its ``rounding_mode``: a rounded division runs as
    torch's ``floor_divide`` (the same function), or, rounded toward zero, as a float division then ``trunc``, and
    for integers as the floor quotient moved up by one where the remainder is nonzero and the signs differ (ops
    the fuser does not map)."""
    if rounding_mode == "floor":
        return torch.floor_divide(a, b)
    if rounding_mode == "trunc":
        if torch.result_type(a, b).is_floating_point:
            return torch.trunc(torch.div(a, b))
        quotient = torch.floor_divide(a, b)
        inexact = torch.ne(torch.fmod(a, b), 0) & torch.ne(torch.lt(a, 0), torch.lt(torch.as_tensor(b), 0))
        return torch.where(inexact, torch.sub(quotient, -1), quotient)
    return _on_vectors(torch.div)(a, b)


REQUIRED = {
    torch.add: _add,
    torch.mul: _on_vectors(torch.mul),
    torch.div: _div,
    F.gelu: _gelu,
}
"""The spellings without which the fuser fails to compile a graph or computes something else than torch (they are
kept when the others are dropped)."""

SPELLINGS = {
    **REQUIRED,
    F.hardsigmoid: _hardsigmoid,
    F.adaptive_avg_pool2d: _adaptive_avg_pool2d,
    torch.mean: _mean,
}
"""Torch functions the fuser does not map → the same computation in ops it does (NotImplemented: leave the call
as it is). Without them the squeeze-and-excitation blocks' pool and gate ran outside oneDNN's partitions (25 ops
on mobilenet_v3_large, 17 on efficientnet_b0), and each partition next to one converted its output to a strided
tensor (benchmarks/README.md, "Runtime" → Notes). ``mean`` is that pool as timm writes it. The binary ops on 0-d
tensors avoid a fuser failure. Attention is spelled per call, where :func:`_attention_plan` chose it."""


class _Spelled(TorchFunctionMode):
    """Active while tracing: :data:`SPELLINGS` (only :data:`REQUIRED` when not ``faster``) and, for the calls in
    ``attention`` (:func:`_attention_plan`), :func:`_attention` replace the calls they know (the mode is off inside
    a replacement)."""

    def __init__(self, faster: bool = True, attention: dict[tuple, torch.Tensor | None] | None = None):
        super().__init__()
        self.table = dict(SPELLINGS) if faster else dict(REQUIRED)
        if attention:
            self.table[F.scaled_dot_product_attention] = functools.partial(_attention, plan=attention)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        spelling = self.table.get(func)
        if spelling is not None:
            out = spelling(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


class _Interpreted(torch.nn.Module):
    """The reference interpreter over ``graph``: what torch.jit.trace records, op by op, as ATen calls."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from gawee.interp import run

        return tuple(run(self.graph, *inputs))


@contextlib.contextmanager
def _fusion(enabled: bool):
    before = torch.jit.onednn_fusion_enabled()
    torch.jit.enable_onednn_fusion(enabled)
    try:
        yield
    finally:
        torch.jit.enable_onednn_fusion(before)


def compile_traced(
    module: torch.nn.Module, xs: tuple[torch.Tensor, ...], spelling: TorchFunctionMode | None = None
) -> tuple[torch.jit.ScriptModule, str]:
    """``module`` traced on ``xs`` (under ``spelling``), frozen, and run with the fuser on until oneDNN Graph
    compiled its partitions; with the plan TorchScript executes. Raises RuntimeError where the fuser fails."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on constants it records: the graph's weights
        with spelling or contextlib.nullcontext():
            traced = torch.jit.trace(module, xs, check_trace=False)
        scripted = torch.jit.freeze(traced)
        with _fusion(True):
            for _ in range(PROFILING_RUNS):
                scripted(*xs)
            return scripted, str(torch.jit.last_executed_optimized_graph())


def _compiled(
    graph: Graph, xs: tuple[torch.Tensor, ...], *, faster: bool, attention: dict | None = None
) -> tuple[torch.jit.ScriptModule, str]:
    """``graph`` traced (spelled as :class:`_Spelled` says) and compiled (:func:`compile_traced`)."""
    return compile_traced(_Interpreted(graph).eval(), xs, _Spelled(faster, attention))


class OneDNNGraphModule(torch.nn.Module):
    """``graph`` traced, frozen and compiled by oneDNN Graph for ``example_inputs``' shapes: a callable taking
    and returning torch tensors (outputs nested as ``output_structure``, a pytree spec, when given)."""

    def __init__(self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, output_structure: Any = None):
        super().__init__()
        why = supports(graph)
        if why is not None:
            raise GaweeError(f"{graph.name} cannot run on oneDNN Graph: {why}", hint='use backend="torch"')
        xs = tuple(example_inputs)
        attention, self.attention_kernels = _attention_plan(graph) if unavailable("attention") is None else ({}, [])
        """Each attention's kernel as measured per shape (:func:`_attention_plan`), listed like the torch lowering's."""
        try:
            self.scripted, plan = _compiled(graph, xs, faster=True, attention=attention)
            self.spelled = True
            """Whether the faster spellings are in (False: the fuser failed on them; only the REQUIRED ones are)."""
        except RuntimeError:
            try:
                self.scripted, plan = _compiled(graph, xs, faster=False)
                self.spelled = False
            except RuntimeError as e:  # the fuser compiles partitions on the last profiling call
                raise GaweeError(
                    f"oneDNN Graph could not compile {graph.name}: {str(e).strip().splitlines()[-1]}",
                    hint='use backend="torch" (or "auto", which measures the runtimes that build)',
                ) from e
        self.attention = self.spelled and bool(attention)
        """Whether some attention runs as oneDNN Graph's partition (:func:`_attention`): measured faster here."""
        top = plan.split("\nwith ")[0]  # the graph itself, before the partitions' and fallbacks' bodies
        self.partitions = len(re.findall(r"prim::oneDNNFusionGroup_\d+\[", top))
        """How many fused partitions oneDNN Graph compiled (0: it fused nothing; the module runs op by op)."""
        self.unfused = collections.Counter(re.findall(r"^  %\S+ : \S+ = (aten::\w+)", top, re.MULTILINE))
        """The ATen ops that run outside every partition, and how many times (shape arithmetic included)."""
        self.signature = InputSignature.of(graph)
        self.output_structure = None if output_structure is None else as_structure(output_structure)
        self.gawee_report = None

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        inputs = self.signature.inputs(args, kwargs)
        with torch.no_grad():
            return arrange(list(self.scripted(*inputs)), self.output_structure)


class OneDNNGraphRuntime(Runtime):
    """oneDNN Graph's compiled partitions of the traced graph (:class:`OneDNNGraphModule`); tried apart first, as
    the fuser is native code that has aborted the process on graphs it mishandles."""

    name = "onednn_graph"
    title = "oneDNN Graph"
    isolated = True
    whole_graph = True

    def unavailable(self) -> str | None:
        return unavailable()

    def cannot_run(self, graph: Graph) -> str | None:
        return supports(graph)

    def build(
        self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, output_structure: Any = None
    ) -> OneDNNGraphModule:
        return OneDNNGraphModule(graph, example_inputs, output_structure=output_structure)


RUNTIME = OneDNNGraphRuntime()
