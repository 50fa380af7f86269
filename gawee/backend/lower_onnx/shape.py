"""ONNX lowerings of the shape ops (gawee.ops.shape): views, copies into new arrangements, indexing, scatters."""

from __future__ import annotations

import math

import torch

from gawee.backend.lower_onnx import ONNX
from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType


@ONNX.register("reshape", "flatten", "unsqueeze", "squeeze")
def _reshape_onnx(c):
    """Any view that keeps the element order is a Reshape to the (static) output shape."""
    shape = c.out.shape
    return c.emit("Reshape", c.x(0), c.ints(shape), allowzero=1 if 0 in shape else None)


@ONNX.register("pad")
def _pad_onnx(c):
    rank, pad = c.type(0).rank, c.attrs["pad"]
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # F.pad lists (before, after) pairs from the last dim backwards
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[c.attrs["mode"]]
    value = c.scalar(c.attrs["value"], c.out.dtype) if mode == "constant" else ""
    return c.emit("Pad", c.x(0), c.ints(begins + ends), value, mode=mode)


@ONNX.register("unbind")
def _unbind_onnx(c):
    dim, n = c.attrs["dim"], c.type(0).shape[c.attrs["dim"]]
    pieces = c.emit_multi("Split", [c.x(0), c.ints([1] * n)], n, axis=dim)
    return [c.emit("Squeeze", piece, c.ints([dim])) for piece in pieces]


@ONNX.register("repeat")
def _repeat_onnx(c):
    repeats, x = c.attrs["repeats"], c.x(0)
    if len(repeats) > c.type(0).rank:  # repeat adds leading dims first
        x = c.emit("Reshape", x, c.ints((1,) * (len(repeats) - c.type(0).rank) + c.type(0).shape))
    return c.emit("Tile", x, c.ints(repeats))


@ONNX.register("roll")
def _roll_onnx(c):
    """torch.roll: per dim, the last ``shift`` entries then the rest (two Slices and a Concat); no dims
    rolls the flattened tensor."""
    x, t, shifts, dims = c.x(0), c.type(0), c.attrs["shifts"], c.attrs["dims"]
    if has_symbols(t.shape):
        c.fail("a symbolic size (the split point depends on it)")
    if not dims:
        zero = 1 if 0 in t.shape else None
        flat = c.emit("Reshape", x, c.ints([math.prod(t.shape)]), allowzero=zero)
        rolled = _roll_onnx_dim(c, flat, shifts[0], 0, math.prod(t.shape))
        return c.emit("Reshape", rolled, c.ints(t.shape), allowzero=zero)
    for shift, d in zip(shifts, dims):
        x = _roll_onnx_dim(c, x, shift, d % t.rank, t.shape[d % t.rank])
    return x


def _roll_onnx_dim(c, x: str, shift: int, d: int, n: int) -> str:
    s = shift % n if n else 0
    if not s:
        return x
    tail = c.emit("Slice", x, c.ints([n - s]), c.ints([n]), c.ints([d]))
    head = c.emit("Slice", x, c.ints([0]), c.ints([n - s]), c.ints([d]))
    return c.emit("Concat", tail, head, axis=d)


@ONNX.register("index")
def _index_onnx(c):
    """Advanced indexing with adjacent index tensors, as in :func:`_index_mlir`: the indexed dims merged
    into one (Reshape), the broadcast indices linearized with negative ones wrapped, one Gather."""
    t = c.type(0)
    pos = [i for i in range(1, c.arity) if c.type(i) is not None]
    if not pos:
        return c.emit("Identity", c.x(0))
    dims = [p - 1 for p in pos]
    if dims != list(range(dims[0], dims[-1] + 1)) or any(c.type(p).dtype is DType.bool for p in pos):
        c.fail("boolean masks or index tensors separated by a slice")
    d0, d1 = dims[0], dims[-1] + 1
    if has_symbols(t.shape[d0:d1]) or any(has_symbols(c.type(p).shape) for p in pos):
        c.fail("a symbolic size in an indexed dim or an index")
    shape = tuple(torch.broadcast_shapes(*(c.type(p).shape for p in pos)))
    flat = None
    for p in pos:
        n = c.scalar(t.shape[p - 1], DType.i64)
        v = c.x_as(p, DType.i64)
        v = c.emit("Where", c.emit("Less", v, c.scalar(0, DType.i64)), c.emit("Add", v, n), v)
        v = c.emit("Expand", v, c.ints(shape))
        flat = v if flat is None else c.emit("Add", c.emit("Mul", flat, n), v)
    merged_shape = (*t.shape[:d0], math.prod(t.shape[d0:d1]), *t.shape[d1:])
    merged = c.emit("Reshape", c.x(0), c.ints(merged_shape), allowzero=1 if 0 in merged_shape else None)
    return c.emit("Gather", merged, flat, axis=d0)


def _slice_scatter_onnx(c, src: str, src_shape: tuple, dim: int, start: int, step: int) -> str:
    """``src`` (of ``src_shape``, in the output's dtype) written over x[start::step] along ``dim``: with step 1 the
    parts of x before and after it concatenated around it; else ScatterElements at start, start + step, ..."""
    if has_symbols(src_shape) or has_symbols(c.out.shape):
        c.fail("a scatter of a symbolic shape")
    k = src_shape[dim]
    if not k:
        return c.emit("Identity", c.x(0))
    if step == 1:
        axis, parts = c.ints([dim]), []
        if start:
            parts.append(c.emit("Slice", c.x(0), c.ints([0]), c.ints([start]), axis))
        parts.append(src)
        if start + k < c.out.shape[dim]:
            parts.append(c.emit("Slice", c.x(0), c.ints([start + k]), c.ints([c.out.shape[dim]]), axis))
        return c.emit("Concat", *parts, axis=dim) if len(parts) > 1 else c.emit("Identity", src)
    shape = [1] * len(src_shape)
    shape[dim] = k
    index = torch.arange(start, start + step * k, step, dtype=torch.int64).reshape(shape).expand(src_shape)
    return c.emit("ScatterElements", c.x(0), c.constant(index.contiguous()), src, axis=dim)


@ONNX.register("select_scatter")
def _select_scatter_onnx(c):
    d = c.attrs["dim"] % c.out.rank
    src = c.emit("Unsqueeze", c.x_as(1, c.out.dtype), c.ints([d]))
    shape = (*c.out.shape[:d], 1, *c.out.shape[d + 1 :])
    return _slice_scatter_onnx(c, src, shape, d, c.attrs["index"] % c.out.shape[d], 1)


ONNX.add(
    "permute",
    lambda c: (
        c.emit("Transpose", c.x(0), perm=list(c.attrs["dims"])) if c.attrs["dims"] else c.emit("Identity", c.x(0))
    ),
)
ONNX.add(
    "transpose",
    lambda c: c.emit(
        "Transpose",
        c.x(0),
        perm=[
            {c.attrs["dim0"]: c.attrs["dim1"], c.attrs["dim1"]: c.attrs["dim0"]}.get(i, i) for i in range(c.out.rank)
        ],
    ),
)
ONNX.add("expand", lambda c: c.emit("Expand", c.x(0), c.ints(c.out.shape)))
ONNX.add("select", lambda c: c.emit("Gather", c.x(0), c.constant(torch.tensor(c.attrs["index"])), axis=c.attrs["dim"]))
ONNX.add("slice", lambda c: c.emit("Slice", c.x(0), *(c.ints([c.attrs[k]]) for k in ("start", "end", "dim", "step"))))
ONNX.add("alias", "Identity")
ONNX.add("to_layout", "Identity")
ONNX.add("clone", "Identity")
ONNX.add("cat", lambda c: c.emit("Concat", *(c.x_as(i, c.out.dtype) for i in range(c.arity)), axis=c.attrs["dim"]))
ONNX.add(
    "stack",
    lambda c: c.emit(
        "Concat",
        *(c.emit("Unsqueeze", c.x_as(i, c.out.dtype), c.ints([c.attrs["dim"]])) for i in range(c.arity)),
        axis=c.attrs["dim"],
    ),
)
ONNX.add(
    "split",
    lambda c: c.emit_multi(
        "Split", [c.x(0), c.ints(c.attrs["split_sizes"])], len(c.attrs["split_sizes"]), axis=c.attrs["dim"]
    ),
)
ONNX.add(
    "flip",
    lambda c: c.emit(
        "Slice",
        c.x(0),
        c.ints([-1] * len(c.attrs["dims"])),
        c.ints([-(2**63)] * len(c.attrs["dims"])),
        c.ints(c.attrs["dims"]),
        c.ints([-1] * len(c.attrs["dims"])),
    ),
)
ONNX.add(
    "index_select",
    lambda c: c.emit(  # a 0-d index selects as a 1-element one (ONNX's Gather would drop the dim)
        "Gather", c.x(0), c.x(1) if c.type(1).rank else c.emit("Reshape", c.x(1), c.ints([1])), axis=c.attrs["dim"]
    ),
)
ONNX.add("gather", lambda c: c.emit("GatherElements", c.x(0), c.x(1), axis=c.attrs["dim"]))
ONNX.add("copy", lambda c: c.emit("Expand", c.x_as(1, c.out.dtype), c.ints(list(c.out.shape))))
ONNX.add(
    "slice_scatter",
    lambda c: _slice_scatter_onnx(
        c, c.x_as(1, c.out.dtype), c.type(1).shape, c.attrs["dim"] % c.out.rank, c.attrs["start"], c.attrs["step"]
    ),
)
