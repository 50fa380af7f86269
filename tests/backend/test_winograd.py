"""Winograd F(4×4, 3×3) as a candidate kernel of oneDNN's primitives runtime (gawee.backend.winograd): where it is
chosen it computes torch's convolution (bias, residual, ReLU; every layout, padding and partial tile), it is
chosen by measurement only, and a machine without a C compiler runs without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gawee.backend import dnnl, dnnl_conv, dnnl_plan, winograd
from gawee.backend.dnnl import DnnlModule

from .test_dnnl import Lambda, _graph, assert_race_decides, assert_runs_like

pytestmark = [
    pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable())),
    pytest.mark.skipif(winograd.unavailable() is not None, reason=str(winograd.unavailable())),
]


def _prefer(monkeypatch, winograd_wins: bool, smallest_chunks: bool = False) -> None:
    """Every race decided for (or against) the Winograd candidates, whatever the clock says (among them, for the
    one of the fewest rows of tiles per chunk)."""
    fastest = dnnl_plan._Plan.fastest

    def decided(self, candidates, reads, situation=None):
        kept = [c for c in candidates if isinstance(c, dnnl_conv._Winograd) == winograd_wins] or candidates
        if smallest_chunks and winograd_wins:
            kept = [c for c in kept if c.rows == min(k.rows for k in kept)]
        for c in candidates:
            if c not in kept:
                c.drop()
        return fastest(self, kept, reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", decided)


def _winograd_convs(graph, layout: str) -> int:
    return list(DnnlModule(graph, layout=layout).conv_kernels.values()).count(dnnl_conv._Winograd.name)


@pytest.mark.parametrize("layout", dnnl.LAYOUTS)
@pytest.mark.parametrize(
    ("cin", "cout", "size", "padding", "batch"),
    [(16, 16, 14, 1, 1), (16, 32, 9, 1, 2), (32, 16, 7, 0, 1), (16, 16, 5, 2, 2), (16, 16, 3, 1, 1), (32, 32, 1, 1, 1)],
)
@pytest.mark.parametrize("epilogue", ["none", "relu", "residual_relu"])
def test_winograd_computes_torchs_convolution(monkeypatch, layout, cin, cout, size, padding, batch, epilogue):
    """Output sizes that are and are not a multiple of the 4×4 tile (partial tiles), paddings 0-2 (tiles reading
    past the image on every side), a residual post-op and the ReLU; against torch within 1e-5 of the output's
    magnitude."""
    torch.manual_seed(0)
    _prefer(monkeypatch, winograd_wins=True)
    conv = nn.Conv2d(cin, cout, 3, padding=padding)
    if epilogue == "none":
        model = Lambda(lambda p, x: p[0](x), conv)
    elif epilogue == "relu":
        model = Lambda(lambda p, x: F.relu(p[0](x)), conv)
    else:
        skip = nn.Conv2d(cin, cout, 3, padding=padding)
        model = Lambda(lambda p, x: F.relu(p[0](x) + p[1](x)), conv, skip)
    x = torch.randn(batch, cin, size, size)
    graph = assert_runs_like(model, x, layouts=[layout])
    assert _winograd_convs(graph, layout) == (1 if epilogue != "residual_relu" else 2)


@pytest.mark.parametrize("layout", dnnl.LAYOUTS)
def test_winograd_in_chunks_of_tile_rows_computes_the_whole_batch(monkeypatch, layout):
    """With chunks of one row of tiles (budgets that small), every chunk's three steps run over a batch of images
    whose rows end in partial tiles, and together compute the whole convolution with its residual."""
    torch.manual_seed(0)
    monkeypatch.setattr(winograd, "CHUNK_BYTES", (36 * 3 * 32 * 4,))  # one row: 3 tiles, 16 + 16 channels
    _prefer(monkeypatch, winograd_wins=True, smallest_chunks=True)
    model = Lambda(lambda p, x: F.relu(p[0](x) + x), nn.Conv2d(16, 16, 3, padding=1))
    x = torch.randn(3, 16, 10, 10)
    assert winograd.chunkings(3, 16, 16, 10, 10, (1, 1)) == [9, 1]
    graph = assert_runs_like(model, x, layouts=[layout])
    module = DnnlModule(graph, layout=layout)
    assert list(module.conv_kernels.values()) == [dnnl_conv._Winograd.name]
    assert module.kernels.count("gawee:winograd_input") == 9


def test_winograd_is_a_candidate_only_where_it_computes_the_convolution(monkeypatch):
    """Strided, dilated, grouped, 1×1 and 5×5 convolutions, channels that are not a multiple of 8 and an activation
    the output transform does not apply run on oneDNN's kernels even when Winograd would win every race."""
    torch.manual_seed(0)
    _prefer(monkeypatch, winograd_wins=True)
    model = nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, stride=2),
        nn.Conv2d(16, 16, 3, padding=2, dilation=2),
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
        nn.Conv2d(16, 16, 1),
        nn.Conv2d(16, 12, 5, padding=2),
        nn.Conv2d(12, 16, 3, padding=1),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.Sigmoid(),
    )
    graph = assert_runs_like(model, torch.randn(1, 16, 12, 12))
    for layout in dnnl.LAYOUTS:
        assert _winograd_convs(graph, layout) == 0


def test_winograd_runs_only_where_it_measures_fastest(monkeypatch):
    """The race decides: measured slower, a convolution Winograd could compute runs on oneDNN's kernel; measured
    faster, on Winograd's three steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).eval()
    assert_race_decides(monkeypatch, _graph(model, torch.randn(1, 16, 10, 10)), dnnl_conv._Winograd.name, 2)


def test_without_a_c_compiler_the_runtime_runs_without_winograd(monkeypatch, tmp_path):
    """A compiler that is missing or fails is a reason (:func:`winograd.available`), not an error: the module is
    built from oneDNN's kernels alone and still computes the model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 16, 8, 8)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built before
    try:
        for cc, why in ((str(tmp_path / "no-such-cc"), "does not run"), ("false", "could not build")):
            monkeypatch.setenv("CC", cc)
            winograd._load.cache_clear()
            assert why in winograd.unavailable()
            _prefer(monkeypatch, winograd_wins=True)
            graph = assert_runs_like(model, x)
            assert all(_winograd_convs(graph, layout) == 0 for layout in dnnl.LAYOUTS)
        assert not list((tmp_path / "gawee").glob("*"))  # no half-written library left behind
    finally:
        monkeypatch.undo()
        winograd._load.cache_clear()
    assert winograd.unavailable() is None


def test_the_transforms_are_built_once_into_the_cache(monkeypatch, tmp_path):
    """The first use compiles the transforms into gawee's cache directory; later processes load that file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        winograd._load.cache_clear()
        assert winograd.unavailable() is None
        built = list((tmp_path / "gawee").glob("winograd-*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        winograd._load.cache_clear()
        assert winograd.unavailable() is None
        assert built[0].stat().st_mtime_ns == stamp
        assert list((tmp_path / "gawee").glob("*")) == built
    finally:
        monkeypatch.undo()
        winograd._load.cache_clear()


def test_a_cache_directory_that_cannot_be_written_builds_for_this_process_only(monkeypatch, tmp_path):
    """Where gawee's cache directory cannot be made (here its parent is a file), the transforms are built into a
    temporary directory instead: the kernel is still offered and computes the convolution."""
    home = tmp_path / "not-a-directory"
    home.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    try:
        winograd._load.cache_clear()
        assert winograd.unavailable() is None
        _prefer(monkeypatch, winograd_wins=True)
        model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        graph = assert_runs_like(model, torch.randn(1, 16, 8, 8), layouts=["blocked"])
        assert _winograd_convs(graph, "blocked") == 1
    finally:
        monkeypatch.undo()
        winograd._load.cache_clear()


def test_the_weight_transform_is_lavins():
    """U = G g Gᵀ reproduces the direct convolution of one 6×6 tile: Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A equals the 4×4
    valid correlation of d with g (float64)."""
    torch.manual_seed(0)
    g, d = torch.randn(1, 1, 3, 3, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    bt = torch.tensor(
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        dtype=torch.float64,
    )
    at = torch.tensor(
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=torch.float64
    )
    u = torch.einsum("ia,kcab,jb->ijck", winograd._G, g, winograd._G)[:, :, 0, 0]
    y = at @ (u * (bt @ d @ bt.T)) @ at.T
    torch.testing.assert_close(y, F.conv2d(d[None, None], g)[0, 0])
