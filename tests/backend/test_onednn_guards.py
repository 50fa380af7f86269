"""The geometries and dtypes the torch lowering keeps away from oneDNN's fused convolution (or from its packed
weights): each guard, and a graph of each such geometry lowered and run against the interpreter (a crash would
take the test's process down, a wrong value fails the comparison)."""

import pytest
import torch

import gawee
from gawee.backend import TorchOptions, onednn, to_torch
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType

pytestmark = pytest.mark.skipif(onednn.unavailable() is not None, reason=str(onednn.unavailable()))


def _conv(x_shape, w_shape, **attrs):
    gb = GraphBuilder("conv")
    x = gb.input("x", f"f32[{','.join(map(str, x_shape))}]")
    w = gb.const(torch.randn(w_shape, generator=torch.Generator().manual_seed(0)), "w")
    b = gb.const(torch.randn(w_shape[0], generator=torch.Generator().manual_seed(1)), "b")
    return gb.output(gb.conv2d(x, w, b, **attrs)), torch.randn(x_shape, generator=torch.Generator().manual_seed(2))


def _targets(module) -> set[str]:
    return {str(n.target) for n in module.graph.nodes}


def test_onednn_takes_bf16_only_where_the_cpu_and_torch_both_run_it(monkeypatch):
    def supports(dtype, no_bf16, torch_bf16) -> bool:
        monkeypatch.setattr(onednn, "no_bf16", lambda: no_bf16)
        monkeypatch.setattr(onednn, "_torch_bf16", lambda: torch_bf16)
        onednn.supports.cache_clear()
        return onednn.supports(dtype)

    try:
        assert supports(DType.bf16, None, True) and supports(DType.f32, None, True)
        assert not supports(DType.f16, None, True)
        assert not supports(DType.bf16, "no bf16 instructions (planted)", True)
        assert supports(DType.f32, "no bf16 instructions (planted)", True)
        assert not supports(DType.bf16, None, False)
    finally:
        onednn.supports.cache_clear()


def test_onednn_never_runs_the_geometries_it_crashes_or_errs_on():
    assert onednn.safe_geometry((1, 4, 5, 3), (1, 1), [2, 2])
    assert onednn.safe_geometry((1, 4, 5, 1), (2, 2), [1, 1])  # undilated over a width of 1: squeeze-excite's 1x1
    assert not onednn.safe_geometry((1, 4, 5, 1), (2, 2), [2, 1])  # a dilated window over a width of 1
    assert not onednn.safe_geometry((2, 4, 1, 7), (1, 1), [1, 3])
    assert not onednn.safe_geometry((1, 4, 9, 9), (1, 2), [1, 1]) and not onednn.safe_geometry(
        (1, 4, 9, 9), [1, 3], [1, 1]
    )
    assert onednn.safe_geometry((1, 4, 9, 9), (2, 1), [1, 1]) and onednn.safe_geometry((1, 4, 9, 9), (3, 2), [1, 1])


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_dilated_window_over_a_width_of_1_runs_the_reference(channels_last):
    """oneDNN's convolution on the packed weight segfaults here, in either memory format."""
    graph, xs = _conv((2, 2, 3, 1), (8, 2, 3, 2), stride=[2, 2], padding=[2, 3], dilation=[2, 2])
    module = to_torch(graph, TorchOptions(channels_last=channels_last))
    assert not any("mkldnn" in t for t in _targets(module))
    torch.testing.assert_close(module(xs)[0], gawee.run(graph, xs)[0])


def test_a_dilated_kernel_dimension_of_1_runs_undilated():
    """A window one tap wide with dilation 2, stride 2 and padding 1 over a width of 1: oneDNN's convolution on the
    packed weight segfaults on it; the lowering passes dilation 1 there (the same convolution)."""
    assert onednn.effective_dilation((2, 1), (1, 2)) == [1, 1]
    assert onednn.effective_dilation((3, 3), (2, 2)) == [2, 2]
    graph, xs = _conv((1, 2, 4, 1), (2, 2, 2, 1), stride=[2, 2], padding=[0, 1], dilation=[1, 2])
    module = to_torch(graph, TorchOptions(channels_last=False))
    assert any("_convolution_pointwise" in t for t in _targets(module))
    torch.testing.assert_close(module(xs)[0], gawee.run(graph, xs)[0])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_stride_1_in_height_and_more_in_width_runs_the_reference(dtype, channels_last):
    """oneDNN's convolution computes wrong values for some convolutions of stride (1, s > 1): on the packed weight
    (this geometry, f32: 2.16 off), on the plain one too in bf16 channels-last (torch's own bf16 conv2d as well)."""
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gb = GraphBuilder("stride_1_2")
    x = gb.input("x", f"{dtype}[1,1,11,2]")
    w = gb.const(torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0)).to(tdtype), "w")
    b = gb.const(torch.randn(1, generator=torch.Generator().manual_seed(1)).to(tdtype), "b")
    graph = gb.output(gb.conv2d(x, w, b, stride=[1, 3], padding=[1, 2], dilation=[3, 1]))
    module = to_torch(graph, TorchOptions(channels_last=channels_last))
    assert not any("mkldnn" in t for t in _targets(module))
    xs = torch.randn(1, 1, 11, 2, generator=torch.Generator().manual_seed(2)).to(tdtype)
    assert torch.equal(module(xs)[0], gawee.run(graph, xs)[0])
    packed = to_torch(_conv((1, 1, 11, 4), (1, 1, 3, 3), stride=[2, 2])[0], TorchOptions(channels_last=False))
    assert any(name.endswith("packed_weight") for name, _ in packed.named_buffers())
