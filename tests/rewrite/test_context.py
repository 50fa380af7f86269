"""The checks a folded constant goes through before a replacement may use it."""

import math

import pytest
import torch

from gawee.analysis.tensor_facts import SMALL, abs_peak, abs_range, all_finite


@pytest.mark.parametrize("n", [1, SMALL, SMALL + 1, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_constant_facts_are_exact_small_and_large(n, dtype):
    t = ((torch.rand(n) + 0.5) * torch.where(torch.rand(n) < 0.5, -1.0, 1.0)).to(dtype)
    peak = t.abs().max().item()
    assert abs_peak(t) == peak and all_finite(t) and abs_range(t) == (t.abs().min().item(), peak)
    t[-1] = -0.0  # the last element
    peak = t.abs().max().item()
    assert abs_range(t) == (0.0, peak) and abs_peak(t) == peak
    t[n // 2] = -float("inf")
    assert abs_peak(t) == math.inf and abs_range(t) == (0.0 if n > 1 else math.inf, math.inf) and not all_finite(t)
    t[0] = float("nan")
    assert math.isnan(abs_peak(t)) and all(map(math.isnan, abs_range(t))) and not all_finite(t)
    assert all_finite(torch.arange(n)) and abs_peak(torch.empty(0, dtype=dtype)) == 0.0
