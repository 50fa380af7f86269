"""Attention chosen by measurement: aten's fused kernel, or oneDNN Graph's attention partition.

``scaled_dot_product_attention`` has two CPU kernels within reach of the torch lowering:

* ``aten``: ``F.scaled_dot_product_attention`` (torch's flash-attention kernel for CPU);
* ``onednn_graph``: ``softmax(q @ k^T * scale + mask) @ v`` written out, traced into TorchScript and compiled by
  oneDNN Graph into one attention partition for this node's shapes (:mod:`gawee.backend.onednn_graph`, whose
  fuser the whole-graph runtime uses too). Timed alone, it ran the attention of deit_tiny's and BERT-base's heads
  two to three times faster than aten's kernel (benchmarks/README.md, "Runtime: transformers" → Notes).

Which wins depends on the CPU and the shapes, so the lowering times both on random inputs of the node's shapes at
compile time, once per distinct shape, scale and mask per process, after checking the partition against aten's
result, and keeps the faster (an :class:`AttentionChoice` in the compile report). The partition is used only where
it computes torch's result (:func:`onednn_graph.written_attention`): 4-D float32 operands of static shapes with
equal batch and head dims, no dropout or grouped heads, and no mask or a bool or float32 one that
:func:`onednn_graph.additive_mask` makes a term of the scores (a causal attention's is torch's lower-triangular
mask); or 4-D bf16 operands (rules/precision/bf16.rules' ``sdpa_bf16``) without a mask or with a causal or constant
bool one (its term's 0 and -inf are bf16 numbers), whose partition runs oneDNN's bf16 matmuls and softmax — the
scores rounded to bf16 once, where aten's kernel keeps them in float32, an error within that rule's bound (it allows
four roundings to bf16 per logit: the query, the key, the scores and their scaling) — and is checked against aten's
bf16 result within bf16's resolution. A constant mask becomes that term once, at compile time; one computed at run
time on every call, where a mask it cannot turn into a term (a query row that attends to no key, which is 0 in
torch's kernel and NaN in a softmax) makes that call run aten's kernel. ``TorchOptions.attention_kernel`` forces
either. The fuser is first tried on an attention in a child process, once per process
(:func:`onednn_graph.unavailable`, about 2 s on the first graph with an attention): a CPU on which it crashes loses
the candidate, not the process.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gawee.backend import isolation, kernels, onednn_graph
from gawee.errors import GaweeError
from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType

ATTENTION_KERNELS = ("aten", "onednn_graph")
"""The candidate kernels of an attention, in the order they are preferred on a tie."""

CHOICES = ("measure", *ATTENTION_KERNELS)
"""Values of ``TorchOptions.attention_kernel``."""


@dataclass
class AttentionChoice:
    """The kernel picked for one attention shape, and what each candidate measured (best of several calls). The
    shapes are those the partition runs: a grouped-query attention's folded ones (:func:`fold_groups`)."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    mask: tuple[int, ...] | None
    kernel: str
    ms: dict[str, float] = field(default_factory=dict)
    """Candidate → its fastest call in milliseconds; empty when nothing was measured (see ``why``)."""
    why: str = ""
    """Why nothing was measured: the kernel was forced, or oneDNN Graph gave no partition of aten's result."""
    nodes: int = 0
    """How many nodes of the graph run with this choice."""
    op: str = "attention"
    dtype: str = ""
    """The operands' type where it is not float32 ("bf16")."""

    @property
    def shape(self) -> str:
        dims = "x".join
        mask = f"+mask {dims(map(str, self.mask))}" if self.mask is not None else ""
        typed = f" {self.dtype}" if self.dtype else ""
        operands = f"q {dims(map(str, self.query))}, k {dims(map(str, self.key))}, v {dims(map(str, self.value))}"
        return f"{operands}{mask}{typed}"

    def __str__(self) -> str:
        how = ", ".join(f"{k} {v:.3g} ms" for k, v in self.ms.items()) or self.why
        return f"{self.op} {self.shape} x{self.nodes}: {self.kernel} ({how})"


class _Written(torch.nn.Module):
    """The written-out attention, its mask a constant of the trace (``mask``) or its fourth operand."""

    def __init__(self, scale: float | None, mask: torch.Tensor | None):
        super().__init__()
        self.scale, self.mask = scale, mask

    def forward(self, query, key, value, mask=None):
        mask = self.mask if mask is None else mask
        return onednn_graph.written_attention(query, key, value, mask, self.scale)


class Partition:
    """oneDNN Graph's attention partition for one set of shapes: called from the lowered module like a kernel.

    TorchScript guards a compiled partition on its inputs' strides: the operands are made contiguous (a no-op
    for contiguous ones; heads split from a projection by a permute are copied) so that every call runs the
    partition it was compiled for. A run-time mask comes with its term (:func:`onednn_graph.additive_mask`,
    computed once per call of the module for every layer that reads the mask); where it has none (a row that
    attends to no key is 0 in torch's kernel, NaN in the written-out softmax) the call runs aten's kernel on the
    mask. With ``groups`` > 1 (grouped-query attention: ``groups`` query heads per key/value head) the query heads
    of a group are folded into its rows (:func:`fold_groups`) and the partition runs an attention of as many heads
    as the keys have."""

    __module__ = "gawee"  # fx names a call's target by its module and name

    def __init__(self, scripted: torch.jit.ScriptModule, scale: float | None, groups: int = 1):
        self.scripted, self.scale, self.groups = scripted, scale, groups
        self.__name__ = self.__qualname__ = "onednn_graph_attention"

    def grouped(self, groups: int) -> Partition:
        """This partition called on grouped-query attentions of ``groups`` query heads per key/value head."""
        return self if groups == 1 else Partition(self.scripted, self.scale, groups)

    def __call__(self, query, key, value, mask: torch.Tensor | None = None, term: torch.Tensor | None = None):
        if mask is not None and term is None:
            gqa = {"enable_gqa": True} if self.groups > 1 else {}
            return F.scaled_dot_product_attention(query, key, value, mask, scale=self.scale, **gqa)
        batch, heads, rows, _ = query.shape
        query, term = fold_groups(query.contiguous(), term, self.groups)
        operands = [query, key.contiguous(), value.contiguous()] + ([term.contiguous()] if term is not None else [])
        out = self.scripted(*operands)
        return out if self.groups == 1 else out.reshape(batch, heads, rows, out.shape[-1])


def fold_groups(query: torch.Tensor, term: torch.Tensor | None, groups: int):
    """Grouped-query attention as attention of as many heads as the keys have: query head ``h`` uses key/value head
    ``h // groups`` (torch's ``enable_gqa``), so a contiguous B x H x L x D query is, as a view, B x H/groups x
    groups·L x D, row ``g·L + l`` of head ``k`` being row ``l`` of query head ``k·groups + g``; the 4-D mask term
    is repeated or regrouped to match. The output, B x H/groups x groups·L x Dv, is B x H x L x Dv as a view."""
    if groups == 1:
        return query, term
    batch, heads, rows, dim = query.shape
    folded = query.reshape(batch, heads // groups, groups * rows, dim)
    if term is not None:
        mb, mh, _, keys = term.shape
        if mh == 1:
            term = term.expand(mb, 1, rows, keys).repeat(1, 1, groups, 1)
        else:
            term = term.expand(mb, heads, rows, keys).reshape(mb, heads // groups, groups * rows, keys)
    return folded, term


Mask = torch.Tensor | tuple[int, ...] | None
"""An attention's mask as :func:`choose` takes it: the float32 term of a constant mask
(:func:`onednn_graph.additive_mask`), the shape of a run-time mask, or None."""


def _operands(shapes, mask: Mask, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Random query, key and value of ``shapes`` and ``dtype``, and where ``mask`` is a shape, a random float32
    mask of it with a quarter of its values -inf but none of its rows (what a bool mask becomes)."""
    g = torch.Generator().manual_seed(seed)
    xs = tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)
    if not isinstance(mask, tuple):
        return xs
    term = torch.randn(mask, generator=g).masked_fill_(torch.rand(mask, generator=g) < 0.25, float("-inf"))
    term[..., 0] = 0.0
    return (*xs, term)


def _partition(shapes, scale: float | None, mask: Mask, dtype: torch.dtype) -> Partition | None:
    """The written-out attention for ``shapes`` of ``dtype`` compiled by oneDNN Graph, or None where the fuser fails
    or does not make it one partition."""
    constant = mask if isinstance(mask, torch.Tensor) else None
    try:
        operands = _operands(shapes, mask, 0, dtype)
        scripted, plan = onednn_graph.compile_traced(_Written(scale, constant).eval(), operands)
    except RuntimeError:
        return None
    if "prim::oneDNNFusionGroup" not in plan:
        return None
    return Partition(scripted, scale)


_MEASURED: dict[tuple, tuple[AttentionChoice, Partition | None]] = {}
"""Per process: (shapes, scale, mask, dtype, threads, forced) → the choice and the partition it needs."""


def _mask_key(mask: Mask) -> tuple | None:
    """``mask`` in a cache key: a constant by its shape and a digest of its values."""
    if isinstance(mask, torch.Tensor):
        data = mask.contiguous().view(torch.uint8).numpy().tobytes()  # numpy has no bf16
        return (tuple(mask.shape), mask.dtype, hashlib.sha1(data).hexdigest())
    return mask


class _Aten:
    """aten's kernel on :func:`_operands` (a run-time mask last)."""

    def __init__(self, mask: Mask, scale: float | None):
        self.mask, self.scale = (mask if isinstance(mask, torch.Tensor) else None), scale

    def __call__(self, query, key, value, mask=None):
        mask = self.mask if mask is None else mask
        return F.scaled_dot_product_attention(query, key, value, mask, scale=self.scale)


def _on_operands(partition: Partition, mask: Mask):
    """``partition`` called like :class:`_Aten` on :func:`_operands`: a run-time mask there is already a term."""
    return partition if not isinstance(mask, tuple) else lambda q, k, v, term: partition(q, k, v, term, term)


def _checked_partition(shapes, scale: float | None, mask: Mask, dtype: torch.dtype) -> tuple[Partition | None, str]:
    """The partition for ``shapes`` of ``dtype`` where oneDNN Graph compiles one that gives aten's result on random
    operands, else None with why not. The fuser compiles and runs it in a child process first
    (:mod:`gawee.backend.isolation`): where that child dies, the partition is never compiled in this one."""
    work = functools.partial(_partition_why, shapes, scale, mask, dtype)
    trial = isolation.tried({"attention": work})["attention"]
    if trial.died:
        return None, f"oneDNN Graph's partition: {trial.why}"
    if trial.error or trial.answer:
        return None, trial.error or trial.answer
    partition = _partition(shapes, scale, mask, dtype)
    why = _why_not(partition, shapes, scale, mask, dtype)
    return (partition, "") if why is None else (None, why)


def _partition_why(shapes, scale: float | None, mask: Mask, dtype: torch.dtype) -> str | None:
    """In a trial process: why the partition for ``shapes`` is no candidate (:func:`_checked_partition`), or None."""
    return _why_not(_partition(shapes, scale, mask, dtype), shapes, scale, mask, dtype)


def _why_not(partition: Partition | None, shapes, scale: float | None, mask: Mask, dtype: torch.dtype) -> str | None:
    """Why ``partition`` (None: the fuser made none) does not serve the attention, or None."""
    if partition is None:
        return "no oneDNN Graph partition"
    if not _computes_torchs_result(partition, shapes, scale, mask, dtype):
        return "oneDNN Graph's partition differs from aten's result"
    return None


BF16_AGREEMENT = 2**-6
"""How far a bf16 partition's result may be from aten's bf16 kernel's on the same operands, as a share of the
result's largest magnitude: twice bf16's spacing of numbers at that magnitude (the partition rounds the scores
to bf16, aten's kernel does not; either rounds the probabilities and the result to bf16)."""


def _computes_torchs_result(partition: Partition, shapes, scale: float | None, mask: Mask, dtype: torch.dtype) -> bool:
    """Whether ``partition`` gives aten's result on random operands of ``dtype`` (a run-time mask with -inf terms):
    within float32's rounding for float32, :data:`BF16_AGREEMENT` for bf16."""
    xs = _operands(shapes, mask, 1, dtype)
    with torch.no_grad():
        got, expected = _on_operands(partition, mask)(*xs), _Aten(mask, scale)(*xs)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if dtype == torch.float32:
        return torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    got, expected = got.float(), expected.float()
    return bool((got - expected).abs().max() <= BF16_AGREEMENT * expected.abs().max())


def choose(
    shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
    scale: float | None,
    mask: Mask,
    forced: str = "measure",
    *,
    dtype: torch.dtype = torch.float32,
    min_rounds: int = 3,
    max_rounds: int = 15,
    budget_s: float = 0.25,
) -> tuple[AttentionChoice, Partition | None]:
    """The kernel of an attention of ``shapes`` (query, key, value) of ``dtype`` with ``scale`` and ``mask``
    (:data:`Mask`): timed like :func:`gawee.backend.kernels.measure_linear`, or as ``forced``; either way the
    partition only if it gives aten's result on random operands. With the partition when the choice is
    ``onednn_graph``."""
    key = (shapes, scale, _mask_key(mask), dtype, torch.get_num_threads(), forced)
    hit = _MEASURED.get(key)
    if hit is not None:
        return hit
    t_start = time.perf_counter()
    mask_shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else mask
    partition, why = None, "forced"
    if forced != "aten":
        usable = onednn_graph.unavailable("attention") is None
        partition, why = (
            _checked_partition(shapes, scale, mask, dtype) if usable else (None, "no oneDNN Graph partition")
        )
        why = why or "forced"
    ms: dict[str, float] = {}
    if forced != "measure" or partition is None:
        kernel = forced if partition is not None or forced == "aten" else "aten"
    else:
        xs = _operands(shapes, mask, 1, dtype)
        runners = {"aten": _Aten(mask, scale), "onednn_graph": _on_operands(partition, mask)}
        best = kernels.best_calls(runners, xs, min_rounds, max_rounds, budget_s)
        kernel = min(best, key=lambda k: (best[k], ATTENTION_KERNELS.index(k)))
        ms = {k: round(t, 4) for k, t in best.items()}
    choice = AttentionChoice(*shapes, mask_shape, kernel, ms, why, dtype="" if dtype == torch.float32 else "bf16")
    result = (choice, partition if kernel == "onednn_graph" else None)
    _MEASURED[key] = result
    kernels.add_measuring_seconds(time.perf_counter() - t_start)
    return result


@dataclass(frozen=True)
class Problem:
    """A node's attention as the partition computes it."""

    shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    """Query, key and value: a grouped-query attention's folded (:func:`fold_groups`)."""
    scale: float | None
    mask: Mask
    groups: int
    """Query heads per key/value head (1: plain attention)."""
    dtype: torch.dtype
    """The operands' type: float32, or bf16 (with a bf16 term of 0 and -inf, if any)."""


def problem(types, mask_type, constant: torch.Tensor | None, attrs) -> Problem | None:
    """The attention of a ``scaled_dot_product_attention`` node with operand ``types`` (query, key, value), mask type
    ``mask_type`` (None: no mask) of value ``constant`` (None: computed at run time) and attributes ``attrs`` as
    the partition computes it; None where the partition would not give torch's result: not 4-D float32 of static
    shapes (or bf16, without a mask or with one of 0 and -inf terms), dropout, key and value heads that differ
    or do not divide the query's, or a mask :func:`onednn_graph.additive_mask` cannot make a term (a run-time
    one is made one on each call)."""
    if mask_type is None:
        mask: Mask = None
        if attrs["is_causal"]:  # torch's causal mask: query row i attends to keys 0..i
            rows, keys = types[0].shape[-2], types[1].shape[-2]
            mask = onednn_graph.additive_mask(torch.ones(rows, keys, dtype=torch.bool).tril())
    elif constant is not None:
        mask = onednn_graph.additive_mask(constant)
    elif mask_type.dtype in (DType.f32, DType.bool) and mask_type.rank <= 4 and not has_symbols(mask_type.shape):
        mask = _four_d(tuple(mask_type.shape))  # made a term of the scores on each call (Partition), 4-D
    else:
        mask = None
    q, k, v = types
    if attrs["dropout_p"] or (mask is None and (mask_type is not None or attrs["is_causal"])):
        return None
    dtype = DType.f32
    if q.dtype is DType.bf16 and (mask is None or _exact_in_bf16(mask)):
        dtype = DType.bf16
        mask = None if mask is None else mask.to(torch.bfloat16)
    if not all(t.rank == 4 and t.dtype is dtype and not has_symbols(t.shape) and 0 not in t.shape for t in types):
        return None
    heads, kv_heads = q.shape[1], k.shape[1]
    groups = heads // kv_heads if attrs["enable_gqa"] and heads % kv_heads == 0 else 1
    if not (q.shape[0] == k.shape[0] == v.shape[0] and heads == groups * kv_heads and kv_heads == v.shape[1]):
        return None
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if groups > 1:  # timed and compiled as the attention it folds into
        shapes = ((q.shape[0], kv_heads, groups * q.shape[2], q.shape[3]), *shapes[1:])
        query = torch.empty(q.shape, device="meta")
        if isinstance(mask, torch.Tensor):
            mask = fold_groups(query, mask, groups)[1].contiguous()
        elif isinstance(mask, tuple):
            mask = tuple(fold_groups(query, torch.empty(mask, device="meta"), groups)[1].shape)
    return Problem(shapes, attrs["scale"], mask, groups, dtype.torch)


def lower_attention(ctx) -> torch.fx.Node:
    """The torch lowering of ``scaled_dot_product_attention``: aten's kernel, or oneDNN Graph's partition where
    it computes torch's result (:func:`problem`) and ``ctx.options.attention_kernel`` forces it or it measured
    faster."""
    forced = ctx.options.attention_kernel
    if forced not in CHOICES:
        raise GaweeError(
            f"unknown attention kernel {forced!r}", hint=f"TorchOptions.attention_kernel is one of {', '.join(CHOICES)}"
        )
    found = problem([ctx.type(i) for i in range(3)], ctx.type(3), ctx.const(3), ctx.attrs)
    if found is None or not ctx.options.fused_kernels or forced == "aten":
        return ctx.reference()
    choice, partition = choose(found.shapes, found.scale, found.mask, forced, dtype=found.dtype)
    ctx.record_kernel(choice)
    if partition is None:
        return ctx.reference()
    runtime_mask = (ctx.arg(3), ctx.derived(3, onednn_graph.additive_mask)) if isinstance(found.mask, tuple) else ()
    return ctx.call(partition.grouped(found.groups), ctx.arg(0), ctx.arg(1), ctx.arg(2), *runtime_mask)


def _exact_in_bf16(mask: Mask) -> bool:
    """Whether ``mask`` is a constant term whose every value is 0 or -inf (a causal or bool mask's): the same
    numbers in bf16, added to bf16 scores exactly."""
    return isinstance(mask, torch.Tensor) and bool(((mask == 0) | (mask == float("-inf"))).all())


def _four_d(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + shape
