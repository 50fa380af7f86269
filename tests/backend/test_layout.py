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
        assert ("channels_last" in module.code) is forced
        assert_matches_reference(graph, module)


def test_graphs_without_convolutions_are_not_measured():
    b = GraphBuilder("mlp")
    x = b.input("x", "f32[2,4]")
    graph = b.output(b.relu(b.linear(x, b.const(torch.randn(3, 4)), b.const(torch.randn(3)))))
    assert to_torch(graph).gawee_layout is None


def test_bad_layout_option_is_a_typed_error():
    with pytest.raises(GaweeError, match="channels_last"):
        to_torch(fused_conv_graph(), TorchOptions(channels_last="nhwc"))


class _Sleeper(torch.nn.Module):
    def __init__(self, seconds: float, channels_last: bool):
        super().__init__()
        self.seconds, self.channels_last = seconds, channels_last

    def forward(self, *xs):
        time.sleep(self.seconds)
        return xs


@pytest.mark.parametrize("nchw_s, nhwc_s, expected", [(0.02, 0.001, "channels_last"), (0.001, 0.02, "contiguous")])
def test_the_faster_layout_wins(nchw_s, nhwc_s, expected):
    """The decision, on modules whose time is known (sleeps: no CPU-dependent digits)."""
    graph = fused_conv_graph()
    module, choice = layout.choose(graph, lambda cl: _Sleeper(nhwc_s if cl else nchw_s, cl))
    assert choice.layout == expected and module.channels_last is (expected == "channels_last")


def test_a_tie_keeps_nchw():
    graph = fused_conv_graph()
    module, choice = layout.choose(graph, lambda cl: _Sleeper(0.01, cl))
    assert choice.layout == "contiguous" and not module.channels_last


def test_compile_report_lists_the_layout():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    module = gawee.compile(model, (torch.randn(1, 3, 16, 16),))
    assert module.gawee_report.layout is module.gawee_layout is not None
    assert "layout: activations" in str(module.gawee_report)
