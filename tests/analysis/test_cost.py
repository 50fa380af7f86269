"""FLOPs match torch.utils.flop_counter to the FLOP; bytes and peak memory follow their definitions."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import gawee
from gawee.frontend.capture import export_program, from_exported_program
from gawee.ir.builder import GraphBuilder

# gawee op -> the ATen ops flop_counter attributes its FLOPs to
COUNTED_AS = {
    "conv2d": "convolution",
    "linear": "mm",
    "matmul": "mm",
    "mm": "mm",
    "bmm": "mm",
    "scaled_dot_product_attention": "attention",
}


def _their_category(aten_name: str) -> str:
    if "convolution" in aten_name:
        return "convolution"
    if "attention" in aten_name:
        return "attention"
    return "mm"  # mm, addmm, bmm, baddbmm


@pytest.mark.parametrize("name", ["resnet18", "vgg11", "vit_b_16"])
def test_flops_match_flop_counter_on_the_same_exported_program(name):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    ep, _, _ = export_program(model, (x,))
    g = from_exported_program(ep, name)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        ep.module()(x)
    theirs: dict[str, int] = {}
    for op, n in counter.get_flop_counts()["Global"].items():
        cat = _their_category(str(op))
        theirs[cat] = theirs.get(cat, 0) + n
    ours: dict[str, int] = {}
    for c in gawee.cost(g).nodes:
        if c.op in COUNTED_AS:
            ours[COUNTED_AS[c.op]] = ours.get(COUNTED_AS[c.op], 0) + c.flops
    both = set(ours) & set(theirs)  # on CPU flop_counter does not see attention kernels
    assert {"convolution", "mm"} <= both
    assert {k: ours[k] for k in both} == {k: theirs[k] for k in both}


def test_bytes_and_views():
    b = GraphBuilder()
    x = b.input("x", "f32[4,8]")
    w = b.const(torch.randn(16, 8), "w")
    y = b.linear(x, w)  # reads 4*8*4 + 16*8*4, writes 4*16*4
    z = b.reshape(y, shape=[64])  # a view: free
    b.output(b.relu(z))
    costs = {c.op: c for c in gawee.cost(b.graph).nodes}
    assert (costs["linear"].bytes_read, costs["linear"].bytes_written) == (128 + 512, 256)
    assert (costs["reshape"].bytes_read, costs["reshape"].bytes_written) == (0, 0)
    assert costs["linear"].flops == 2 * 4 * 16 * 8 and costs["relu"].flops == 64


def test_layout_conversions_cost_their_bytes():
    b = GraphBuilder()
    x = b.input("x", "f32[2,3,4,5]")
    y = b.to_layout(x, layout="channels_last")  # a copy: reads and writes the tensor
    b.output(b.reshape(b.relu(y), shape=[-1]))
    costs = {c.op: c for c in gawee.cost(b.graph).nodes}
    assert (costs["to_layout"].bytes_read, costs["to_layout"].bytes_written) == (480, 480)
    assert costs["to_layout"].flops == 0 and (costs["reshape"].bytes_read, costs["reshape"].bytes_written) == (0, 0)


def test_peak_memory_by_liveness():
    b = GraphBuilder()
    x = b.input("x", "f32[256]")  # 1 KiB
    a = b.relu(x)  # x, a live: 2 KiB
    c = b.sigmoid(a)  # x dead after relu; a, c live: 2 KiB
    v = b.reshape(c, shape=[16, 16])  # a view of c: no new buffer
    d = b.add(v, b.reshape(a, shape=[16, 16]))  # a, c, d: 3 KiB  <- peak
    e = b.neg(d)  # d, e: 2 KiB
    b.output(e)
    peak, at = gawee.peak_memory(b.graph)
    assert (peak, at) == (3 * 1024, d.producer.name)


def test_constant_propagation():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    w = b.const(torch.ones(4), "w")
    s = b.mul(w, 2.0)
    r = b.add(x, s)
    f = b.full(shape=[4], value=1.0, dtype="f32")
    b.output(b.add(r, f))
    known = gawee.constant_values(b.graph)
    assert s in known and f in known and w in known
    assert r not in known and x not in known


def test_topological_order_repairs_a_shuffled_graph():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    a = b.relu(x)
    c = b.neg(a)
    b.output(c)
    g = b.graph
    order = gawee.topological_order(g)
    assert [n.op for n in order] == ["relu", "neg"]


def test_attention_flops_use_flop_counter_formula():
    from torch.utils.flop_counter import sdpa_flop_count

    from gawee.ir.types import DType, TensorType
    from gawee.ops import get_op

    q, k, v = (TensorType((2, 12, 197, 64), DType.f32) for _ in range(3))
    op = get_op("scaled_dot_product_attention")
    attrs = op.complete_attrs({})
    (out,) = op.infer_types([q, k, v, None], attrs)
    assert op.flops([q, k, v, None], [out], attrs) == sdpa_flop_count(q.shape, k.shape, v.shape)


def test_a_view_of_a_view_of_a_constant_is_no_activation():
    """ConvBERT slices a slice of its position-id buffer: neither is an activation (it raised KeyError)."""
    b = GraphBuilder()
    x = b.input("x", "f32[4,16]")  # 256 B
    ids = b.slice(b.slice(b.const(torch.arange(32.0).reshape(1, 32)), dim=1, start=0, end=16), dim=0, start=0, end=1)
    b.output(b.add(x, ids))
    assert gawee.peak_memory(b.graph) == (2 * 256, b.graph.nodes[-1].name)
