"""Boundary classes of values: data that breaks rewrites at the edges of a dtype, drawn on purpose.

Random normal data almost never holds the values where a rewrite goes wrong: an int32 near 2**31
that wraps before a widening cast, an integer past 256 that bfloat16 cannot hold, float16 data whose
sum passes 65504, a quotient that rounds up to an integer before ``floor``, a row of the magnitude of
an ``eps`` the rewrite moves, a tie that ``argmax`` and ``topk`` break by position. Each class here
is a way to fill a tensor; the harness fills every enumerated instance with some of them (see
gawee.testing.scope), so each class reaches each rule in every run, not by luck.

A class's data depends only on the tensor's type and a generator: where the class cannot express a
value in the dtype (int8 past 256), it uses the nearest the dtype holds (its limits).
"""

from __future__ import annotations

import math

import torch

from gawee.dsl.compiler import Rule
from gawee.ir.core import Graph
from gawee.ir.types import DType, TensorType

CLASSES = ("limits", "past_exact", "overflow", "tenths", "ties")
"""The classes every rule gets, whatever its text (``scaled:c`` are added per eps-like constant)."""

PAST_EXACT = (255, 256, 257, 259, 2047, 2048, 2049, 2051, 2**24 - 1, 2**24 + 1, 2**24 + 3, 2**53 + 1)
"""Integers around the end of the exactly representable range of bf16 (8 significand bits: 256),
f16 (11 bits: 2048), f32 (24 bits) and f64 (53 bits): a round trip through the narrower type moves them."""

EPS_LIKE = 0.01
"""Float constants of a rule or instance at most this large (in magnitude, and nonzero) are eps-like."""


def classes_for(rule: Rule, graph: Graph | None = None) -> list[str]:
    """The value classes for ``rule`` on an instance ``graph``: CLASSES, then ``scaled:c`` for every
    eps-like float constant c of the rule's text or the instance's attributes, at c and sqrt(c) (rows
    whose variance is comparable to eps, and rows that eps swamps)."""
    consts: set[float] = set()
    if rule.ast is not None:
        _float_literals(rule.ast, consts)
    if graph is not None:
        for node in graph:
            for v in node.attrs.values():
                for x in v if isinstance(v, tuple) else (v,):
                    if isinstance(x, float):
                        consts.add(x)
    scales: set[float] = set()
    for c in consts:
        if math.isfinite(c) and 0 < abs(c) <= EPS_LIKE:
            scales |= {abs(c), math.sqrt(abs(c))}
    return list(CLASSES) + [f"scaled:{c:.6g}" for c in sorted(scales)]


def _float_literals(node, out: set[float], depth: int = 0) -> None:
    from gawee.dsl import ast as A

    if depth > 64:
        return
    if isinstance(node, A.ELit) and isinstance(node.value, float):
        out.add(node.value)
    for v in vars(node).values() if hasattr(node, "__dict__") else ():
        for x in v if isinstance(v, list) else (v,):
            if isinstance(x, A.Node):
                _float_literals(x, out, depth + 1)


def is_class(style: str) -> bool:
    """Whether a leaf style names a value class (``limits``, ``scaled:1e-05``, with ``!finite`` or not)."""
    base = style.partition("!")[0]
    return base in CLASSES or base.startswith("scaled:")


def fill_class(t: TensorType, style: str, gen: torch.Generator, nonfinite: bool = True) -> torch.Tensor:
    """Data of type ``t`` in a value class; ``style`` may end in ``!finite`` (no inf or nan: the guard
    asks for finite values), as may ``nonfinite=False``."""
    base, *flags = style.split("!")
    nonfinite = nonfinite and "finite" not in flags
    capped = "input" in flags
    if t.dtype is DType.bool:
        return torch.rand(t.shape, generator=gen) > 0.5
    if t.dtype.is_float:
        values = _float_pool(base, t.dtype, nonfinite, capped)
    else:
        values = _int_pool(base, t.dtype)
    pool = torch.tensor(values, dtype=torch.float64 if t.dtype.is_float else torch.int64)
    if base.startswith("scaled:"):  # whole rows at the constant's magnitude
        scale = float(base.partition(":")[2])
        x = torch.randn(t.shape, generator=gen, dtype=torch.float64) * scale
        return x.to(t.dtype.torch) if t.dtype.is_float else torch.zeros(t.shape, dtype=t.dtype.torch)
    pick = pool[torch.randint(0, len(values), t.shape, generator=gen)]
    if base in ("limits", "past_exact"):  # half of the elements ordinary, so that both meet
        ordinary = torch.randint(-3, 4, t.shape, generator=gen).to(pick.dtype)
        if t.dtype.is_float:
            ordinary = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        pick = torch.where(torch.rand(t.shape, generator=gen) < 0.5, pick, ordinary)
    return pick.to(t.dtype.torch)


INPUT_CAP = 65504.0
"""The largest magnitude of a float *input* in the limits and overflow classes (float16's max): activations
of 1e38 are not what a model holds, and torch's fused kernels square them (layer_norm overflows past
1.8e19 in float32 where the written-out variance does not). Constants take the dtype's own extremes."""


def _float_pool(base: str, dtype: DType, nonfinite: bool, capped: bool = False) -> list[float]:
    # f64 gets float32's extremes: where an f64 original overflows, no wider type gives the truth that
    # would tell a rewrite avoiding the overflow from a wrong one (as gawee.numerics.special_values)
    fi = torch.finfo(torch.float32 if dtype is DType.f64 else dtype.torch)
    if capped and base in ("limits", "overflow") and fi.max > INPUT_CAP:
        fi = torch.finfo(torch.float16)
    if base == "limits":
        out = [fi.max, -fi.max, fi.tiny, -fi.tiny, fi.tiny / 4, -fi.tiny / 4, 0.0, -0.0, 1 / fi.eps, fi.eps]
        return out + ([math.inf, -math.inf, math.nan] if nonfinite else [])
    if base == "past_exact":
        return [float(s * v) for v in PAST_EXACT if v < fi.max for s in (1, -1)]
    if base == "overflow":  # the sum of any two passes the dtype's max; each, and their mean, does not
        return [fi.max * f for f in (0.55, 0.6, 0.7, 0.8)]
    if base == "tenths":  # quotients of these round to integers they are not: floor(1 / 0.1) vs 1 // 0.1
        return [k / 10 for k in range(-30, 31)] + [0.7, 1.1, 2.3, 4.9, 5.0, 10.0]
    if base == "ties":
        return [-1.0, -0.0, 0.0, 1.0]
    return [0.0]


def _int_pool(base: str, dtype: DType) -> list[int]:
    ii = torch.iinfo(dtype.torch)
    if base == "limits":  # the ends, and the square root of the end (a product wraps)
        root = math.isqrt(ii.max)
        return [ii.max, ii.max - 1, ii.min, ii.min + 1, root + 1, -(root + 1), ii.max // 2 + 1, 0, 1, -1]
    if base == "past_exact":
        return [min(max(s * v, ii.min), ii.max) for v in PAST_EXACT for s in (1, -1)]
    if base == "overflow":
        return [ii.max // 3 + 1, ii.max // 2 + 1, ii.max // 2]
    if base == "tenths":
        return list(range(-12, 13))
    if base == "ties":
        return [0, 1] if ii.min == 0 else [-1, 0, 1]
    return [0]
