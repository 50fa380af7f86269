"""The checks a folded constant goes through before a replacement may use it."""

import math

import pytest
import torch

from gawee.analysis.tensor_facts import SMALL, abs_peak, all_finite, has_zero


@pytest.mark.parametrize("n", [1, SMALL, SMALL + 1, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_constant_facts_are_exact_small_and_large(n, dtype):
    t = ((torch.rand(n) + 0.5) * torch.where(torch.rand(n) < 0.5, -1.0, 1.0)).to(dtype)
    assert abs_peak(t) == t.abs().max().item() and all_finite(t) and not has_zero(t)
    t[-1] = -0.0  # the last element
    assert has_zero(t) and abs_peak(t) == t.abs().max().item()
    t[n // 2] = -float("inf")
    assert abs_peak(t) == math.inf and not all_finite(t)
    t[0] = float("nan")
    assert math.isnan(abs_peak(t)) and not all_finite(t)
    assert all_finite(torch.arange(n)) and abs_peak(torch.empty(0, dtype=dtype)) == 0.0
