"""Shape and data-movement ops: views, reshapes, concatenation, splitting, indexing, padding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.ir.symbolic import has_symbols, prove
from gawee.ir.types import DType, Layout, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import AtenBinding, Attr, OpDef, Operand, register, zero_flops

VIEW = frozenset({"pure", "view"})
MOVE = frozenset({"pure"})


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _resolve_shape(shape, numel):
    """A shape with its one -1 (if any) replaced by the size it stands for."""
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


def _view_bytes(ins, outs, attrs):
    return (0, 0)


def _shape_op(traits, name, operands, fn, attrs=(), canonicalize=None, aten=(), sample=None, doc="", **extra) -> OpDef:
    return register(
        OpDef(
            name,
            operands,
            fn,
            attrs=attrs,
            traits=traits,
            flops=zero_flops,
            sample=sample,
            canonicalize=canonicalize,
            aten=aten,
            doc=doc,
            **extra,
        )
    )


def view_op(*args, **kwargs) -> OpDef:
    """An op whose output aliases its input: no FLOPs, no bytes moved."""
    return _shape_op(VIEW, *args, bytes_accessed=_view_bytes, **kwargs)


def move_op(*args, traits=(), **kwargs) -> OpDef:
    """An op that copies elements into a new arrangement: no FLOPs, its bytes read and written."""
    return _shape_op(frozenset(MOVE) | frozenset(traits), *args, **kwargs)


def unary_sample(draw_attrs=None, min_rank: int = 0, free=None):
    """Sampler of a one-operand op: the operand's type, then ``draw_attrs(draw, type)``. ``free(draw,
    attrs)`` draws the operand when it is free and the pattern fixed attributes it must fit (or None)."""

    def sample(draw, slots, attrs):
        x = slots[0] if isinstance(slots[0], TensorType) else free(draw, attrs) if free else None
        if x is None:
            x = S.tensor(draw, draw.rank(min_rank, 4))
        if x.rank < min_rank:
            raise S.Reject(f"needs rank >= {min_rank}")
        drawn = draw_attrs(draw, x, attrs) if draw_attrs else {}
        return [x], {**drawn, **attrs}

    return sample


def _draw_reshape(draw, x, attrs):
    dims = list(x.shape)
    kinds = ["flat", "same", "merge", "split", "ones", "any", "same_rank", "same_rank"] + ["matrix", "seen"] * 2
    kind = draw.choice(kinds)
    if kind == "matrix" and len(dims) >= 2:  # all but the last dim flattened (what a linear layer is fed)
        return {"shape": (x.numel // dims[-1] if dims[-1] else 0, dims[-1])}
    if kind == "seen":  # the shape of another tensor of the example, its last dim fitted (unflattening)
        seen = [tuple(t) for t in getattr(draw, "shapes", ()) if t and tuple(t) != tuple(dims)]
        fits = [
            (*t[:-1], x.numel // math.prod(t[:-1]))
            for t in seen
            if math.prod(t[:-1]) and not x.numel % math.prod(t[:-1])
        ]
        if fits:  # mostly the highest-rank one: unflattening back to the shape a matrix came from
            fits.sort(key=len, reverse=True)
            return {"shape": fits[0] if draw.boolean(0.7) else draw.choice(fits)}
    if kind in ("any", "same_rank"):  # any factorization: same-rank reshapes that move elements included
        rank = x.rank if kind == "same_rank" else draw.integers(0, 4)
        shape = S.factor_shape(draw, x.numel, rank)
        if shape is not None:
            if shape and x.numel and draw.boolean(0.25):
                i = draw.integers(0, len(shape) - 1)
                shape = (*shape[:i], -1, *shape[i + 1 :])
            return {"shape": shape}
    if kind == "flat" or not dims:
        return {"shape": (x.numel,) if draw.boolean() else (-1,)}
    if kind == "same":
        return {"shape": tuple(dims)}
    if kind == "merge" and len(dims) >= 2:
        i = draw.integers(0, len(dims) - 2)
        return {"shape": (*dims[:i], dims[i] * dims[i + 1], *dims[i + 2 :])}
    if kind == "ones":
        i = draw.integers(0, len(dims))
        return {"shape": (*dims[:i], 1, *dims[i:])}
    i = draw.integers(0, len(dims) - 1)  # split: dim i as two factors (a batch of windows seen as [n, w])
    f = draw.choice([k for k in range(1, dims[i] + 1) if dims[i] % k == 0]) if dims[i] else 1
    return {"shape": (*dims[:i], f, dims[i] // f, *dims[i + 1 :])}


def _draw_flatten(draw, x, attrs):
    n = max(x.rank, 1)
    a, b = sorted((draw.integers(0, n - 1), draw.integers(0, n - 1)))
    return {"start_dim": a, "end_dim": b - n if draw.boolean(0.3) else b}


def _draw_dims(draw, x) -> tuple[int, ...]:
    """One or two distinct dims of x, some negative."""
    dims: list[int] = []
    for _ in range(draw.integers(1, 2)):
        d = S.dim(draw, x.rank)
        if all(d % x.rank != e % x.rank for e in dims):
            dims.append(d)
    return tuple(dims)


def _draw_roll(draw, x, attrs):
    if draw.boolean(0.2):  # no dims: roll the flattened tensor
        return {"shifts": (draw.integers(-5, 5),), "dims": ()}
    dims = _draw_dims(draw, x)
    return {"shifts": tuple(draw.integers(-3, 3) for _ in dims), "dims": dims}


def _draw_squeeze(draw, x, attrs):
    if not x.rank:
        return {"dims": None}
    return {"dims": draw.choice([None, (S.dim(draw, x.rank),), tuple(i for i in range(x.rank) if draw.boolean())])}


def _draw_slice(draw, x, attrs):
    if not x.rank:
        raise S.Reject("slice needs rank >= 1")
    d = S.normalize_dim(attrs["dim"], x.rank) if isinstance(attrs.get("dim"), int) else S.dim(draw, x.rank)
    size = x.shape[d]
    # bounds past either end (clamped) and negative ones (counted from the end) included
    start = draw.integers(-size - 1, size + 1) if draw.boolean(0.6) else None
    end = draw.integers(-size - 1, size + 2) if draw.boolean(0.6) else None
    return {"dim": d, "start": start, "end": end, "step": draw.choice([1, 1, 2, 3])}


def _free_for_reshape(draw, attrs):
    """An operand with as many elements as the fixed ``shape`` (any multiple of the rest with a -1)."""
    shape = attrs.get("shape")
    if not isinstance(shape, tuple) or not all(isinstance(d, int) for d in shape):
        return None
    numel = math.prod(d for d in shape if d != -1) * (draw.integers(1, 3) if -1 in shape else 1)
    return TensorType(S.factor_shape(draw, numel, draw.integers(1 if numel != 1 else 0, 4)), draw.dtype)


def _free_for_dims(draw, attrs):
    """An operand of rank len(dims) for a fixed permutation."""
    dims = attrs.get("dims")
    return S.tensor(draw, len(dims)) if isinstance(dims, tuple) else None


def _free_for_expand(draw, attrs):
    """An operand that expands to the fixed ``size``: its trailing dims, each kept or 1."""
    size = attrs.get("size")
    if not isinstance(size, tuple):
        return None
    keep = size[draw.integers(0, len(size)) :]
    return TensorType(tuple(draw.integers(1, 3) if d == -1 else (d if draw.boolean() else 1) for d in keep), draw.dtype)


def _free_for_unsqueeze(draw, attrs):
    """An operand the fixed ``dim`` fits (``unsqueeze(k, dim=2)`` needs rank >= 2)."""
    dim = attrs.get("dim")
    if not isinstance(dim, int):
        return None
    need = dim if dim >= 0 else -dim - 1
    return S.tensor(draw, draw.rank(min(need, 4), max(need, 4)))


def _draw_expand(draw, x, attrs):
    size = [draw.integers(1, 3) if d == 1 and draw.boolean() else (-1 if draw.boolean(0.2) else d) for d in x.shape]
    lead = [draw.size(1, 3) for _ in range(draw.integers(0, 2))]
    return {"size": (*lead, *size)}


def _draw_pad(draw, x, attrs):
    if not x.rank:
        raise S.Reject("pad needs rank >= 1")
    modes = ["constant"] * 4 + ["reflect", "replicate", "circular"]
    mode = attrs.get("mode") if "mode" in attrs else draw.choice(modes)
    if mode == "constant":
        k = draw.integers(1, min(x.rank, 3))
    else:  # torch pads the last 1-3 dims of a tensor with 1 or 2 more dims in these modes
        if x.rank < 2:
            raise S.Reject(f"{mode} padding needs rank >= 2")
        k = draw.integers(max(1, x.rank - 2), min(x.rank - 1, 3))
    pads = []
    for i in range(k):
        size = x.shape[x.rank - 1 - i]
        hi = size - 1 if mode == "reflect" else size if mode == "circular" else 2
        lo = 0 if mode != "constant" else -1 if size > 2 else 0  # constant mode may crop
        pads += [draw.integers(lo, max(lo, hi)), draw.integers(0, max(0, hi))]
    value = draw.choice([None, 0.0, 1.5, -2.0]) if mode == "constant" else None
    return {"pad": tuple(pads), "mode": mode, "value": value}


def _draw_select(draw, x, attrs):
    d = S.dim(draw, x.rank)
    return {"dim": d, "index": draw.integers(-x.shape[d], x.shape[d] - 1) if x.shape[d] else 0}


def _draw_split(draw, x, attrs):
    d = S.dim(draw, x.rank)
    size, sizes = x.shape[d], []
    while sum(sizes) < size:
        sizes.append(min(draw.integers(1, 3), size - sum(sizes)))
    if not sizes or draw.boolean(0.2):  # a piece of size 0, anywhere
        sizes.insert(draw.integers(0, len(sizes)), 0)
    return {"split_sizes": tuple(sizes), "dim": d}


def _stack_sample(draw, slots, attrs):
    fixed = attrs.get("dim")
    like = S.first_fixed(slots)
    if like is None:
        lo = 0 if fixed is None else (fixed if fixed >= 0 else -fixed - 1)
        like = S.tensor(draw, draw.rank(lo, max(lo, 3)))
    if any(isinstance(s, TensorType) and s.shape != like.shape for s in slots):
        raise S.Reject("stack needs operands of one shape")
    dim = S.dim(draw, like.rank, 1) if fixed is None else fixed
    S.normalize_dim(dim, like.rank + 1)
    return [s if isinstance(s, TensorType) else like for s in slots], {**attrs, "dim": dim}


def _cat_sample(draw, slots, attrs):
    """Operands of one rank that agree except along dim (of any size there, 0 included)."""
    fixed = attrs.get("dim")
    like = S.first_fixed(slots)
    if like is None:
        lo = 1 if fixed is None else (fixed + 1 if fixed >= 0 else -fixed)
        like = S.tensor(draw, draw.rank(lo, max(lo, 3)))
    if like.rank == 0:
        raise S.Reject("cat needs rank >= 1")
    dim = S.dim(draw, like.rank) if fixed is None else fixed
    d = S.normalize_dim(dim, like.rank)
    out = []
    for s in slots:
        if isinstance(s, TensorType):
            if s.rank != like.rank or any(a != b for k, (a, b) in enumerate(zip(s.shape, like.shape)) if k != d):
                raise S.Reject(f"cat operands {like} and {s} differ outside dim {d}")
            out.append(s)
        else:
            shape = list(like.shape)
            shape[d] = draw.integers(0, 3) if draw.boolean(0.1) else draw.integers(1, 3)
            out.append(TensorType(tuple(shape), like.dtype))
    return out, {**attrs, "dim": dim}


SELF = (Operand("self"),)


def _unflatten_args(args, types):
    """``unflatten(self, dim, sizes)`` as the reshape to ``shape[:dim] + sizes + shape[dim + 1:]``."""
    shape = list(types["self"].shape)
    d = _norm_dim(args["dim"], max(len(shape), 1))
    return {"self": args["self"], "shape": [*shape[:d], *args["sizes"], *shape[d + 1 :]]}


# -- views (no data moves; they cost nothing) ----------------------------------------
view_op(
    "reshape",
    SELF,
    lambda self, *, shape: torch.reshape(self, shape),
    sample=unary_sample(_draw_reshape, free=_free_for_reshape),
    attrs=(Attr("shape", "ints"),),
    canonicalize=lambda a, t: {**a, "shape": _resolve_shape(a["shape"], t[0].numel)},
    aten=(
        AtenBinding("aten.view.default", rename={"size": "shape"}),
        "aten.reshape.default",
        AtenBinding("aten._unsafe_view.default", rename={"size": "shape"}),
        AtenBinding("aten.unflatten.int", convert=_unflatten_args),
    ),
    doc="same elements in row-major order, new shape (-1 resolved at creation)",
)
view_op(
    "flatten",
    SELF,
    lambda self, *, start_dim, end_dim: torch.flatten(self, start_dim, end_dim),
    sample=unary_sample(_draw_flatten),
    attrs=(Attr("start_dim", "int", 0), Attr("end_dim", "int", -1)),
    canonicalize=lambda a, t: {
        "start_dim": _norm_dim(a["start_dim"], max(t[0].rank, 1)),
        "end_dim": _norm_dim(a["end_dim"], max(t[0].rank, 1)),
    },
    aten=("aten.flatten.using_ints",),
)
view_op(
    "permute",
    SELF,
    lambda self, *, dims: self.permute(dims),
    attrs=(Attr("dims", "ints"),),
    sample=unary_sample(lambda d, x, a: {"dims": S.permutation(d, x.rank)}, free=_free_for_dims),
    canonicalize=lambda a, t: {"dims": tuple(_norm_dim(d, t[0].rank) for d in a["dims"])},
    aten=("aten.permute.default",),
    doc="output dim i is input dim dims[i]",
)
view_op(
    "transpose",
    SELF,
    lambda self, *, dim0, dim1: self.transpose(dim0, dim1),
    sample=unary_sample(lambda d, x, a: {"dim0": S.dim(d, x.rank), "dim1": S.dim(d, x.rank)}, 1),
    attrs=(Attr("dim0", "int"), Attr("dim1", "int")),
    canonicalize=lambda a, t: {"dim0": _norm_dim(a["dim0"], t[0].rank), "dim1": _norm_dim(a["dim1"], t[0].rank)},
    aten=(
        "aten.transpose.int",
        AtenBinding(
            "aten.t.default", convert=lambda a, t: {**a, "dim0": 0, "dim1": 1} if t["self"].rank == 2 else None
        ),
    ),
)
view_op(
    "expand",
    SELF,
    lambda self, *, size: self.expand(size),
    attrs=(Attr("size", "ints"),),
    sample=unary_sample(_draw_expand, free=_free_for_expand),
    canonicalize=lambda a, t: {
        "size": tuple(t[0].shape[i - (len(a["size"]) - t[0].rank)] if s == -1 else s for i, s in enumerate(a["size"]))
    },
    aten=(AtenBinding("aten.expand.default", fixed={"implicit": False}),),
    doc="broadcast to size (-1 keeps a dim)",
)
view_op(
    "unsqueeze",
    SELF,
    lambda self, *, dim: self.unsqueeze(dim),
    attrs=(Attr("dim", "int"),),
    sample=unary_sample(lambda d, x, a: {"dim": S.dim(d, x.rank, extra=1)}, free=_free_for_unsqueeze),
    canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank + 1)},
    aten=("aten.unsqueeze.default",),
)


def _squeeze_canon(attrs, types):
    shape = types[0].shape
    dims = attrs["dims"]
    if dims is None:
        dims = tuple(i for i, s in enumerate(shape) if s == 1)
    dims = tuple(sorted({_norm_dim(d, max(len(shape), 1)) for d in dims}))
    # squeeze ignores dims that are not 1; canonical form lists only the ones it removes
    return {"dims": tuple(d for d in dims if d < len(shape) and shape[d] == 1)}


view_op(
    "squeeze",
    SELF,
    lambda self, *, dims: self.squeeze(dims) if dims else self.view(self.shape),
    sample=unary_sample(_draw_squeeze),
    attrs=(Attr("dims", "ints?", None),),
    canonicalize=_squeeze_canon,
    aten=(
        AtenBinding("aten.squeeze.dims", rename={"dim": "dims"}),
        AtenBinding("aten.squeeze.dim", convert=lambda a, t: {"self": a["self"], "dims": [a["dim"]]}),
        "aten.squeeze.default",
    ),
    doc="drop size-1 dims (canonical: exactly the dims removed)",
)
view_op(
    "select",
    SELF,
    lambda self, *, dim, index: self.select(dim, index),
    sample=unary_sample(_draw_select, 1),
    attrs=(Attr("dim", "int"), Attr("index", "int")),
    canonicalize=lambda a, t: {
        "dim": _norm_dim(a["dim"], t[0].rank),
        "index": _norm_dim(a["index"], t[0].shape[_norm_dim(a["dim"], t[0].rank)]),
    },
    aten=("aten.select.int",),
)


def _slice_canon(attrs, types):
    dim = _norm_dim(attrs["dim"], types[0].rank)
    size = types[0].shape[dim]
    if has_symbols((size, attrs["start"], attrs["end"])):
        return {"dim": dim, **_symbolic_bounds(attrs["start"], attrs["end"], size), "step": attrs["step"]}
    start, end, _ = slice(attrs["start"], attrs["end"], 1).indices(size)
    return {"dim": dim, "start": start, "end": max(end, start), "step": attrs["step"]}


def _symbolic_bounds(start, end, size) -> dict:
    """Slice bounds clamped to ``0 <= start <= end <= size`` when symbols are involved: each clamp must be
    decided for every value of the symbols in range (``x[:, :seq]`` of a longer buffer), else ValueError."""

    def clamp(b, default):
        if b is None:
            return default
        if prove(b, "<", 0) is not None and prove(b, ">=", 0) is not True:
            raise ValueError(f"slice bound {b} may be negative")
        if prove(b, "<=", size):
            return b
        if prove(b, ">=", size):
            return size
        raise ValueError(f"slice bound {b} may exceed the size {size} or not")

    lo, hi = clamp(start, 0), clamp(end, size)
    if prove(hi, ">=", lo):
        return {"start": lo, "end": hi}
    raise ValueError(f"slice [{lo}:{hi}] may be empty or not")


def _slice(self, *, dim, start, end, step):
    return torch.ops.aten.slice.Tensor(self, dim, start, end, step)


view_op(
    "slice",
    SELF,
    _slice,
    sample=unary_sample(_draw_slice, 1),
    attrs=(Attr("dim", "int", 0), Attr("start", "int?", None), Attr("end", "int?", None), Attr("step", "int", 1)),
    canonicalize=_slice_canon,
    aten=("aten.slice.Tensor",),
    doc="self[start:end:step] along dim (bounds clamped at creation)",
)
view_op(
    "alias",
    SELF,
    lambda self: self.view(self.shape),
    aten=("aten.alias.default", "aten.detach.default"),
    sample=unary_sample(),
    doc="the same tensor",
)

# -- data movement ----------------------------------------------------------------------
_MEMORY_FORMATS = {Layout.contiguous: torch.contiguous_format, Layout.channels_last: torch.channels_last}


def _to_layout(self, *, layout):
    if self is None:
        raise TypeError("to_layout needs a tensor")
    return self.contiguous(memory_format=_MEMORY_FORMATS[Layout(layout)])


def _layout_from_aten(args, types):
    """``clone``/``contiguous`` into channels-last (other memory formats are ``clone``)."""
    if args.pop("memory_format", None) is not torch.channels_last:
        return None
    return {**args, "layout": "channels_last"}


def _to_layout_infer(ins, attrs):
    x, layout = ins[0], Layout(attrs["layout"])
    if x is None:
        raise TypeError("to_layout needs a tensor")
    if layout is Layout.channels_last and x.rank != 4:
        raise ValueError(f"channels_last needs a 4-D tensor, this one has rank {x.rank}")
    return [TensorType(x.shape, x.dtype, layout)]


def _draw_layout(draw, x, attrs):
    return {"layout": draw.choice(["channels_last", "contiguous"]) if x.rank == 4 else "contiguous"}


def _free_for_layout(draw, attrs):
    """channels_last needs a 4-D operand."""
    return S.tensor(draw, 4) if attrs.get("layout") == "channels_last" else None


move_op(
    "to_layout",
    SELF,
    _to_layout,
    traits=("converts_layout",),
    aten=(
        AtenBinding("aten.clone.default", convert=_layout_from_aten),
        AtenBinding("aten.contiguous.default", convert=_layout_from_aten),
    ),
    infer=_to_layout_infer,
    sample=unary_sample(_draw_layout, free=_free_for_layout),
    attrs=(Attr("layout", "str"),),
    doc='the same values stored in another memory layout ("contiguous", or "channels_last" for a 4-D tensor)',
)
move_op(
    "clone",
    SELF,
    lambda self: self.clone(),
    sample=unary_sample(),
    aten=(
        AtenBinding("aten.clone.default", drop=frozenset({"memory_format"})),
        "aten.lift_fresh_copy.default",
        AtenBinding("aten.contiguous.default", drop=frozenset({"memory_format"})),
    ),
    doc="a copy with the same values",
)


def _legacy_empty(arg) -> bool:
    """An operand torch.cat skips: a 1-D tensor with no elements (``torch.empty(0)``), beside operands of any rank."""
    val = getattr(arg, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 1 and isinstance(val.shape[0], int) and val.shape[0] == 0


def _cat_without_legacy_empty(args, _types):
    """torch.cat ignores 1-D empty operands whatever the others' rank (Hugging Face's attention concatenates
    onto an empty cache). gawee's ``cat`` takes operands of one rank: those are dropped (one is kept when
    they are all there is)."""
    kept = [t for t in args["tensors"] if not _legacy_empty(t)]
    if kept and len(kept) < len(args["tensors"]):
        args["tensors"] = kept
    return args


move_op(
    "cat",
    (Operand("tensors", variadic=True),),
    lambda *tensors, dim: torch.cat(tensors, dim),
    sample=_cat_sample,
    attrs=(Attr("dim", "int", 0),),
    canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], next(x for x in t if x is not None).rank)},
    aten=(AtenBinding("aten.cat.default", convert=_cat_without_legacy_empty),),
)
move_op(
    "stack",
    (Operand("tensors", variadic=True),),
    lambda *tensors, dim: torch.stack(tensors, dim),
    sample=_stack_sample,
    attrs=(Attr("dim", "int", 0),),
    canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank + 1)},
    aten=("aten.stack.default",),
)


def _split_sizes(args, types):
    size = types["self"].shape[_norm_dim(args.get("dim", 0), types["self"].rank)]
    if "split_size" in args:
        step = args.pop("split_size")
        args["split_sizes"] = [min(step, size - i) for i in range(0, size, step)] if step else [0]
    elif "chunks" in args:
        step = -(-size // args.pop("chunks"))
        args["split_sizes"] = [min(step, size - i) for i in range(0, size, step)]
    return args


move_op(
    "split",
    SELF,
    lambda self, *, split_sizes, dim: torch.split(self, list(split_sizes), dim),
    sample=unary_sample(_draw_split, 1),
    attrs=(Attr("split_sizes", "ints"), Attr("dim", "int", 0)),
    traits=("multi_output",),
    canonicalize=lambda a, t: {**a, "dim": _norm_dim(a["dim"], t[0].rank)},
    aten=(
        "aten.split_with_sizes.default",
        AtenBinding("aten.split.Tensor", convert=_split_sizes),
        AtenBinding("aten.chunk.default", convert=_split_sizes),
    ),
    doc="consecutive pieces along dim, one output each",
)
move_op(
    "unbind",
    SELF,
    lambda self, *, dim: torch.unbind(self, dim),
    attrs=(Attr("dim", "int", 0),),
    traits=("multi_output",),
    canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank)},
    aten=("aten.unbind.int",),
    doc="one output per index along dim",
)


def _pad_shape(types, attrs):
    """Size i grows by its two pads; a non-constant mode reads the input, so it pads no symbolic size."""
    x, pad = types[0], attrs["pad"]
    shape = list(x.shape)
    for i in range(len(pad) // 2):  # (before, after) pairs from the last dim backwards
        d, lo, hi = x.rank - 1 - i, pad[2 * i], pad[2 * i + 1]
        if (lo or hi) and attrs["mode"] != "constant" and has_symbols(shape[d]):
            raise ValueError(f"{attrs['mode']} padding of size {shape[d]} holds only for some of its values")
        shape[d] = shape[d] + lo + hi
    return [tuple(shape)]


def _pad_args(args, types):
    if "mode" not in args:  # constant_pad_nd
        args["mode"] = "constant"
    return args


move_op(
    "pad",
    SELF,
    lambda self, *, pad, mode, value: F.pad(self, pad, mode, value if mode == "constant" else None),
    attrs=(Attr("pad", "ints"), Attr("mode", "str", "constant"), Attr("value", "float?", None)),
    canonicalize=lambda a, t: {**a, "value": (a["value"] or 0.0) if a["mode"] == "constant" else None},
    shape_formula=_pad_shape,
    aten=(
        AtenBinding("aten.pad.default", convert=_pad_args),
        AtenBinding("aten.constant_pad_nd.default", convert=_pad_args),
    ),
    sample=unary_sample(_draw_pad, 1),
    doc="F.pad: pairs (before, after) from the last dim backwards",
)
move_op(
    "roll",
    SELF,
    lambda self, *, shifts, dims: torch.roll(self, shifts, dims),
    sample=unary_sample(_draw_roll, 1),
    attrs=(Attr("shifts", "ints"), Attr("dims", "ints", ())),
    aten=("aten.roll.default",),
)
move_op(
    "flip",
    SELF,
    lambda self, *, dims: torch.flip(self, dims),
    attrs=(Attr("dims", "ints"),),
    sample=unary_sample(lambda d, x, a: {"dims": _draw_dims(d, x)}, 1),
    aten=("aten.flip.default",),
)
move_op(
    "repeat",
    SELF,
    lambda self, *, repeats: self.repeat(repeats),
    attrs=(Attr("repeats", "ints"),),
    aten=("aten.repeat.default",),
)
move_op(
    "index",
    (Operand("self"), Operand("indices", optional=True, variadic=True)),
    lambda self, *indices: torch.ops.aten.index.Tensor(self, list(indices)),
    aten=("aten.index.Tensor",),
    doc="advanced indexing self[i0, i1, ...]; absent indices take a whole dim",
)


def _index_select_sample(draw, slots, attrs):
    x = S.indexed(draw, slots)
    if not x.rank:
        raise S.Reject("index_select needs a dim")
    index = slots[1] if isinstance(slots[1], TensorType) else S.indices(draw, draw.integers(0, 1))
    return [x, index], {"dim": S.dim(draw, x.rank), **attrs}


def _gather_sample(draw, slots, attrs):
    """An index of self's rank, no larger than self off ``dim``."""
    x = S.indexed(draw, slots)
    if not x.rank:
        raise S.Reject("gather needs a dim")
    dim = attrs.get("dim", S.dim(draw, x.rank))
    d = dim % x.rank
    shape = tuple(draw.integers(1, 4) if i == d else draw.integers(1, max(1, n)) for i, n in enumerate(x.shape))
    index = slots[1] if isinstance(slots[1], TensorType) else TensorType(shape, DType.i64)
    return [x, index], {**attrs, "dim": dim}


move_op(
    "index_select",
    (Operand("self"), Operand("index", domain="nonnegative")),
    lambda self, index, *, dim: torch.index_select(self, dim, index),
    attrs=(Attr("dim", "int"),),
    sample=_index_select_sample,
    aten=("aten.index_select.default",),
)
move_op(
    "gather",
    (Operand("self"), Operand("index", domain="nonnegative")),
    lambda self, index, *, dim: torch.gather(self, dim, index),
    attrs=(Attr("dim", "int"),),
    sample=_gather_sample,
    aten=(AtenBinding("aten.gather.default", fixed={"sparse_grad": False}),),
)

# -- functional forms of in-place writes (what functionalization leaves) ---------------
move_op(
    "copy",
    (Operand("self"), Operand("src")),
    lambda self, src: src.to(self.dtype).expand(self.shape).clone(),
    aten=(AtenBinding("aten.copy.default", drop=frozenset({"non_blocking"})),),
    doc="src broadcast to self's shape and cast to its dtype (self's values are not read)",
)
move_op(
    "slice_scatter",
    (Operand("self"), Operand("src")),
    lambda self, src, *, dim, start, end, step: torch.slice_scatter(self, src, dim, start, end, step),
    attrs=(Attr("dim", "int", 0), Attr("start", "int?", None), Attr("end", "int?", None), Attr("step", "int", 1)),
    canonicalize=_slice_canon,
    aten=("aten.slice_scatter.default",),
    doc="self with self[start:end:step] along dim replaced by src",
)


def _select_scatter_sample(draw, slots, attrs):
    """self, and src of its shape without ``dim``."""
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.rank(1, 3))
    if not x.rank or has_symbols(x.shape):
        raise S.Reject("select_scatter needs a dim of known size")
    dim = attrs.get("dim", S.dim(draw, x.rank))
    d = dim % x.rank
    if not x.shape[d]:
        raise S.Reject("select_scatter needs an index into dim, which has size 0")
    src = TensorType(x.shape[:d] + x.shape[d + 1 :], x.dtype)
    index = attrs["index"] if "index" in attrs else draw.integers(-x.shape[d], x.shape[d] - 1)
    return [x, slots[1] if isinstance(slots[1], TensorType) else src], {"dim": dim, "index": index}


move_op(
    "select_scatter",
    (Operand("self"), Operand("src")),
    lambda self, src, *, dim, index: torch.select_scatter(self, src, dim, index),
    attrs=(Attr("dim", "int"), Attr("index", "int")),
    sample=_select_scatter_sample,
    aten=("aten.select_scatter.default",),
)
move_op(
    "index_put",
    (Operand("self"), Operand("values"), Operand("indices", optional=True, variadic=True)),
    lambda self, values, *indices, accumulate: torch.ops.aten.index_put(self, list(indices), values, accumulate),
    attrs=(Attr("accumulate", "bool", False),),
    aten=("aten.index_put.default",),
)
