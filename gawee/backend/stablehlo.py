"""to_mlir: a Graph as an MLIR module in the StableHLO dialect.

Each node lowers through the MLIR target's lowering table (:data:`gawee.backend.lower_mlir.MLIR`): an entry is
a StableHLO (or CHLO) op name for an op that maps one to one onto it (operands broadcast to the result's shape
and converted to its element type), or a function of an :class:`MlirLowering` that emits the op's composition.
Fused gawee ops lower to their parts (``conv2d(..., residual=r, act=a)`` is a ``stablehlo.convolution``, an
``add``, the activation's ops): IREE's dispatch formation fuses them again. Constants become ``dense_resource``
blobs in the module's ``dialect_resources`` section (small ones are hex ``dense`` literals), never giant decimal
literals; or, for a large model (:data:`EXTERNAL_BYTES`), IREE *parameters*: immutable
``util.global``s named in the scope :data:`PARAMETER_SCOPE`, whose data stays out of the text and
out of the compiler and is handed to the runtime (:class:`gawee.backend.iree.IreeModule`) or written to an
``.irpa`` archive (:func:`gawee.backend.iree.write_parameters`) — as iree-turbine externalizes the weights of
large models. Shapes are the graph's static shapes.

This module needs nothing beyond gawee (it never imports IREE); compiling the text with IREE and running it is
:mod:`gawee.backend.iree`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gawee.backend.lower_mlir import MLIR
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType, TensorType
from gawee.ops import OPAQUE, OpDef, get_op

__all__ = [
    "LoweringError",
    "MlirLowering",
    "MlirModule",
    "V",
    "lower_mlir",
    "to_mlir",
]

_ELEM = {
    DType.f64: "f64",
    DType.f32: "f32",
    DType.f16: "f16",
    DType.bf16: "bf16",
    DType.i64: "i64",
    DType.i32: "i32",
    DType.i16: "i16",
    DType.i8: "i8",
    DType.u8: "ui8",
    DType.bool: "i1",
}
"""DType → MLIR element type (complex types have no lowering)."""

SLICED_WINDOW = 16
"""A max/min ``reduce_window`` over at most this many elements (pools up to 4×4) is lowered as strided
slices and elementwise max/min (``MlirLowering.reduce_window``); larger windows keep ``reduce_window``."""

INLINE_BYTES = 64
"""Constants up to this size are hex ``dense<"0x...">`` literals; larger ones are resource blobs."""

EXTERNAL_BYTES = 256 * 2**20
"""A graph whose constants exceed this many bytes keeps them out of the module (IREE parameters): as text
they would take twice their size, more than once over while the text is built and compiled — regnet_y_128gf's
2.6 GB of weights ran its process out of 24 GB of memory."""

PARAMETER_SCOPE = "gawee"
"""The scope of the parameters of a module with external weights (``iree-run-module --parameters=gawee=X.irpa``)."""


class LoweringError(GaweeError):
    """A graph that cannot be written as StableHLO (an op without a lowering, an opaque node, no weights)."""

    kind = "mlir lowering error"


def tensor_type(t: TensorType) -> str:
    """``tensor<2x3xf32>`` (``tensor<f32>`` for a 0-d tensor)."""
    if t.dtype not in _ELEM:
        raise LoweringError(f"element type {t.dtype.value} has no StableHLO lowering")
    if t.symbolic:
        raise LoweringError(
            f"{t} has symbolic dimensions: to_mlir lowers static shapes only",
            hint="capture without dynamic_shapes (or at the sizes to compile for) to lower to MLIR",
        )
    return "tensor<" + "".join(f"{d}x" for d in t.shape) + _ELEM[t.dtype] + ">"


def scalar_literal(value: float | int | bool, dtype: DType) -> str:
    """An exact MLIR literal of ``value`` as ``dtype`` (floats by bit pattern: inf and nan too)."""
    if dtype is DType.bool:
        return "true" if value else "false"
    t = torch.tensor(value, dtype=dtype.torch)
    if not dtype.is_float:
        return str(int(t.item()))
    bits = int.from_bytes(_raw_bytes(t), "little")
    return f"0x{bits:0{2 * dtype.itemsize}X}"


def _raw_bytes(t: torch.Tensor) -> bytes:
    """The little-endian bytes of ``t`` in row-major order (bf16 through an int16 view)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    arr = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _ints(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if len(values) else "") + ">"


def _dense_i64(rows: Sequence[Sequence[int]]) -> str:
    """A ``tensor<Nx2xi64>`` attribute (padding pairs)."""
    body = ", ".join("[" + ", ".join(str(int(v)) for v in r) + "]" for r in rows)
    return f"dense<[{body}]> : tensor<{len(rows)}x2xi64>" if rows else "dense<> : tensor<0x2xi64>"


class V:
    """An SSA value of the module being built: its name and static type."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: TensorType):
        self.name = name
        self.type = type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def __repr__(self) -> str:
        return f"{self.name}: {self.type}"


_REDUCERS = {
    "add": "stablehlo.add",
    "max": "stablehlo.maximum",
    "min": "stablehlo.minimum",
    "mul": "stablehlo.multiply",
    "and": "stablehlo.and",
    "or": "stablehlo.or",
}


class MlirLowering:
    """What an MLIR lowering (:data:`gawee.backend.lower_mlir.MLIR`) sees for one node: its operands as
    :class:`V`, and StableHLO builders.

    The builders broadcast (numpy rules), convert element types and splat Python numbers where
    that is what the op means, so a lowering reads like the op's formula. The function returns
    the V holding the op's output (a list of them for a multi-output op).
    """

    def __init__(
        self,
        emitter: _Emitter,
        node: Node,
        opdef: OpDef,
        inputs: Sequence[V | None] | None = None,
        attrs: Mapping[str, Any] | None = None,
        out_types: Sequence[TensorType] | None = None,
    ):
        self._e = emitter
        self.node = node
        self.opdef = opdef
        self.attrs = node.attrs if attrs is None else attrs
        self._inputs = inputs
        self._out_types = out_types

    # -- operands ------------------------------------------------------------------
    @property
    def arity(self) -> int:
        return len(self._inputs) if self._inputs is not None else len(self.node.inputs)

    def x(self, index: int) -> V | None:
        """Operand ``index`` (None for an absent optional operand)."""
        if self._inputs is not None:
            return self._inputs[index] if index < len(self._inputs) else None
        value = self.node.inputs[index] if index < len(self.node.inputs) else None
        return None if value is None else self._e.value(value)

    @property
    def xs(self) -> list[V]:
        """All present operands (the tensors of a variadic op)."""
        return [v for v in (self.x(i) for i in range(self.arity)) if v is not None]

    def type(self, index: int) -> TensorType | None:
        v = self.x(index)
        return None if v is None else v.type

    @property
    def outs(self) -> list[TensorType]:
        if self._out_types is not None:
            return list(self._out_types)
        return [o.type for o in self.node.outputs]

    @property
    def out(self) -> TensorType:
        """The type of the (first) output."""
        return self.outs[0]

    def const(self, index: int) -> torch.Tensor | None:
        """Operand ``index``'s data if it is a constant with known values."""
        if self._inputs is not None:
            return None
        value = self.node.inputs[index] if index < len(self.node.inputs) else None
        return value.data if value is not None and value.has_known_data else None

    def fail(self, why: str):
        """Raise LoweringError: this node has no StableHLO form (usable inside a lambda)."""
        raise LoweringError(
            f"node {self.node.name} ({self.opdef.name}) has no StableHLO lowering: {why}",
            where=self.node.name,
            hint=f"extend the MLIR lowering of {self.opdef.name} (gawee/backend/lower_mlir/)",
        )

    # -- emitting ------------------------------------------------------------------
    def op(
        self,
        name: str,
        operands: Sequence[V],
        result: TensorType | Sequence[TensorType],
        attrs: Mapping[str, str] | None = None,
        region: str | None = None,
    ) -> V | list[V]:
        """One operation in generic form; a list of results when ``result`` is a list of types."""
        return self._e.emit(name, operands, result, attrs, region)

    def constant(self, data: torch.Tensor) -> V:
        """A constant tensor (a resource blob when large)."""
        return self._e.constant(data, f"{self.node.name}_const")

    def splat(self, value: float | int | bool, dtype: DType, shape: Sequence[int] = ()) -> V:
        """``value`` as a ``dtype`` tensor of ``shape``."""
        s = self._e.scalar(value, dtype)
        return s if not shape else self.broadcast(s, tuple(shape))

    def iota(self, shape: Sequence[int], dim: int, dtype: DType) -> V:
        return self.op("stablehlo.iota", [], TensorType(tuple(shape), dtype), {"iota_dimension": f"{dim} : i64"})

    # -- shapes and types --------------------------------------------------------
    def convert(self, v: V, dtype: DType) -> V:
        """``v`` as ``dtype`` (to bool: ``v != 0``)."""
        if v.dtype is dtype:
            return v
        if dtype is DType.bool:
            return self.compare("NE", v, 0)
        return self.op("stablehlo.convert", [v], TensorType(v.shape, dtype))

    def broadcast(self, v: V, shape: Sequence[int]) -> V:
        """``v`` broadcast to ``shape`` by numpy's rules (trailing dimensions aligned)."""
        shape = tuple(shape)
        if v.shape == shape:
            return v
        offset = len(shape) - v.rank
        if offset < 0 or any(d not in (1, shape[offset + i]) for i, d in enumerate(v.shape)):
            raise LoweringError(f"cannot broadcast {list(v.shape)} to {list(shape)}", where=self.node.name)
        dims = _ints(range(offset, len(shape)))
        return self.op("stablehlo.broadcast_in_dim", [v], TensorType(shape, v.dtype), {"broadcast_dimensions": dims})

    def broadcast_dims(self, v: V, shape: Sequence[int], dims: Sequence[int]) -> V:
        """``stablehlo.broadcast_in_dim``: dimension i of ``v`` becomes dimension ``dims[i]``."""
        return self.op(
            "stablehlo.broadcast_in_dim", [v], TensorType(tuple(shape), v.dtype), {"broadcast_dimensions": _ints(dims)}
        )

    def reshape(self, v: V, shape: Sequence[int]) -> V:
        shape = tuple(shape)
        return v if v.shape == shape else self.op("stablehlo.reshape", [v], TensorType(shape, v.dtype))

    def transpose(self, v: V, perm: Sequence[int]) -> V:
        perm = [p % v.rank for p in perm] if v.rank else []
        if perm == list(range(v.rank)):
            return v
        shape = tuple(v.shape[p] for p in perm)
        return self.op("stablehlo.transpose", [v], TensorType(shape, v.dtype), {"permutation": _ints(perm)})

    def slice(self, v: V, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int] | None = None) -> V:
        strides = list(strides or [1] * v.rank)
        shape = tuple(max(0, -(-(hi - lo) // s)) for lo, hi, s in zip(starts, limits, strides))
        if shape == v.shape:
            return v
        attrs = {"start_indices": _ints(starts), "limit_indices": _ints(limits), "strides": _ints(strides)}
        return self.op("stablehlo.slice", [v], TensorType(shape, v.dtype), attrs)

    def slice_dim(self, v: V, dim: int, start: int, end: int, step: int = 1) -> V:
        starts, limits, strides = [0] * v.rank, list(v.shape), [1] * v.rank
        starts[dim], limits[dim], strides[dim] = start, end, step
        return self.slice(v, starts, limits, strides)

    def concat(self, vs: Sequence[V], dim: int) -> V:
        if len(vs) == 1:
            return vs[0]
        shape = list(vs[0].shape)
        shape[dim] = sum(v.shape[dim] for v in vs)
        return self.op(
            "stablehlo.concatenate", list(vs), TensorType(tuple(shape), vs[0].dtype), {"dimension": f"{dim} : i64"}
        )

    def reverse(self, v: V, dims: Sequence[int]) -> V:
        return self.op("stablehlo.reverse", [v], v.type, {"dimensions": _ints(dims)}) if dims else v

    def pad(self, v: V, value: V, low: Sequence[int], high: Sequence[int], interior: Sequence[int] | None = None) -> V:
        interior = list(interior or [0] * v.rank)
        shape = tuple(d + lo + hi + max(d - 1, 0) * i for d, lo, hi, i in zip(v.shape, low, high, interior))
        attrs = {"edge_padding_low": _ints(low), "edge_padding_high": _ints(high), "interior_padding": _ints(interior)}
        return self.op("stablehlo.pad", [v, value], TensorType(shape, v.dtype), attrs)

    def index_select(self, v: V, index: V, dim: int) -> V:
        """``torch.index_select`` (``stablehlo.torch_index_select``): ``index`` may have any rank."""
        shape = v.shape[:dim] + index.shape + v.shape[dim + 1 :]
        attrs = {"dim": f"{dim} : i64", "batch_dims": "0 : i64"}
        return self.op("stablehlo.torch_index_select", [v, index], TensorType(shape, v.dtype), attrs)

    # -- arithmetic ----------------------------------------------------------------
    def _operand(self, a: V | float | int | bool, like: V | None, dtype: DType | None) -> V:
        if isinstance(a, V):
            return a
        if dtype is None:
            dtype = like.dtype if like is not None else DType.f32
        return self._e.scalar(a, dtype)

    def ew(self, name: str, *operands: V | float | int | bool, dtype: DType | None = None) -> V:
        """Elementwise ``name`` of operands broadcast together and converted to ``dtype`` (default:
        the first tensor operand's); Python numbers become scalars of that type."""
        tensors = [a for a in operands if isinstance(a, V)]
        if dtype is None:
            dtype = tensors[0].dtype if tensors else DType.f32
        vs = [self.convert(self._operand(a, None, dtype), dtype) for a in operands]
        shape = tuple(torch.broadcast_shapes(*(v.shape for v in vs)))
        vs = [self.broadcast(v, shape) for v in vs]
        return self.op(name, vs, TensorType(shape, dtype))

    def add(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.add", a, b, dtype=dtype)

    def sub(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.subtract", a, b, dtype=dtype)

    def mul(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.multiply", a, b, dtype=dtype)

    def div(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.divide", a, b, dtype=dtype)

    def max(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.maximum", a, b, dtype=dtype)

    def min(self, a, b, dtype=None) -> V:
        return self.ew("stablehlo.minimum", a, b, dtype=dtype)

    def unary(self, name: str, v: V) -> V:
        return self.op(name, [v], v.type)

    def compare(self, direction: str, a, b, dtype: DType | None = None) -> V:
        """``a <direction> b`` (EQ, NE, LT, LE, GT, GE) after broadcasting; a bool tensor."""
        tensors = [x for x in (a, b) if isinstance(x, V)]
        dtype = dtype or tensors[0].dtype
        va, vb = (self.convert(self._operand(x, None, dtype), dtype) for x in (a, b))
        shape = tuple(torch.broadcast_shapes(va.shape, vb.shape))
        kind = "FLOAT" if dtype.is_float else "UNSIGNED" if dtype in (DType.u8, DType.bool) else "SIGNED"
        attrs = {
            "comparison_direction": f"#stablehlo<comparison_direction {direction}>",
            "compare_type": f"#stablehlo<comparison_type {kind}>",
        }
        vs = [self.broadcast(va, shape), self.broadcast(vb, shape)]
        return self.op("stablehlo.compare", vs, TensorType(shape, DType.bool), attrs)

    def select(self, pred: V, a, b, dtype: DType | None = None) -> V:
        """``pred ? a : b``, broadcasting all three."""
        tensors = [x for x in (a, b) if isinstance(x, V)]
        dtype = dtype or (tensors[0].dtype if tensors else DType.f32)
        va, vb = (self.convert(self._operand(x, None, dtype), dtype) for x in (a, b))
        shape = tuple(torch.broadcast_shapes(pred.shape, va.shape, vb.shape))
        vs = [self.broadcast(x, shape) for x in (pred, va, vb)]
        return self.op("stablehlo.select", vs, TensorType(shape, dtype))

    def clamp(self, v: V, lo: float | None, hi: float | None) -> V:
        if lo is not None:
            v = self.max(v, lo)
        if hi is not None:
            v = self.min(v, hi)
        return v

    # -- reductions, windows, contractions -----------------------------------------
    def _body(self, kind: str, dtype: DType) -> str:
        t = tensor_type(TensorType((), dtype))
        op = _REDUCERS[kind]
        return (
            f"({{\n    ^bb0(%lhs: {t}, %rhs: {t}):\n"
            f'      %r = "{op}"(%lhs, %rhs) : ({t}, {t}) -> {t}\n'
            f'      "stablehlo.return"(%r) : ({t}) -> ()\n    }})'
        )

    def _init(self, kind: str, dtype: DType) -> V:
        if kind in ("add", "or"):
            return self.splat(False if dtype is DType.bool else 0, dtype)
        if kind in ("mul", "and"):
            return self.splat(True if dtype is DType.bool else 1, dtype)
        if dtype.is_float:
            return self.splat(-math.inf if kind == "max" else math.inf, dtype)
        info = torch.iinfo(dtype.torch) if dtype is not DType.bool else None
        if info is None:
            return self.splat(kind == "min", dtype)
        return self.splat(info.min if kind == "max" else info.max, dtype)

    def reduce(self, v: V, dims: Sequence[int], kind: str = "add", keepdim: bool = False) -> V:
        """``v`` reduced over ``dims`` by ``kind`` (add, max, min, mul, and, or)."""
        dims = sorted({d % v.rank for d in dims}) if v.rank else []
        if not dims:
            return v
        shape = tuple(d for i, d in enumerate(v.shape) if i not in dims)
        out = self.op(
            "stablehlo.reduce",
            [v, self._init(kind, v.dtype)],
            TensorType(shape, v.dtype),
            {"dimensions": _ints(dims)},
            self._body(kind, v.dtype),
        )
        if keepdim:
            out = self.reshape(out, tuple(1 if i in dims else d for i, d in enumerate(v.shape)))
        return out

    def _trim(self, x: V, first: int, out_sizes, windows, strides, dilations, padding):
        """``x`` and ``padding`` without the rows no window reaches (dims ``first``...): the high
        padding shrinks, then a slice drops input rows. Same result; IREE 3.13 rejects windowed
        ops whose last rows are unused ("inferred input/output operand ... dimension")."""
        padding = [list(p) for p in padding]
        limits = list(x.shape)
        for i, (o, k, s, d) in enumerate(zip(out_sizes, windows, strides, dilations)):
            j = first + i
            excess = x.shape[j] + padding[i][0] + padding[i][1] - ((o - 1) * s + d * (k - 1) + 1)
            cut = min(max(excess, 0), max(padding[i][1], 0))
            padding[i][1] -= cut
            limits[j] -= max(excess - cut, 0)
        return self.slice(x, [0] * x.rank, limits), [tuple(p) for p in padding]

    def reduce_window(
        self,
        v: V,
        kind: str,
        window: Sequence[int],
        strides: Sequence[int],
        padding: Sequence[tuple[int, int]],
        window_dilations: Sequence[int] | None = None,
        init: V | None = None,
    ) -> V:
        """``stablehlo.reduce_window`` over every dimension (padding takes the reduction's identity).

        A max or min over a window of at most ``SLICED_WINDOW`` elements is the elementwise max (min) of
        the window's strided slices of the padded input instead: the same values (max and min are
        exact), and IREE fuses the slices into one elementwise dispatch, where its CPU tiling of a
        ``reduce_window`` keeps a tile on the stack that can exceed its limit (googlenet's 3×3/2
        ceil-mode pool of 1×192×56×56 asked for 100352 of 32768 bytes; pooling in iree-org/iree#13205)."""
        window_dilations = list(window_dilations or [1] * v.rank)
        shape = []
        for d, k, s, (lo, hi), dil in zip(v.shape, window, strides, padding, window_dilations):
            shape.append((d + lo + hi - (dil * (k - 1) + 1)) // s + 1)
        if kind in ("max", "min") and init is None and 1 < math.prod(window) <= SLICED_WINDOW:
            return self._sliced_window(v, kind, window, strides, padding, window_dilations, shape)
        v, padding = self._trim(v, 0, shape, window, strides, window_dilations, padding)
        attrs = {
            "window_dimensions": _ints(window),
            "window_strides": _ints(strides),
            "window_dilations": _ints(window_dilations),
            "padding": _dense_i64(padding),
        }
        init = init if init is not None else self._init(kind, v.dtype)
        return self.op(
            "stablehlo.reduce_window", [v, init], TensorType(tuple(shape), v.dtype), attrs, self._body(kind, v.dtype)
        )

    def _sliced_window(self, v: V, kind: str, window, strides, padding, dilations, shape) -> V:
        """``reduce_window`` of max/min as the max/min over the window's offsets of strided slices."""
        padded = v
        if any(lo or hi for lo, hi in padding):
            padded = self.pad(v, self._init(kind, v.dtype), [lo for lo, _ in padding], [hi for _, hi in padding])
        out = None
        for offsets in itertools.product(*(range(k) for k in window)):
            starts = [o * dil for o, dil in zip(offsets, dilations)]
            limits = [b + (n - 1) * s + 1 for b, n, s in zip(starts, shape, strides)]
            part = self.slice(padded, starts, limits, strides)
            out = part if out is None else (self.max if kind == "max" else self.min)(out, part)
        return out

    def dot_general(
        self,
        a: V,
        b: V,
        contract: tuple[Sequence[int], Sequence[int]],
        batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
        dtype: DType | None = None,
    ) -> V:
        """Contract ``a`` and ``b``: the result is batch dims, then a's free dims, then b's free dims."""
        (lc, rc), (lb, rb) = contract, batch
        free_a = [d for i, d in enumerate(a.shape) if i not in lc and i not in lb]
        free_b = [d for i, d in enumerate(b.shape) if i not in rc and i not in rb]
        shape = tuple([a.shape[i] for i in lb] + free_a + free_b)
        parts = []
        if lb:
            parts += [f"lhs_batching_dimensions = [{', '.join(map(str, lb))}]"]
            parts += [f"rhs_batching_dimensions = [{', '.join(map(str, rb))}]"]
        parts += [f"lhs_contracting_dimensions = [{', '.join(map(str, lc))}]"]
        parts += [f"rhs_contracting_dimensions = [{', '.join(map(str, rc))}]"]
        attrs = {"dot_dimension_numbers": "#stablehlo.dot<" + ", ".join(parts) + ">"}
        return self.op("stablehlo.dot_general", [a, b], TensorType(shape, dtype or a.dtype), attrs)

    def convolution(
        self,
        x: V,
        w: V,
        out: TensorType,
        stride: Sequence[int],
        padding: Sequence[tuple[int, int]],
        lhs_dilation: Sequence[int] | None = None,
        rhs_dilation: Sequence[int] | None = None,
        groups: int = 1,
        weight_spatial_first: bool = False,
    ) -> V:
        """An N-d convolution in torch's layout: input (N, C, *spatial), weight (O, I/groups, *kernel)
        — or, ``weight_spatial_first``, weight (*kernel, I/groups, O): the layout IREE computes in
        (NHWC/HWCF), given by a constant weight transposed here rather than by IREE at compile time.

        Input rows no window reaches (a strided window that does not fit the last rows) are dropped
        first, from the high padding and then by a slice: the result is the same, and IREE 3.13's
        convolution lowering rejects such inputs ("inferred input/output operand ... dimension").

        A depthwise convolution (one input and one output channel per group) of a batch of N > 1
        is one of batch 1 over N·C channels, the weight repeated N times: IREE 3.13's im2col
        (iree.compile_flags) rejects batched depthwise convolutions ("'linalg.batch_matvec' op
        inferred input/output operand #1 has shape's dimension #0 to be 8, but found 4")."""
        nd = x.rank - 2
        kernel = w.shape[:nd] if weight_spatial_first else w.shape[2:]
        n, channels = x.shape[0], x.shape[1]
        depthwise = groups == channels == out.shape[1] and w.shape[nd if weight_spatial_first else 1] == 1
        if depthwise and nd == 2 and self._e.iree_ops and not any(d != 1 for d in lhs_dilation or ()):
            return self._linalg_depthwise(x, w, out, stride, padding, rhs_dilation or [1, 1], weight_spatial_first)
        if n > 1 and depthwise:
            x = self.reshape(x, (1, n * channels, *x.shape[2:]))
            if weight_spatial_first:  # (*kernel, 1, C) -> (*kernel, 1, N, C) -> (*kernel, 1, N·C)
                dims = [*range(nd + 1), nd + 2]
                w = self.broadcast_dims(w, (*kernel, 1, n, channels), dims)
            else:  # (C, 1, *kernel) -> (N, C, 1, *kernel) -> (N·C, 1, *kernel)
                w = self.broadcast_dims(w, (n, channels, 1, *kernel), range(1, nd + 3))
            w = self.reshape(w, (*kernel, 1, n * channels) if weight_spatial_first else (n * channels, 1, *kernel))
            folded = TensorType((1, n * channels, *out.shape[2:]), out.dtype)
            y = self.convolution(
                x, w, folded, stride, padding, lhs_dilation, rhs_dilation, n * channels, weight_spatial_first
            )
            return self.reshape(y, out.shape)
        if not lhs_dilation or all(d == 1 for d in lhs_dilation):
            x, padding = self._trim(x, 2, out.shape[2:], kernel, stride, rhs_dilation or [1] * nd, padding)
        sp = ", ".join(str(i) for i in range(nd))
        w_layout = f"{sp}, i, o" if weight_spatial_first else f"o, i, {sp}"
        attrs = {
            "dimension_numbers": f"#stablehlo.conv<[b, f, {sp}]x[{w_layout}]->[b, f, {sp}]>",
            "window_strides": _ints(stride),
            "padding": _dense_i64(padding),
            "lhs_dilation": _ints(lhs_dilation or [1] * nd),
            "rhs_dilation": _ints(rhs_dilation or [1] * nd),
            "feature_group_count": f"{groups} : i64",
            "batch_group_count": "1 : i64",
        }
        return self.op("stablehlo.convolution", [x, w], out, attrs)

    def _linalg_depthwise(self, x: V, w: V, out: TensorType, stride, padding, dilation, weight_spatial_first) -> V:
        """A 2-D depthwise convolution as ``linalg.depthwise_conv_2d_nchw_chw`` on the padded input
        (torch-mlir's form, so iree-turbine's too): IREE keeps it a direct convolution, where
        StableHLO's becomes ``depthwise_conv_2d_nhwc_hwc``, which IREE's im2col (iree.compile_flags) turns
        into a gather as slow as the whole direct convolution and a batched matvec."""
        x, padding = self._trim(
            x, 2, out.shape[2:], w.shape[:2] if weight_spatial_first else w.shape[2:], stride, dilation, padding
        )
        x = self.pad(
            x, self._e.scalar(0.0, x.dtype), [0, 0, *(p[0] for p in padding)], [0, 0, *(p[1] for p in padding)]
        )
        if weight_spatial_first:  # (kh, kw, 1, C) -> (C, kh, kw)
            w = self.transpose(self.reshape(w, (*w.shape[:2], w.shape[3])), [2, 0, 1])
        else:  # (C, 1, kh, kw) -> (C, kh, kw)
            w = self.reshape(w, (w.shape[0], *w.shape[2:]))
        elem, result = _ELEM[x.dtype], tensor_type(TensorType(out.shape, x.dtype))
        init, zero, fill, name = (self._e.fresh() for _ in range(4))
        self._e.lines += [
            f"{init} = tensor.empty() : {result}",
            f"{zero} = arith.constant {scalar_literal(0.0, x.dtype)} : {elem}",
            f"{fill} = linalg.fill ins({zero} : {elem}) outs({init} : {result}) -> {result}",
            f"{name} = linalg.depthwise_conv_2d_nchw_chw {{dilations = dense<{list(dilation)}> : vector<2xi64>, "
            f"strides = dense<{list(stride)}> : vector<2xi64>}} ins({x.name}, {w.name} : {tensor_type(x.type)}, "
            f"{tensor_type(w.type)}) outs({fill} : {result}) -> {result}",
        ]
        return V(name, TensorType(out.shape, x.dtype))

    def sort(self, operands: Sequence[V], dim: int, descending: bool = False, tiebreak: int | None = None) -> list[V]:
        """``stablehlo.sort`` of ``operands`` along ``dim``, ordered by the first one as torch
        orders it: NaN above every number (last ascending, first descending); the other operands
        follow the same permutation. Equal keys (NaNs equal to each other) are ordered by operand
        ``tiebreak`` ascending (an iota: a stable sort; IREE's sort is not stable by itself)."""
        args = ", ".join(
            f"%a{i}: {tensor_type(TensorType((), v.dtype))}, %b{i}: {tensor_type(TensorType((), v.dtype))}"
            for i, v in enumerate(operands)
        )
        b1 = tensor_type(TensorType((), DType.bool))
        lines = []

        def cmp(lhs: str, rhs: str, direction: str, dtype: DType) -> str:
            t = tensor_type(TensorType((), dtype))
            kind = "FLOAT" if dtype.is_float else "UNSIGNED" if dtype in (DType.u8, DType.bool) else "SIGNED"
            name = f"%c{len(lines)}"
            lines.append(
                f'{name} = "stablehlo.compare"({lhs}, {rhs}) {{comparison_direction = '
                f"#stablehlo<comparison_direction {direction}>, compare_type = #stablehlo<comparison_type {kind}>}}"
                f" : ({t}, {t}) -> {b1}"
            )
            return name

        def logic(op: str, lhs: str, rhs: str) -> str:
            name = f"%c{len(lines)}"
            lines.append(f'{name} = "stablehlo.{op}"({lhs}, {rhs}) : ({b1}, {b1}) -> {b1}')
            return name

        key = operands[0].dtype
        # a goes before b: a < b, or b is NaN and a is not (descending: a and b swapped)
        first, second = ("%b0", "%a0") if descending else ("%a0", "%b0")
        result = cmp(first, second, "LT", key)
        if key.is_float:
            result = logic("or", result, logic("and", cmp(second, second, "NE", key), cmp(first, first, "EQ", key)))
        if tiebreak is not None:
            same = cmp("%a0", "%b0", "EQ", key)
            if key.is_float:
                same = logic("or", same, logic("and", cmp("%a0", "%a0", "NE", key), cmp("%b0", "%b0", "NE", key)))
            t = operands[tiebreak].dtype
            result = logic("or", result, logic("and", same, cmp(f"%a{tiebreak}", f"%b{tiebreak}", "LT", t)))
        body = "".join(f"      {line}\n" for line in lines)
        region = f'({{\n    ^bb0({args}):\n{body}      "stablehlo.return"({result}) : ({b1}) -> ()\n    }})'
        attrs = {"dimension": f"{dim} : i64", "is_stable": "true"}
        return self.op("stablehlo.sort", list(operands), [v.type for v in operands], attrs, region)

    def gather_points(self, v: V, coords: V) -> V:
        """``v`` at the points of ``coords`` (shape ``(*batch, v.rank)``, i64): a tensor of shape ``batch``."""
        k = coords.shape[-1]
        dn = (
            f"#stablehlo.gather<offset_dims = [], collapsed_slice_dims = [{', '.join(map(str, range(k)))}], "
            f"start_index_map = [{', '.join(map(str, range(k)))}], index_vector_dim = {coords.rank - 1}>"
        )
        attrs = {"dimension_numbers": dn, "slice_sizes": _ints([1] * v.rank), "indices_are_sorted": "false"}
        return self.op("stablehlo.gather", [v, coords], TensorType(coords.shape[:-1], v.dtype), attrs)

    def scatter(self, v: V, coords: V, updates: V, dims: Sequence[int], combine: str | None = None) -> V:
        """``v`` with the slices at ``coords`` (shape ``(*batch, len(dims))``: positions along
        ``dims``) replaced by ``updates`` (shape ``(*batch, *other dims of v)``), or combined with
        them by ``combine`` (``add``, ``or``...)."""
        nb = coords.rank - 1
        window = ", ".join(str(nb + i) for i in range(v.rank - len(dims)))
        ds = ", ".join(str(d) for d in dims)
        dn = (
            f"#stablehlo.scatter<update_window_dims = [{window}], inserted_window_dims = [{ds}], "
            f"scatter_dims_to_operand_dims = [{ds}], index_vector_dim = {nb}>"
        )
        t = tensor_type(TensorType((), v.dtype))
        if combine is None:
            region = f'({{\n    ^bb0(%lhs: {t}, %rhs: {t}):\n      "stablehlo.return"(%rhs) : ({t}) -> ()\n    }})'
        else:
            region = self._body(combine, v.dtype)
        attrs = {"scatter_dimension_numbers": dn, "indices_are_sorted": "false", "unique_indices": "false"}
        return self.op("stablehlo.scatter", [v, coords, updates], v.type, attrs, region)

    # -- other ops -------------------------------------------------------------------
    def lower_as(self, op: str, inputs: Sequence[V | None], attrs: Mapping[str, Any] | None = None) -> V | list[V]:
        """Emit op ``op`` (its own lowering) on ``inputs``: e.g. a fused activation as the standalone op."""
        opdef = get_op(op)
        full = opdef.prepare_attrs(dict(attrs or {}), [None if v is None else v.type for v in inputs], self.node.name)
        outs = opdef.infer_types([None if v is None else v.type for v in inputs], full)
        return self._e.lower(MlirLowering(self._e, self.node, opdef, list(inputs), full, outs))


def _unique(base: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", base) or "v"
    if not base[0].isalpha():
        base = "c" + base
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class _Emitter:
    def __init__(self, graph: Graph, iree_ops: bool = True, external: bool = False):
        self.graph = graph
        self.iree_ops = iree_ops
        self.external = external
        self.lines: list[str] = []
        self.values: dict[Value, V] = {}
        self.resources: list[tuple[str, bytes, int]] = []
        self.parameters: dict[str, torch.Tensor] = {}
        self.globals: list[str] = []
        self._resource_names: set[str] = set()
        self._scalars: dict[tuple, V] = {}
        self._count = 0

    def fresh(self) -> str:
        self._count += 1
        return f"%v{self._count}"

    def emit(self, name, operands, result, attrs=None, region=None):
        many = not isinstance(result, TensorType)
        results = list(result) if many else [result]
        names = [self.fresh() for _ in results]
        for v in operands:
            if not isinstance(v, V):
                raise TypeError(f"{name}: operand {v!r} is not an SSA value")
        args = ", ".join(v.name for v in operands)
        text = f'{", ".join(names)} = "{name}"({args})'
        if region:
            text += " " + region
        if attrs:
            text += " {" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}"
        ins = ", ".join(tensor_type(v.type) for v in operands)
        outs = ", ".join(tensor_type(t) for t in results)
        text += f" : ({ins}) -> " + (f"({outs})" if many else outs)
        self.lines.append(text)
        vs = [V(n, t) for n, t in zip(names, results)]
        return vs if many else vs[0]

    def scalar(self, value, dtype: DType) -> V:
        key = (dtype, type(value), value if not (isinstance(value, float) and math.isnan(value)) else "nan")
        v = self._scalars.get(key)
        if v is None:
            t = TensorType((), dtype)
            lit = scalar_literal(value, dtype)
            v = self.emit("stablehlo.constant", [], t, {"value": f"dense<{lit}> : {tensor_type(t)}"})
            self._scalars[key] = v
        return v

    def constant(self, data: torch.Tensor, base: str) -> V:
        dtype = DType.from_torch(data.dtype)
        if dtype is DType.bool:  # i1 blobs have no agreed byte layout: build from i8
            v = self.constant(data.to(torch.int8), base)
            return self.emit("stablehlo.convert", [v], TensorType(v.shape, DType.bool))  # nonzero: true
        t = TensorType(tuple(data.shape), dtype)
        if data.numel() == 1:
            attr = f"dense<{scalar_literal(data.reshape(()).item(), dtype)}> : {tensor_type(t)}"
        elif data.numel() * dtype.itemsize <= INLINE_BYTES:
            attr = f'dense<"0x{_raw_bytes(data).hex().upper()}"> : {tensor_type(t)}'
        elif self.external:
            name = _unique(base, self._resource_names)
            self.parameters[name] = data
            source = f'#stream.parameter.named<"{PARAMETER_SCOPE}"::"{name}">'
            self.globals.append(f"util.global private @{name} = {source} : {tensor_type(t)}")
            v = V(self.fresh(), t)
            self.lines.append(f"{v.name} = util.global.load @{name} : {tensor_type(t)}")
            return v
        else:
            name = _unique(base, self._resource_names)
            self.resources.append((name, _raw_bytes(data), max(dtype.itemsize, 4)))
            attr = f"dense_resource<{name}> : {tensor_type(t)}"
        return self.emit("stablehlo.constant", [], t, {"value": attr})

    def value(self, value: Value) -> V:
        v = self.values.get(value)
        if v is None:
            if value.data is None:
                raise LoweringError(
                    f"%{value.name} is read before it is computed",
                    hint="the graph is not in topological order: run gawee.verify(graph)",
                )
            if not value.has_known_data:
                raise LoweringError(
                    f"constant %{value.name} has no values (meta-device capture)",
                    hint="capture the model with real weights to lower it",
                )
            v = self.values[value] = self.constant(value.data, value.name)
        return v

    def lower(self, ctx: MlirLowering) -> V | list[V]:
        spec = MLIR.get(ctx.opdef.name)
        if ctx.opdef.name == OPAQUE:
            raise LoweringError(
                f"node {ctx.node.name} is an opaque ATen call ({ctx.attrs['target']}): no StableHLO lowering",
                where=ctx.node.name,
                hint="opaque nodes run through torch only; give the op an OpDef and an MLIR lowering",
            )
        if spec is None:
            raise LoweringError(
                f"op {ctx.opdef.name} has no StableHLO lowering (node {ctx.node.name})",
                where=ctx.node.name,
                hint=f'add `@MLIR.register("{ctx.opdef.name}")` to the MLIR table (gawee/backend/lower_mlir/)',
            )
        if isinstance(spec, str):
            return ctx.ew(spec, *ctx.xs, dtype=ctx.out.dtype)
        return spec(ctx)

    def build(self, func_name: str) -> str:
        self._resource_names.add(func_name)  # a parameter's global must not take the function's symbol
        args = []
        for i, value in enumerate(self.graph.inputs):
            v = self.values[value] = V(f"%arg{i}", value.type)
            args.append(f"{v.name}: {tensor_type(v.type)}")
        for node in self.graph:
            result = self.lower(MlirLowering(self, node, get_op(node.op)))
            results = [result] if isinstance(result, V) else list(result)
            if len(results) != len(node.outputs):
                raise LoweringError(
                    f"the StableHLO lowering of {node.op} gave {len(results)} outputs for {len(node.outputs)}",
                    where=node.name,
                )
            for value, v in zip(node.outputs, results):
                if v.type.shape != value.type.shape or v.type.dtype != value.type.dtype:
                    raise LoweringError(
                        f"the StableHLO lowering of {node.op} made {v.type}, the node's output is {value.type}",
                        where=node.name,
                        hint=f"a bug in the MLIR lowering of {node.op} (gawee/backend/lower_mlir/)",
                    )
                self.values[value] = v
        outs = [self.value(v) for v in self.graph.outputs]
        out_types = ", ".join(tensor_type(v.type) for v in outs)
        lines = [
            f"module @{_module_name(self.graph.name)} {{",
            *("  " + line for line in self.globals),
            f"  func.func @{func_name}({', '.join(args)}) -> ({out_types}) {{",
            *("    " + line for line in self.lines),
            f"    return {', '.join(v.name for v in outs)} : {out_types}" if outs else "    return",
            "  }",
            "}",
        ]
        if self.resources:
            lines += ["{-#", "  dialect_resources: {", "    builtin: {"]
            blobs = [
                f'      {name}: "0x{align.to_bytes(4, "little").hex()}{raw.hex()}"'
                for name, raw, align in self.resources
            ]
            lines += [",\n".join(blobs), "    }", "  }", "#-}"]
        return "\n".join(lines) + "\n"


def _module_name(name: str) -> str:
    return _unique(name or "gawee", set())


@dataclass
class MlirModule:
    """A graph lowered to MLIR: the module's text and, with external weights, the parameters it names."""

    text: str
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)
    """Parameter name (in scope :data:`PARAMETER_SCOPE`) → its data; empty when the weights are in the text."""


def constant_bytes(graph: Graph) -> int:
    """Bytes of the constant data ``graph``'s nodes read (what a lowering must carry)."""
    seen = {v for n in graph for v in n.inputs if v is not None and v.is_const and v.data is not None}
    return sum(v.data.numel() * v.data.element_size() for v in seen)


def lower_mlir(
    graph: Graph, *, func_name: str = "main", iree_ops: bool = True, external_weights: bool | None = None
) -> MlirModule:
    """:func:`to_mlir`, with the weights as IREE parameters when ``external_weights`` (None: when the graph's
    constants exceed :data:`EXTERNAL_BYTES`). Constants of up to :data:`INLINE_BYTES` stay literals."""
    if external_weights is None:
        external_weights = constant_bytes(graph) > EXTERNAL_BYTES
    emitter = _Emitter(graph, iree_ops, external_weights)
    return MlirModule(emitter.build(func_name), emitter.parameters)


def to_mlir(graph: Graph, *, func_name: str = "main", iree_ops: bool = True) -> str:
    """``graph`` as the text of an MLIR module in the StableHLO dialect: one function ``func_name``
    taking the graph's inputs and returning its outputs; weights in a ``dialect_resources`` section.

    ``iree_ops``: ops that IREE's CPU backend runs faster in another form are written in it
    (2-D depthwise convolutions as ``linalg.depthwise_conv_2d_nchw_chw``, see
    :meth:`MlirLowering.convolution`); ``iree_ops=False`` writes pure StableHLO (any consumer).
    Attention is its StableHLO composition either way: IREE 3.13's fused
    ``iree_linalg_ext.attention`` ran 5× slower on CPU (docs/mlir.md).

    Raises LoweringError naming the op and node for ops without a StableHLO lowering, opaque
    nodes, and graphs whose constants have no values (meta-device capture).
    """
    return _Emitter(graph, iree_ops).build(func_name)
