"""The ops transformer, ConvNeXt-V2 and video models emit: bindings, samplers, inference, lowerings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gawee
from gawee.equivalence import random_inputs
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType, TensorType
from gawee.ops import OPAQUE, get_op
from gawee.ops import sampling as S
from gawee.testing.generate import DataDraw

NEW_OPS = [
    "rms_norm",
    "batch_norm_training",
    "addcmul",
    "max_pool3d",
    "avg_pool3d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
]


def _data(t: TensorType) -> torch.Tensor:
    if t.dtype is DType.bool:
        return torch.rand(t.shape) > 0.5
    if t.dtype.is_float:
        return torch.randn(t.shape).to(t.dtype.torch)
    return torch.randint(-4, 5, t.shape, dtype=t.dtype.torch)


@pytest.mark.parametrize("name", NEW_OPS)
@given(data=st.data())
def test_sampled_instances_infer_what_they_evaluate_to(name, data):
    """Every draw of the sampler is a valid node whose inferred types are those torch computes."""
    op = get_op(name)
    draw = DataDraw(data, data.draw(st.sampled_from([DType.f32, DType.f64])))
    try:
        types, attrs = op.sample(draw, [S.FREE] * len(op.operands), {})
    except S.Reject:
        return
    g = gawee.Graph("one")
    ins = [None if t is None else g.add_input(t, f"x{i}") for i, t in enumerate(types)]
    node = g.create_node(name, ins, attrs)  # raises if the sampler drew an invalid instance
    xs = [_data(t) for t in types if t is not None]
    outs = op.run(xs, node.attrs)
    assert [TensorType.of(o) for o in outs] == [v.type for v in node.outputs]
    flops = op.flops([None if v is None else v.type for v in ins], [v.type for v in node.outputs], node.attrs)
    assert flops >= node.outputs[0].type.numel


def test_addcmul_flops_count_the_scaling_only_when_present():
    t = TensorType((2, 3), DType.f32)
    op = get_op("addcmul")
    assert op.flops([t, t, t], [t], {"value": 1}) == 2 * 6
    assert op.flops([t, t, t], [t], {"value": 0.5}) == 3 * 6


class Emitted(torch.nn.Module):
    """One of each ATen spelling that used to stay opaque in transformer/ConvNeXt-V2/video models."""

    def forward(self, x, y, m1, m2, v):
        a = x.pow(2) + y.pow(3.0) + torch.pow(2.0, x) + x.abs().pow(y)  # pow.Tensor_Scalar, .Scalar, .Tensor_Tensor
        b = torch.min(x, y) + torch.max(x, y)  # min.other, max.other
        masks = (m1 & m2) | (m1 ^ m2) | (m1 & True)  # __and__, __or__, __xor__ (Tensor and Scalar)
        c = torch.addcmul(x, y, a, value=0.5) + torch.addcmul(x, y, b)
        pooled = torch.nn.functional.adaptive_avg_pool3d(v, 1) + torch.nn.functional.adaptive_max_pool3d(v, (1, 2, 1))
        w = torch.nn.functional.max_pool3d(v, 2, padding=1) * 2 + torch.nn.functional.avg_pool3d(v, 2, 1)
        return c * masks, pooled, w


def _emitted_inputs():
    torch.manual_seed(0)
    return (
        torch.randn(3, 4),
        torch.randn(3, 4),
        torch.rand(3, 4) > 0.5,
        torch.rand(3, 4) > 0.5,
        torch.randn(1, 2, 4, 4, 4),
    )


def test_every_emitted_spelling_binds_to_an_opdef():
    xs = _emitted_inputs()
    stats = gawee.CaptureStats()
    g = gawee.capture(Emitted(), xs, stats=stats)
    assert stats.opaque_ops == {}
    ops = {n.op for n in g}
    assert {"pow", "minimum", "maximum", "bitwise_and", "bitwise_or", "bitwise_xor", "addcmul"} <= ops
    assert {"max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d"} <= ops
    with torch.no_grad():
        ref = Emitted()(*xs)
    for got, want in zip(gawee.run(g, *xs), ref):
        torch.testing.assert_close(got, want)
    for got, want in zip(gawee.to_torch(g)(*xs), ref):
        torch.testing.assert_close(got, want)
    assert gawee.cost(g).uncounted == {}


def test_pow_keeps_a_scalar_exponent_as_a_0d_constant_of_the_base_type():
    g = gawee.capture(Emitted(), _emitted_inputs())
    exps = [n.inputs[1] for n in g if n.op == "pow" and n.inputs[1].producer is None and n.inputs[1].type.rank == 0]
    assert sorted(float(v.data) for v in exps if v.data is not None) == [2.0, 3.0]
    assert all(v.type.dtype is DType.f32 for v in exps)


def test_new_ops_run_in_onnx_runtime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    b = GraphBuilder("capture_ops")
    x = b.input("x", "f32[2,3,4]")
    y = b.input("y", "f32[3,4]")
    m1 = b.input("m1", "bool[3,4]")
    m2 = b.input("m2", "bool[3,4]")
    v = b.input("v", "f32[1,2,4,6,6]")
    masked = b.where(b.bitwise_or(b.bitwise_and(m1, m2), b.bitwise_xor(m1, m2)), x, 0.0)
    graph = b.output(
        b.addcmul(x, y, x, value=0.5),
        b.addcmul(y, x, y),
        masked,
        b.max_pool3d(v, kernel_size=[2, 2, 2], padding=[1, 1, 1]),
        b.avg_pool3d(v, kernel_size=[3, 3, 3], stride=[1, 2, 2], padding=[1, 1, 1], count_include_pad=False),
        b.adaptive_avg_pool3d(v, output_size=[1, 1, 1]),
        b.adaptive_max_pool3d(v, output_size=[2, 3, 3]),
        b.pow(b.abs(y), x),
    )
    assert not [n for n in graph if n.op == OPAQUE]
    xs = random_inputs([t.type for t in graph.inputs], seed=3)
    expected = gawee.run(graph, *xs)
    path = tmp_path / "ops.onnx"
    gawee.to_onnx(graph, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), xs)})
    for e, o in zip(expected, got):
        e = e.numpy()
        assert o.shape == e.shape and o.dtype == e.dtype
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-4 * max(1.0, float(np.nanmax(np.abs(e)))))
