"""Numerics shared by the soundness harness and equivalence checking: per-dtype tolerances, error measures,
float64 recomputation, and the awkward values that break sloppy rewrites."""

from __future__ import annotations

import math

import torch

from gawee.errors import GaweeError
from gawee.ir.core import Graph, Value
from gawee.ir.types import DType, TensorType

TOLERANCE = {DType.f64: 1e-9, DType.f32: 1e-4, DType.f16: 1e-2, DType.bf16: 4e-2, DType.c64: 1e-4, DType.c128: 1e-9}
"""Per-dtype tolerance: outputs agree when max|a - b| <= tol * max(1, max|reference|).
Integer and bool outputs must be identical."""


AWKWARD = [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, 1e-4, -1e-4, 1e3, -1e3, 6e4, -6e4, 1e-30]
"""Values that break sloppy rewrites: zeros (of both signs), tiny, huge, cancelling pairs."""


NONFINITE = [float("inf"), float("-inf"), float("nan")]
"""Added to the awkward pool of graph inputs (not of constants: weights are finite)."""


CANCEL_MAGNITUDE = {DType.f16: 1e3, DType.bf16: 1e3, DType.f32: 1e8, DType.f64: 1e17}
"""In "cancel" mode every float leaf is filled with one value, M, -M or 0.3 (chosen by hypothesis, so
the combinations are explored and shrunk), where 0.3 is below M's rounding step. (M + -M) + 0.3 and
M + (-M + 0.3) then differ in every element, exposing reassociation even under a max-norm tolerance."""


def output_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    """max|ref - got| with NaN/inf compared by position (a mismatch is inf). Integers (and bools, as 0 and 1)
    differ by the exact integer: a rewrite off by 2**32 reports 4294967296, not inf."""
    if ref.numel() == 0:
        return 0.0
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        return _integer_error(ref, got)
    a, b = ref.double() if not ref.is_complex() else ref, got.double() if not got.is_complex() else got
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return float("inf")
    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
        return float("inf")
    finite = ~(nan_a | inf_a)
    if not finite.any():
        return 0.0
    return (a[finite] - b[finite]).abs().max().item()


def _integer_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    """max|ref - got| of integer tensors, exact (as a float: exact up to 2**53, never 0 for a mismatch)."""
    if ref.shape != got.shape or got.is_floating_point() or got.is_complex():
        return 0.0 if torch.equal(ref, got) else float("inf")
    differ = ref != got
    if not differ.any():
        return 0.0
    a, b = ref[differ].long(), got[differ].long()  # every integer dtype fits in int64
    safe = 2**62  # |a - b| < 2**63: no int64 overflow
    if all(bool(((t > -safe) & (t < safe)).all()) for t in (a, b)):
        return float((a - b).abs().max().item())
    return float(max(abs(x - y) for x, y in zip(a.tolist(), b.tolist())))


def format_error(x: float) -> str:
    """An error or a tolerance as reports print it: an integral value as the integer (an integer output off by
    2**32 reads 4294967296), any other to three significant digits."""
    if math.isfinite(x) and x == int(x) and abs(x) < 2**63:
        return str(int(x))
    return f"{x:.3g}"


def no_farther(ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor, allowed: float) -> bool:
    """Element by element, ``got`` agrees with ``ref`` or is no farther from the float64 ``truth`` than
    ``ref`` is: a rewrite that avoids an overflow of the original (inf where float64 is finite, or
    nan where it is inf), in some elements while others overflow in both, is not wrong. Nor is an element
    that is the truth correctly rounded to its dtype, an overflow to inf included: where the original
    gives nan for it (torch's f16 gelu(inf) is nan on one CPU kernel and inf on another), the rewrite
    that gives inf is the exact answer."""
    r, g = ref.double(), got.double()
    rounded = truth.to(got.dtype).double()
    agree = (r == g) | (torch.isnan(r) & torch.isnan(g)) | ((r - g).abs() <= allowed) | (g == rounded)
    d = _distance(g, truth)
    return bool((agree | ((d <= _distance(r, truth) + allowed) & torch.isfinite(d))).all())


def _distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| element by element, 0 where they are equal (equal infinities too), inf where one is nan."""
    d = (a - b).abs().nan_to_num(nan=float("inf"), posinf=float("inf"))
    return torch.where(a == b, torch.zeros_like(d), d)


def upcast(graph: Graph, magnitudes: bool = False, values: dict[int, Value] | None = None) -> Graph | None:
    """The graph recomputed in float64 (floats only), or None if an op refuses it; with ``magnitudes``, on
    the absolute values of its float constants (its inputs are the caller's to take). ``values``, when given,
    is filled as in ``recast``."""

    def up(t: TensorType) -> TensorType:
        return TensorType(t.shape, DType.f64, t.layout) if t.dtype.is_float else t

    def data(d):
        return (d.double().abs() if magnitudes else d.double()) if d.is_floating_point() else d

    return recast(graph, "_magnitude" if magnitudes else "_f64", up, data, values)


def recast(graph: Graph, suffix: str, retype, redata, values: dict[int, Value] | None = None) -> Graph | None:
    """``graph`` rebuilt with input types mapped by ``retype`` and constant data by ``redata``. ``values``, when
    given, is filled with ``id(v)`` of each value of ``graph`` -> its counterpart in the rebuilt graph."""
    g = Graph(graph.name + suffix)
    vmap: dict[int, Value] = {} if values is None else values
    for v in graph.inputs:
        vmap[id(v)] = g.add_input(retype(v.type), v.name)
    try:
        for node in graph:
            ins = []
            for v in node.inputs:
                if v is not None and id(v) not in vmap:
                    vmap[id(v)] = g.constant(redata(v.data), v.name)
                ins.append(None if v is None else vmap[id(v)])
            n = g.create_node(node.op, ins, node.attrs, name=node.name)
            for a, b in zip(node.outputs, n.outputs):
                vmap[id(a)] = b
        outs = []
        for v in graph.outputs:
            if id(v) not in vmap:
                vmap[id(v)] = g.constant(redata(v.data), v.name)
            outs.append(vmap[id(v)])
    except GaweeError:
        return None
    g.set_outputs(outs)
    return g


def fill(t: TensorType, style: str, gen: torch.Generator, nonfinite: bool = False) -> torch.Tensor:
    """Random data of type ``t`` in a style (see Leaf.style); ``nonfinite`` adds inf/nan to awkward values."""
    if t.dtype is DType.bool:
        return torch.rand(t.shape, generator=gen) > 0.5
    if not (t.dtype.is_float or t.dtype.is_complex):  # small ints; in [0, 3] for a nonnegative operand (indices)
        low = 0 if style.startswith("abs-") else -3
        return torch.randint(low, 4, t.shape, generator=gen).to(t.dtype.torch)
    if style.startswith("abs-"):
        return fill(t, style[4:], gen, nonfinite).abs()
    if style.startswith("cancel:"):
        m = CANCEL_MAGNITUDE.get(t.dtype, 1e3)
        value = (m, -m, 0.3)[int(style.partition(":")[2])]
        return torch.full(t.shape, value, dtype=t.dtype.torch)
    if style == "awkward":
        values = AWKWARD + (NONFINITE if nonfinite else [])
        pool = torch.tensor(values, dtype=torch.float64)
        idx = torch.randint(0, len(values), t.shape, generator=gen)
        x = pool[idx] * torch.where(
            torch.rand(t.shape, generator=gen) < 0.5, 1.0, 1.0 + torch.rand(t.shape, generator=gen, dtype=torch.float64)
        )
    elif style == "positive":
        x = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 + 0.05
    elif style in ("special", "special1", "extreme", "extreme1", "nonfinite1"):
        finite = style.startswith("extreme") or not nonfinite
        values = NONFINITE if style == "nonfinite1" and nonfinite else special_values(t.dtype, finite=finite)
        pool = torch.tensor(values, dtype=torch.float64)
        if style.endswith("1"):  # one value everywhere (a scalar constant, an all-equal bias)
            x = pool[torch.randint(0, len(pool), (), generator=gen)].expand(t.shape).clone()
        else:  # each element special or ordinary
            pick = pool[torch.randint(0, len(pool), t.shape, generator=gen)]
            x = torch.where(
                torch.rand(t.shape, generator=gen) < 0.5, pick, torch.randn(t.shape, generator=gen, dtype=torch.float64)
            )
    elif style == "wide":
        scale = 10.0 ** torch.randint(0, 5, t.shape, generator=gen).double()
        x = torch.randn(t.shape, generator=gen, dtype=torch.float64) * scale
    elif style == "ints":
        x = torch.randint(-3, 4, t.shape, generator=gen).double()
    elif style == "unit":
        x = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
    else:
        x = torch.randn(t.shape, generator=gen, dtype=torch.float64)
    return x.to(t.dtype.torch)


def special_values(dtype: DType, finite: bool = False) -> list[float]:
    """Values a constant may hold that break rewrites assuming ordinary numbers: huge ones, the dtype's
    smallest normal and a subnormal, signed zeros, 1/eps, and (unless ``finite``) inf, -inf and nan.

    Huge is max^(3/4) and sqrt(max) of the dtype (7.6e28 and 1.8e19 for f32, 4096 and 256 for f16):
    huge enough to swamp ordinary values (x + c == c) and to overflow products, with headroom below
    max, so that a fold that is exact in real arithmetic is not blamed for an intermediate overflow
    at max itself (a conv over weights of 1.7e38 scaled by 1.5: the original's sum stays finite,
    the folded one's does not). The huge ones are listed twice: they matter most."""
    # f64 gets float32's extremes: where an f64 original overflows, the harness has no wider truth to
    # tell a rewrite that avoids the overflow (more accurate) from a wrong one
    fi = torch.finfo(dtype.torch if dtype.is_float and dtype is not DType.f64 else torch.float32)
    big = [fi.max**0.75, -(fi.max**0.75), fi.max**0.5, -(fi.max**0.5)]
    out = big + big + [fi.tiny, -fi.tiny, fi.tiny / 4, 0.0, -0.0, 1 / fi.eps]
    return out if finite else out + NONFINITE + NONFINITE
