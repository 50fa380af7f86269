"""gawee: a deep-learning graph compiler frontend whose optimizations are written as text.

The public API, re-exported from the modules that own each piece.
"""

from gawee.analysis import constant_values, cost, infer_types, peak_memory, topological_order
from gawee.errors import GaweeError
from gawee.frontend.capture import CaptureStats, capture
from gawee.interp import run
from gawee.ir.core import Graph, Node, Use, Value
from gawee.ir.serialize import load
from gawee.ir.types import DType, Layout, TensorType
from gawee.ir.verify import verify

__version__ = "0.1.0"

__all__ = [
    "CaptureStats", "DType", "GaweeError", "Graph", "Layout", "Node", "TensorType", "Use", "Value",
    "capture", "constant_values", "cost", "infer_types", "load", "peak_memory", "run", "topological_order",
    "verify",
]
