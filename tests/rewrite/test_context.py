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


def test_a_weights_magnitudes_are_kept_until_it_is_written_to():
    from gawee.analysis.tensor_facts import KEPT, kept_abs_range

    w = torch.randn(KEPT)
    assert kept_abs_range(w) is None
    assert all_finite(w) and kept_abs_range(w) == (w.abs().min().item(), w.abs().max().item())
    w[0] = 1e30  # a write bumps the version counter: the kept range is not used
    assert kept_abs_range(w) is None and abs_peak(w) == pytest.approx(1e30)
    small = torch.randn(KEPT - 1)
    abs_range(small)
    assert kept_abs_range(small) is None  # only weights are kept


_MAGNITUDES = [0.0, 1e-45, 1e-40, 1e-30, 1e-20, 1e-5, 0.5, 1.0, 3.0, 1e5, 1e10, 1e19, 1e20, 1e30, 3e38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_product_shown_safe_from_its_operands_passes_the_checks_of_its_result(dtype):
    """`_product_is_safe` skips reading a folded product only where reading it finds nothing: over operands
    spanning zero, subnormals, the headroom, overflow, inf and nan, it never says safe where reading the result
    finds a problem (`result_problem`), and it says safe for ordinary weights."""
    from gawee.ops import get_op
    from gawee.rewrite.context import OPERAND_PASS, _product_is_safe, result_problem

    mul = get_op("mul")
    gen = torch.Generator().manual_seed(0)
    specials = [*_MAGNITUDES, math.inf, math.nan]
    said_safe = 0
    for lo_a in specials:
        for hi_b in specials:
            n = OPERAND_PASS  # a weight: shown safe only from the magnitudes its guard's pass kept
            w = (torch.rand(n, generator=gen) + 0.5) * torch.where(torch.rand(n, generator=gen) < 0.5, -1, 1)
            w[0], w[1] = lo_a, -lo_a
            w = w.to(dtype).reshape(8, -1)  # past the dtype's range: inf
            s = torch.rand(8, 1, generator=gen).double() * hi_b
            s[0] = hi_b
            s = s.to(dtype)
            all_finite(w)  # the guard's pass keeps w's magnitudes
            product = w * s
            safe = _product_is_safe([w, s], product)
            assert not (safe and result_problem(mul, [w, s], {}, product) is not None), (lo_a, hi_b)
            said_safe += safe
    assert said_safe >= 5
    if dtype is not torch.float16:  # a normal weight: its smallest magnitude times the scale's is normal
        w = (torch.randn(64, 64, 3, 3, generator=gen) + 1e-3).to(dtype)
        all_finite(w)
        s = (torch.rand(64, 1, 1, 1, generator=gen) + 0.5).to(dtype)
        assert _product_is_safe([w, s], w * s)
