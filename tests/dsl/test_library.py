"""Builtins whose fast paths must answer as torch does."""

import math

import pytest
import torch

from gawee.dsl.library import _all_equal
from gawee.rewrite.context import detached_constant

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.uint8, torch.bool]
ELEMENTS = [0, 1, -1, 0.1, 1e-40, 3e38, math.inf, -math.inf, math.nan, 2**24 + 1, 300, 255, 256, -0.0, 2**40]
SCALARS = [0, 0.0, -0.0, 1, 1.0, True, False, 0.1, 1e-40, 3e38, 1e39, 2**24 + 1, 16777216.0, math.nan, math.inf, 255.5]


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_equal_answers_as_torch_compares(dtype):
    """all_equal(c, x) reads a small constant in Python (its elements and x rounded to its dtype): the same answer
    as `(c == x).all()` on every element and scalar where rounding, promotion (an integer tensor against a float),
    nan, infinities, signed zeros and out-of-range values could tell them apart; an empty constant is not all x."""
    for v in ELEMENTS:
        for shape in [(), (3,), (2, 2), (40,)]:  # (40,): past the Python path, torch answers
            t = torch.full(shape, v).to(dtype)
            for x in SCALARS:
                assert _all_equal(detached_constant(t), x) == bool((t == x).all().item()), (v, x, shape)
    assert not _all_equal(detached_constant(torch.zeros(0, dtype=dtype)), 0)
