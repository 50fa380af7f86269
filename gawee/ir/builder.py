"""GraphBuilder: write graphs in Python as compactly as in text (``b.conv2d(x, w, padding=[1, 1])``)."""

from __future__ import annotations

from typing import Any

import torch

from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType, TensorType


def parse_type(text: str) -> TensorType:
    """``"f32[1,3,224,224]"`` → TensorType."""
    dtype, _, rest = text.partition("[")
    dims = rest.rstrip("]").strip()
    return TensorType(tuple(int(d) for d in dims.split(",")) if dims else (), DType.parse(dtype))


class GraphBuilder:
    """Appends nodes to a new Graph. Any registered op is a method: ``b.relu(x)``.

    A method returns the output Value (or a tuple for multi-output ops); Python
    numbers among the operands become 0-d constants of a matching dtype.
    """

    def __init__(self, name: str = "graph"):
        self.graph = Graph(name)
        self.source = ""

    def input(self, name: str, type: TensorType | str) -> Value:
        return self.graph.add_input(parse_type(type) if isinstance(type, str) else type, name)

    def const(self, data: torch.Tensor | float | int | bool, name: str = "const") -> Value:
        if not isinstance(data, torch.Tensor):
            data = torch.tensor(data)
        return self.graph.constant(data, name)

    def output(self, *values: Value) -> Graph:
        self.graph.set_outputs(values)
        return self.graph

    def node(self, op: str, *inputs: Value | float | None, name: str | None = None, **attrs: Any) -> Node:
        ref = next((v for v in inputs if isinstance(v, Value)), None)
        operands = [self._operand(v, ref) for v in inputs]
        return self.graph.create_node(op, operands, attrs, name=name, source=self.source)

    def _operand(self, v, ref: Value | None):
        if v is None or isinstance(v, Value):
            return v
        dtype = ref.dtype.torch if ref is not None and ref.dtype.is_float else None
        return self.const(torch.tensor(v, dtype=dtype), "scalar")

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)

        def make(*inputs, name: str | None = None, **attrs):
            node = self.node(op, *inputs, name=name, **attrs)
            return node.outputs[0] if len(node.outputs) == 1 else node.outputs

        return make
