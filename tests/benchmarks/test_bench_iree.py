"""benchmarks/bench_runtime.py's IREE columns: gawee's path and iree-turbine's, compiled alike, both equal to eager."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytest.importorskip("iree.runtime", reason="the IREE extra: pip install 'gawee[iree]'")
pytest.importorskip("iree.turbine", reason="the bench extra: pip install 'gawee[bench]'")

import bench_runtime


def test_gawee_iree_and_iree_turbine_build_the_same_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4)
    ).eval()
    xs = (torch.randn(1, 3, 8, 8),)
    with torch.no_grad():
        ref = model(*xs)
    for method in ("gawee_iree", "iree_turbine"):
        fn, seconds = bench_runtime.BUILDERS[method](model, xs)
        out = bench_runtime._run(fn, xs)
        assert seconds > 0 and out.shape == ref.shape, method
        assert (out - ref).abs().max().item() <= bench_runtime.RELATIVE_TOLERANCE * ref.abs().max().item(), method
