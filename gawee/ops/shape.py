"""Shape and data-movement ops: views, reshapes, concatenation, splitting, indexing, padding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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


def view_op(name, operands, fn, attrs=(), canonicalize=None, aten=(), doc="") -> OpDef:
    return register(OpDef(name, operands, fn, attrs=attrs, traits=VIEW, flops=zero_flops,
                          bytes_accessed=_view_bytes, canonicalize=canonicalize, aten=aten, doc=doc))


def move_op(name, operands, fn, attrs=(), canonicalize=None, aten=(), doc="") -> OpDef:
    return register(OpDef(name, operands, fn, attrs=attrs, traits=MOVE, flops=zero_flops,
                          canonicalize=canonicalize, aten=aten, doc=doc))


SELF = (Operand("self"),)

# -- views (no data moves; they cost nothing) ----------------------------------------
view_op("reshape", SELF, lambda self, *, shape: torch.reshape(self, shape),
        attrs=(Attr("shape", "ints"),),
        canonicalize=lambda a, t: {**a, "shape": _resolve_shape(a["shape"], t[0].numel)},
        aten=(AtenBinding("aten.view.default", rename={"size": "shape"}), "aten.reshape.default",
              AtenBinding("aten._unsafe_view.default", rename={"size": "shape"})),
        doc="same elements in row-major order, new shape (-1 resolved at creation)")
view_op("flatten", SELF, lambda self, *, start_dim, end_dim: torch.flatten(self, start_dim, end_dim),
        attrs=(Attr("start_dim", "int", 0), Attr("end_dim", "int", -1)),
        canonicalize=lambda a, t: {"start_dim": _norm_dim(a["start_dim"], max(t[0].rank, 1)),
                                   "end_dim": _norm_dim(a["end_dim"], max(t[0].rank, 1))},
        aten=("aten.flatten.using_ints",))
view_op("permute", SELF, lambda self, *, dims: self.permute(dims), attrs=(Attr("dims", "ints"),),
        canonicalize=lambda a, t: {"dims": tuple(_norm_dim(d, t[0].rank) for d in a["dims"])},
        aten=("aten.permute.default",), doc="output dim i is input dim dims[i]")
view_op("transpose", SELF, lambda self, *, dim0, dim1: self.transpose(dim0, dim1),
        attrs=(Attr("dim0", "int"), Attr("dim1", "int")),
        canonicalize=lambda a, t: {"dim0": _norm_dim(a["dim0"], t[0].rank), "dim1": _norm_dim(a["dim1"], t[0].rank)},
        aten=("aten.transpose.int",
              AtenBinding("aten.t.default",
                          convert=lambda a, t: {**a, "dim0": 0, "dim1": 1} if t["self"].rank == 2 else None)))
view_op("expand", SELF, lambda self, *, size: self.expand(size), attrs=(Attr("size", "ints"),),
        canonicalize=lambda a, t: {"size": tuple(
            t[0].shape[i - (len(a["size"]) - t[0].rank)] if s == -1 else s for i, s in enumerate(a["size"]))},
        aten=(AtenBinding("aten.expand.default", fixed={"implicit": False}),),
        doc="broadcast to size (-1 keeps a dim)")
view_op("unsqueeze", SELF, lambda self, *, dim: self.unsqueeze(dim), attrs=(Attr("dim", "int"),),
        canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank + 1)},
        aten=("aten.unsqueeze.default",))


def _squeeze_canon(attrs, types):
    shape = types[0].shape
    dims = attrs["dims"]
    if dims is None:
        dims = tuple(i for i, s in enumerate(shape) if s == 1)
    dims = tuple(sorted({_norm_dim(d, max(len(shape), 1)) for d in dims}))
    # squeeze ignores dims that are not 1; canonical form lists only the ones it removes
    return {"dims": tuple(d for d in dims if d < len(shape) and shape[d] == 1)}


view_op("squeeze", SELF, lambda self, *, dims: self.squeeze(dims) if dims else self.view(self.shape),
        attrs=(Attr("dims", "ints?", None),), canonicalize=_squeeze_canon,
        aten=(AtenBinding("aten.squeeze.dims", rename={"dim": "dims"}),
              AtenBinding("aten.squeeze.dim", convert=lambda a, t: {"self": a["self"], "dims": [a["dim"]]}),
              "aten.squeeze.default"),
        doc="drop size-1 dims (canonical: exactly the dims removed)")
view_op("select", SELF, lambda self, *, dim, index: self.select(dim, index),
        attrs=(Attr("dim", "int"), Attr("index", "int")),
        canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank),
                                   "index": _norm_dim(a["index"], t[0].shape[_norm_dim(a["dim"], t[0].rank)])},
        aten=("aten.select.int",))


def _slice_canon(attrs, types):
    dim = _norm_dim(attrs["dim"], types[0].rank)
    size = types[0].shape[dim]
    start, end, _ = slice(attrs["start"], attrs["end"], 1).indices(size)
    return {"dim": dim, "start": start, "end": max(end, start), "step": attrs["step"]}


def _slice(self, *, dim, start, end, step):
    return torch.ops.aten.slice.Tensor(self, dim, start, end, step)


view_op("slice", SELF, _slice,
        attrs=(Attr("dim", "int", 0), Attr("start", "int?", None), Attr("end", "int?", None), Attr("step", "int", 1)),
        canonicalize=_slice_canon, aten=("aten.slice.Tensor",),
        doc="self[start:end:step] along dim (bounds clamped at creation)")
view_op("alias", SELF, lambda self: self.view(self.shape), aten=("aten.alias.default", "aten.detach.default"),
        doc="the same tensor")

# -- data movement ----------------------------------------------------------------------
move_op("clone", SELF, lambda self: self.clone(),
        aten=(AtenBinding("aten.clone.default", drop=frozenset({"memory_format"})),
              "aten.lift_fresh_copy.default",
              AtenBinding("aten.contiguous.default", drop=frozenset({"memory_format"}))),
        doc="a copy with the same values")
move_op("cat", (Operand("tensors", variadic=True),), lambda *tensors, dim: torch.cat(tensors, dim),
        attrs=(Attr("dim", "int", 0),),
        canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], next(x for x in t if x is not None).rank)},
        aten=("aten.cat.default",))
move_op("stack", (Operand("tensors", variadic=True),), lambda *tensors, dim: torch.stack(tensors, dim),
        attrs=(Attr("dim", "int", 0),),
        canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank + 1)}, aten=("aten.stack.default",))


def _split_sizes(args, types):
    size = types["self"].shape[_norm_dim(args.get("dim", 0), types["self"].rank)]
    if "split_size" in args:
        step = args.pop("split_size")
        args["split_sizes"] = [min(step, size - i) for i in range(0, size, step)] if step else [0]
    elif "chunks" in args:
        step = -(-size // args.pop("chunks"))
        args["split_sizes"] = [min(step, size - i) for i in range(0, size, step)]
    return args


move_op("split", SELF, lambda self, *, split_sizes, dim: torch.split(self, list(split_sizes), dim),
        attrs=(Attr("split_sizes", "ints"), Attr("dim", "int", 0)),
        canonicalize=lambda a, t: {**a, "dim": _norm_dim(a["dim"], t[0].rank)},
        aten=("aten.split_with_sizes.default", AtenBinding("aten.split.Tensor", convert=_split_sizes),
              AtenBinding("aten.chunk.default", convert=_split_sizes)),
        doc="consecutive pieces along dim, one output each")
move_op("unbind", SELF, lambda self, *, dim: torch.unbind(self, dim), attrs=(Attr("dim", "int", 0),),
        canonicalize=lambda a, t: {"dim": _norm_dim(a["dim"], t[0].rank)},
        aten=("aten.unbind.int",), doc="one output per index along dim")


def _pad_args(args, types):
    if "mode" not in args:  # constant_pad_nd
        args["mode"] = "constant"
    return args


move_op("pad", SELF,
        lambda self, *, pad, mode, value: F.pad(self, pad, mode, value if mode == "constant" else None),
        attrs=(Attr("pad", "ints"), Attr("mode", "str", "constant"), Attr("value", "float?", None)),
        canonicalize=lambda a, t: {**a, "value": (a["value"] or 0.0) if a["mode"] == "constant" else None},
        aten=(AtenBinding("aten.pad.default", convert=_pad_args),
              AtenBinding("aten.constant_pad_nd.default", convert=_pad_args)),
        doc="F.pad: pairs (before, after) from the last dim backwards")
move_op("roll", SELF, lambda self, *, shifts, dims: torch.roll(self, shifts, dims),
        attrs=(Attr("shifts", "ints"), Attr("dims", "ints", ())), aten=("aten.roll.default",))
move_op("flip", SELF, lambda self, *, dims: torch.flip(self, dims), attrs=(Attr("dims", "ints"),),
        aten=("aten.flip.default",))
move_op("repeat", SELF, lambda self, *, repeats: self.repeat(repeats), attrs=(Attr("repeats", "ints"),),
        aten=("aten.repeat.default",))
move_op("index", (Operand("self"), Operand("indices", optional=True, variadic=True)),
        lambda self, *indices: torch.ops.aten.index.Tensor(self, list(indices)),
        aten=("aten.index.Tensor",), doc="advanced indexing self[i0, i1, ...]; absent indices take a whole dim")
move_op("index_select", (Operand("self"), Operand("index")),
        lambda self, index, *, dim: torch.index_select(self, dim, index), attrs=(Attr("dim", "int"),),
        aten=("aten.index_select.default",))
move_op("gather", (Operand("self"), Operand("index")),
        lambda self, index, *, dim: torch.gather(self, dim, index), attrs=(Attr("dim", "int"),),
        aten=(AtenBinding("aten.gather.default", fixed={"sparse_grad": False}),))

# -- functional forms of in-place writes (what functionalization leaves) ---------------
move_op("copy", (Operand("self"), Operand("src")),
        lambda self, src: src.to(self.dtype).expand(self.shape).clone(),
        aten=(AtenBinding("aten.copy.default", drop=frozenset({"non_blocking"})),),
        doc="src broadcast to self's shape and cast to its dtype (self's values are not read)")
move_op("slice_scatter", (Operand("self"), Operand("src")),
        lambda self, src, *, dim, start, end, step: torch.slice_scatter(self, src, dim, start, end, step),
        attrs=(Attr("dim", "int", 0), Attr("start", "int?", None), Attr("end", "int?", None), Attr("step", "int", 1)),
        canonicalize=_slice_canon, aten=("aten.slice_scatter.default",),
        doc="self with self[start:end:step] along dim replaced by src")
move_op("select_scatter", (Operand("self"), Operand("src")),
        lambda self, src, *, dim, index: torch.select_scatter(self, src, dim, index),
        attrs=(Attr("dim", "int"), Attr("index", "int")), aten=("aten.select_scatter.default",))
move_op("index_put", (Operand("self"), Operand("values"), Operand("indices", optional=True, variadic=True)),
        lambda self, values, *indices, accumulate: torch.index_put(self, list(indices), values, accumulate),
        attrs=(Attr("accumulate", "bool", False),), aten=("aten.index_put.default",))
