"""gawee.backend.layout: the activation layout of a graph's convolutions, chosen by measurement."""

from __future__ import annotations

import time

import pytest
import torch

import gawee
from gawee.backend import TorchOptions, layout, to_torch
from gawee.errors import GaweeError
from gawee.ir.builder import GraphBuilder
from tests.backend.test_torch_backend import assert_matches_reference, fused_conv_graph


def test_measured_layout_is_recorded_and_the_module_matches_the_reference():
    graph = fused_conv_graph()
    module = to_torch(graph)  # the default: measure
    choice = module.gawee_layout
    assert choice.layout in ("contiguous", "channels_last")
    assert choice.convolutions == sum(n.op == "conv2d" for n in graph) > 0
    assert choice.contiguous_s > 0 and choice.channels_last_s > 0
    assert "channels-last" in str(choice) and "NCHW" in str(choice)
    assert_matches_reference(graph, module)


def test_forced_layouts_are_not_measured():
    graph = fused_conv_graph()
    for forced in (False, True):
        module = to_torch(graph, TorchOptions(channels_last=forced))
        assert module.gawee_layout is None
        assert ("to_layout" in module.code) is forced  # the phase's conversions, nothing else
        assert_matches_reference(graph, module)


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def test_the_phase_runs_every_convolution_on_channels_last_activations():
    """to_torch honours each value's layout: with the phase every convolution reads NHWC activations
    (the input converted once); without it the input reaches the first convolution as it is, NCHW.
    (oneDNN may return NHWC from an NCHW convolution: only the inputs are checked.)"""
    graph = fused_conv_graph()
    for forced in (False, True):
        module = to_torch(graph, TorchOptions(channels_last=forced))
        seen = []
        interp = torch.fx.Interpreter(module)
        run_node = interp.run_node

        def record(n, run_node=run_node):
            if n.op == "call_function" and "convolution" in str(n.target):
                seen.append(_is_channels_last(interp.env[n.args[0]]))
            return run_node(n)

        interp.run_node = record
        with torch.no_grad():
            interp.run(*[torch.randn(v.shape) for v in graph.inputs])
        assert len(seen) == sum(n.op == "conv2d" for n in graph)
        assert all(seen) if forced else not seen[0]


def test_graphs_without_convolutions_are_not_measured():
    b = GraphBuilder("mlp")
    x = b.input("x", "f32[2,4]")
    graph = b.output(b.relu(b.linear(x, b.const(torch.randn(3, 4)), b.const(torch.randn(3)))))
    assert to_torch(graph).gawee_layout is None


def test_a_graph_whose_convolutions_are_a_sliver_of_its_flops_is_not_measured():
    """A patch embedding before large linears (a vision transformer): NCHW, no candidate built or timed."""
    b = GraphBuilder("patches")
    x = b.input("x", "f32[1,3,32,32]")
    patches = b.conv2d(x, b.const(torch.randn(8, 3, 4, 4)), None, stride=[4, 4])  # 8 x 8 x 8 = 512 features
    h = b.reshape(patches, shape=[1, 512])
    graph = b.output(b.linear(b.linear(h, b.const(torch.randn(4096, 512))), b.const(torch.randn(512, 4096))))
    assert layout.conv_share(graph) < layout.CONV_SHARE
    built = []
    module, choice = layout.choose(graph, lambda g: built.append(g) or to_torch(g, TorchOptions(channels_last=False)))
    assert built == [graph] and choice.layout == "contiguous" and choice.contiguous_s is None
    assert choice.convolutions == 1 and "not measured" in str(choice)
    assert_matches_reference(graph, module)
    assert layout.conv_share(fused_conv_graph()) > layout.CONV_SHARE  # the graph the measuring tests use


def test_bad_layout_option_is_a_typed_error():
    with pytest.raises(GaweeError, match="channels_last"):
        to_torch(fused_conv_graph(), TorchOptions(channels_last="nhwc"))


class _Sleeper(torch.nn.Module):
    def __init__(self, seconds: float, graph):
        super().__init__()
        self.seconds, self.channels_last = seconds, any(n.op == "to_layout" for n in graph)

    def forward(self, *xs):
        time.sleep(self.seconds)
        return xs


@pytest.mark.parametrize("nchw_s, nhwc_s, expected", [(0.02, 0.001, "channels_last"), (0.001, 0.02, "contiguous")])
def test_the_faster_layout_wins(nchw_s, nhwc_s, expected):
    """The decision, on modules whose time is known (sleeps: no CPU-dependent digits)."""
    graph = fused_conv_graph()
    module, choice = layout.choose(graph, lambda g: _Sleeper(nhwc_s if g is not graph else nchw_s, g))
    assert choice.layout == expected and module.channels_last is (expected == "channels_last")


def test_a_tie_keeps_nchw():
    graph = fused_conv_graph()
    module, choice = layout.choose(graph, lambda g: _Sleeper(0.01, g))
    assert choice.layout == "contiguous" and not module.channels_last


def test_compile_report_lists_the_layout():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    module = gawee.compile(model, (torch.randn(1, 3, 16, 16),), options=TorchOptions(whole_graph=False))
    assert module.gawee_report.layout is module.gawee_layout is not None
    assert "layout: activations" in str(module.gawee_report)


def _conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1)
    ).eval()


def test_the_default_compile_times_the_torch_layouts_beside_the_runtimes_once(monkeypatch):
    # one measurement settles the torch lowering's layout and the runtime: the layouts are not timed on their
    # own first (that measurement cost the compile as much as the whole-graph one)
    from gawee.backend import measure
    from gawee.backend.measure import Timings

    def not_alone(*args, **kwargs):
        raise AssertionError("the layouts were timed on their own")

    timed = []

    def scripted(candidates, xs, **kwargs):  # channels-last torch wins, whatever the clock says
        timed.append(list(candidates))
        seconds = {name: 0.5 if name == "torch:channels_last" else 1.0 for name in candidates}
        return Timings(seconds, "torch:channels_last")

    monkeypatch.setattr(layout, "fastest", not_alone)
    monkeypatch.setattr(measure, "fastest", scripted)
    model, x = _conv_net(), torch.randn(1, 3, 16, 16)
    module = gawee.compile(model, (x,))
    assert len(timed) == 1 and timed[0][:2] == ["torch", "torch:channels_last"] and len(timed[0]) > 2
    report = module.gawee_report
    assert report.backend.chosen == "torch:channels_last"
    choice = module.gawee_layout
    assert report.layout is choice and choice.layout == "channels_last"
    assert (choice.contiguous_s, choice.channels_last_s) == (1.0, 0.5)
    assert "to_layout" in module.code and report.backend_error < 1e-4
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("why", ["over the budget", "no runtime can run it"])
def test_the_torch_layouts_are_timed_alone_where_no_runtime_is(monkeypatch, why):
    from gawee.backend import compiler

    if why == "over the budget":
        monkeypatch.setattr(compiler, "WHOLE_GRAPH_CALLS", 10**9)
    else:
        monkeypatch.setattr(compiler, "_whole_graph_runtimes", lambda graph, lowered, spent: ([], {}))
    alone = []
    fastest = layout.fastest

    def counted(candidates, xs, **kwargs):
        alone.append(list(candidates))
        return fastest(candidates, xs, **kwargs)

    monkeypatch.setattr(layout, "fastest", counted)
    model, x = _conv_net(), torch.randn(1, 3, 16, 16)
    module = gawee.compile(model, (x,))
    assert alone == [["contiguous", "channels_last"]]
    assert module.gawee_report.backend.chosen == "torch" and module.gawee_report.layout is module.gawee_layout
    assert module.gawee_layout.contiguous_s > 0 and module.gawee_layout.channels_last_s > 0
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-4)
