"""ONNX Runtime as a backend: the rewritten graph, exported by :func:`gawee.to_onnx`, run by an ORT session.

Why a second runtime beside the torch lowering: which kernels are fastest depends on the CPU. On an
AVX-512 machine, ONNX Runtime's MLAS convolutions in its channel-blocked layout (the NCHWc
transformer, weights reordered once at session start) ran mobilenet_v3_large at batch 1 in half the
time of oneDNN's fused convolutions as torch reaches them (whole calls; why is open, see
benchmarks/README.md); on an AVX2 machine the torch lowering tied or beat it. So
``gawee.compile(backend="auto")`` builds both and keeps the one measured faster on this machine
(:func:`gawee.backend.measure.fastest`); ``backend="onnxruntime"`` asks for this one.

The session runs with all of ORT's graph optimizations (its layout transformer and fusions run on
gawee's graph), ``torch.get_num_threads()`` intra-op threads, and ORT's default spin-waiting
between calls (turning it off made mobilenet_v3_large's calls at batch 1 half as slow again on that machine),
which keeps the cores busy for a while after each call.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from gawee.backend.host import InputSignature, arrange, as_structure, numpy_inputs
from gawee.backend.runtime import Runtime
from gawee.errors import GaweeError, first_line
from gawee.ir.core import Graph
from gawee.ir.types import DType


def unavailable() -> str | None:
    """Why this runtime cannot run here (onnx or onnxruntime is not installed), or None."""
    for package in ("onnx", "onnxruntime"):
        try:
            importlib.import_module(package)
        except ModuleNotFoundError:
            return f"{package} is not installed: pip install 'gawee[onnx]'"
    return None


def supports(graph: Graph) -> str | None:
    """Why ``graph`` cannot run on this backend, or None if it can: static shapes, numpy-typed values."""
    if any(v.type.symbolic for v in graph.inputs):
        return "symbolic input shapes (the ONNX export fixes every size)"
    if any(v.dtype is DType.bf16 for v in (*graph.inputs, *graph.outputs)):
        return "bf16 inputs or outputs (no numpy form for ORT's Python API)"
    return None


class OrtModule(torch.nn.Module):
    """An ONNX Runtime session on the rewritten graph: call it with torch tensors, get torch tensors back.

    Returns the outputs as a tuple, like :func:`gawee.run`, or arranged as ``output_structure``
    (a pytree spec: the model's own nesting, as :func:`gawee.compile` passes it).
    """

    def __init__(self, graph: Graph, *, output_structure: Any = None, threads: int | None = None):
        super().__init__()
        why = unavailable()
        if why is not None:
            raise RUNTIME.unavailable_error(why)
        import onnxruntime as ort

        from gawee.backend.onnx import to_onnx

        why = supports(graph)
        if why is not None:
            raise GaweeError(f"{graph.name} cannot run on ONNX Runtime: {why}", hint='use backend="torch"')
        model = to_onnx(graph)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.log_severity_level = 3  # ORT's warnings about the layout it chose are not the user's
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT's own errors (a kernel missing for a dtype, say) are not gawee's types
            raise GaweeError(
                f"ONNX Runtime cannot load {graph.name}: {first_line(e)}", hint='use backend="torch"'
            ) from None
        self.signature = InputSignature.of(graph)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_structure = None if output_structure is None else as_structure(output_structure)
        self.gawee_report = None

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        arrays = numpy_inputs(self.signature.inputs(args, kwargs), self.signature.types, "ONNX Runtime")
        results = self.session.run(None, dict(zip(self.input_names, arrays)))
        return arrange([torch.from_numpy(r) for r in results], self.output_structure)


class OrtRuntime(Runtime):
    """ONNX Runtime on gawee's ONNX export (:class:`OrtModule`); not tried apart: an ORT session checks what it is
    given and raises."""

    name = "onnxruntime"
    title = "ONNX Runtime"

    def unavailable(self) -> str | None:
        return unavailable()

    def cannot_run(self, graph: Graph) -> str | None:
        return supports(graph)

    def build(self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, output_structure: Any = None) -> OrtModule:
        return OrtModule(graph, output_structure=output_structure)

    def unavailable_error(self, why: str) -> Exception:
        return ModuleNotFoundError(f"the onnxruntime backend needs ONNX Runtime: {why}")


RUNTIME = OrtRuntime()
