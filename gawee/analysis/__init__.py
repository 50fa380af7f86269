"""Analyses over a Graph: type inference, constant propagation, traversal, cost and liveness."""

from gawee.analysis.constprop import constant_values
from gawee.analysis.cost import CostReport, NodeCost, cost
from gawee.analysis.liveness import peak_memory
from gawee.analysis.shapes import TypeMismatch, check_types, infer_types
from gawee.analysis.traversal import topological_order

__all__ = [
    "CostReport",
    "NodeCost",
    "TypeMismatch",
    "check_types",
    "constant_values",
    "cost",
    "infer_types",
    "peak_memory",
    "topological_order",
]
