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


def test_onednn_never_runs_a_dilated_window_over_a_channels_last_input_with_a_spatial_size_of_1():
    assert onednn.safe_geometry((1, 4, 5, 3), True, [2, 2])
    assert onednn.safe_geometry((1, 4, 5, 1), False, [2, 2])
    assert onednn.safe_geometry((1, 4, 5, 1), True, [1, 1])  # undilated: the squeeze-excite 1x1 case
    assert not onednn.safe_geometry((1, 4, 5, 1), True, [2, 1])
    assert not onednn.safe_geometry((2, 4, 1, 7), True, [1, 3])
    gb = GraphBuilder("width_1")
    x = gb.input("x", "f32[2,3,9,1]")
    w = gb.const(torch.randn(1, 3, 3, 2), "w")
    graph = gb.output(gb.conv2d(x, w, None, stride=[1, 2], padding=[0, 3], dilation=[3, 2]))
    module = to_torch(graph, TorchOptions(channels_last=True))
    assert not any("mkldnn" in t for t in _targets(module))
    xs = torch.randn(2, 3, 9, 1)
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


def test_stride_1_in_height_and_more_in_width_runs_on_the_plain_weight():
    """oneDNN's convolution over a packed weight computes wrong values for some convolutions of stride (1, s > 1);
    over the plain weight it is right: the lowering packs no such weight."""
    assert not onednn.packable((1, 3)) and not onednn.packable([1, 2])
    assert onednn.packable((1, 1)) and onednn.packable((2, 1)) and onednn.packable((2, 2)) and onednn.packable((3, 2))
    graph, xs = _conv((1, 1, 11, 2), (1, 1, 4, 4), stride=[1, 3], padding=[1, 2], dilation=[3, 1])
    for options in (TorchOptions(channels_last=False), TorchOptions(channels_last=True)):
        module = to_torch(graph, options)
        assert any("_convolution_pointwise" in t for t in _targets(module)), options
        assert not any(name.endswith("packed_weight") for name, _ in module.named_buffers()), options
        torch.testing.assert_close(module(xs)[0], gawee.run(graph, xs)[0])
    packed = to_torch(_conv((1, 1, 11, 4), (1, 1, 3, 3), stride=[2, 2])[0], TorchOptions(channels_last=False))
    assert any(name.endswith("packed_weight") for name, _ in packed.named_buffers())
