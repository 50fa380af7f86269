"""oneDNN Graph as a runtime: the rewritten graph traced into TorchScript and compiled into fused partitions.

The torch lowering calls one oneDNN primitive per node through torch's operator, which rebuilds the
primitive's descriptor on every call: about 18 µs per convolution on the machines measured, against 2 µs
of oneDNN's own execution (``ONEDNN_VERBOSE``) and 4 µs for ONNX Runtime's whole call of a one-convolution
session (``benchmarks/conv_overhead.py``). On a small CNN that fixed cost is a third of the time
(mobilenet_v3_large has 62 convolutions). TorchScript's oneDNN Graph fuser (``torch.jit.enable_onednn_fusion``)
instead compiles each fusible subgraph (convolution + activation + add, pools, ...) once, after two
profiling runs, and executes the compiled partitions: the per-call cost is gone and whole models run close
to ONNX Runtime. gawee traces its reference interpreter over the rewritten graph (every op's torch
semantics), freezes it, and runs the profiling calls with the fuser on (the flag is restored afterwards: the
compiled plan stays with the module). Static shapes and float32 only; ``backend="auto"`` measures it against
the torch lowering and ONNX Runtime (:func:`gawee.backend.compiler.compile`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch

from gawee.backend.host import arrange, check_inputs
from gawee.errors import GaweeError
from gawee.ir.core import Graph
from gawee.ir.types import DType, TensorType

PROFILING_RUNS = 3
"""Calls made while fusion is on: TorchScript's profiling executor records shapes on the first two and
compiles the fused partitions on the next."""


TRIAL = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)).eval()
x = torch.randn(1, 3, 8, 8)
with torch.no_grad():
    ref = net(x)
    torch.jit.enable_onednn_fusion(True)
    scripted = torch.jit.freeze(torch.jit.trace(net, x))
    for _ in range(3):
        scripted(x)
    torch.testing.assert_close(scripted(x), ref, rtol=1e-4, atol=1e-4)
print("ok")
"""
"""A small traced network compiled and run by the fuser, in a child process."""


@cache
def available() -> bool:
    """Whether this torch has TorchScript's oneDNN Graph fuser (x86 and Arm builds with MKLDNN) and it runs here.

    The fuser is native code on a path torch itself no longer exercises much: it is first tried on a small
    network in a child process (about 2 s, once per process), so that a CPU on which it crashes or computes
    wrongly loses a candidate runtime instead of the process."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.jit, "enable_onednn_fusion")):
        return False
    try:
        trial = subprocess.run([sys.executable, "-c", TRIAL], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return trial.returncode == 0 and trial.stdout.strip().endswith("ok")


def supports(graph: Graph) -> str | None:
    """Why ``graph`` cannot run on oneDNN Graph here, or None: static shapes, float32 tensors only."""
    if not available():
        return "this torch has no oneDNN Graph fuser, or it failed its trial run on this machine"
    values = [*graph.inputs, *(o for n in graph for o in n.outputs)]
    if any(v.type.symbolic for v in values):
        return "oneDNN Graph compiles static shapes only"
    if any(v.type.dtype.is_float and v.type.dtype is not DType.f32 for v in values):
        return "oneDNN Graph is used for float32 graphs only"
    return None


class _Interpreted(torch.nn.Module):
    """The reference interpreter over ``graph``: what torch.jit.trace records, op by op, as ATen calls."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from gawee.interp import run

        return tuple(run(self.graph, *inputs))


@contextlib.contextmanager
def _fusion(enabled: bool):
    before = torch.jit.onednn_fusion_enabled()
    torch.jit.enable_onednn_fusion(enabled)
    try:
        yield
    finally:
        torch.jit.enable_onednn_fusion(before)


class OneDNNGraphModule(torch.nn.Module):
    """``graph`` traced, frozen and compiled by oneDNN Graph for ``example_inputs``' shapes: a callable taking
    and returning torch tensors (outputs nested as ``output_structure``, a pytree spec, when given)."""

    def __init__(self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, output_structure: Any = None):
        super().__init__()
        why = supports(graph)
        if why is not None:
            raise GaweeError(f"{graph.name} cannot run on oneDNN Graph: {why}", hint='use backend="torch"')
        xs = tuple(example_inputs)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on constants it records: the graph's weights
            self.scripted = torch.jit.freeze(torch.jit.trace(_Interpreted(graph).eval(), xs, check_trace=False))
            with _fusion(True):
                for _ in range(PROFILING_RUNS):
                    self.scripted(*xs)
                plan = str(torch.jit.last_executed_optimized_graph())
        self.partitions = plan.count("prim::oneDNNFusionGroup")
        """How many fused partitions oneDNN Graph compiled (0: it fused nothing; the module runs op by op)."""
        self.input_types: list[TensorType] = [v.type for v in graph.inputs]
        self.output_structure = output_structure
        self.gawee_report = None

    def forward(self, *inputs: torch.Tensor):
        check_inputs(inputs, self.input_types)
        with torch.no_grad():
            return arrange(list(self.scripted(*inputs)), self.output_structure)
