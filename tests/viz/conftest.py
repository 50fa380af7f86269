"""Small graphs for the picture tests: a conv block the bundled rules fold and fuse."""

from __future__ import annotations

import pytest
import torch

import gawee
from gawee.ir.builder import GraphBuilder


def conv_block() -> gawee.Graph:
    """conv → batch_norm → relu → conv → batch_norm → add(residual) → relu, then a split and a mul by 2."""
    torch.manual_seed(0)
    b = GraphBuilder("block")
    x = b.input("x", "f32[1,4,8,8]")

    def conv_bn(v, name):
        w = b.const(torch.randn(4, 4, 3, 3) * 0.3, f"{name}.weight")
        y = b.conv2d(v, w, padding=[1, 1])
        stats = [
            b.const(t, f"{name}.{k}")
            for k, t in (
                ("gamma", torch.rand(4) + 0.5),
                ("beta", torch.randn(4)),
                ("mean", torch.randn(4)),
                ("var", torch.rand(4) + 0.5),
            )
        ]
        return b.batch_norm(y, *stats)

    h = b.relu(conv_bn(x, "c1"))
    y = b.relu(b.add(conv_bn(h, "c2"), x))
    lo, hi = b.split(y, split_sizes=[2, 2], dim=1)
    return b.output(b.mul(lo, 2.0), hi)


@pytest.fixture(scope="module")
def block():
    """(original graph, rewritten graph, rewrite report with a trace)."""
    graph = conv_block()
    optimized, report = gawee.rewrite(graph, trace=True)
    return graph, optimized, report
