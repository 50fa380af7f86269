"""oneDNN Graph as a runtime: the rewritten graph traced, frozen and compiled into fused partitions."""

from __future__ import annotations

import pytest
import torch

import gawee
from gawee.backend import onednn_graph
from gawee.backend.onednn_graph import OneDNNGraphModule
from gawee.errors import GaweeError
from gawee.ir.builder import GraphBuilder
from tests.backend.test_ort import _net, assert_runs_like_the_net

needs_fuser = pytest.mark.skipif(not onednn_graph.available(), reason="no working oneDNN Graph fuser here")


@needs_fuser
def test_backend_compiles_fused_partitions_equal_to_the_model_and_restores_the_fuser_flag():
    net, x = _net()
    before = torch.jit.onednn_fusion_enabled()
    module = gawee.compile(net, (x,), backend="onednn_graph")
    assert torch.jit.onednn_fusion_enabled() == before
    assert isinstance(module, OneDNNGraphModule) and module.partitions > 0
    assert_runs_like_the_net(module, net)


@needs_fuser
def test_static_float32_graphs_only():
    b = GraphBuilder("half")
    half = b.output(b.relu(b.input("x", "f16[2,3]")))
    assert "float32" in onednn_graph.supports(half)
    with pytest.raises(GaweeError, match="float32 graphs only"):
        OneDNNGraphModule(half, [torch.randn(2, 3).half()])
    net, x = _net()
    graph = gawee.capture(net, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=8)}})
    assert "static shapes" in onednn_graph.supports(graph)


@needs_fuser
def test_auto_names_a_runtime_it_could_not_build(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise RuntimeError("tracer: something torch.jit cannot record")

    monkeypatch.setattr(OneDNNGraphModule, "__init__", refuse)
    net, x = _net()
    choice = gawee.compile(net, (x,), backend="auto").gawee_report.backend
    assert "torch.jit cannot record" in choice.not_candidates["onednn_graph"]
    assert "onednn_graph" not in choice.seconds


def test_a_fuser_that_crashes_its_trial_is_no_candidate(monkeypatch):
    """The trial runs in a child process: a fuser that aborts there leaves this process running, unavailable."""
    monkeypatch.setattr(onednn_graph, "TRIAL", "import os; os.abort()")
    onednn_graph.available.cache_clear()
    try:
        assert not onednn_graph.available()
        b = GraphBuilder("relu")
        assert "failed its trial run" in onednn_graph.supports(b.output(b.relu(b.input("x", "f32[2]"))))
    finally:
        monkeypatch.undo()
        onednn_graph.available.cache_clear()
