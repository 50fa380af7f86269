"""to_torch: the fx module computes what the reference interpreter computes, on fused kernels where it can."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

import gawee
from gawee.backend import TorchOptions, onednn, to_torch
from gawee.equivalence import random_inputs
from gawee.errors import IRError
from gawee.ir.builder import GraphBuilder
from gawee.ops import ACTIVATIONS
from tests.conftest import captured

ACT_PARAMS = {"hardtanh": (-0.5, 2.0), "leaky_relu": (0.1,)}
needs_onednn = pytest.mark.skipif(onednn.unavailable() is not None, reason=str(onednn.unavailable()))


def optimized(name: str) -> gawee.Graph:
    graph, _, _ = captured(name)
    return gawee.rewrite(graph)[0]


def assert_matches_reference(graph: gawee.Graph, module: torch.nn.Module, tol: float = 1e-4) -> None:
    xs = random_inputs([v.type for v in graph.inputs], seed=1)
    with torch.no_grad():
        expected = gawee.run(graph, *xs)
        got = module(*xs)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=tol, atol=tol * max(1.0, e.abs().max().item()))


def fused_conv_graph(dtype: str = "f32") -> gawee.Graph:
    """One fused conv2d per activation, each with and without a residual, chained."""
    torch.manual_seed(0)
    b = GraphBuilder("fused")
    x = b.input("x", f"{dtype}[2,8,10,10]")
    tdtype = getattr(torch, {"f32": "float32", "f64": "float64", "bf16": "bfloat16"}[dtype])
    y = x
    for act in [None, *ACTIVATIONS]:
        for residual in (False, True):
            w = b.const(torch.randn(8, 8, 3, 3, dtype=tdtype) * 0.2, "w")
            bias = b.const(torch.randn(8, dtype=tdtype), "b")
            y = b.conv2d(
                y, w, bias, y if residual else None, padding=[1, 1], act=act, act_params=ACT_PARAMS.get(act, ())
            )
    w = b.const(torch.randn(16, 4, 3, 3, dtype=tdtype), "w_grouped")  # grouped, strided, no bias
    y = b.conv2d(y, w, None, stride=[2, 2], groups=2, act="relu")
    return b.output(y)


def test_fused_activations_and_residuals_match_the_reference():
    graph = fused_conv_graph()
    module = to_torch(graph)
    assert_matches_reference(graph, module)


@needs_onednn
def test_fused_convolutions_run_on_onednn_with_prepacked_weights():
    graph = fused_conv_graph()
    module = to_torch(graph)
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    mkldnn = torch.ops.mkldnn
    convs = [t for t in targets if t in (mkldnn._convolution_pointwise.default, mkldnn._convolution_pointwise.binary)]
    assert len(convs) == sum(n.op == "conv2d" for n in graph)
    assert all(b.is_mkldnn for name, b in module.named_buffers() if "packed_weight" in name)
    assert not any(name.startswith("w") for name, _ in module.named_buffers())  # raw weights are not kept
    # oneDNN fuses only relu after the residual add: the other activations follow unfused
    assert sum(t is gawee.ops.apply_act for t in targets) == len(ACTIVATIONS) - 1


@needs_onednn
@pytest.mark.parametrize("read_later", [False, True])
def test_a_dead_residual_takes_the_sum_in_place(read_later):
    torch.manual_seed(0)
    b = GraphBuilder("inplace")
    x = b.input("x", "f32[1,8,6,6]")
    a = b.conv2d(x, b.const(torch.randn(8, 8, 1, 1)), None)
    y = b.conv2d(a, b.const(torch.randn(8, 8, 3, 3)), None, padding=[1, 1])
    y = b.conv2d(y, b.const(torch.randn(8, 8, 1, 1)), b.const(torch.randn(8)), a, act="silu")
    graph = b.output(b.add(y, a) if read_later else y)
    module = to_torch(graph, TorchOptions(conv1x1_kernel="onednn"))  # oneDNN's in-place residual, not the GEMM
    targets = [n.target for n in module.graph.nodes]
    assert (torch.ops.mkldnn._convolution_pointwise_.binary in targets) is not read_later
    assert_matches_reference(graph, module)


@pytest.mark.parametrize("case", ["dead", "read_later", "view", "broadcast"])
def test_add_writes_into_a_dead_operand_that_owns_its_memory(case):
    b = GraphBuilder("add")
    x = b.input("x", "f32[2,3,4]")
    y = b.relu(x)
    if case == "view":
        y = b.reshape(b.relu(b.reshape(x, shape=[6, 4])), shape=[2, 3, 4])
    other = b.input("bias", "f32[4]") if case == "broadcast" else x
    z = b.add(other, y) if case == "broadcast" else b.add(y, other)
    graph = b.output(b.mul(z, y) if case == "read_later" else z)
    module = to_torch(graph)
    in_place = torch.Tensor.add_ in [n.target for n in module.graph.nodes]
    assert in_place is (case in ("dead", "broadcast"))
    assert_matches_reference(graph, module)


@pytest.mark.parametrize("case", ["batch_norm", "cat", "read_later", "input"])
def test_a_unary_op_runs_in_place_on_a_dead_operand_that_owns_its_memory(case):
    torch.manual_seed(0)
    b = GraphBuilder("unary")
    x = b.input("x", "f32[2,3,4,4]")
    if case == "cat":
        y = b.cat(x, b.neg(x), dim=1)
    elif case == "input":
        y = x
    else:
        y = b.batch_norm(x, *(b.const(torch.rand(3) + 0.5) for _ in range(4)), eps=1e-5)
    z = b.relu(y)
    graph = b.output(b.add(z, y) if case == "read_later" else z)
    module = to_torch(graph)
    in_place = torch.Tensor.relu_ in [n.target for n in module.graph.nodes]
    assert in_place is (case in ("batch_norm", "cat"))
    assert_matches_reference(graph, module)


def test_every_in_place_lowering_computes_its_op():
    """The in-place method a unary op is lowered to (``relu_`` for relu) computes what the op's reference does."""
    from gawee.backend.lower_torch import IN_PLACE
    from gawee.ops.base import get_op

    lowered = {n: get_op(n) for n in IN_PLACE}
    assert "relu" in lowered and "sigmoid" in lowered
    torch.manual_seed(0)
    for name, op in lowered.items():
        x = {"bitwise_not": torch.randint(0, 5, (3, 4)), "logical_not": torch.rand(3, 4) > 0.5}.get(name)
        x = torch.rand(3, 4) + 0.5 if x is None else x  # in place only where the result has the operand's type
        method = getattr(torch.Tensor, f"{name}_")
        torch.testing.assert_close(method(x.clone()), op.evaluate(x), msg=name)


def test_fallback_without_fused_kernels_is_the_reference_semantics():
    graph = fused_conv_graph()
    module = to_torch(graph, TorchOptions(fused_kernels=False))
    assert not any("mkldnn" in str(n.target) for n in module.graph.nodes)
    assert_matches_reference(graph, module, tol=1e-5)


def test_unsupported_dtype_falls_back():
    graph = fused_conv_graph("f64")
    module = to_torch(graph)
    assert not any("mkldnn" in str(n.target) for n in module.graph.nodes)
    assert_matches_reference(graph, module, tol=1e-9)


@pytest.mark.parametrize("channels_last", [False, True])
def test_resnet18_matches_the_reference(channels_last):
    graph = optimized("resnet18")
    assert_matches_reference(graph, to_torch(graph, TorchOptions(channels_last=channels_last)))


def test_mobilenet_v3_small_matches_the_reference():
    graph = optimized("mobilenet_v3_small")
    assert_matches_reference(graph, to_torch(graph))


def test_outputs_come_back_contiguous_and_structured():
    structure = pytree.tree_structure({"features": 0, "pair": (0, 0)})
    b = GraphBuilder("multi")
    x = b.input("x", "f32[1,4,6,6]")
    y = b.conv2d(x, b.const(torch.randn(4, 4, 1, 1)), None, act="relu")
    graph = b.output(y, b.relu(x), y)
    module = to_torch(graph, output_structure=structure)
    out = module(torch.randn(1, 4, 6, 6))
    assert set(out) == {"features", "pair"} and isinstance(out["pair"], tuple)
    assert out["features"].is_contiguous()


def test_multi_output_and_opaque_ops():
    b = GraphBuilder("misc")
    x = b.input("x", "f32[4,6]")
    first, second = b.split(x, split_sizes=[2, 4], dim=1)
    node = b.graph.create_node(
        "aten", [first], {"target": "aten.cumprod.default", "args": (("$in", 0), 1), "kwargs": ()}, types=[first.type]
    )
    graph = b.output(node.output, b.exp(second))
    module = to_torch(graph)
    assert torch.ops.aten.cumprod.default in [n.target for n in module.graph.nodes]
    assert_matches_reference(graph, module)


def test_a_graph_read_out_of_order_is_refused():
    b = GraphBuilder("bad")
    x = b.input("x", "f32[3]")
    orphan = gawee.Value(x.type, "orphan")
    b.graph.create_node("relu", [orphan])
    with pytest.raises(IRError, match="read before it is computed"):
        to_torch(b.output(x))


def masked_rows_and_nan_sign() -> tuple[gawee.Graph, list[torch.Tensor]]:
    """Attention whose masks shut a query out of every key (a given bool mask, a constant -inf float one), and
    sign of nan, with inputs that hit both: torch gives 0 for each (ONNX's Softmax and Sign, and StableHLO's
    exp(-inf - -inf) and sign, nan)."""
    b = GraphBuilder("masked")
    q, mask, x = b.input("q", "f32[1,2,3,4]"), b.input("mask", "bool[3,3]"), b.input("x", "f32[4]")
    shut = torch.zeros(3, 3).index_fill(0, torch.tensor([2]), -torch.inf)
    graph = b.output(
        b.scaled_dot_product_attention(q, q, q, mask), b.scaled_dot_product_attention(q, q, q, b.const(shut)), b.sign(x)
    )
    rows = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    return graph, [torch.randn(1, 2, 3, 4), rows, torch.tensor([torch.nan, -2.0, 0.0, 3.0])]


def test_every_unary_op_with_an_in_place_method_is_lowered_in_place():
    """The torch table lists, as in-place lowerings, exactly the elementwise ops of one operand and no attributes
    whose torch method ``<op>_`` exists (a new such op is added to ``IN_PLACE``)."""
    from gawee.backend.lower_torch import IN_PLACE
    from gawee.ops.base import all_ops

    eligible = [
        n
        for n, o in all_ops().items()
        if "elementwise" in o.traits and len(o.operands) == 1 and not o.attrs and hasattr(torch.Tensor, f"{n}_")
    ]
    assert list(IN_PLACE) == eligible


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_bf16_residual_convolution_with_its_relu_runs_in_either_layout(monkeypatch, channels_last):
    """torch's residual convolution in the plain layout (or of several groups) convolves, then adds and applies the
    ReLU with ``add_relu``, which has no bf16 kernel: the lowering applies the activation after it there."""
    if onednn.unavailable() is not None:
        pytest.skip(onednn.unavailable())
    monkeypatch.setattr(onednn, "no_bf16", lambda: None)  # torch's bf16 kernels, whichever CPU runs this
    torch.manual_seed(0)
    b = GraphBuilder("residual")
    x = b.input("x", "bf16[2,8,6,6]")
    conv = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], act="relu")
    for groups in (1, 2):
        w, bias = b.const(torch.randn(8, 8 // groups, 3, 3).bfloat16()), b.const(torch.randn(8).bfloat16())
        x = b.conv2d(x, w, bias, x, groups=groups, **conv)
    graph = b.output(x)
    module = to_torch(graph, TorchOptions(channels_last=channels_last))
    xs = [torch.randn(2, 8, 6, 6).bfloat16()]
    (want,) = gawee.run(graph, *xs)
    got = module(*xs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert got.dtype == torch.bfloat16 and float((got - want).float().abs().max()) <= 4 * 2.0**-8 * float(
        want.abs().max()
    )
