"""gawee: a deep-learning graph compiler frontend whose optimizations are written as text.

The public API, re-exported from the modules that own each piece.
"""

from gawee import accel

accel.install()  # first: the engine's modules imported below load compiled where built (gawee.accel)

from gawee.analysis import constant_values, cost, infer_types, peak_memory, topological_order
from gawee.backend.compile_report import CompileReport
from gawee.backend.compiler import compile
from gawee.backend.onnx import to_onnx
from gawee.backend.stablehlo import to_mlir
from gawee.backend.torch_backend import TorchOptions, to_torch
from gawee.dsl.library import Helper
from gawee.equivalence import EquivalenceReport, assert_equivalent, verify_equivalent
from gawee.errors import GaweeError
from gawee.frontend.capture import CaptureStats, capture
from gawee.interp import run
from gawee.ir.core import Graph, Node, Use, Value
from gawee.ir.serialize import load
from gawee.ir.types import DType, Layout, TensorType
from gawee.ir.verify import verify
from gawee.resources import VERSION
from gawee.rewrite.driver import RewriteReport, rewrite
from gawee.rewrite.explain import explain
from gawee.rewrite.ruleset import RuleSet, default_rules, load_rules, load_rules_text

__version__ = VERSION

__all__ = [
    "CaptureStats",
    "CompileReport",
    "DType",
    "EquivalenceReport",
    "GaweeError",
    "Graph",
    "Helper",
    "Layout",
    "Node",
    "RewriteReport",
    "RuleSet",
    "TensorType",
    "TorchOptions",
    "Use",
    "Value",
    "assert_equivalent",
    "capture",
    "compile",
    "constant_values",
    "cost",
    "default_rules",
    "explain",
    "infer_types",
    "load",
    "load_rules",
    "load_rules_text",
    "peak_memory",
    "rewrite",
    "run",
    "to_mlir",
    "to_onnx",
    "to_torch",
    "topological_order",
    "verify",
    "verify_equivalent",
]
