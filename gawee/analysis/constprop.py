"""Constant propagation: which values are known at compile time."""

from __future__ import annotations

from gawee.ir.core import Graph, Value
from gawee.ops import get_op


def constant_values(graph: Graph) -> set[Value]:
    """Values computable before any input is seen: constants, and outputs of pure ops
    (creation ops included) whose operands are all such values.

    Nothing is evaluated; folding them is the job of the `fold` rules.
    """
    known: set[Value] = set(graph.constants())
    for node in graph:
        if not get_op(node.op).has_trait("pure"):
            continue
        if all(v is None or v in known for v in node.inputs):
            known.update(node.outputs)
    return known
