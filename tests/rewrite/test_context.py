"""The checks a folded constant goes through before a replacement may use it."""

import math

import pytest
import torch

from gawee.rewrite.context import _CHUNK, _abs_range


@pytest.mark.parametrize("n", [10, 5000, _CHUNK, 2 * _CHUNK + 7])
def test_abs_range_scans_every_chunk(n):
    t = torch.rand(n) + 0.5
    assert _abs_range(t) == (pytest.approx(t.abs().min().item()), pytest.approx(t.abs().max().item()))
    t[-1] = -0.0  # the last element, in the last (partial) chunk
    assert _abs_range(t)[0] == 0.0
    t[n // 2] = -float("inf")
    assert _abs_range(t)[1] == math.inf
    t[0] = float("nan")
    assert all(math.isnan(v) for v in _abs_range(t))
    t16 = (torch.rand(n) + 0.5).half()
    assert _abs_range(t16)[1] == pytest.approx(t16.float().max().item())
