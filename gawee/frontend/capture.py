"""torch.export capture: an nn.Module and example inputs → a gawee Graph."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from gawee.errors import CaptureError
from gawee.frontend.aten import NodeConverter, recorded_types
from gawee.ir.core import Graph
from gawee.ops import OPAQUE


@dataclass
class CaptureStats:
    """Where capture time went, and what could not be mapped onto the registry."""

    export_s: float = 0.0
    """torch.export.export."""
    decompose_s: float = 0.0
    """run_decompositions({}): functionalization only (no op is decomposed)."""
    convert_s: float = 0.0
    """gawee's own conversion of the exported graph."""
    opaque_ops: dict[str, int] = field(default_factory=dict)
    dropped_checks: dict[str, int] = field(default_factory=dict)
    """No-result runtime checks export emitted (``aten._assert_tensor_metadata``...), dropped."""
    warnings: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.export_s + self.decompose_s + self.convert_s

    def seconds(self) -> dict[str, float]:
        """The timings, rounded for reports (``{}`` when nothing was captured, e.g. a graph loaded from a file)."""
        if not self.total_s:
            return {}
        return {k: round(getattr(self, k), 4) for k in ("export_s", "decompose_s", "convert_s")}


def export_program(model: torch.nn.Module, example_inputs: Sequence) -> tuple[ExportedProgram, float, float]:
    """torch.export in eval mode, then functionalize. Raises CaptureError saying why and where."""
    model = model.eval()
    t0 = time.perf_counter()
    try:
        ep = torch.export.export(model, tuple(example_inputs))
    except Exception as e:  # torch.export raises many unrelated types; all mean "cannot capture"
        raise CaptureError(_export_failure(e), hint=_export_hint(e)) from e
    t1 = time.perf_counter()
    try:
        ep = ep.run_decompositions({})
    except Exception as e:  # same: any failure here is a capture failure of this model
        raise CaptureError(f"functionalization failed: {_first_line(e)}") from e
    return ep, t1 - t0, time.perf_counter() - t1


def capture(
    model: torch.nn.Module, example_inputs: Sequence, *, name: str | None = None, stats: CaptureStats | None = None
) -> Graph:
    """Capture ``model`` (put in eval mode) on ``example_inputs`` into a Graph.

    Parameters and buffers become constant Values (meta-device models give meta
    constants: structure and cost work, numbers do not). ATen ops without an OpDef
    become opaque ``aten`` nodes. Raises CaptureError when torch.export fails.
    """
    stats = stats if stats is not None else CaptureStats()
    ep, stats.export_s, stats.decompose_s = export_program(model, example_inputs)
    t0 = time.perf_counter()
    graph = from_exported_program(ep, name or type(model).__name__, stats)
    stats.convert_s = time.perf_counter() - t0
    # Timings go to ``stats`` (the CLI reports them), never into the graph: a saved graph is a pure function
    # of the model (and rules), byte for byte.
    return graph


def from_exported_program(ep: ExportedProgram, name: str = "graph", stats: CaptureStats | None = None) -> Graph:
    """Convert a (functionalized) ExportedProgram into a Graph."""
    stats = stats if stats is not None else CaptureStats()
    graph = Graph(name)
    env: dict[torch.fx.Node, object] = {}
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    state = dict(ep.state_dict)
    state.update(ep.constants)
    converter = NodeConverter(graph, env, stats.warnings, stats.dropped_checks)
    for fx_node in ep.graph.nodes:
        if fx_node.op == "placeholder":
            spec = specs.get(fx_node.name)
            if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                data = state[spec.target]
                if isinstance(data, torch.nn.Parameter):
                    data = data.detach()
                env[fx_node] = graph.constant(data, spec.target)
            elif spec is None or spec.kind == InputKind.USER_INPUT:
                (t,) = recorded_types(fx_node)
                if t is None:
                    raise CaptureError(
                        f"input {fx_node.name} is not a tensor",
                        hint="pass tensors as example inputs; other values are baked in by export",
                    )
                env[fx_node] = graph.add_input(t, fx_node.name)
            else:
                raise CaptureError(f"unsupported input kind {spec.kind.name} for {fx_node.name}")
        elif fx_node.op == "call_function":
            converter.convert(fx_node)
        elif fx_node.op == "output":
            outs = []
            for spec, arg in zip(sig.output_specs, fx_node.args[0]):
                if spec.kind == OutputKind.USER_OUTPUT:
                    if not isinstance(arg, torch.fx.Node):
                        raise CaptureError(f"output {arg!r} is not a tensor", hint="return tensors from forward()")
                    outs.append(env[arg])
                else:
                    stats.warnings.append(f"ignored {spec.kind.name} output {spec.target}: gawee graphs are pure")
            graph.set_outputs(outs)
        else:
            raise CaptureError(
                f"unsupported exported node {fx_node.op} {fx_node.target}",
                hint="control flow (torch.cond, while_loop) is not supported yet",
            )
    for node in graph:
        if node.op == OPAQUE:
            t = node.attrs["target"]
            stats.opaque_ops[t] = stats.opaque_ops.get(t, 0) + 1
    return graph


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _export_failure(e: BaseException) -> str:
    """'why' is the first line of torch's message; 'where' is the innermost user frame it names."""
    text = str(e)
    why = _first_line(e)
    frames = _USER_FRAME.findall(text)
    if not frames:
        import traceback

        frames = [
            (f.filename, str(f.lineno), f.name)
            for f in traceback.extract_tb(e.__traceback__)
            if "site-packages/torch" not in f.filename and "/gawee/" not in f.filename
        ]
    where = f" (at {frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]})" if frames else ""
    return f"torch.export could not capture the model: {type(e).__name__}: {why}{where}"


def _export_hint(e: BaseException) -> str:
    text = str(e)
    if "data-dependent" in text or "GuardOnDataDependent" in type(e).__name__:
        return "the model branches on tensor values; use torch.cond or make the branch static"
    return "see https://pytorch.org/docs/stable/export.html for what torch.export supports"
