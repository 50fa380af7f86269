"""f16/bf16 convolutions on CPU: no crash (oneDNN's f16 kernel segfaults on Sapphire Rapids) and within one
ulp of a float64 reference, through the reference interpreter and the torch backend alike."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.backend import TorchOptions, onednn, to_torch
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType

MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}

# (op, torch function, x shape, w shape, attrs); the first is the crashing geometry.
CASES = [
    (
        "conv2d",
        F.conv2d,
        (1, 2, 4, 1),
        (2, 2, 2, 1),
        {"stride": [2, 2], "padding": [0, 1], "dilation": [1, 2], "groups": 1},
    ),
    (
        "conv2d",
        F.conv2d,
        (2, 16, 9, 7),
        (32, 4, 3, 3),
        {"stride": [2, 1], "padding": [1, 2], "dilation": [2, 1], "groups": 4},
    ),
    ("conv1d", F.conv1d, (2, 6, 11), (4, 3, 3), {"stride": [2], "padding": [1], "dilation": [2], "groups": 2}),
    (
        "conv3d",
        F.conv3d,
        (1, 4, 5, 4, 3),
        (4, 4, 2, 2, 2),
        {"stride": [1, 2, 1], "padding": [1, 0, 1], "dilation": [1, 1, 2], "groups": 1},
    ),
    (
        "conv_transpose2d",
        F.conv_transpose2d,
        (2, 16, 12, 12),
        (16, 8, 3, 3),
        {"stride": [2, 2], "padding": [1, 1], "output_padding": [1, 1], "groups": 1, "dilation": [1, 1]},
    ),
    (
        "conv_transpose2d",
        F.conv_transpose2d,
        (1, 4, 3, 5),
        (4, 3, 2, 3),
        {"stride": [2, 1], "padding": [0, 1], "output_padding": [1, 0], "groups": 2, "dilation": [2, 1]},
    ),
]


def _positional(op: str, attrs: dict) -> list:
    keys = (
        ("stride", "padding", "output_padding", "groups", "dilation")
        if op == "conv_transpose2d"
        else (
            "stride",
            "padding",
            "dilation",
            "groups",
        )
    )
    return [attrs[k] for k in keys]


def within_one_ulp(got: torch.Tensor, x, w, b, fn, args) -> torch.Tensor:
    """Elementwise: |got - exact| <= 1 ulp of the exact value in got's dtype, plus float32's own accumulation
    error bound (K+1) * 2^-24 * (|x| conv |w| + |b|), which matters only where terms cancel to near zero."""
    dtype = got.dtype
    exact = fn(x.double(), w.double(), b.double(), *args)
    magnitude = fn(x.double().abs(), w.double().abs(), b.double().abs(), *args)
    terms = math.prod(w.shape[1:]) if fn is not F.conv_transpose2d else math.prod(w.shape[2:]) * w.shape[0]
    tiny = torch.finfo(dtype).tiny
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(tiny))) - MANTISSA_BITS[dtype])
    bound = ulp + (terms + 1) * 2.0**-24 * magnitude
    return (got.double() - exact).abs() <= bound


def _graph(op, dtype, x, w, b, attrs):
    gb = GraphBuilder(f"{op}_{NAMES[dtype]}")
    xi = gb.input("x", f"{NAMES[dtype]}[{','.join(map(str, x.shape))}]")
    y = getattr(gb, op)(xi, gb.const(w, "w"), gb.const(b, "b"), **attrs)
    return gb.output(y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_low_precision_convolutions_match_float64_within_one_ulp(case, dtype):
    op, fn, x_shape, w_shape, attrs = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(x_shape, generator=gen).to(dtype)
    w = torch.randn(w_shape, generator=gen).to(dtype)
    cout = w_shape[1] * attrs["groups"] if op == "conv_transpose2d" else w_shape[0]
    b = torch.randn(cout, generator=gen).to(dtype)
    graph = _graph(op, dtype, x, w, b, attrs)
    args = _positional(op, attrs)

    (interp,) = gawee.run(graph, x)
    assert interp.dtype == dtype
    ok = within_one_ulp(interp, x, w, b, fn, args)
    assert ok.all(), f"{(~ok).sum().item()}/{ok.numel()} elements off by more than one ulp"

    onednn_bf16 = dtype is torch.bfloat16 and op == "conv2d" and onednn.supports(DType.bf16)
    for options in (TorchOptions(), TorchOptions(fused_kernels=False), TorchOptions(channels_last=True)):
        (backend,) = to_torch(graph, options)(x)
        assert backend.dtype == dtype
        if onednn_bf16 and options.fused_kernels:  # oneDNN's bf16 kernel: float32 sums in its own order, one rounding
            ok = within_one_ulp(backend, x, w, b, fn, args)
            assert ok.all(), f"{options}: {(~ok).sum().item()}/{ok.numel()} elements off by more than one ulp"
        else:
            assert torch.equal(backend, interp), options  # the same float32 computation, rounded once


def test_the_ulp_bound_rejects_a_result_two_ulps_off():
    op, fn, x_shape, w_shape, attrs = CASES[1]
    x, w, b = (torch.randn(s, generator=torch.Generator().manual_seed(1)).half() for s in (x_shape, w_shape, (32,)))
    args = _positional(op, attrs)
    exact = fn(x.double(), w.double(), b.double(), *args)
    rounded = exact.half()
    assert within_one_ulp(rounded, x, w, b, fn, args).all()
    big = exact.abs() > 1
    two_ulps = torch.exp2(torch.floor(torch.log2(exact.abs())) - 9)
    nudged = (exact + two_ulps).half()
    assert not within_one_ulp(nudged, x, w, b, fn, args)[big].any()


def _fused_low(dtype: str):
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gb = GraphBuilder("fused_low")
    x = gb.input("x", f"{dtype}[1,4,6,6]")
    w = gb.const(torch.randn(4, 4, 3, 3, generator=torch.Generator().manual_seed(0)).to(tdtype), "w")
    y = gb.conv2d(x, w, None, x, padding=[1, 1], act="relu", act_params=())
    return gb.output(y), torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(1)).to(tdtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_backend_hands_low_precision_convolutions_to_onednn_only_bf16_on_a_bf16_cpu(dtype, monkeypatch):
    """f16 never (oneDNN's f16 convolution crashes on some CPUs); bf16 not on a CPU without bf16 arithmetic (its
    kernels would convert around every op): both run the op's reference lowering, bit for bit the interpreter."""
    monkeypatch.setattr(onednn, "no_bf16", lambda: "this CPU has no bf16 instructions (planted)")
    onednn.supports.cache_clear()
    try:
        graph, xs = _fused_low(dtype)
        module = to_torch(graph)
    finally:
        onednn.supports.cache_clear()
    assert not any("mkldnn" in str(n.target) for n in module.graph.nodes)
    assert torch.equal(module(xs)[0], gawee.run(graph, xs)[0])


@pytest.mark.skipif(not onednn.supports(DType.bf16), reason="this CPU or torch runs no oneDNN bf16 kernels")
def test_a_bf16_cpu_runs_bf16_convolutions_on_onednn():
    """Where the CPU has bf16 arithmetic, the bf16 convolution (with its residual and relu) is oneDNN's fused
    kernel, within two bf16 ulps (and float32's accumulation error) of the exact result."""
    graph, xs = _fused_low("bf16")
    module = to_torch(graph)
    assert any("mkldnn._convolution_pointwise" in str(n.target) for n in module.graph.nodes)
    (got,) = module(xs)
    w = graph.nodes[0].inputs[1].data
    exact = F.conv2d(xs.double(), w.double(), padding=1) + xs.double()
    magnitude = F.conv2d(xs.double().abs(), w.double().abs(), padding=1) + xs.double().abs()
    ulp = torch.exp2(torch.floor(torch.log2(exact.relu().clamp_min(torch.finfo(torch.bfloat16).tiny))) - 7)
    assert ((got.double() - exact.relu()).abs() <= 2 * ulp + 38 * 2.0**-24 * magnitude).all()


def test_a_channels_last_convolution_runs_where_onednn_would_crash():
    """A grouped, dilated, padded window over a width of 1 on a channels-last input: oneDNN's channels-last
    kernel segfaults on some CPUs; the op convolves it in NCHW, agrees with the contiguous input and gives
    a channels-last result."""
    from gawee.ops import get_op

    x = torch.randn(2, 4, 5, 1)
    w, b = torch.randn(2, 2, 3, 1), torch.randn(2)
    attrs = dict(stride=(2, 2), padding=(1, 1), dilation=(2, 2), groups=2)
    conv = get_op("conv2d")
    got = conv.evaluate(x.to(memory_format=torch.channels_last), w, b, **attrs)
    torch.testing.assert_close(got, conv.evaluate(x, w, b, **attrs))
    assert got.is_contiguous(memory_format=torch.channels_last)
