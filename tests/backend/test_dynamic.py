"""Dynamic batch end to end: one capture of resnet18 serves batch 1, 3 and 8 through gawee.run,
to_torch and gawee.compile, with every fold and fusion of the static capture."""

import pytest
import torch
import torchvision
from torch.export import Dim

import gawee
from gawee.ir.symbolic import ShapeOutOfRange, Sym

BATCH = {"x": {0: Dim("batch", min=1, max=32)}}


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    static = gawee.capture(model, (x,))
    dynamic = gawee.capture(model, (x,), dynamic_shapes=BATCH)
    return model, x, static, dynamic


def test_capture_makes_the_batch_a_symbol(resnet):
    _, _, static, dynamic = resnet
    (s,) = dynamic.inputs[0].shape[:1]
    assert isinstance(s, Sym) and (s.lo, s.hi, s.example) == (1, 32, 2)
    assert dynamic.inputs[0].shape[1:] == (3, 64, 64)
    assert dynamic.outputs[0].shape == (s, 1000)
    assert [n.op for n in dynamic] == [n.op for n in static]
    assert not gawee.infer_types(dynamic)  # registry inference agrees with what export recorded


def test_rewrite_applies_every_static_fold_and_fusion(resnet):
    _, _, static, dynamic = resnet
    s_opt, s_rep = gawee.rewrite(static)
    d_opt, d_rep = gawee.rewrite(dynamic)
    assert d_rep.firings == s_rep.firings
    assert d_rep.firings["fold_conv_bn"] == 20
    assert len(d_opt) == len(s_opt) == 24
    assert not any(n.op == "batch_norm" for n in d_opt)


def test_run_and_to_torch_every_batch(resnet):
    model, _, _, dynamic = resnet
    opt, _ = gawee.rewrite(dynamic)
    module = gawee.to_torch(opt)
    for n in (1, 3, 8):
        x = torch.randn(n, 3, 64, 64)
        with torch.no_grad():
            ref = model(x)
        (y,) = gawee.run(opt, x)
        (z,) = module(x)
        assert y.shape == z.shape == (n, 1000)
        assert torch.allclose(y, ref, atol=1e-4, rtol=1e-4)
        assert torch.allclose(z, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ShapeOutOfRange, match=r"input x dimension 0 is 33, outside the range of s\d+: 1..32"):
        module(torch.randn(33, 3, 64, 64))
    with pytest.raises(ShapeOutOfRange, match="dimension 2 is 32, the graph needs 64"):
        module(torch.randn(2, 3, 32, 64))


def test_convolution_weights_packed_per_batch_met(resnet):
    """oneDNN's weight format depends on the input size: a dynamic module packs each convolution's
    weight once per size it meets (the example's at build time), never reusing another size's packing."""
    from gawee.backend import onednn

    if not onednn.supports(gawee.DType.f32):
        pytest.skip("no oneDNN fused convolution in this torch")
    _, _, _, dynamic = resnet
    opt, _ = gawee.rewrite(dynamic)
    module = gawee.to_torch(opt, gawee.TorchOptions(linear_kernel="aten"))  # the fc packs no weight then
    packers = [n.target for n in module.graph.nodes if isinstance(n.target, onednn.PackedPerSize)]
    assert len(packers) == sum(n.op == "conv2d" for n in opt) == 20
    first = packers[0]
    assert list(first.packed) == [(2, 3, 64, 64)]  # the example size
    with torch.no_grad():
        for n in (1, 3, 1, 4, 5, 6):
            module(torch.randn(n, 3, 64, 64))
    assert (
        list(first.packed)
        == [(3, 3, 64, 64), (1, 3, 64, 64), (4, 3, 64, 64), (5, 3, 64, 64), (6, 3, 64, 64)][-first.keep :]
    )


@pytest.mark.parametrize("kernel", ["mkl", "onednn"])
def test_linear_weights_packed_per_rows_met(resnet, kernel):
    """MKL's and oneDNN's packed GEMMs are packed for one M: a dynamic module packs per M it meets."""
    from gawee.backend import kernels, onednn

    model, _, _, dynamic = resnet
    if kernel not in kernels.linear_candidates(None, gawee.DType.f32):
        pytest.skip(f"no {kernel} linear in this torch")
    opt, _ = gawee.rewrite(dynamic)
    module = gawee.to_torch(opt, gawee.TorchOptions(linear_kernel=kernel))
    (fc,) = [c for c in module.gawee_kernels if c.op == "linear"]
    assert fc.kernel == kernel
    (packer,) = [
        n.target
        for n in module.graph.nodes
        if isinstance(n.target, onednn.PackedPerSize) and n.target.__name__ == "linear_packed_for"
    ]
    for n in (1, 3):
        x = torch.randn(n, 3, 64, 64)
        with torch.no_grad():
            assert torch.allclose(module(x)[0], model(x), atol=1e-4, rtol=1e-4)
    assert list(packer.packed) == [(2, 512), (1, 512), (3, 512)]


def test_compile_with_dynamic_batch(resnet):
    model, x, _, _ = resnet
    module = gawee.compile(model, (x,), dynamic_shapes=BATCH)
    report = module.gawee_report
    assert report.rewrite.firings["fold_conv_bn"] == 20 and len(report.optimized) == 24
    for n in (1, 3, 8):
        xb = torch.randn(n, 3, 64, 64)
        with torch.no_grad():
            assert torch.allclose(module(xb), model(xb), atol=1e-4, rtol=1e-4)


def test_to_onnx_writes_dynamic_axes(resnet):
    ort = pytest.importorskip("onnxruntime")
    model, _, _, dynamic = resnet
    opt, _ = gawee.rewrite(dynamic)
    proto = gawee.to_onnx(opt)
    (s,) = [d for d in opt.inputs[0].shape if not isinstance(d, int)]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == s.name
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == s.name
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = torch.randn(n, 3, 64, 64)
        (y,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            assert torch.allclose(torch.from_numpy(y), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("v2", [False, True], ids=["swin", "swin_v2"])
def test_swin_window_partition_optimizes_as_the_static_capture(v2):
    """The zero pad and the full slices around the window partition are inferred over the batch (pad's
    shape formula; a slice to 2**63-1 covers any size) and folded as in the static capture."""
    from torchvision.models import swin_transformer as sw

    torch.manual_seed(0)
    kw = {"block": sw.SwinTransformerBlockV2, "downsample_layer": sw.PatchMergingV2} if v2 else {}
    model = sw.SwinTransformer([4, 4], 8, [2, 2], [1, 2], [2, 2], num_classes=5, **kw).eval()
    x = torch.randn(2, 3, 16, 16)
    static, _ = gawee.rewrite(gawee.capture(model, (x,)))
    dynamic, _ = gawee.rewrite(gawee.capture(model, (x,), dynamic_shapes={"x": {0: Dim("batch", min=1)}}))
    assert isinstance(dynamic.inputs[0].shape[0], Sym)
    assert [n.op for n in dynamic] == [n.op for n in static]
    assert not any(n.op in ("aten", "pad") for n in dynamic)
    for n in (1, 3):
        xs = torch.randn(n, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(gawee.run(dynamic, xs)[0], model(xs), rtol=1e-4, atol=1e-4)


class BatchIndex(torch.nn.Module):
    """`arange(batch)`, as Hugging Face's mask builders write it."""

    def forward(self, x):
        return x + torch.arange(x.shape[0])[:, None]


def test_arange_of_the_batch_is_an_op_not_an_opaque_node():
    from gawee.backend.onnx import ExportError

    stats = gawee.CaptureStats()
    g = gawee.capture(BatchIndex(), (torch.randn(3, 4),), dynamic_shapes=BATCH, stats=stats)
    assert stats.opaque_ops == {}
    (node,) = [n for n in g if n.op == "arange"]
    assert isinstance(node.attrs["end"], Sym) and node.output.type.shape == (node.attrs["end"],)
    module = gawee.to_torch(g)
    for n in (1, 5):
        x = torch.randn(n, 4)
        assert torch.equal(gawee.run(g, x)[0], BatchIndex()(x))
        assert torch.equal(module(x)[0], BatchIndex()(x))
    with pytest.raises(ExportError, match="arange of a symbolic length"):
        gawee.to_onnx(g)
