"""batch_norm_training: weight standardization (timm's StdConv2d, NFNets) binds to an op that folding removes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.ops import OPAQUE


class StandardizedConv(torch.nn.Module):
    """A convolution whose weight is standardized per output channel on every call, as NFNets do. The weight
    is past fold_constants' 2^18-element limit on growing constants: the fold must count only the normalized
    weight (the statistics are unused), which replaces the weight one for one."""

    def __init__(self, out=512, inp=64):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out, inp, 3, 3))
        self.gain = torch.nn.Parameter(torch.rand(out, 1, 1, 1) + 0.5)

    def forward(self, x):
        n = self.weight.shape[0]
        w = F.batch_norm(self.weight.reshape(1, n, -1), None, None, training=True, momentum=0.0, eps=1e-6)
        return torch.relu(F.conv2d(x, w.reshape_as(self.weight) * self.gain, padding=1))


def _ops(graph: gawee.Graph) -> list[str]:
    return [n.op for n in graph]


@pytest.mark.parametrize("make", [StandardizedConv, "timm"])
def test_weight_standardization_is_folded_away(make):
    if make == "timm":
        timm = pytest.importorskip("timm")
        model = torch.nn.Sequential(timm.layers.StdConv2d(3, 8, 3), torch.nn.ReLU())
    else:
        model = make()
    torch.manual_seed(0)
    x = torch.randn(2, model[0].in_channels if make == "timm" else 64, 4, 4)
    graph = gawee.capture(model.eval(), (x,))
    assert "batch_norm_training" in _ops(graph) and OPAQUE not in _ops(graph)
    out, _ = gawee.rewrite(graph, gawee.default_rules())
    assert "batch_norm_training" not in _ops(out), out
    assert gawee.peak_memory(out)[0] <= gawee.peak_memory(graph)[0]
    torch.testing.assert_close(gawee.run(out, x)[0], model(x), rtol=1e-4, atol=1e-5)


class Statistics(torch.nn.Module):
    """All three results of ATen's batch norm by batch statistics, on a computed input."""

    def forward(self, x):
        return torch.ops.aten._native_batch_norm_legit.no_stats(x * 2, None, None, True, 0.1, 1e-5)


def test_all_three_outputs_are_bound_and_export_to_onnx():
    ort = pytest.importorskip("onnxruntime")
    x = torch.randn(2, 4, 5)
    graph = gawee.capture(Statistics(), (x,))
    assert _ops(graph) == ["mul", "batch_norm_training"]
    want = Statistics()(x)
    for got, expected in zip(gawee.run(graph, x), want):
        torch.testing.assert_close(got, expected)
    session = ort.InferenceSession(gawee.to_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    for got, expected in zip(session.run(None, {session.get_inputs()[0].name: x.numpy()}), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)


def test_half_inputs_keep_float32_statistics_as_inference_says():
    g = gawee.Graph("half")
    x = g.add_input(gawee.TensorType((2, 3, 4), gawee.DType.f16), "x")
    node = g.create_node("batch_norm_training", [x, None, None], {"eps": 1e-5})
    half = torch.randn(2, 3, 4, dtype=torch.float16)
    got = gawee.ops.get_op("batch_norm_training").run([half, None, None], node.attrs)
    assert [gawee.TensorType.of(t) for t in got] == [v.type for v in node.outputs]
    assert [v.type.dtype for v in node.outputs] == [gawee.DType.f16, gawee.DType.f32, gawee.DType.f32]


def test_batch_statistics_of_an_activation_bind_and_lower_to_stablehlo():
    """``F.batch_norm(x, None, None, training=True)`` exports as ``aten.batch_norm.default``, one result against
    the op's three: the binding checks the results the call has (it was kept opaque), and StableHLO lowers it."""
    from gawee.backend.stablehlo import to_mlir

    class Normalize(torch.nn.Module):
        def forward(self, x):
            return F.batch_norm(x, None, None, training=True, eps=1e-5) * 2

    x = torch.randn(2, 3, 4, 5)
    graph = gawee.capture(Normalize(), (x,))
    assert _ops(graph) == ["batch_norm_training", "mul"]
    np.testing.assert_allclose(gawee.run(graph, x)[0], Normalize()(x), atol=1e-5)
    assert "stablehlo.rsqrt" in str(to_mlir(graph))
