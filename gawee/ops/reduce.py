"""Reductions and scans: sum, mean, max, norms, cumsum, topk, sort."""

from __future__ import annotations

import torch

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


def reduction(name, fn, *, extra=(), aten=(), doc="") -> OpDef:
    """A reduction over ``dim`` (None: all dims) with ``keepdim``; ``fn(self, dim, keepdim, **extra)``."""
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
            doc=doc,
        )
    )


def _all_dims(self, dim):
    return tuple(range(self.dim())) if dim is None or len(dim) == 0 else dim


reduction(
    "sum",
    lambda self, *, dim, keepdim, dtype: torch.sum(self, _all_dims(self, dim), keepdim, dtype=_torch_dtype(dtype)),
    extra=(Attr("dtype", "dtype?", None),),
    aten=("aten.sum.dim_IntList", "aten.sum.default"),
)
reduction(
    "mean",
    lambda self, *, dim, keepdim, dtype: torch.mean(self, _all_dims(self, dim), keepdim, dtype=_torch_dtype(dtype)),
    extra=(Attr("dtype", "dtype?", None),),
    aten=("aten.mean.dim", "aten.mean.default"),
)
reduction(
    "amax",
    lambda self, *, dim, keepdim: torch.amax(self, _all_dims(self, dim), keepdim),
    aten=("aten.amax.default",),
)
reduction(
    "amin",
    lambda self, *, dim, keepdim: torch.amin(self, _all_dims(self, dim), keepdim),
    aten=("aten.amin.default",),
)
reduction(
    "prod",
    lambda self, *, dim, keepdim: _prod(self, dim, keepdim),
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
    aten=(
        "aten.any.dims",
        AtenBinding("aten.any.dim", convert=lambda a, t: {**a, "dim": [a["dim"]]}),
        "aten.any.default",
    ),
)
reduction(
    "all",
    lambda self, *, dim, keepdim: torch.all(self, _all_dims(self, dim), keepdim) if self.dim() else torch.all(self),
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
)
reduction(
    "std",
    lambda self, *, dim, keepdim, correction: torch.std(
        self, _all_dims(self, dim), correction=correction, keepdim=keepdim
    ),
    extra=(Attr("correction", "float", 1.0),),
    aten=("aten.std.correction",),
)
reduction(
    "logsumexp",
    lambda self, *, dim, keepdim: torch.logsumexp(self, _all_dims(self, dim), keepdim),
    aten=("aten.logsumexp.default",),
)
reduction(
    "linalg_vector_norm",
    lambda self, *, dim, keepdim, ord, dtype: torch.linalg.vector_norm(
        self, ord, dim, keepdim, dtype=_torch_dtype(dtype)
    ),
    extra=(Attr("ord", "float", 2.0), Attr("dtype", "dtype?", None)),
    aten=("aten.linalg_vector_norm.default",),
    doc="the ord-norm over dim (None: all elements)",
)


def _prod(self, dim, keepdim):
    out = self
    for d in sorted(_all_dims(self, dim), reverse=True):
        out = torch.prod(out, d, keepdim)
    return out


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
    )
)
