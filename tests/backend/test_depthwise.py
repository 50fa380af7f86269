"""The depthwise convolution with its activation (gawee.backend.depthwise) as a candidate kernel of oneDNN's
primitives runtime: where it is chosen it computes torch's convolution (bias, residual; ReLU, SiLU, hardswish;
kernel sizes, strides, padding, dilation, batches; every layout, channels that do not fill the last block), it is
offered only where it computes the convolution, the race decides, and a machine without a C compiler runs
without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gawee.backend import depthwise, dnnl, dnnl_conv, dnnl_plan
from gawee.backend.dnnl import DnnlModule

from .test_dnnl import (
    Lambda,
    _graph,
    assert_race_decides,
    assert_runs_like,
    assert_runs_without_compiler,
    convs_on,
    prefer,
)

pytestmark = [
    pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable())),
    pytest.mark.skipif(depthwise.unavailable() is not None, reason=str(depthwise.unavailable())),
]

ACTS = {"none": lambda x: x, "relu": F.relu, "silu": F.silu, "hardswish": F.hardswish}


@pytest.mark.parametrize("layout", dnnl.LAYOUTS)
@pytest.mark.parametrize(
    ("channels", "kernel", "stride", "padding", "dilation", "size", "batch"),
    [
        (32, 3, 1, 1, 1, 14, 1),  # MobileNet's: rows of 14 in two tiles of 7, reading the padding
        (48, 5, 2, 2, 1, 15, 2),  # 5×5, stride 2, an odd image, a batch
        (16, 3, 1, 2, 2, 11, 1),  # dilated
        (24, 7, 1, 3, 1, 9, 1),  # 7×7 on a 9-pixel image: most taps read the padding
        (32, 3, 3, 0, 1, 31, 1),  # stride 3 (no copy of its own), no padding; 10 pixels a row: tiles of 5
        (32, 3, 1, 1, 1, 40, 1),  # 40 pixels a row: five tiles of 8
    ],
)
@pytest.mark.parametrize("epilogue", ["none", "relu", "silu", "hardswish", "residual_relu", "silu_in_and_out"])
def test_depthwise_computes_torchs_convolution(
    monkeypatch, layout, channels, kernel, stride, padding, dilation, size, batch, epilogue
):
    """Against torch within 1e-5 of the output's magnitude, with the kernel chosen for every such convolution that
    its layout can hold (channels-last: a multiple of its vector; 24 channels fill no block of 16)."""
    torch.manual_seed(0)
    prefer(monkeypatch, dnnl_conv._Depthwise, wins=True)
    c = channels
    conv = nn.Conv2d(c, c, kernel, stride, padding, dilation=dilation, groups=c)
    if epilogue == "residual_relu":  # the residual is another depthwise convolution of the same input
        skip = nn.Conv2d(c, c, kernel, stride, padding, dilation=dilation, groups=c)
        model = Lambda(lambda p, x: F.relu(p[0](x) + p[1](x)), conv, skip)
    elif epilogue == "silu_in_and_out":  # EfficientNet's: the 1x1 convolution's SiLU applied as the rows are read
        model = Lambda(lambda p, x: F.silu(p[0](F.silu(p[1](x)))), conv, nn.Conv2d(c, c, 1))
    else:
        model = Lambda(lambda p, x: ACTS[epilogue](p[0](x)), conv)
    x = torch.randn(batch, c, size, size) * 3  # SiLU's e^-x over a wide range
    graph = assert_runs_like(model, x, layouts=[layout])
    module = DnnlModule(graph, layout=layout)
    fits = {"blocked": dnnl_plan.block_size() == depthwise.width(), "channels_last": c % depthwise.width() == 0}
    dws = [n for n in graph if n.op in ("conv2d", "onednn_depthwise") and n.attrs["groups"] > 1]
    # a prologue gawee's kernel cannot hold in this layout (24 channels in 16-lane vectors) runs as core ops
    unfolded = [n for n in dws if n.name not in module.conv_layouts]
    assert all(n.op == "onednn_depthwise" and n.attrs["act_in"] and not fits[layout] for n in unfolded)
    expected = sum(fits[module.conv_layouts[n.name]] for n in dws if n not in unfolded)
    assert list(module.conv_kernels.values()).count(dnnl_conv._Depthwise.name) == expected
    if layout == "blocked" and fits["blocked"]:
        assert expected == len(dws) == (2 if epilogue == "residual_relu" else 1)


def test_the_padding_lanes_of_a_block_stay_zero(monkeypatch):
    """12 channels fill 12 of a block's lanes: the kernel writes act(0) = 0 into the rest (zero filters, zero
    bias), which the next convolution reads as the zero padding oneDNN keeps there; its sum over all channels
    matches torch's."""
    torch.manual_seed(0)
    prefer(monkeypatch, dnnl_conv._Depthwise, wins=True)
    model = nn.Sequential(
        nn.Conv2d(12, 12, 3, padding=1, groups=12), nn.SiLU(), nn.Conv2d(12, 8, 1), nn.Conv2d(8, 8, 1, groups=8)
    )
    graph = assert_runs_like(model, torch.randn(1, 12, 10, 10), layouts=["blocked"])
    if dnnl_plan.block_size() == depthwise.width():
        assert dnnl_conv._Depthwise.name in DnnlModule(graph, layout="blocked").conv_kernels.values()


def test_depthwise_is_offered_only_where_its_vector_is_the_block(monkeypatch):
    """With oneDNN's blocks forced to the other width, the kernel is not offered in the blocked layout: a blocked
    module runs the convolution on oneDNN's kernels there (or, where oneDNN has only its reference kernel in blocks
    of 16 on an AVX2 CPU, on the depthwise kernel in channels-last); a channels-last one on the depthwise kernel."""
    torch.manual_seed(0)
    other = 8 if depthwise.width() == 16 else 16
    monkeypatch.setattr(dnnl_plan, "block_size", lambda: other)
    prefer(monkeypatch, dnnl_conv._Depthwise, wins=True)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.SiLU())
    graph = assert_runs_like(model, torch.randn(1, 16, 9, 9), layouts=["blocked", "channels_last"])
    blocked = DnnlModule(graph, layout="blocked")
    for name, kernel in blocked.conv_kernels.items():
        assert kernel != dnnl_conv._Depthwise.name or blocked.conv_layouts[name] == "channels_last"
    assert convs_on(graph, "channels_last", dnnl_conv._Depthwise) == 1


def test_depthwise_is_a_candidate_only_where_it_computes_the_convolution(monkeypatch):
    """A channel multiplier (32 -> 64 in 32 groups), groups of 2 channels and an activation the epilogue does not
    apply (sigmoid: padding lanes would be 0.5) run on oneDNN's kernels even when the kernel would win every
    race."""
    torch.manual_seed(0)
    prefer(monkeypatch, dnnl_conv._Depthwise, wins=True)
    model = nn.Sequential(
        nn.Conv2d(32, 64, 3, padding=1, groups=32),
        nn.Conv2d(64, 64, 3, padding=1, groups=32),
        nn.Conv2d(64, 64, 3, padding=1, groups=64),
        nn.Sigmoid(),
    )
    graph = assert_runs_like(model, torch.randn(1, 32, 12, 12))
    for layout in dnnl.LAYOUTS:
        assert convs_on(graph, layout, dnnl_conv._Depthwise) == 0


def test_depthwise_runs_only_where_it_measures_fastest(monkeypatch):
    """The race decides: measured slower, a convolution the kernel could compute runs on oneDNN's; measured
    faster, on the depthwise kernel."""
    torch.manual_seed(0)
    c = 2 * depthwise.width()
    model = nn.Sequential(
        nn.Conv2d(c, c, 3, padding=1, groups=c), nn.ReLU(), nn.Conv2d(c, c, 5, padding=2, groups=c), nn.SiLU()
    )
    assert_race_decides(monkeypatch, _graph(model, torch.randn(1, c, 10, 10)), dnnl_conv._Depthwise.name, 2)


def test_without_a_c_compiler_the_runtime_runs_without_the_depthwise_kernel(monkeypatch, tmp_path):
    """A compiler that fails is a reason (:func:`depthwise.available`), not an error: the module is built from
    oneDNN's kernels alone and still computes the model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.SiLU())
    assert_runs_without_compiler(
        monkeypatch, tmp_path, depthwise, dnnl_conv._Depthwise, model, torch.randn(1, 16, 8, 8)
    )


def test_the_filters_are_packed_chunk_tap_channel_and_padded():
    """weights() puts w[V·cb + j][0][kh][kw] at [cb][kh][kw][j], zero past the channels; bias() pads too."""
    w = torch.arange(20 * 3 * 3, dtype=torch.float32).reshape(20, 1, 3, 3) + 1
    packed = depthwise.weights(w, 8).reshape(3, 3, 3, 8)
    for cb, kh, kw, j in ((0, 0, 0, 0), (1, 2, 1, 5), (2, 1, 2, 3)):
        assert packed[cb, kh, kw, j] == w[8 * cb + j, 0, kh, kw]
    assert not packed[2, :, :, 4:].any()
    assert depthwise.bias(torch.ones(20), 8).tolist() == [1.0] * 20 + [0.0] * 4


def _moved(graph, layout: str) -> dict[str, str]:
    return DnnlModule(graph, layout=layout).moved_acts


def test_a_silu_only_a_depthwise_convolution_reads_moves_into_its_kernel():
    """1x1 convolution -> SiLU -> depthwise -> SiLU -> 1x1 (EfficientNet's block): the first SiLU is applied by the
    depthwise kernel to its input, in every layout the kernel can hold (per_conv: either), also with channels that
    do not fill the last block (their padding lanes read act(0) = 0); it computes torch's block."""
    torch.manual_seed(0)
    vector = depthwise.width()
    for c in (2 * vector, 12):
        model = nn.Sequential(
            nn.Conv2d(8, c, 1), nn.SiLU(), nn.Conv2d(c, c, 3, padding=1, groups=c), nn.SiLU(), nn.Conv2d(c, 8, 1)
        )
        graph = assert_runs_like(model, torch.randn(1, 8, 13, 13) * 3)
        # the target phase (rules/targets/onednn/3-depthwise.rules) moved the SiLU: the producer has none left
        (dw,) = [n.name for n in graph if n.op == "onednn_depthwise" and n.attrs["act_in"] == "silu"]
        assert [n.attrs["act"] for n in graph if n.op == "conv2d"] == [None, None]
        fits = {"blocked": dnnl_plan.block_size() == vector, "channels_last": c % vector == 0}
        fits["per_conv"] = any(fits.values())
        for layout in dnnl.LAYOUTS:
            module = DnnlModule(graph, layout=layout)
            assert module.moved_acts == ({dw: "silu"} if fits[layout] else {}), (c, layout)
            if fits[layout]:
                assert module.conv_kernels[dw] == dnnl_conv._Depthwise.name
            else:  # a torch step of the target op computes it (the SiLU, then the convolution)
                assert "torch:onednn_depthwise" in module.kernels


def test_an_activation_stays_with_its_producer_where_the_kernel_would_not_apply_it_alone():
    """Not moved: a SiLU another node also reads (an SE block's pool), a ReLU (oneDNN's post-op costs nothing), a
    SiLU before a convolution of 2 channels per group, a SiLU that is the graph's output too."""
    torch.manual_seed(0)
    c = 2 * depthwise.width()
    conv1, dw = nn.Conv2d(8, c, 1), nn.Conv2d(c, c, 3, padding=1, groups=c)
    pool = nn.AdaptiveAvgPool2d(1)
    shared = Lambda(lambda p, x: (lambda y: p[1](y) * p[2](y))(F.silu(p[0](x))), conv1, dw, pool)
    relu = nn.Sequential(conv1, nn.ReLU(), dw)
    pairs = nn.Sequential(conv1, nn.SiLU(), nn.Conv2d(c, c, 3, padding=1, groups=c // 2))
    output = Lambda(lambda p, x: (lambda y: (y, p[1](y)))(F.silu(p[0](x))), conv1, dw)
    for model in (shared, relu, pairs, output):
        graph = assert_runs_like(model, torch.randn(1, 8, 9, 9))
        assert "onednn_depthwise" not in {n.op for n in graph}
        assert all(_moved(graph, layout) == {} for layout in dnnl.LAYOUTS)
