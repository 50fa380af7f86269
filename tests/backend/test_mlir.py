"""to_mlir and the IREE backend: StableHLO text that IREE's own tools parse and verify, modules
compiled for the host CPU that match the reference interpreter, resnet18 end to end, the errors.

IREE compiles take seconds each, so every numeric test packs one op family into one graph with
many outputs (one compile), and resnet18 runs at 64x64.
"""

from __future__ import annotations

import builtins
import subprocess
import sys

import pytest
import torch

import gawee
from gawee.backend.iree import IreeModule, compile_iree, write_artifacts
from gawee.backend.stablehlo import INLINE_BYTES, LoweringError, MlirModule, lower_mlir, to_mlir
from gawee.equivalence import TOLERANCE, output_error, random_inputs
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType
from gawee.ops.nn import ACTIVATIONS
from tests.backend.test_torch_backend import fused_conv_graph, masked_rows_and_nan_sign

iree_compiler = pytest.importorskip("iree.compiler", reason="the IREE extra: pip install 'gawee[iree]'")
pytest.importorskip("iree.runtime")

ACT_PARAMS = {"hardtanh": (0.0, 6.0), "leaky_relu": (0.1,)}


def run_iree(graph: gawee.Graph, xs, iree_ops: bool = False):
    text = to_mlir(graph, iree_ops=iree_ops)
    module = IreeModule(compile_iree(text), [v.type for v in graph.inputs], [v.type for v in graph.outputs])
    return module(*xs)


def assert_iree_matches_reference(graph: gawee.Graph, tol: float = 1e-4, iree_ops: bool = False) -> None:
    xs = random_inputs([v.type for v in graph.inputs], seed=2)
    expected = gawee.run(graph, *xs)
    got = run_iree(graph, xs, iree_ops)
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got)):
        producer = graph.outputs[i].producer
        what = f"output {i} ({producer.op if producer else 'input'})"
        assert g.shape == e.shape and g.dtype == e.dtype, what
        if e.dtype.is_floating_point:
            scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
            t = max(tol, 2e-3) if e.dtype in (torch.float16, torch.bfloat16) else tol
            assert output_error(e, g) <= t * scale, f"{what}: error {output_error(e, g):.3g}"
        else:
            assert torch.equal(g, e), what


def test_elementwise_ops():
    b = GraphBuilder("elementwise")
    x, y, i = b.input("x", "f32[2,3,4]"), b.input("y", "f32[3,1]"), b.input("i", "i64[2,3,4]")
    ax = b.abs(x)
    graph = b.output(
        *(getattr(b, op)(x) for op in ("relu", "sigmoid", "tanh", "silu", "hardswish", "hardsigmoid", "mish")),
        *(getattr(b, op)(x) for op in ("exp", "exp2", "expm1", "neg", "reciprocal", "sin", "cos", "erf")),
        *(getattr(b, op)(x) for op in ("floor", "ceil", "trunc", "sign", "logical_not", "isnan", "isinf")),
        *(getattr(b, op)(ax) for op in ("log", "log2", "log1p", "sqrt", "rsqrt")),
        b.gelu(x),
        b.gelu(x, approximate="tanh"),
        b.hardtanh(x, min_val=0.0, max_val=6.0),
        b.leaky_relu(x, negative_slope=0.1),
        b.elu(x),
        b.softplus(x, beta=2.0),
        b.clamp(x, min=-0.5),
        b.round(b.mul(x, 3.0)),
        b.bitwise_not(i),
        b.add(x, y),
        b.sub(x, 2.0),
        b.mul(x, y),
        b.div(x, y),
        b.div(i, 3, rounding_mode="floor"),
        b.div(x, y, rounding_mode="trunc"),
        b.pow(ax, 1.5),
        b.maximum(x, y),
        b.minimum(x, y),
        b.fmod(i, 3),
        b.remainder(i, 3),
        b.floor_divide(i, 3),
        b.atan2(x, y),
        b.eq(i, 1),
        b.ne(x, y),
        b.lt(x, y),
        b.le(i, 0),
        b.gt(x, 0.1),
        b.ge(x, y),
        b.logical_and(x, y),
        b.logical_or(i, x),
        b.logical_xor(x, i),
        b.bitwise_and(i, 3),
        b.bitwise_or(b.gt(x, 0), b.lt(y, 0)),
        b.bitwise_xor(i, 5),
        b.where(b.gt(x, 0), x, y),
        b.masked_fill(x, b.lt(y, 0), 7.0),
        b.addcmul(x, y, x, value=0.5),
        b.cast(x, dtype="f16"),
        b.cast(i, dtype="f32"),
        b.cast(x, dtype="i32"),
    )
    assert_iree_matches_reference(graph)


def test_cnn_ops():
    """Fused conv2d with every activation (with and without residual), grouped/strided/dilated and
    depthwise convolutions (constant and input weights),
    conv_transpose2d, norms, every pooling flavour (ceil mode, padding counted
    or not, unequal adaptive bins), windows that leave the last rows unused (IREE rejects those:
    they are trimmed first), upsampling, softmax."""
    torch.manual_seed(0)
    b = GraphBuilder("cnn")
    x = b.input("x", "f32[2,4,9,9]")
    y = x
    for act in [None, *ACTIVATIONS]:
        w, bias = b.const(torch.randn(4, 4, 3, 3) * 0.2), b.const(torch.randn(4))
        residual = y if act in (None, "relu", "silu") else None
        y = b.conv2d(y, w, bias, residual, padding=[1, 1], act=act, act_params=ACT_PARAMS.get(act, ()))
    x3 = b.reshape(x, shape=[2, 4, 3, 3, 9])
    small = b.input("small", "f32[1,2,4,4]")
    graph = b.output(
        y,
        b.conv2d(x, b.const(torch.randn(8, 2, 3, 3)), None, stride=[2, 2], groups=2, dilation=[2, 1], padding=[2, 0]),
        b.conv2d(x, b.const(torch.randn(4, 1, 5, 5)), b.const(torch.randn(4)), stride=[2, 2], groups=4, padding=[2, 2]),
        b.conv2d(x, b.input("depthwise", "f32[4,1,3,3]"), None, groups=4, dilation=[2, 1]),
        b.conv_transpose2d(
            x,
            b.const(torch.randn(4, 3, 3, 3)),
            b.const(torch.randn(6)),
            stride=[2, 2],
            padding=[1, 1],
            output_padding=[1, 1],
            groups=2,
        ),
        b.conv1d(b.reshape(x, shape=[2, 4, 81]), b.const(torch.randn(3, 4, 3)), None, stride=[2]),
        b.batch_norm(
            x,
            b.const(torch.rand(4) + 0.5),
            b.const(torch.randn(4)),
            b.const(torch.randn(4)),
            b.const(torch.rand(4) + 0.1),
        ),
        b.group_norm(x, b.const(torch.rand(4) + 0.5), b.const(torch.randn(4)), num_groups=2),
        b.max_pool2d(x, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1]),
        b.max_pool2d(x, kernel_size=[2, 2], stride=[2, 2], ceil_mode=True),
        b.max_pool2d(x, kernel_size=[3, 3], stride=[1, 1], dilation=[2, 2]),
        b.max_pool2d(x, kernel_size=[5, 5], stride=[2, 2], padding=[2, 2]),  # > SLICED_WINDOW: a reduce_window
        b.avg_pool2d(x, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1]),
        b.avg_pool2d(x, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], count_include_pad=False, ceil_mode=True),
        b.avg_pool2d(x, kernel_size=[2, 2], stride=[2, 2], ceil_mode=True, divisor_override=3),
        b.adaptive_avg_pool2d(x, output_size=[1, 1]),
        b.adaptive_avg_pool2d(x, output_size=[3, 3]),
        b.adaptive_avg_pool2d(x, output_size=[4, 5]),
        b.adaptive_max_pool2d(x, output_size=[3, 3]),
        b.max_pool3d(x3, kernel_size=[2, 2, 2], stride=[1, 1, 2]),
        b.avg_pool3d(x3, kernel_size=[2, 2, 3], stride=[1, 1, 2], padding=[1, 1, 1]),
        b.adaptive_avg_pool3d(x3, output_size=[1, 1, 1]),
        b.upsample_nearest2d(x, output_size=[13, 18]),
        b.softmax(x, dim=1),
        b.log_softmax(x, dim=-1),
        b.dropout(x, p=0.5, train=False),
        b.max_pool2d(small, kernel_size=[3, 3], stride=[2, 2]),
        b.conv2d(small, b.const(torch.randn(3, 2, 3, 3)), None, stride=[2, 2]),
        b.avg_pool2d(small, kernel_size=[2, 2], stride=[3, 3]),
    )
    assert_iree_matches_reference(graph)


def test_small_max_windows_are_strided_slices_iree_compiles():
    """googlenet's 3×3/2 ceil-mode max pool of 1×192×56×56 exceeded IREE's CPU stack limit as a
    reduce_window (100352 of 32768 bytes); as the max of its 9 strided slices it compiles and is exact."""
    b = GraphBuilder("pool")
    x = b.input("x", "f32[1,192,56,56]")
    graph = b.output(b.max_pool2d(x, kernel_size=[3, 3], stride=[2, 2], ceil_mode=True))
    text = to_mlir(graph)
    assert "reduce_window" not in text and text.count("stablehlo.maximum") == 8
    assert "stablehlo.pad" in text  # ceil mode: the last window reaches past the input
    even = GraphBuilder("even")
    z = even.input("z", "f32[1,2,8,8]")
    assert "stablehlo.pad" not in to_mlir(even.output(even.max_pool2d(z, kernel_size=[2, 2], stride=[2, 2])))
    xs = random_inputs([v.type for v in graph.inputs])
    assert torch.equal(run_iree(graph, xs)[0], gawee.run(graph, *xs)[0])
    big = GraphBuilder("big")
    y = big.input("y", "f32[1,2,9,9]")
    assert "reduce_window" in to_mlir(big.output(big.max_pool2d(y, kernel_size=[5, 5], stride=[1, 1])))


def test_transformer_ops():
    """layer_norm, rms_norm, linear, split/permute, attention as its composition (causal, bool and float masks,
    grouped-query), the matmul family with 1-D operands and broadcast batches, embedding, einsum,
    advanced indexing."""
    torch.manual_seed(0)
    b = GraphBuilder("transformer")
    x, mask, idx = b.input("x", "f32[2,5,8]"), b.input("mask", "bool[5,5]"), b.input("idx", "i64[2,3]")
    h = b.layer_norm(x, b.const(torch.rand(8) + 0.5), b.const(torch.randn(8)), normalized_shape=[8])
    q, k, v = b.split(
        b.linear(h, b.const(torch.randn(24, 8) * 0.3), b.const(torch.randn(24))), split_sizes=[8] * 3, dim=2
    )
    heads = [b.permute(b.reshape(t, shape=[2, 5, 2, 4]), dims=[0, 2, 1, 3]) for t in (q, k, v)]
    one_kv = [b.slice(t, dim=1, start=0, end=1) for t in heads[1:]]
    graph = b.output(
        b.scaled_dot_product_attention(*heads, is_causal=True),
        b.scaled_dot_product_attention(*heads, mask, scale=0.3),
        b.scaled_dot_product_attention(*heads, b.const(torch.randn(5, 5))),
        b.scaled_dot_product_attention(heads[0], *one_kv, enable_gqa=True),
        b.rms_norm(x, b.const(torch.rand(8) + 0.5), normalized_shape=[8], eps=1e-6),
        b.rms_norm(b.cast(x, dtype="f16"), normalized_shape=[5, 8]),
        b.matmul(x, b.const(torch.randn(8))),
        b.matmul(b.const(torch.randn(8)), b.transpose(x, dim0=1, dim1=2)),
        b.matmul(b.reshape(x, shape=[2, 1, 5, 8]), b.const(torch.randn(3, 8, 4))),
        b.mm(b.reshape(x, shape=[10, 8]), b.const(torch.randn(8, 3))),
        b.bmm(x, b.transpose(x, dim0=1, dim1=2)),
        b.addmm(b.const(torch.randn(3)), b.reshape(x, shape=[10, 8]), b.const(torch.randn(8, 3)), beta=0.5, alpha=2.0),
        b.linear(x, b.const(torch.randn(3, 8))),
        b.embedding(b.const(torch.randn(10, 4)), idx),
        b.einsum(*heads[:2], equation="B H I D, B H J D -> B H I J"),  # maxvit's attention
        b.einsum(heads[0], b.const(torch.randn(4, 3)), equation="bhid,dk->bkhi"),
        b.einsum(x, equation="bld->d"),
        b.index(b.const(torch.randn(10, 3)), b.const(torch.tensor([0, 9, -1, 3]))),  # swin's bias table
        b.index(x, None, b.const(torch.tensor([[0, 2], [1, 1]])), b.const(torch.tensor([3, -1]))),
    )
    assert_iree_matches_reference(graph)


def test_depthwise_convs_are_linalgs_direct_form_unless_pure_stablehlo(tmp_path):
    """2-D depthwise convolutions are linalg.depthwise_conv_2d_nchw_chw for IREE (its im2col would
    gather them), else StableHLO with the batch folded into the channels (IREE's im2col rejects batched
    depthwise convolutions); attention is its composition in both."""
    torch.manual_seed(0)
    b = GraphBuilder("depthwise")
    x = b.input("x", "f32[2,4,9,9]")
    q, k, v = (b.input(n, "f32[2,3,5,4]") for n in "qkv")
    graph = b.output(
        b.conv2d(x, b.const(torch.randn(4, 1, 3, 3)), b.const(torch.randn(4)), padding=[1, 1], groups=4, act="relu"),
        b.conv2d(x, b.input("w", "f32[4,1,5,5]"), None, stride=[2, 2], padding=[2, 1], dilation=[1, 2], groups=4),
        b.conv2d(x, b.const(torch.randn(8, 1, 3, 3)), None, groups=4),  # two outputs per channel: not depthwise
        b.conv1d(b.reshape(x, shape=[2, 4, 81]), b.const(torch.randn(4, 1, 3)), None, groups=4),
        b.scaled_dot_product_attention(q, k, v, scale=0.3),
    )
    text, pure = to_mlir(graph), to_mlir(graph, iree_ops=False)
    assert text.count("linalg.depthwise_conv_2d_nchw_chw") == 2 and "linalg" not in pure
    assert "iree_linalg_ext" not in text
    assert iree_opt(text, tmp_path).returncode == 0 and iree_opt(pure, tmp_path).returncode == 0
    assert_iree_matches_reference(graph)
    assert_iree_matches_reference(graph, iree_ops=False)


def test_shape_reduction_creation_and_low_precision_ops():
    torch.manual_seed(0)
    b = GraphBuilder("shapes")
    x, i = b.input("x", "f32[2,3,4]"), b.input("i", "i64[2,3,4]")
    h = b.cast(x, dtype="f16")
    graph = b.output(
        b.reshape(x, shape=[6, 4]),
        b.flatten(x, start_dim=1),
        b.permute(x, dims=[2, 0, 1]),
        b.transpose(x, dim0=0, dim1=2),
        b.expand(b.slice(x, dim=0, start=0, end=1), size=[5, 3, 4]),
        b.squeeze(b.unsqueeze(x, dim=0), dims=[0]),
        b.select(x, dim=1, index=2),
        b.slice(x, dim=2, start=1, end=4, step=2),
        b.clone(b.alias(x)),
        b.cat(x, i, dim=1),
        b.stack(x, x, dim=3),
        *b.split(x, split_sizes=[1, 3], dim=2),
        *b.unbind(x, dim=1),
        b.pad(x, pad=[1, 2, 0, -1], value=0.5),
        b.pad(x, pad=[1, 2, 2, 1], mode="reflect"),
        b.pad(x, pad=[1, 2], mode="replicate"),
        b.pad(x, pad=[1, 2, 1, 0], mode="circular"),
        b.roll(x, shifts=[1, -1], dims=[1, 2]),
        b.roll(x, shifts=[5]),
        b.flip(x, dims=[0, -1]),
        b.repeat(x, repeats=[2, 1, 1, 3]),
        b.index_select(x, b.const(torch.tensor([2, 0, 2])), dim=1),
        b.sum(x, dim=[1], keepdim=True),
        b.sum(i),
        b.mean(x, dim=[0, 2]),
        b.amax(x, dim=[-1]),
        b.amin(x, dim=[0], keepdim=True),
        b.prod(x, dim=[1]),
        b.any(b.gt(x, 1.0), dim=[2]),
        b.all(b.gt(x, -1.0)),
        b.var(x, dim=[2]),
        b.std(x, dim=[0, 1], correction=0.0),
        b.logsumexp(x, dim=[1]),
        b.linalg_vector_norm(x, dim=[2]),
        b.linalg_vector_norm(x, ord=3.0),
        b.max(x),
        b.min(i),
        b.cumsum(x, dim=1),
        b.cumsum(i, dim=-1),
        b.tril(x),
        b.triu(x, diagonal=1),
        b.full(shape=[2, 2], value=1.5, dtype="f32"),
        b.arange(end=5, dtype="i64"),
        b.fill(x, b.const(torch.tensor(3.0))),
        b.argmax(x, dim=1),
        b.argmin(x, dim=-1, keepdim=True),
        b.argmax(x),
        *b.max_dim(x, dim=2),
        *b.min_dim(i, dim=0, keepdim=True),
        b.copy(x, b.const(torch.randn(4))),
        b.slice_scatter(x, b.const(torch.randn(2, 2, 4)), dim=1, start=0, end=3, step=2),
        b.select_scatter(x, b.const(torch.randn(2, 4)), dim=1, index=-1),
        b.sum(h, dim=[2]),
        b.softmax(h, dim=2),
        b.layer_norm(h, None, None, normalized_shape=[4]),
        b.linear(h, b.const(torch.randn(5, 4).half())),
        b.conv2d(b.reshape(h, shape=[1, 2, 3, 4]), b.const(torch.randn(3, 2, 2, 2).half()), None, act="relu"),
    )
    assert_iree_matches_reference(graph)


def iree_opt(text: str, tmp_path) -> subprocess.CompletedProcess:
    """IREE's own MLIR parser and verifier (iree-opt, no passes) on ``text``."""
    from iree.compiler.tools.binaries import find_tool

    path = tmp_path / "module.mlir"
    path.write_text(text)
    return subprocess.run([find_tool("iree-opt"), str(path), "-o", "/dev/null"], capture_output=True, text=True)


def test_text_parses_and_verifies_with_iree_opt_and_keeps_weights_out_of_line(tmp_path):
    graph = fused_conv_graph()
    text = to_mlir(graph)
    result = iree_opt(text, tmp_path)
    assert result.returncode == 0, result.stderr
    body, _, resources = text.partition("{-#")
    assert "dense_resource<" in body and "dialect_resources" in resources and "builtin" in resources
    sizes = [v.data.numel() * v.data.element_size() for v in {v for n in graph for v in n.inputs if v and v.is_const}]
    assert len(resources) >= 2 * sum(n for n in sizes if n > INLINE_BYTES)  # every weight is a hex blob there
    assert max(len(line) for line in body.splitlines()) < 600  # and none is a literal in the ops
    assert text.count("stablehlo.convolution") == sum(n.op == "conv2d" for n in graph)
    broken = text.replace("stablehlo.convolution", "stablehlo.convolutionx", 1)
    assert iree_opt(broken, tmp_path).returncode != 0  # the tool does check


def test_large_models_weights_are_iree_parameters_given_as_tensors_or_archive(tmp_path, monkeypatch):
    """Over EXTERNAL_BYTES the weights leave the text: immutable globals named in the gawee scope, given to the
    runtime as tensors or as the .irpa written beside the artifacts; a module without them is a LoweringError."""
    from gawee.backend import stablehlo

    graph = fused_conv_graph()
    assert lower_mlir(graph).parameters == {}  # small: weights in the text, as to_mlir writes them
    monkeypatch.setattr(stablehlo, "EXTERNAL_BYTES", 1000)
    lowered = lower_mlir(graph)
    weights = {v for n in graph for v in n.inputs if v is not None and v.is_const}
    big = {v for v in weights if v.data.numel() * v.data.element_size() > INLINE_BYTES}
    assert len(lowered.parameters) == len(big) > 0
    assert "dense_resource" not in lowered.text and "dialect_resources" not in lowered.text
    assert lowered.text.count('#stream.parameter.named<"gawee"::') == len(big)
    assert len(lowered.text) < sum(v.data.numel() * v.data.element_size() for v in big)  # far smaller than hex
    vmfb = compile_iree(lowered.text)
    types = ([v.type for v in graph.inputs], [v.type for v in graph.outputs])
    xs = random_inputs(types[0], seed=3)
    expected = gawee.run(graph, *xs)
    written = write_artifacts(lowered, vmfb, tmp_path / "m.mlir", tmp_path / "m.vmfb")
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["m.irpa", "m.mlir", "m.vmfb"] == sorted(p.name for p in written)
    )
    for parameters in (lowered.parameters, tmp_path / "m.irpa"):
        got = IreeModule(vmfb, *types, parameters=parameters)(*xs)
        for e, g in zip(expected, got):
            assert output_error(e, g) <= 1e-4 * max(1.0, e.abs().max().item())
    with pytest.raises(LoweringError, match="external weights") as info:
        IreeModule(vmfb, *types)
    assert "parameters=" in info.value.hint
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(2, 64)
    module = gawee.compile(model, (x,), backend="iree", vmfb_path=tmp_path / "lin.vmfb")
    assert module._parameters is not None and (tmp_path / "lin.irpa").exists()  # gawee.compile's path too
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-5)


def test_op_without_lowering_names_op_and_node(monkeypatch):
    """Every registered op but those only rules make (int8, a runtime's target ops) has a lowering today; an op
    added without one, an opaque ATen node and a case a lowering refuses are each a LoweringError naming op and
    node."""
    from gawee.backend.lower_mlir import MLIR
    from gawee.ops import base
    from gawee.ops.quantized import RULE_ONLY
    from gawee.ops.targets import TARGET_OPS

    unlowered = sorted(name for name in base.all_ops() if name not in MLIR)
    assert unlowered == sorted(["aten", *RULE_ONLY, *TARGET_OPS])
    monkeypatch.delitem(MLIR._lowerings, "sort")
    b = GraphBuilder("sorting")
    x = b.input("x", "f32[2,3]")
    graph = b.output(b.relu(b.sort(x, name="pick")[0]))
    with pytest.raises(LoweringError, match=r"op sort has no StableHLO lowering \(node pick\)") as e:
        to_mlir(graph)
    assert '@MLIR.register("sort")' in e.value.hint
    b = GraphBuilder("opaque")
    x = b.input("x", "f32[4]")
    node = b.graph.create_node(
        "aten", [x], {"target": "aten.cumprod.default", "args": (("$in", 0), 0), "kwargs": ()}, types=[x.type]
    )
    with pytest.raises(LoweringError, match=r"opaque ATen call \(aten.cumprod.default\)"):
        to_mlir(b.output(node.output))
    b = GraphBuilder("rounding")
    x = b.input("x", "f32[2,3]")
    with pytest.raises(LoweringError, match=r"node r \(round\).*decimals"):
        to_mlir(b.output(b.round(x, decimals=2, name="r")))
    b = GraphBuilder("masked")  # x[mask] = values: as many values as true elements, data-dependent
    x = b.input("x", "f32[4]")
    put = b.index_put(x, b.const(torch.ones(2)), b.const(torch.tensor([True, False, True, False])), name="put")
    with pytest.raises(LoweringError, match=r"node put \(index_put\).*boolean mask with more than one value"):
        to_mlir(b.output(put))


def test_symbolic_shapes_are_refused():
    from torch.export import Dim

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    graph = gawee.capture(model, (torch.randn(2, 4),), dynamic_shapes={"input": {0: Dim("batch", max=8)}})
    with pytest.raises(LoweringError, match="symbolic dimensions: to_mlir lowers static shapes only"):
        to_mlir(graph)


def test_iree_rejection_is_a_lowering_error():
    with pytest.raises(LoweringError, match="iree-compile rejected"):
        compile_iree('func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { "stablehlo.nonsense"(%a) }')


def test_host_target_is_the_runtimes_cpu_features_not_the_cpu_name(monkeypatch):
    from gawee.backend import iree

    features = iree.host_cpu_features()
    flags = iree.compile_flags()
    assert "--iree-global-opt-use-im2col-for-convs" in flags
    assert "--iree-llvmcpu-target-cpu=generic" in iree.compile_flags("generic")
    if features is None:  # not x86-64: LLVM's host CPU
        assert "--iree-llvmcpu-target-cpu=host" in flags
        return
    # the CPU name (say znver4) would also turn on the features it implies, AVX-512 on a VM that hides it
    assert not any(f.startswith("--iree-llvmcpu-target-cpu=") for f in flags)
    assert f"--iree-llvmcpu-target-cpu-features={features}" in flags
    assert all(f.startswith("+") for f in features.split(",")) and "+sse4.2" in features.split(",")
    iree.host_cpu_features.cache_clear()
    monkeypatch.setattr(iree.platform, "machine", lambda: "aarch64")
    try:
        assert iree.host_cpu_features() is None and "--iree-llvmcpu-target-cpu=host" in iree.compile_flags()
    finally:
        iree.host_cpu_features.cache_clear()


@pytest.fixture(scope="module")
def resnet18_iree(tmp_path_factory):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    out = tmp_path_factory.mktemp("iree")
    module = gawee.compile(model, (x,), backend="iree", mlir_path=out / "r18.mlir", vmfb_path=out / "r18.vmfb")
    return model, x, module, out


def test_resnet18_on_iree_equals_eager(resnet18_iree):
    model, _, module, _ = resnet18_iree
    x2 = torch.randn(1, 3, 64, 64)  # not the example input the compile checked
    with torch.no_grad():
        expected = model(x2)
    got = module(x2)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
    tol = TOLERANCE[DType.f32] * max(1.0, expected.abs().max().item())
    assert output_error(expected, got) <= tol
    assert module.gawee_report.backend_error <= tol
    ops = {n.op for n in module.gawee_report.optimized}
    assert "conv2d" in ops and "batch_norm" not in ops  # the rewritten graph is what runs


def test_artifacts_are_written_and_reload(resnet18_iree):
    _, x, module, out = resnet18_iree
    assert (out / "r18.mlir").read_text().startswith("module @")
    assert sorted(p.name for p in out.iterdir()) == ["r18.mlir", "r18.vmfb"]  # no temp files left
    graph = module.gawee_report.optimized
    again = IreeModule((out / "r18.vmfb").read_bytes(), [v.type for v in graph.inputs], [v.type for v in graph.outputs])
    torch.testing.assert_close(again(x)[0], module(x), rtol=0, atol=1e-6)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    import os

    path = tmp_path / "m.mlir"
    assert write_artifacts(MlirModule("old"), None, path, None) == [path]

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(gawee.GaweeError, match=r"cannot write .*m\.mlir: disk full"):
        write_artifacts(MlirModule("new text"), None, path, None)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.mlir"]


@pytest.fixture
def no_iree(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "iree" or name.startswith("iree."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m == "iree" or m.startswith("iree.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", fake)


def test_missing_iree_says_how_to_install(no_iree, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'gawee\[iree\]'"):
        gawee.compile(model, (torch.randn(3, 4),), backend="iree")
    b = GraphBuilder("g")
    graph = b.output(b.relu(b.input("x", "f32[2]")))
    assert "stablehlo.maximum" in to_mlir(graph)  # the text needs no IREE
    graph.save(tmp_path / "g.json")
    from gawee.cli import main

    code = main(["optimize", str(tmp_path / "g.json"), "--no-verify", "--vmfb", str(tmp_path / "g.vmfb")])
    assert code != 0 and not (tmp_path / "g.vmfb").exists()


def test_cli_optimize_writes_mlir(tmp_path, capsys):
    from gawee.cli import main

    b = GraphBuilder("small")
    x = b.input("x", "f32[1,2,5,5]")
    w, bn = b.const(torch.randn(3, 2, 3, 3)), [b.const(torch.rand(3) + 0.5) for _ in range(4)]
    b.output(b.relu(b.batch_norm(b.conv2d(x, w, None, padding=[1, 1]), *bn))).save(tmp_path / "small.json")
    code = main(["optimize", str(tmp_path / "small.json"), "--no-verify", "--mlir", str(tmp_path / "small.mlir")])
    assert code == 0
    text = (tmp_path / "small.mlir").read_text()
    assert text.count("stablehlo.convolution") == 1 and "dense_resource<" in text
    assert "wrote" in capsys.readouterr().out


def test_sort_topk_gather_index_put_and_bilinear_upsampling():
    """The ops that need stablehlo.sort, gather and scatter: sort and topk as torch orders (NaN
    above every number, ties in their original order), torch.gather, index_put with adjacent and
    separated index tensors, accumulation, negative indices, a boolean mask; bilinear upsampling
    with and without align_corners, by size and by scale factors."""
    torch.manual_seed(0)
    b = GraphBuilder("gathers")
    x, i = b.input("x", "f32[3,5,6]"), b.input("i", "i64[4,7]")
    with_nan = b.const(torch.tensor([[1.0, float("nan"), -2.0, 0.5, float("nan"), 3.0]]))
    ties = b.const(torch.tensor([[3, 1, 3, 0, 1, 3, 2]]))
    img = b.input("img", "f32[1,2,5,7]")
    graph = b.output(
        *b.sort(x, dim=1),
        *b.sort(x, dim=-1, descending=True),
        *b.sort(with_nan),
        *b.sort(with_nan, descending=True),
        *b.sort(ties),
        *b.sort(ties, descending=True),
        *b.sort(i, dim=0),
        *b.topk(x, k=3),
        *b.topk(x, k=2, dim=0, largest=False),
        *b.topk(with_nan, k=2),
        b.gather(x, b.const(torch.tensor([[[4, 0, 1], [2, 2, 3]]])), dim=1),
        b.gather(i, b.const(torch.tensor([[6, 0], [1, 1]])), dim=-1),
        b.index_put(x, b.const(torch.randn(2, 6)), b.const(torch.tensor([0, 2])), b.const(torch.tensor([4, -1]))),
        b.index_put(x, b.const(torch.randn(2, 1)), None, b.const(torch.tensor([1, 3]))),
        b.index_put(x, b.const(torch.randn(2, 5)), b.const(torch.tensor([1, 2])), None, b.const(torch.tensor([0, 5]))),
        b.index_put(x, b.const(torch.tensor(1.0)), b.const(torch.tensor([0, 0, 2])), accumulate=True),
        b.index_put(x, b.const(torch.tensor(-3.0)), b.gt(x, 0.5)),
        b.index_put(i, b.const(torch.tensor([5])), b.const(torch.tensor([[0], [3]])), accumulate=True),
        b.upsample_bilinear2d(img, output_size=[9, 16]),
        b.upsample_bilinear2d(img, output_size=[3, 4], align_corners=True),
        b.upsample_bilinear2d(img, scale_factors=[2.0, 1.5]),
        b.upsample_bilinear2d(b.cast(img, dtype="f16"), scale_factors=[2.0, 2.0], align_corners=True),
    )
    assert_iree_matches_reference(graph)


def test_the_text_is_written_even_when_iree_rejects_it(tmp_path, monkeypatch):
    from gawee.backend import iree

    def reject(text, **kwargs):
        raise LoweringError("iree-compile rejected the module: planted")

    monkeypatch.setattr(iree, "compile_iree", reject)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
    with pytest.raises(LoweringError, match="planted"):
        gawee.compile(
            model, (torch.randn(3, 4),), backend="iree", mlir_path=tmp_path / "m.mlir", vmfb_path=tmp_path / "m.vmfb"
        )
    assert (tmp_path / "m.mlir").read_text().startswith("module @") and not (tmp_path / "m.vmfb").exists()


def test_attention_rows_masked_whole_are_zero_and_sign_of_nan_is_zero():
    graph, xs = masked_rows_and_nan_sign()
    for e, g in zip(gawee.run(graph, *xs), run_iree(graph, xs)):
        assert not e.isnan().any()
        torch.testing.assert_close(g, e)


def test_float64_stays_float64():
    """IREE demotes float64 to float32 unless told not to: the module then refused its own float64 inputs."""
    b = GraphBuilder("f64")
    x = b.input("x", "f64[2,3]")
    graph = b.output(b.add(b.mul(x, b.const(torch.tensor(1.5, dtype=torch.float64))), b.const(torch.randn(3).double())))
    xs = [torch.randn(2, 3, dtype=torch.float64)]
    (got,) = run_iree(graph, xs)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, gawee.run(graph, *xs)[0])


def test_float64_math_iree_lacks_says_so():
    b = GraphBuilder("f64_tanh")
    graph = b.output(b.tanh(b.input("x", "f64[3]")))
    with pytest.raises(gawee.GaweeError, match="undefined symbol") as info:
        run_iree(graph, [torch.randn(3, dtype=torch.float64)])
    assert "float32" in info.value.hint
