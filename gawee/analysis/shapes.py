"""Shape and dtype inference through the registry, compared with the types a graph records."""

from __future__ import annotations

from dataclasses import dataclass

from gawee.errors import InferenceError
from gawee.ir.core import Graph, Node
from gawee.ir.types import TensorType
from gawee.ops import OPAQUE, get_op


@dataclass(frozen=True)
class TypeMismatch:
    node: Node
    recorded: tuple[TensorType, ...]
    inferred: tuple[TensorType, ...]

    def __str__(self) -> str:
        rec = ", ".join(map(str, self.recorded))
        inf = ", ".join(map(str, self.inferred))
        return f"{self.node.name} ({self.node.op}): recorded {rec}, inferred {inf}"


def infer_types(graph: Graph) -> list[TypeMismatch]:
    """Re-infer every node's output types from its operand types (opaque nodes keep theirs).

    Inference runs forward on the *inferred* operand types, so an error propagates
    to where it starts. Returns the nodes whose recorded shape or dtype differs.
    """
    inferred: dict = {}
    mismatches: list[TypeMismatch] = []
    for node in graph:
        in_types = [None if v is None else inferred.get(v, v.type) for v in node.inputs]
        if node.op == OPAQUE:
            outs = [v.type for v in node.outputs]
        else:
            outs = get_op(node.op).infer_types(in_types, node.attrs)
        for v, t in zip(node.outputs, outs):
            inferred[v] = t
        recorded = tuple(v.type for v in node.outputs)
        if len(outs) != len(recorded) or any(not a.same_shape_dtype(b) for a, b in zip(outs, recorded)):
            mismatches.append(TypeMismatch(node, recorded, tuple(outs)))
    return mismatches


def check_types(graph: Graph) -> None:
    """Raise InferenceError naming the first node whose recorded type disagrees with inference."""
    bad = infer_types(graph)
    if bad:
        raise InferenceError(f"{len(bad)} node(s) disagree with inference; first: {bad[0]}")
