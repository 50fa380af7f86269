"""ONNX lowerings of the reductions, scans, sorts and triangles (gawee.ops.reduce)."""

from __future__ import annotations

import math

import torch

from gawee.backend.lower_onnx import ONNX
from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType


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


@ONNX.register("linalg_vector_norm")
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


ONNX.add("sum", _reduce_onnx("ReduceSum"))
ONNX.add("mean", _reduce_onnx("ReduceMean"))
ONNX.add("amax", _reduce_onnx("ReduceMax"))
ONNX.add("amin", _reduce_onnx("ReduceMin"))
ONNX.add("prod", lambda c: c.emit("ReduceProd", c.x_as(0, c.out.dtype), _axes(c), keepdims=int(c.attrs["keepdim"])))
ONNX.add("any", _truth_reduce_onnx("ReduceMax"))
ONNX.add("all", _truth_reduce_onnx("ReduceMin"))
ONNX.add("var", _var_onnx(False))
ONNX.add("std", _var_onnx(True))
ONNX.add("logsumexp", _reduce_onnx("ReduceLogSumExp"))
ONNX.add("argmax", lambda c: _arg_onnx(c, "ArgMax"))
ONNX.add("argmin", lambda c: _arg_onnx(c, "ArgMin"))
ONNX.add("max_dim", lambda c: _max_dim_onnx(c, True))
ONNX.add("min_dim", lambda c: _max_dim_onnx(c, False))
ONNX.add("max", lambda c: c.emit("ReduceMax", c.x(0), keepdims=0))
ONNX.add("min", lambda c: c.emit("ReduceMin", c.x(0), keepdims=0))
ONNX.add(
    "cumsum",
    lambda c: c.on_vector(
        lambda x: c.emit(
            "CumSum",
            x if c.type(0).dtype is c.out.dtype else c.cast(x, c.out.dtype),
            c.constant(torch.tensor(c.attrs["dim"])),
        )
    ),
)
ONNX.add("topk", lambda c: _topk_onnx(c, c.attrs["k"], c.attrs["dim"], c.attrs["largest"]))
ONNX.add("sort", lambda c: _topk_onnx(c, None, c.attrs["dim"], c.attrs["descending"]))
ONNX.add("tril", lambda c: c.emit("Trilu", c.x(0), c.constant(torch.tensor(c.attrs["diagonal"])), upper=0))
ONNX.add("triu", lambda c: c.emit("Trilu", c.x(0), c.constant(torch.tensor(c.attrs["diagonal"])), upper=1))
