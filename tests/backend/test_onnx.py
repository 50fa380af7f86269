"""to_onnx: the exported graph runs in ONNX Runtime (its own optimizer off) and matches the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gawee
from gawee.backend.onnx import ExportError
from gawee.equivalence import random_inputs
from gawee.ir.builder import GraphBuilder
from tests.backend.test_torch_backend import fused_conv_graph, masked_rows_and_nan_sign, optimized

ort = pytest.importorskip("onnxruntime")


def run_ort(graph: gawee.Graph, path, xs):
    gawee.to_onnx(graph, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), xs)}
    return session.run(None, feed)


def assert_ort_matches_reference(graph: gawee.Graph, path, tol: float = 1e-4) -> None:
    xs = random_inputs([v.type for v in graph.inputs], seed=2)
    expected = gawee.run(graph, *xs)
    got = run_ort(graph, path, xs)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        e = e.numpy()
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol * max(1.0, float(np.abs(e).max())))


def test_fused_convolutions_export_as_conv_add_activation(tmp_path):
    graph = fused_conv_graph()
    assert_ort_matches_reference(graph, tmp_path / "fused.onnx")
    ops = [n.op_type for n in gawee.to_onnx(graph).graph.node]
    assert ops.count("Conv") == sum(n.op == "conv2d" for n in graph)
    assert ops.count("Add") >= sum(n.op == "conv2d" and n.inputs[3] is not None for n in graph)


def test_resnet18_runs_in_onnx_runtime(tmp_path):
    assert_ort_matches_reference(optimized("resnet18"), tmp_path / "resnet18.onnx")


def test_transformer_ops(tmp_path):
    torch.manual_seed(0)
    b = GraphBuilder("transformer")
    x = b.input("x", "f32[2,5,8]")
    mask = b.input("mask", "bool[5,5]")
    h = b.layer_norm(x, b.const(torch.rand(8) + 0.5), b.const(torch.randn(8)), normalized_shape=[8])
    qkv = b.linear(h, b.const(torch.randn(24, 8) * 0.3), b.const(torch.randn(24)))
    q, k, v = b.split(qkv, split_sizes=[8, 8, 8], dim=2)
    heads = [b.permute(b.reshape(t, shape=[2, 5, 2, 4]), dims=[0, 2, 1, 3]) for t in (q, k, v)]
    causal = b.scaled_dot_product_attention(*heads, is_causal=True)
    masked = b.scaled_dot_product_attention(*heads, mask, scale=0.3)
    att = b.reshape(b.transpose(b.add(causal, masked), dim0=1, dim1=2), shape=[2, 5, 8])
    y = b.gelu(b.linear(b.reshape(att, shape=[10, 8]), b.const(torch.randn(8, 8))), approximate="tanh")
    y = b.softmax(b.mul(b.reshape(y, shape=[2, 5, 8]), 0.5), dim=-1)
    pooled = b.mean(b.cat(y, x, dim=1), dim=[1], keepdim=False)
    first = b.select(y, dim=1, index=0)
    tail = b.slice(y, dim=1, start=1, end=4)
    graph = b.output(
        pooled,
        b.where(b.gt(first, 0.1), first, b.clamp(first, min=-0.5, max=0.5)),
        b.stack(b.expand(b.sum(tail, dim=[2], keepdim=True), size=[2, 3, 8]), tail, dim=0),
        b.cast(b.hardtanh(tail, min_val=0.0, max_val=0.2), dtype="f64"),
        b.rms_norm(x, b.const(torch.rand(8) + 0.5), normalized_shape=[8], eps=1e-6),
        b.rms_norm(b.cast(x, dtype="f16"), normalized_shape=[5, 8]),
    )
    assert_ort_matches_reference(graph, tmp_path / "transformer.onnx")


def test_grouped_query_attention(tmp_path):
    """sdpa(enable_gqa): key/value head h // n for query head h (6 query heads, 2 key/value heads)."""
    b = GraphBuilder("gqa")
    q = b.input("q", "f32[2,6,5,4]")
    k, v = b.input("k", "f32[2,2,7,4]"), b.input("v", "f32[2,2,7,4]")
    mask = b.input("mask", "f32[5,7]")  # additive: a random bool mask may hide a whole row (nan either way)
    graph = b.output(
        b.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        b.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, scale=0.5),
    )
    assert_ort_matches_reference(graph, tmp_path / "gqa.onnx")


def test_cnn_ops(tmp_path):
    torch.manual_seed(0)
    b = GraphBuilder("cnn")
    x = b.input("x", "f32[1,3,12,12]")
    y = b.batch_norm(
        x,
        b.const(torch.rand(3)),
        b.const(torch.randn(3)),
        b.const(torch.randn(3)),
        b.const(torch.rand(3) + 0.5),
        eps=1e-3,
    )
    y = b.pad(y, pad=[1, 1, 2, 0])
    y = b.max_pool2d(y, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])
    a = b.avg_pool2d(y, kernel_size=[2, 2], count_include_pad=False)
    c = b.adaptive_avg_pool2d(y, output_size=[1, 1])
    d = b.adaptive_avg_pool2d(y, output_size=[7, 1])
    e = b.silu(b.hardswish(b.leaky_relu(a, negative_slope=0.2)))
    graph = b.output(e, b.flatten(c, start_dim=1), b.hardsigmoid(d), b.sigmoid(b.tanh(b.neg(d))))
    assert_ort_matches_reference(graph, tmp_path / "cnn.onnx")


def test_roll_and_advanced_indexing(tmp_path):
    """swin's shifted windows (roll), BERT's and GPT-2's position lookups (index with tensors): negative
    indices, broadcast index tensors on adjacent dims, a leading whole dim, rolls with and without dims."""
    b = GraphBuilder("rolls")
    x = b.input("x", "f32[2,5,6,3]")
    rows = b.const(torch.tensor([[0, -1, 2]]))
    cols = b.const(torch.tensor([[1], [-6], [5]]))
    graph = b.output(
        b.roll(x, shifts=[-2, 3], dims=[1, 2]),
        b.roll(x, shifts=[7]),
        b.index(x, None, rows, cols),
        b.index(x, b.const(torch.tensor([1, 0, -1]))),
    )
    assert_ort_matches_reference(graph, tmp_path / "rolls.onnx")
    b = GraphBuilder("apart")
    x = b.input("x", "f32[2,5,6]")
    with pytest.raises(ExportError, match="separated by a slice"):
        gawee.to_onnx(b.output(b.index(x, b.const(torch.tensor([0])), None, b.const(torch.tensor([1])))))


def test_math_sorting_and_triangle_ops(tmp_path):
    """The ops whose ONNX forms are compositions or multi-output: exp2, expm1, log2, log1p, trunc, fmod and
    remainder (float and integer: the sign conventions differ), float floor division, tril/triu, topk, sort,
    max/min along a dim."""
    b = GraphBuilder("math")
    x = b.input("x", "f32[3,6]")
    i = b.input("i", "i64[3,6]")
    pos = b.add(b.abs(x), 0.5)
    d = b.const(torch.tensor([1.5, -2.0, 0.7, -0.3, 3.0, -1.1]))
    k = b.const(torch.tensor([3, -4, 5, -2, 7, 2]))
    values, indices = b.topk(x, k=2, dim=1)
    svalues, sindices = b.sort(x, dim=0, descending=True)
    mvalues, mindices = b.max_dim(x, dim=1, keepdim=True)
    nvalues, nindices = b.min_dim(x, dim=0)
    graph = b.output(
        b.exp2(x), b.expm1(x), b.log2(pos), b.log1p(pos), b.trunc(b.mul(x, 3.0)),
        b.fmod(x, d), b.remainder(x, d), b.fmod(i, k), b.remainder(i, k), b.floor_divide(x, d),
        b.tril(x, diagonal=1), b.triu(x, diagonal=-1),
        values, indices, svalues, sindices, mvalues, mindices, nvalues, nindices,
    )  # fmt: skip
    assert_ort_matches_reference(graph, tmp_path / "math.onnx")


def test_integer_floor_division_rounds_down_for_negative_operands(tmp_path):
    """ONNX's Div truncates integers: -7 // 2 must still be -4 (floor_divide, div with rounding_mode="floor"),
    and trunc division (integer and float) rounds towards zero."""
    b = GraphBuilder("floordiv")
    i = b.input("i", "i64[8]")
    x = b.input("x", "f32[8]")
    k = b.const(torch.tensor([2, -2, 3, -3, 1, -1, 5, -4]))
    d = b.const(torch.tensor([2.0, -2.0, 0.5, -0.3, 3.0, -1.1, 7.0, -4.0]))
    graph = b.output(
        b.floor_divide(i, k), b.div(i, k, rounding_mode="floor"), b.div(i, k, rounding_mode="trunc"),
        b.div(x, d, rounding_mode="trunc"), b.floor_divide(i, 2),
    )  # fmt: skip
    xs = [torch.tensor([-7, 7, -7, 7, -3, 0, -10, 9]), torch.tensor([-7.0, 7.0, -1.2, 2.5, -3.5, 0.0, -10.0, 9.0])]
    got = run_ort(graph, tmp_path / "floordiv.onnx", xs)
    for g, e in zip(got, gawee.run(graph, *xs)):
        np.testing.assert_array_equal(g, e.numpy())
    assert got[0].tolist() == [-4, -4, -3, -3, -3, 0, -2, -3]


def test_ops_without_an_onnx_form_are_named():
    b = GraphBuilder("scatter")
    x = b.input("x", "f32[4]")
    index = b.const(torch.tensor([1]))
    with pytest.raises(ExportError, match="op index_put has no ONNX lowering"):
        gawee.to_onnx(b.output(b.index_put(x, b.const(torch.tensor(1.0)), index, accumulate=False)))
    b = GraphBuilder("opaque")
    x = b.input("x", "f32[4]")
    node = b.graph.create_node(
        "aten", [x], {"target": "aten.cumprod.default", "args": (("$in", 0), 0), "kwargs": ()}, types=[x.type]
    )
    with pytest.raises(ExportError, match="opaque"):
        gawee.to_onnx(b.output(node.output))


def ort_optimized_ops(path, tmp_path) -> list[str]:
    """The op types (domain-qualified, with a fused activation in brackets) of ``path`` after ORT's whole
    optimizer (ORT_ENABLE_ALL: its fusions and, on CPUs with MLAS NCHWc kernels, the NCHWc layout transformer)."""
    import onnx

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops = []
    for n in onnx.load(options.optimized_model_filepath).graph.node:
        act = [a.s.decode() for a in n.attribute if a.name == "activation"]
        ops.append(f"{n.domain + '.' if n.domain else ''}{n.op_type}{f'[{act[0]}]' if act else ''}")
    return ops


def test_mobilenet_v3_export_lets_onnx_runtime_fuse_everything(tmp_path):
    """mobilenet_v3_large's blocks (expand/depthwise/project convolutions with ReLU or HardSwish, squeeze-
    and-excitation with HardSigmoid, residual adds) and head (linear + HardSwish): after ORT's optimizer
    every convolution carries its bias, activation and residual add, as on torch.onnx's export of the
    same model — no standalone Conv, Add, Relu or HardSwish, and the only HardSigmoid left is the
    classifier's (linear + HardSwish, which ORT splits into HardSigmoid and Mul); the only Muls left are
    the squeeze-and-excitation scales and that one."""
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    settings, last_channel = _mobilenet_v3_conf("mobilenet_v3_large", width_mult=0.5)
    torch.manual_seed(0)
    model = MobileNetV3(settings[:7], last_channel, num_classes=10).eval()  # 3 blocks with SE, 2 residuals
    with torch.no_grad():  # trained-looking batch norm (at initialization it is the identity)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(0, 0.1), m.running_var.uniform_(0.5, 1.5)
    graph, _ = gawee.rewrite(gawee.capture(model, (torch.randn(1, 3, 32, 32),)))
    gawee.to_onnx(graph, tmp_path / "mobilenet.onnx")
    exported = [n.op_type for n in gawee.to_onnx(graph).graph.node]
    assert exported.count("HardSwish") > 0 and exported.count("HardSigmoid") == 3  # the ONNX ops, not decomposed
    ops = ort_optimized_ops(tmp_path / "mobilenet.onnx", tmp_path)
    plain = [op for op in ops if op.split("[")[0] in ("Conv", "Add", "Relu", "HardSwish", "Clip")]
    assert plain == [], plain
    assert ops.count("HardSigmoid") == 1 and ops.count("Mul") == 3 + 1, ops
    convs = [op for op in ops if op.split("[")[0].endswith("Conv")]
    assert len(convs) == exported.count("Conv")
    assert sum("[HardSigmoid]" in op for op in convs) == 3  # the SE gates: fused into their 1×1 convolution


def test_attention_rows_masked_whole_are_zero_and_sign_of_nan_is_zero(tmp_path):
    graph, xs = masked_rows_and_nan_sign()
    for e, g in zip(gawee.run(graph, *xs), run_ort(graph, tmp_path / "masked.onnx", xs)):
        assert not e.isnan().any()
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-6)


def test_scatters_and_resizes(tmp_path):
    """select_scatter, slice_scatter (step 1: slices concatenated around src; step 2: ScatterElements), and
    upsample_nearest2d / upsample_bilinear2d as Resize, by output size and by scale factors."""
    b = GraphBuilder("scatter")
    x, src, img = b.input("x", "f32[4,6]"), b.input("src", "f32[4,2]"), b.input("img", "f32[1,2,5,7]")
    graph = b.output(
        b.select_scatter(x, b.select(src, dim=1, index=0), dim=1, index=-2),
        b.slice_scatter(x, src, dim=1, start=1, end=3, step=1),
        b.slice_scatter(x, src, dim=1, start=4, end=6, step=1),
        b.slice_scatter(x, src, dim=1, start=1, end=5, step=2),
        b.upsample_nearest2d(img, output_size=[9, 16], scale_factors=None),
        b.upsample_nearest2d(img, output_size=None, scale_factors=[2.0, 3.0]),
        b.upsample_bilinear2d(img, output_size=[9, 16], align_corners=False, scale_factors=None),
        b.upsample_bilinear2d(img, output_size=[9, 16], align_corners=True, scale_factors=None),
        b.upsample_bilinear2d(img, output_size=None, align_corners=False, scale_factors=[2.0, 1.5]),
    )
    assert_ort_matches_reference(graph, tmp_path / "scatter.onnx")
