"""Reductions and scans: sum, mean, max, norms, cumsum, topk, sort."""

from __future__ import annotations

import math

import torch

from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import AtenBinding, Attr, OpDef, Operand, numel, register, zero_flops

PURE = frozenset({"pure"})
SELF = (Operand("self"),)


def _in_numel(ins, outs, attrs):
    """Reductions: one operation per input element."""
    return numel(ins[0])


def _dims_canon(attrs, types):
    dims = attrs.get("dim")
    if dims is not None:
        rank = max(types[0].rank, 1)
        attrs["dim"] = tuple(sorted(d + rank if d < 0 else d for d in dims))
    return attrs


def _torch_dtype(dtype):
    return None if dtype is None else DType.parse(dtype).torch


def _reduction_sample(draw, slots, attrs):
    fixed = attrs.get("dim")
    if isinstance(slots[0], TensorType):
        x = slots[0]
    else:  # a rank that fits dims the pattern fixed (dim=[-1], dim=[2])
        # dims 0 and -1 fit a 0-d tensor too (torch reduces a scalar "along" them)
        need = max((d + 1 if d >= 0 else -d for d in fixed), default=0) if isinstance(fixed, tuple) else 0
        x = S.tensor(draw, draw.rank(0 if need <= 1 else need, max(need, 4)))
    dims: tuple[int, ...] | None = None
    if x.rank and not draw.boolean(0.2):  # None: all dims; else one or more distinct dims, some negative
        picked = {draw.integers(0, x.rank - 1) for _ in range(draw.integers(1, 3))}
        dims = tuple(d - x.rank if draw.boolean(0.3) else d for d in sorted(picked))
    elif not x.rank and draw.boolean(0.5):  # a dim list on a 0-d tensor: keepdim shapes differ only here
        dims = (draw.choice([0, -1]),)
    return [x], {"dim": dims, "keepdim": draw.boolean(), **attrs}


def _reduce_onnx(op_type: str):
    """The ONNX Reduce* op over ``dim`` (no axes: all), on the input cast to ``dtype`` when one is given."""

    def lower(c):
        x = c.x_as(0, c.out.dtype) if c.attrs.get("dtype") is not None else c.x(0)
        axes = c.ints(c.attrs["dim"]) if c.attrs["dim"] else ""
        return c.emit(op_type, x, axes, keepdims=int(c.attrs["keepdim"]))

    return lower


def _max_dim_onnx(c, largest: bool) -> list[str]:
    """(values, indices) along dim: ReduceMax/ReduceMin and ArgMax/ArgMin (the first index, as torch's)."""
    d, keep = c.attrs["dim"], int(c.attrs["keepdim"])
    values = c.emit("ReduceMax" if largest else "ReduceMin", c.x(0), c.ints([d]), keepdims=keep)
    indices = c.emit("ArgMax" if largest else "ArgMin", c.x(0), axis=d, keepdims=keep, select_last_index=0)
    return [values, indices]


def _topk_onnx(c, k: int | None, dim: int, largest: bool) -> list[str]:
    """TopK (sorted): topk's k, or the whole dim for sort. Ties may come back in another order than torch's."""
    t = c.type(0)
    if t.rank == 0:
        return [c.emit("Identity", c.x(0)), c.constant(torch.tensor(0))]
    n = t.shape[dim % t.rank] if k is None else k
    if has_symbols(n):
        c.fail("a symbolic number of elements to sort")
    return c.emit_multi("TopK", [c.x(0), c.ints([n])], 2, axis=dim, largest=int(largest), sorted=1)


# -- MLIR lowerings (OpDef.mlir; see gawee.backend.mlir) ---------------------------------
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


def _logsumexp_mlir(c):
    """max + log(sum(exp(x - max))), with the max taken as 0 where it is infinite."""
    out, dims = c.out, _reduce_dims(c)
    x = c.convert(c.x(0), _accumulator(out.dtype))
    m = c.reduce(x, dims, "max", keepdim=True)
    m = c.select(c.compare("EQ", c.unary("stablehlo.abs", m), math.inf), 0.0, m)
    s = c.reduce(c.unary("stablehlo.exponential", c.sub(x, m)), dims, "add", keepdim=True)
    y = c.add(c.unary("stablehlo.log", s), m)
    return c.convert(c.reshape(y, out.shape), out.dtype)


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


def reduction(name, fn, *, extra=(), aten=(), onnx=None, mlir=None, doc="") -> OpDef:
    """A reduction over ``dim`` (None: all dims) with ``keepdim``; ``fn(self, dim, keepdim, **extra)``.

    ``onnx``: the ONNX Reduce* op type computing it (or a lowering of its own); ``mlir``: see OpDef.mlir.
    """
    attrs = (Attr("dim", "ints?", None), Attr("keepdim", "bool", False), *extra)
    return register(
        OpDef(
            name,
            SELF,
            fn,
            attrs=attrs,
            traits=PURE,
            flops=_in_numel,
            canonicalize=_dims_canon,
            sample=_reduction_sample,
            aten=aten,
            onnx=_reduce_onnx(onnx) if isinstance(onnx, str) else onnx,
            mlir=mlir,
            doc=doc,
        )
    )


def _axes(c) -> str:
    """The reduced axes as an ONNX axes input ("": all of them)."""
    return c.ints(c.attrs["dim"]) if c.attrs["dim"] else ""


def _truth_reduce_onnx(op_type: str):
    """any/all: ReduceMax/ReduceMin of the operand's truth as int32 (ONNX Runtime reduces no bool), back to bool."""

    def lower(c):
        t = c.type(0)
        truth = c.x(0) if t.dtype is DType.bool else c.emit("Not", c.emit("Equal", c.x(0), c.scalar(0, t.dtype)))
        y = c.emit(op_type, c.cast(truth, DType.i32), _axes(c), keepdims=int(c.attrs["keepdim"]))
        return c.cast(y, DType.bool)

    return lower


def _reduced_count(c) -> int:
    t = c.type(0)
    dims = c.attrs["dim"] or range(t.rank)
    sizes = [t.shape[d] for d in dims]
    if has_symbols(tuple(sizes)):
        c.fail("a variance over a symbolic number of elements")
    return math.prod(sizes)


def _var_onnx(std: bool):
    """sum((x - mean)^2) / max(0, n - correction), as torch's var/std (a non-positive count gives inf or nan)."""

    def lower(c):
        x, axes = c.x(0), _axes(c)
        d = c.emit("Sub", x, c.emit("ReduceMean", x, axes, keepdims=1))
        total = c.emit("ReduceSum", c.emit("Mul", d, d), axes, keepdims=int(c.attrs["keepdim"]))
        y = c.emit("Div", total, c.scalar(max(0.0, _reduced_count(c) - c.attrs["correction"]), c.out.dtype))
        return c.emit("Sqrt", y) if std else y

    return lower


def _vector_norm_onnx(c):
    """The ord-norm: ReduceL2/ReduceL1, max/min of |x| for ±inf, the count of nonzeros for 0, else (sum |x|^p)^(1/p)."""
    x, axes, keep, p = c.x_as(0, c.out.dtype), _axes(c), int(c.attrs["keepdim"]), float(c.attrs["ord"])
    if p == 2:
        return c.emit("ReduceL2", x, axes, keepdims=keep)
    if p == 1:
        return c.emit("ReduceL1", x, axes, keepdims=keep)
    if math.isinf(p):
        return c.emit("ReduceMax" if p > 0 else "ReduceMin", c.emit("Abs", x), axes, keepdims=keep)
    if p == 0:
        nonzero = c.cast(c.emit("Not", c.emit("Equal", x, c.scalar(0, c.out.dtype))), c.out.dtype)
        return c.emit("ReduceSum", nonzero, axes, keepdims=keep)
    powered = c.emit("Pow", c.emit("Abs", x), c.scalar(p, c.out.dtype))
    return c.emit("Pow", c.emit("ReduceSum", powered, axes, keepdims=keep), c.scalar(1 / p, c.out.dtype))


def _all_dims(self, dim):
    return tuple(range(self.dim())) if dim is None or len(dim) == 0 else dim


reduction(
    "sum",
    lambda self, *, dim, keepdim, dtype: torch.sum(self, _all_dims(self, dim), keepdim, dtype=_torch_dtype(dtype)),
    extra=(Attr("dtype", "dtype?", None),),
    aten=("aten.sum.dim_IntList", "aten.sum.default"),
    onnx="ReduceSum",
    mlir=_reduce_mlir("add"),
)
reduction(
    "mean",
    lambda self, *, dim, keepdim, dtype: torch.mean(self, _all_dims(self, dim), keepdim, dtype=_torch_dtype(dtype)),
    extra=(Attr("dtype", "dtype?", None),),
    aten=("aten.mean.dim", "aten.mean.default"),
    onnx="ReduceMean",
    mlir=_reduce_mlir("add", lambda c, y, n: c.div(y, n)),
)
reduction(
    "amax",
    lambda self, *, dim, keepdim: torch.amax(self, _all_dims(self, dim), keepdim),
    aten=("aten.amax.default",),
    onnx="ReduceMax",
    mlir=_reduce_mlir("max"),
)
reduction(
    "amin",
    lambda self, *, dim, keepdim: torch.amin(self, _all_dims(self, dim), keepdim),
    aten=("aten.amin.default",),
    onnx="ReduceMin",
    mlir=_reduce_mlir("min"),
)
reduction(
    "prod",
    lambda self, *, dim, keepdim: _prod(self, dim, keepdim),
    mlir=_reduce_mlir("mul"),
    onnx=lambda c: c.emit("ReduceProd", c.x_as(0, c.out.dtype), _axes(c), keepdims=int(c.attrs["keepdim"])),
    aten=(
        AtenBinding(
            "aten.prod.dim_int",
            rename={"dim": "dim"},
            convert=lambda a, t: {**a, "dim": [a["dim"]]},
            fixed={"dtype": None},
        ),
        AtenBinding("aten.prod.default", fixed={"dtype": None}),
    ),
)
reduction(
    "any",
    lambda self, *, dim, keepdim: torch.any(self, _all_dims(self, dim), keepdim) if self.dim() else torch.any(self),
    mlir=_reduce_mlir("or"),
    onnx=_truth_reduce_onnx("ReduceMax"),
    aten=(
        "aten.any.dims",
        AtenBinding("aten.any.dim", convert=lambda a, t: {**a, "dim": [a["dim"]]}),
        "aten.any.default",
    ),
)
reduction(
    "all",
    lambda self, *, dim, keepdim: torch.all(self, _all_dims(self, dim), keepdim) if self.dim() else torch.all(self),
    mlir=_reduce_mlir("and"),
    onnx=_truth_reduce_onnx("ReduceMin"),
    aten=(
        "aten.all.dims",
        AtenBinding("aten.all.dim", convert=lambda a, t: {**a, "dim": [a["dim"]]}),
        "aten.all.default",
    ),
)
reduction(
    "var",
    lambda self, *, dim, keepdim, correction: torch.var(
        self, _all_dims(self, dim), correction=correction, keepdim=keepdim
    ),
    extra=(Attr("correction", "float", 1.0),),
    aten=("aten.var.correction",),
    onnx=_var_onnx(False),
    mlir=_var_mlir(False),
)
reduction(
    "std",
    lambda self, *, dim, keepdim, correction: torch.std(
        self, _all_dims(self, dim), correction=correction, keepdim=keepdim
    ),
    extra=(Attr("correction", "float", 1.0),),
    aten=("aten.std.correction",),
    onnx=_var_onnx(True),
    mlir=_var_mlir(True),
)
reduction(
    "logsumexp",
    lambda self, *, dim, keepdim: torch.logsumexp(self, _all_dims(self, dim), keepdim),
    aten=("aten.logsumexp.default",),
    onnx="ReduceLogSumExp",
    mlir=_logsumexp_mlir,
)
reduction(
    "linalg_vector_norm",
    lambda self, *, dim, keepdim, ord, dtype: torch.linalg.vector_norm(
        self, ord, dim, keepdim, dtype=_torch_dtype(dtype)
    ),
    extra=(Attr("ord", "float", 2.0), Attr("dtype", "dtype?", None)),
    aten=("aten.linalg_vector_norm.default",),
    onnx=_vector_norm_onnx,
    mlir=_vector_norm_mlir,
    doc="the ord-norm over dim (None: all elements)",
)


def _prod(self, dim, keepdim):
    out = self
    for d in sorted(_all_dims(self, dim), reverse=True):
        out = torch.prod(out, d, keepdim)
    return out


def _arg_onnx(c, op_type: str) -> str:
    """ArgMax/ArgMin along ``dim``; over all elements (``dim=None``) along the flattened tensor, kept as a shape of
    ones with ``keepdim``."""
    keep = c.attrs["keepdim"]
    widen = c.type(0).dtype in (DType.bool, DType.i16)  # ONNX Runtime has no ArgMax/ArgMin of these: int32 orders alike

    def arg(x: str, **attrs) -> str:
        return c.emit(op_type, c.cast(x, DType.i32) if widen else x, **attrs)

    if c.attrs["dim"] is not None:
        return c.on_vector(lambda x: arg(x, axis=c.attrs["dim"], keepdims=int(keep)))
    flat = arg(c.emit("Reshape", c.x(0), c.ints([-1])), axis=0, keepdims=0)
    return c.emit("Reshape", flat, c.ints([1] * c.type(0).rank)) if keep else flat


def _arg_reduction(name, fn):
    register(
        OpDef(
            name,
            SELF,
            lambda self, *, dim, keepdim: fn(self, dim, keepdim),
            attrs=(Attr("dim", "int?", None), Attr("keepdim", "bool", False)),
            traits=PURE,
            flops=_in_numel,
            aten=(f"aten.{name}.default",),
            mlir=_arg_mlir("max" if name == "argmax" else "min"),
            onnx=lambda c: _arg_onnx(c, "ArgMax" if name == "argmax" else "ArgMin"),
        )
    )


_arg_reduction("argmax", torch.argmax)
_arg_reduction("argmin", torch.argmin)

for _name, _fn in [("max_dim", torch.max), ("min_dim", torch.min)]:
    register(
        OpDef(
            _name,
            SELF,
            (lambda fn: lambda self, *, dim, keepdim: tuple(fn(self, dim, keepdim)))(_fn),
            attrs=(Attr("dim", "int"), Attr("keepdim", "bool", False)),
            traits=PURE | {"multi_output"},
            flops=_in_numel,
            aten=(f"aten.{_name[:3]}.dim",),
            onnx=(lambda big: lambda c: _max_dim_onnx(c, big))(_name == "max_dim"),
            mlir=_arg_mlir("max" if _name == "max_dim" else "min", values=True),
            doc="(values, indices) along dim",
        )
    )
for _name, _fn in [("max", torch.max), ("min", torch.min)]:
    register(
        OpDef(
            _name,
            SELF,
            _fn,
            traits=PURE,
            flops=_in_numel,
            aten=(f"aten.{_name}.default",),
            onnx=(lambda op_type: lambda c: c.emit(op_type, c.x(0), keepdims=0))(
                "ReduceMax" if _name == "max" else "ReduceMin"
            ),
            mlir=_reduce_mlir("max" if _name == "max" else "min"),
            doc="the largest element, as a 0-d tensor" if _name == "max" else "the smallest element",
        )
    )

register(
    OpDef(
        "cumsum",
        SELF,
        lambda self, *, dim, dtype: torch.cumsum(self, dim, dtype=_torch_dtype(dtype)),
        attrs=(Attr("dim", "int"), Attr("dtype", "dtype?", None)),
        traits=PURE,
        flops=_in_numel,
        onnx=lambda c: c.on_vector(
            lambda x: c.emit(
                "CumSum",
                x if c.type(0).dtype is c.out.dtype else c.cast(x, c.out.dtype),
                c.constant(torch.tensor(c.attrs["dim"])),
            )
        ),
        mlir=_cumsum_mlir,
        aten=("aten.cumsum.default",),
    )
)
register(
    OpDef(
        "topk",
        SELF,
        lambda self, *, k, dim, largest, sorted: tuple(torch.topk(self, k, dim, largest, sorted)),
        attrs=(Attr("k", "int"), Attr("dim", "int", -1), Attr("largest", "bool", True), Attr("sorted", "bool", True)),
        traits=PURE | {"multi_output"},
        flops=_in_numel,
        aten=("aten.topk.default",),
        onnx=lambda c: _topk_onnx(c, c.attrs["k"], c.attrs["dim"], c.attrs["largest"]),
        mlir=lambda c: _sort_mlir(c, c.attrs["dim"], c.attrs["largest"], c.attrs["k"]),
        doc="(values, indices) of the k largest",
    )
)
register(
    OpDef(
        "sort",
        SELF,
        lambda self, *, dim, descending: tuple(torch.sort(self, dim=dim, descending=descending)),
        attrs=(Attr("dim", "int", -1), Attr("descending", "bool", False)),
        traits=PURE | {"multi_output"},
        flops=_in_numel,
        aten=(AtenBinding("aten.sort.default"), AtenBinding("aten.sort.stable", fixed={"stable": None})),
        onnx=lambda c: _topk_onnx(c, None, c.attrs["dim"], c.attrs["descending"]),
        mlir=lambda c: _sort_mlir(c, c.attrs["dim"], c.attrs["descending"]),
        doc="(values, indices) sorted along dim",
    )
)
register(
    OpDef(
        "tril",
        SELF,
        lambda self, *, diagonal: torch.tril(self, diagonal),
        attrs=(Attr("diagonal", "int", 0),),
        traits=frozenset({"pure"}),
        flops=zero_flops,
        aten=("aten.tril.default",),
        onnx=lambda c: c.emit("Trilu", c.x(0), c.constant(torch.tensor(c.attrs["diagonal"])), upper=0),
        mlir=_triangle_mlir(True),
    )
)
register(
    OpDef(
        "triu",
        SELF,
        lambda self, *, diagonal: torch.triu(self, diagonal),
        attrs=(Attr("diagonal", "int", 0),),
        traits=frozenset({"pure"}),
        flops=zero_flops,
        aten=("aten.triu.default",),
        onnx=lambda c: c.emit("Trilu", c.x(0), c.constant(torch.tensor(c.attrs["diagonal"])), upper=1),
        mlir=_triangle_mlir(False),
    )
)
