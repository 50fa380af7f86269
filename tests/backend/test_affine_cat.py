"""A batch norm (and its ReLU) applied while concatenating (gawee.backend.affine_cat): where the runtime plans it,
DenseNet's cat → batch norm → ReLU is one step that computes torch's result in every layout; where the kernel does
not fit (another activation, a concatenation read twice, parts off the channel block, no C compiler) the
concatenation and the batch norm run as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gawee.backend import affine_cat, dnnl
from gawee.backend.dnnl import DnnlModule

from .test_dnnl import Lambda, assert_runs_like

pytestmark = [
    pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable())),
    pytest.mark.skipif(affine_cat.unavailable() is not None, reason=str(affine_cat.unavailable())),
]


def _norm(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    return bn


def _dense(act, widths=(16, 16), read_twice=False) -> nn.Module:
    """x → conv → conv, then act(bn(cat[x, y, z])) → 1×1 conv: a DenseNet layer's shape. The default widths are
    multiples of the block on AVX2 (8) and AVX-512 (16). ``read_twice``: the concatenation is an output too."""
    c, (w1, w2) = 16, widths
    a, b = nn.Conv2d(c, w1, 3, padding=1), nn.Conv2d(w1, w2, 1)
    bn, out = _norm(c + w1 + w2), nn.Conv2d(c + w1 + w2, 8, 1)

    def forward(p, x):
        y = p[0](x)
        z = p[1](y)
        cat = torch.cat([x, y, z], 1)
        result = p[3](act(p[2](cat)))
        return (result, cat) if read_twice else result

    return Lambda(forward, a, b, bn, out)


def _fused(graph, layout: str) -> int:
    return list(DnnlModule(graph, layout=layout).kernels).count("gawee:affine_cat")


@pytest.mark.parametrize("act", [F.relu, lambda x: x], ids=["relu", "none"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_batch_norm_of_a_concatenation_is_one_step_and_computes_torchs_result(act, batch):
    torch.manual_seed(0)
    graph = assert_runs_like(_dense(act), torch.randn(batch, 16, 9, 7))
    assert all(_fused(graph, layout) == 1 for layout in dnnl.LAYOUTS)


@pytest.mark.parametrize(
    ("model", "layouts"),
    [
        (_dense(torch.sigmoid), dnnl.LAYOUTS),  # an activation the kernel does not apply
        (_dense(F.relu, read_twice=True), dnnl.LAYOUTS),  # the concatenation is read by another
        (_dense(F.relu, widths=(12, 4)), ["blocked"]),  # a part of 12 channels: off the block of 8 or 16
    ],
    ids=["sigmoid", "read_twice", "off_block"],
)
def test_where_the_kernel_does_not_fit_the_concatenation_and_the_batch_norm_run_apart(model, layouts):
    torch.manual_seed(0)
    graph = assert_runs_like(model, torch.randn(2, 16, 6, 6), layouts=layouts)
    assert all(_fused(graph, layout) == 0 for layout in layouts)


def test_parts_off_the_block_still_fuse_in_channels_last():
    """NHWC has no channel blocks: any channel counts concatenate there."""
    torch.manual_seed(0)
    graph = assert_runs_like(_dense(F.relu, widths=(12, 4)), torch.randn(2, 16, 6, 6), layouts=["channels_last"])
    assert _fused(graph, "channels_last") == 1


def test_without_a_c_compiler_the_runtime_concatenates_then_normalizes(monkeypatch, tmp_path):
    torch.manual_seed(0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    try:
        affine_cat._load.cache_clear()
        assert "could not build" in affine_cat.unavailable()
        graph = assert_runs_like(_dense(F.relu), torch.randn(1, 16, 6, 6))
        assert all(_fused(graph, layout) == 0 for layout in dnnl.LAYOUTS)
    finally:
        monkeypatch.undo()
        affine_cat._load.cache_clear()
    assert affine_cat.unavailable() is None
