"""StableHLO lowerings of the reductions, scans, sorts and triangles (gawee.ops.reduce)."""

from __future__ import annotations

import math

from gawee.backend.lower_mlir import MLIR
from gawee.ir.types import DType


def _reduce_dims(c) -> list[int]:
    dims, rank = c.attrs.get("dim"), c.x(0).rank
    return list(range(rank)) if not dims else [d % rank for d in dims]


def _accumulator(dtype: DType) -> DType:
    """f16/bf16 sums accumulate in float32, as torch's CPU kernels do."""
    return DType.f32 if dtype in (DType.f16, DType.bf16) else dtype


def _reduce_mlir(kind: str, post=None):
    """stablehlo.reduce by ``kind`` over ``dim`` in the result's dtype (float32 for f16/bf16 sums);
    ``post(c, y, count)`` finishes it (mean: divide by the count)."""

    def lower(c):
        out, dims = c.out, _reduce_dims(c)
        work = _accumulator(out.dtype) if kind == "add" else out.dtype
        y = c.reduce(c.convert(c.x(0), work), dims, kind)
        if post is not None:
            y = post(c, y, math.prod(c.x(0).shape[d] for d in dims))
        return c.convert(c.reshape(y, out.shape), out.dtype)

    return lower


def _var_mlir(sqrt: bool):
    """sum((x - mean)^2) / (N - correction), float32 for f16/bf16; std: its square root."""

    def lower(c):
        out, dims = c.out, _reduce_dims(c)
        x = c.convert(c.x(0), _accumulator(out.dtype))
        count = math.prod(x.shape[d] for d in dims)
        d = c.sub(x, c.div(c.reduce(x, dims, "add", keepdim=True), count))
        y = c.div(c.reduce(c.mul(d, d), dims, "add"), max(count - c.attrs["correction"], 0))
        y = c.unary("stablehlo.sqrt", y) if sqrt else y
        return c.convert(c.reshape(y, out.shape), out.dtype)

    return lower


@MLIR.register("logsumexp")
def _logsumexp_mlir(c):
    """max + log(sum(exp(x - max))), with the max taken as 0 where it is infinite."""
    out, dims = c.out, _reduce_dims(c)
    x = c.convert(c.x(0), _accumulator(out.dtype))
    m = c.reduce(x, dims, "max", keepdim=True)
    m = c.select(c.compare("EQ", c.unary("stablehlo.abs", m), math.inf), 0.0, m)
    s = c.reduce(c.unary("stablehlo.exponential", c.sub(x, m)), dims, "add", keepdim=True)
    y = c.add(c.unary("stablehlo.log", s), m)
    return c.convert(c.reshape(y, out.shape), out.dtype)


@MLIR.register("linalg_vector_norm")
def _vector_norm_mlir(c):
    out, dims, p = c.out, _reduce_dims(c), c.attrs["ord"]
    a = c.unary("stablehlo.abs", c.convert(c.x(0), _accumulator(out.dtype)))
    if p == math.inf or p == -math.inf:
        y = c.reduce(a, dims, "max" if p > 0 else "min")
    elif p == 0:
        y = c.reduce(c.convert(c.compare("NE", a, 0), a.dtype), dims, "add")
    elif p == 1:
        y = c.reduce(a, dims, "add")
    elif p == 2:
        y = c.unary("stablehlo.sqrt", c.reduce(c.mul(a, a), dims, "add"))
    else:
        y = c.ew("stablehlo.power", c.reduce(c.ew("stablehlo.power", a, p), dims, "add"), 1 / p)
    return c.convert(c.reshape(y, out.shape), out.dtype)


@MLIR.register("cumsum")
def _cumsum_mlir(c):
    """A window sum over the n elements ending at each position (n - 1 leading padding)."""
    out = c.out
    x = c.convert(c.x(0), _accumulator(out.dtype))
    if not x.rank:
        return c.convert(x, out.dtype)
    d = c.attrs["dim"] % x.rank
    n = x.shape[d]
    window = [n if i == d else 1 for i in range(x.rank)]
    pads = [(n - 1, 0) if i == d else (0, 0) for i in range(x.rank)]
    return c.convert(c.reduce_window(x, "add", window, [1] * x.rank, pads), out.dtype)


def _arg_mlir(kind: str, values: bool = False):
    """The first index of the max (min) along ``dim`` (None: of the flattened tensor): the extreme by a
    reduce, then the smallest iota where the input equals it (or is NaN, which torch ranks highest);
    ``values``: (extreme, index), as max_dim/min_dim return."""

    def lower(c):
        x, dim = c.x(0), c.attrs["dim"]
        if dim is None or not x.rank:
            x, dim = c.reshape(x, (max(1, math.prod(x.shape)),)), 0
        d = dim % x.rank
        m = c.reduce(x, [d], kind, keepdim=True)
        hit = c.compare("EQ", x, m)
        if x.dtype.is_float:
            hit = c.ew("stablehlo.or", hit, c.compare("NE", x, x), dtype=DType.bool)
        index = c.select(hit, c.iota(x.shape, d, DType.i64), x.shape[d])
        index = c.reshape(c.reduce(index, [d], "min"), c.outs[-1].shape)
        return [c.reshape(m, c.outs[0].shape), index] if values else index

    return lower


def _sort_mlir(c, dim: int, descending: bool, k: int | None = None):
    """stablehlo.sort of (values, iota indices) along dim, ordered as torch orders (NaN largest,
    ties stable); topk keeps the first k (sorted=False gets them sorted: torch leaves the order open)."""
    x = c.x(0)
    if x.rank == 0:
        return x, c.splat(0, DType.i64)
    dim %= x.rank
    values, indices = c.sort([x, c.iota(x.shape, dim, DType.i64)], dim, descending, tiebreak=1)
    if k is not None:
        values, indices = c.slice_dim(values, dim, 0, k), c.slice_dim(indices, dim, 0, k)
    return [values, indices]


def _triangle_mlir(lower_part: bool):
    """Keep col - row <= diagonal (tril) or >= diagonal (triu), zeros elsewhere."""

    def lower(c):
        x = c.x(0)
        rows, cols = c.iota(x.shape, x.rank - 2, DType.i64), c.iota(x.shape, x.rank - 1, DType.i64)
        keep = c.compare("LE" if lower_part else "GE", c.sub(cols, rows), c.attrs["diagonal"])
        return c.select(keep, x, c.splat(0, x.dtype, x.shape))

    return lower


MLIR.add("sum", _reduce_mlir("add"))
MLIR.add("mean", _reduce_mlir("add", lambda c, y, n: c.div(y, n)))
MLIR.add("amax", _reduce_mlir("max"))
MLIR.add("amin", _reduce_mlir("min"))
MLIR.add("prod", _reduce_mlir("mul"))
MLIR.add("any", _reduce_mlir("or"))
MLIR.add("all", _reduce_mlir("and"))
MLIR.add("var", _var_mlir(False))
MLIR.add("std", _var_mlir(True))
MLIR.add("argmax", _arg_mlir("max"))
MLIR.add("argmin", _arg_mlir("min"))
MLIR.add("max_dim", _arg_mlir("max", values=True))
MLIR.add("min_dim", _arg_mlir("min", values=True))
MLIR.add("max", _reduce_mlir("max"))
MLIR.add("min", _reduce_mlir("min"))
MLIR.add("topk", lambda c: _sort_mlir(c, c.attrs["dim"], c.attrs["largest"], c.attrs["k"]))
MLIR.add("sort", lambda c: _sort_mlir(c, c.attrs["dim"], c.attrs["descending"]))
MLIR.add("tril", _triangle_mlir(True))
MLIR.add("triu", _triangle_mlir(False))
