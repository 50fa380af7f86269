"""The grouped convolution of 8 channels per group (gawee.backend.grouped) as a candidate kernel of oneDNN's
primitives runtime: where it is chosen it computes torch's convolution (bias, residual, ReLU; strides 1 and 2,
padding, dilation, kernel sizes; every layout, blocks of 8 and 16), it is offered only where it computes the
convolution, the race decides, and a machine without a C compiler runs without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gawee.backend import dnnl, dnnl_conv, dnnl_plan, grouped
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
    pytest.mark.skipif(grouped.unavailable() is not None, reason=str(grouped.unavailable())),
]


@pytest.mark.parametrize("layout", dnnl.LAYOUTS)
@pytest.mark.parametrize(
    ("groups", "kernel", "stride", "padding", "dilation", "size", "batch"),
    [
        (6, 3, 1, 1, 1, 9, 1),  # RegNet's: rows in tiles of 9, pixels at both edges reading the padding
        (13, 3, 2, 1, 1, 15, 2),  # stride 2, an odd image, a batch
        (3, 3, 1, 2, 2, 10, 1),  # dilated
        (2, 5, 2, 2, 1, 13, 1),  # 5×5
        (4, 3, 1, 0, 1, 30, 1),  # no padding; 28 pixels a row: tiles of 10, 9, 9
        (2, 1, 1, 0, 1, 6, 2),  # 1×1
    ],
)
@pytest.mark.parametrize("epilogue", ["none", "relu", "residual_relu"])
def test_grouped_computes_torchs_convolution(
    monkeypatch, layout, groups, kernel, stride, padding, dilation, size, batch, epilogue
):
    """Against torch within 1e-5 of the output's magnitude, with the kernel chosen for every such convolution."""
    torch.manual_seed(0)
    prefer(monkeypatch, dnnl_conv._Grouped, wins=True)
    c = 8 * groups
    conv = nn.Conv2d(c, c, kernel, stride, padding, dilation=dilation, groups=groups)
    if epilogue == "none":
        model = Lambda(lambda p, x: p[0](x), conv)
    elif epilogue == "relu":
        model = Lambda(lambda p, x: F.relu(p[0](x)), conv)
    else:  # the residual is another convolution of the same input: any geometry
        skip = nn.Conv2d(c, c, kernel, stride, padding, dilation=dilation, groups=groups)
        model = Lambda(lambda p, x: F.relu(p[0](x) + p[1](x)), conv, skip)
    graph = assert_runs_like(model, torch.randn(batch, c, size, size), layouts=[layout])
    # (in blocks of 16, AVX-512, an odd number of groups pads the last block: test_grouped_computes_in_blocks_of_16)
    assert convs_on(graph, layout, dnnl_conv._Grouped) == (2 if epilogue == "residual_relu" else 1)


def test_grouped_computes_in_blocks_of_16(monkeypatch):
    """Where oneDNN's blocks are 16 channels (AVX-512) a group of 8 is half a block: an odd number of groups pads
    the last block, so the kernel is not offered there (it would leave the padding unwritten), and oneDNN has no
    kernel there but its reference one: the convolution runs in channels-last, on the grouped kernel. An even
    number runs on it in either layout."""
    torch.manual_seed(0)
    monkeypatch.setattr(dnnl_plan, "block_size", lambda: 16)
    prefer(monkeypatch, dnnl_conv._Grouped, wins=True)
    for groups, layouts in ((4, dnnl_plan.MEASURED), (3, ("channels_last",))):
        model = nn.Sequential(nn.Conv2d(8 * groups, 8 * groups, 3, padding=1, groups=groups), nn.ReLU())
        graph = assert_runs_like(model, torch.randn(1, 8 * groups, 9, 9), layouts=["blocked"])
        module = DnnlModule(graph, layout="blocked")
        assert list(module.conv_kernels.values()) == [dnnl_conv._Grouped.name], groups
        (layout,) = module.conv_layouts.values()
        assert layout in layouts, groups


def test_grouped_is_a_candidate_only_where_it_computes_the_convolution(monkeypatch):
    """Groups of other widths (4, 16; in and out differing), stride 3 and an activation the epilogue does not apply
    run on oneDNN's kernels even when the grouped kernel would win every race."""
    torch.manual_seed(0)
    prefer(monkeypatch, dnnl_conv._Grouped, wins=True)
    model = nn.Sequential(
        nn.Conv2d(32, 32, 3, padding=1, groups=8),
        nn.Conv2d(32, 32, 3, padding=1, groups=2),
        nn.Conv2d(32, 64, 3, padding=1, groups=4),
        nn.Conv2d(64, 64, 3, padding=1, stride=3, groups=8),
        nn.Conv2d(64, 64, 3, padding=1, groups=8),
        nn.Sigmoid(),
    )
    graph = assert_runs_like(model, torch.randn(1, 32, 12, 12))
    for layout in dnnl.LAYOUTS:
        assert convs_on(graph, layout, dnnl_conv._Grouped) == 0


def test_grouped_runs_only_where_it_measures_fastest(monkeypatch):
    """The race decides: measured slower, a convolution the kernel could compute runs on oneDNN's; measured
    faster, on the grouped kernel."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.ReLU(), nn.Conv2d(16, 16, 3, groups=2))
    assert_race_decides(monkeypatch, _graph(model, torch.randn(1, 16, 10, 10)), dnnl_conv._Grouped.name, 2)


def test_without_a_c_compiler_the_runtime_runs_without_the_grouped_kernel(monkeypatch, tmp_path):
    """A compiler that fails is a reason (:func:`grouped.available`), not an error: the module is built from
    oneDNN's kernels alone and still computes the model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.ReLU())
    assert_runs_without_compiler(monkeypatch, tmp_path, grouped, dnnl_conv._Grouped, model, torch.randn(1, 16, 8, 8))


def test_the_filters_are_packed_group_tap_channel_output():
    """weights() puts w[8g + k][c][kh][kw] at [g][kh][kw][c][k]."""
    w = torch.arange(2 * 8 * 8 * 3 * 3, dtype=torch.float32).reshape(16, 8, 3, 3)
    packed = grouped.weights(w).reshape(2, 3, 3, 8, 8)
    for g, kh, kw, c, k in ((0, 0, 0, 0, 0), (1, 2, 1, 5, 3), (0, 1, 2, 7, 6)):
        assert packed[g, kh, kw, c, k] == w[8 * g + k, c, kh, kw]
