"""to_onnx: a Graph as an ONNX model (opset 20), so other runtimes run the optimized graph.

Each node exports through the ONNX target's lowering table (:data:`gawee.backend.lower_onnx.ONNX`): an entry is
an ONNX op type (the present operands passed as they are, no attributes) or a function of an
:class:`OnnxLowering` that emits ONNX nodes. ONNX has no fused convolution, so a fused
``conv2d(..., residual=r, act=a)`` exports as ``Conv`` (+ ``Add``) (+ the activation's own
nodes); a runtime that fuses them again does so with its own optimizer. Constants become
initializers; shapes are the graph's static shapes. Needs the optional ``onnx`` extra
(``pip install gawee[onnx]``); ops without an ONNX lowering and opaque ``aten`` nodes
raise :class:`ExportError` naming them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gawee.backend.lower_onnx import ONNX
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.symbolic import Sym, has_symbols, text
from gawee.ir.types import DType, TensorType
from gawee.ops import OPAQUE, OpDef, get_op

OPSET = 20
"""The ONNX opset written (20: ``Gelu`` is a standard op)."""

_ELEM_TYPE = {
    DType.f32: 1,
    DType.u8: 2,
    DType.i8: 3,
    DType.i16: 5,
    DType.i32: 6,
    DType.i64: 7,
    DType.bool: 9,
    DType.f16: 10,
    DType.f64: 11,
    DType.c64: 14,
    DType.c128: 15,
    DType.bf16: 16,
}
"""DType → onnx.TensorProto element type."""


class ExportError(GaweeError):
    """A graph that cannot be written as ONNX (an op without a lowering, an opaque node, no weights)."""

    kind = "export error"


class OnnxLowering:
    """What an ONNX lowering (:data:`gawee.backend.lower_onnx.ONNX`) sees for one node: operand names, types,
    and ways to emit ONNX nodes.

    The function returns the name of the value holding the op's output (a list of names
    for a multi-output op).
    """

    def __init__(
        self,
        exporter: _Exporter,
        node: Node,
        opdef: OpDef,
        inputs: Sequence[str] | None = None,
        attrs: Mapping[str, Any] | None = None,
        in_types: Sequence[TensorType | None] | None = None,
    ):
        self._exporter = exporter
        self.node = node
        self.opdef = opdef
        self.attrs = node.attrs if attrs is None else attrs
        self._inputs = inputs
        self._types = in_types

    # -- operands ------------------------------------------------------------------
    def x(self, index: int) -> str:
        """Operand ``index`` as an ONNX value name ("" for an absent optional operand)."""
        if self._inputs is not None:
            return self._inputs[index] if index < len(self._inputs) else ""
        value = self.node.inputs[index] if index < len(self.node.inputs) else None
        return "" if value is None else self._exporter.name_of(value)

    @property
    def arity(self) -> int:
        return len(self._inputs) if self._inputs is not None else len(self.node.inputs)

    def type(self, index: int) -> TensorType | None:
        if self._types is not None:
            return self._types[index]
        value = self.node.inputs[index]
        return None if value is None else value.type

    @property
    def out(self) -> TensorType:
        """The type of the (first) output."""
        return self.node.outputs[0].type

    def const(self, index: int) -> torch.Tensor | None:
        """Operand ``index``'s data if it is a constant with known values."""
        if self._inputs is not None:
            return None
        value = self.node.inputs[index]
        return value.data if value is not None and value.has_known_data else None

    def x_as(self, index: int, dtype: DType) -> str:
        """Operand ``index`` converted to ``dtype`` (ONNX arithmetic does not promote types)."""
        t = self.type(index)
        if t is None or t.dtype is dtype:
            return self.x(index)
        data = self.const(index)
        if data is not None:
            return self.constant(data.to(dtype.torch))
        return self.cast(self.x(index), dtype)

    def cast(self, name: str, dtype: DType) -> str:
        """``Cast`` of value ``name`` to ``dtype``."""
        return self.emit("Cast", name, to=_ELEM_TYPE[dtype])

    # -- emitting ------------------------------------------------------------------
    def emit(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """An ONNX node with one output; returns the output's name."""
        return self.emit_multi(op_type, inputs, 1, **attrs)[0]

    def emit_multi(self, op_type: str, inputs: Sequence[str], n_outputs: int, **attrs: Any) -> list[str]:
        return self._exporter.add_node(op_type, list(inputs), n_outputs, self.node.name, attrs)

    def constant(self, data: torch.Tensor | Sequence | float | int, dtype: DType | None = None) -> str:
        """An initializer holding ``data`` (a tensor, or a Python number/list made into one of ``dtype``)."""
        if not isinstance(data, torch.Tensor):
            data = torch.tensor(data, dtype=None if dtype is None else dtype.torch)
        elif dtype is not None:
            data = data.to(dtype.torch)
        return self._exporter.add_initializer(data, f"{self.node.name}_const")

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 initializer (shapes, axes, pads); with symbolic sizes, a tensor computed from the
        input shapes at run time (``Shape`` slices of the inputs, then the size's arithmetic)."""
        if not has_symbols(tuple(values)):
            return self.constant(torch.tensor(list(values), dtype=torch.int64))
        parts = [self._exporter.size(v, self) if has_symbols(v) else self.ints([v]) for v in values]
        return parts[0] if len(parts) == 1 else self.emit("Concat", *parts, axis=0)

    def scalar(self, value: float | int | bool, dtype: DType) -> str:
        """A 0-d initializer of ``dtype``."""
        return self.constant(torch.tensor(value, dtype=dtype.torch))

    def lower_as(
        self, op: str, inputs: Sequence[str], attrs: Mapping[str, Any], in_types: Sequence[TensorType | None]
    ) -> str | list[str]:
        """Emit op ``op`` (its own ONNX lowering) on ``inputs``: e.g. a fused activation as the standalone op."""
        opdef = get_op(op)
        full = opdef.complete_attrs(dict(attrs), where=self.node.name)
        return self._exporter.lower(OnnxLowering(self._exporter, self.node, opdef, inputs, full, in_types))

    def on_vector(self, emit: Callable[[str], str]) -> str:
        """``emit(x)`` on operand 0, made 1-D first when it is 0-d (ONNX's Softmax, CumSum, ArgMax... need an axis
        to act along; torch's take dim 0 of a 0-d tensor), the result made 0-d again."""
        if self.type(0).rank:
            return emit(self.x(0))
        return self.emit("Reshape", emit(self.emit("Reshape", self.x(0), self.ints([1]))), self.ints([]))

    def on_batched(self, spatial: int, emit: Callable[[str], str]) -> str:
        """``emit(x)`` on operand 0 given a batch dimension when it has none (torch's pools and convolutions take
        ``[C, *spatial]``; ONNX's want ``[N, C, *spatial]``), which is removed again from the result."""
        if self.type(0).rank != spatial + 1:
            return emit(self.x(0))
        zero = self.ints([0])
        return self.emit("Squeeze", emit(self.emit("Unsqueeze", self.x(0), zero)), zero)

    def fail(self, why: str):
        """Raise ExportError: this node has no ONNX form (usable inside a lambda)."""
        raise ExportError(f"node {self.node.name} ({self.opdef.name}) has no ONNX form: {why}", where=self.node.name)


def to_onnx(graph: Graph, path: str | os.PathLike | None = None, *, opset: int = OPSET):
    """``graph`` as an ``onnx.ModelProto``, checked by onnx's checker; written to ``path`` when given.

    Raises ExportError for ops without an ONNX lowering, opaque nodes and graphs whose
    constants have no values (meta-device capture), and ModuleNotFoundError naming the
    extra when onnx is not installed.
    """
    try:
        import onnx
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("gawee.to_onnx needs the onnx package: pip install 'gawee[onnx]'") from e
    model = _Exporter(graph, opset).build()
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


class _Exporter:
    def __init__(self, graph: Graph, opset: int):
        import onnx

        self.onnx = onnx
        self.graph = graph
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict[Value, str] = {}
        self._taken: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def name_of(self, value: Value) -> str:
        name = self.names.get(value)
        if name is None:
            if value.data is None:
                raise ExportError(
                    f"%{value.name} is read before it is computed",
                    hint="the graph is not in topological order: run gawee.verify(graph)",
                )
            if not value.has_known_data:
                raise ExportError(
                    f"constant %{value.name} has no values (meta-device capture)",
                    hint="capture the model with real weights to export it",
                )
            name = self.names[value] = self.add_initializer(value.data, value.name)
        return name

    def add_initializer(self, data: torch.Tensor, base: str) -> str:
        name = self.fresh(base)
        dtype = DType.from_torch(data.dtype)
        data = data.detach().cpu().contiguous()
        raw = (data.view(torch.int16) if dtype is DType.bf16 else data).numpy().tobytes()
        self.initializers.append(self.onnx.helper.make_tensor(name, _ELEM_TYPE[dtype], list(data.shape), raw, raw=True))
        return name

    def add_node(
        self, op_type: str, inputs: list[str], n_outputs: int, base: str, attrs: Mapping[str, Any]
    ) -> list[str]:
        outputs = [self.fresh(base if n_outputs == 1 else f"{base}_{i}") for i in range(n_outputs)]
        while inputs and inputs[-1] == "":  # absent trailing optional inputs are left out
            inputs.pop()
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(
            self.onnx.helper.make_node(op_type, inputs, outputs, name=self.fresh(f"{base}_{op_type}"), **attrs)
        )
        return outputs

    def lower(self, ctx: OnnxLowering) -> str | list[str]:
        spec = ONNX.get(ctx.opdef.name)
        if ctx.opdef.name == OPAQUE:
            raise ExportError(
                f"node {ctx.node.name} is an opaque ATen call ({ctx.attrs['target']})",
                where=ctx.node.name,
                hint="opaque nodes run through torch only; give the op an OpDef",
            )
        if spec is None:
            raise ExportError(
                f"op {ctx.opdef.name} has no ONNX lowering (node {ctx.node.name})",
                where=ctx.node.name,
                hint=f'add `@ONNX.register("{ctx.opdef.name}")` to the ONNX table (gawee/backend/lower_onnx/)',
            )
        if isinstance(spec, str):
            return ctx.emit(spec, *(ctx.x(i) for i in range(ctx.arity)))
        return spec(ctx)

    def build(self):
        helper = self.onnx.helper
        inputs = []
        for value in self.graph.inputs:
            self.names[value] = self.fresh(value.name)
            inputs.append(self._value_info(self.names[value], value.type))
        for node in self.graph:
            outs = [v.type for v in node.outputs]
            if outs and all(not has_symbols(t.shape) and 0 in t.shape for t in outs):
                # no elements to compute: ONNX Runtime refuses some ops an empty result (a transposed convolution)
                ctx = OnnxLowering(self, node, get_op(node.op))
                result = [ctx.constant(torch.empty(t.shape, dtype=t.dtype.torch)) for t in outs]
            else:
                result = self.lower(OnnxLowering(self, node, get_op(node.op)))
            results = [result] if isinstance(result, str) else list(result)
            if len(results) != len(node.outputs):
                raise ExportError(
                    f"the ONNX lowering of {node.op} gave {len(results)} outputs for {len(node.outputs)}",
                    where=node.name,
                )
            for value, name in zip(node.outputs, results):
                self.names[value] = name
        outputs, produced = [], {o for n in self.nodes for o in n.output}
        graph_inputs = {self.names[v] for v in self.graph.inputs}
        for value in self.graph.outputs:
            name = self.name_of(value)
            if name not in produced or name in graph_inputs or name in {o.name for o in outputs}:
                name = self.add_node("Identity", [name], 1, f"{value.name}_out", {})[0]
            outputs.append(self._value_info(name, value.type))
        g = helper.make_graph(self.nodes, self.graph.name, inputs, outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(g, opset_imports=opsets, producer_name="gawee")
        model.ir_version = helper.find_min_ir_version_for(opsets)
        return model

    def _value_info(self, name: str, t: TensorType):
        """A typed graph input/output; a symbolic dimension becomes a named dynamic axis (``dim_param``)."""
        dims = [d if isinstance(d, int) else text(d) for d in t.shape]
        return self.onnx.helper.make_tensor_value_info(name, _ELEM_TYPE[t.dtype], dims)

    def size(self, expr, ctx: OnnxLowering) -> str:
        """A 1-element int64 tensor holding a symbolic size: a ``Shape`` slice of the graph input where the
        symbol stands alone, combined by the expression's arithmetic (``Add``, ``Mul``, floor ``Div``)."""
        import sympy

        if isinstance(expr, int) or (isinstance(expr, sympy.Basic) and expr.is_Integer):
            return ctx.ints([int(expr)])
        if isinstance(expr, Sym):
            for value in self.graph.inputs:
                for i, d in enumerate(value.shape):
                    if d == expr:
                        return ctx.emit("Shape", self.names[value], start=i, end=i + 1)
            ctx.fail(f"symbol {expr} is no dimension of a graph input")
        ops = {sympy.Add: "Add", sympy.Mul: "Mul"}
        op = ops.get(type(expr))
        if op is None and type(expr).__name__ == "FloorDiv":
            op = "Div"  # sizes are non-negative: integer division floors
        if op is None:
            ctx.fail(f"the size {expr} has no ONNX arithmetic here")
        parts = [self.size(a, ctx) for a in expr.args]
        out = parts[0]
        for p in parts[1:]:
            out = ctx.emit(op, out, p)
        return out
