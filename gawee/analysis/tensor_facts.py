"""Exact facts about constant tensors — finite, largest magnitude, holds a zero — in one pass each.

Guards (``finite(w)``) and the checks of a folded constant ask these of every weight a rule
touches. Each answer is exact and reads the tensor once without allocating a tensor of its size:
``torch.aminmax`` gives the extremes (nan when any element is nan), from which finiteness and the
largest magnitude follow; a zero is counted with ``torch.count_nonzero``. Tensors of at most
``SMALL`` elements are read into Python floats instead (exact for every floating dtype), which
costs less than dispatching a torch op on them.
"""

from __future__ import annotations

import math

import torch

SMALL = 16
"""Elements up to which a tensor is examined in Python rather than by a torch reduction."""


def _floats(t: torch.Tensor) -> list[float]:
    return t.reshape(-1).tolist()


def all_finite(t: torch.Tensor) -> bool:
    """No element is inf or nan (always true of integer and bool tensors)."""
    if t.is_complex():
        return bool(torch.isfinite(t).all())
    if not t.is_floating_point() or t.numel() == 0:
        return True
    if t.numel() <= SMALL:
        return all(math.isfinite(v) for v in _floats(t))
    lo, hi = torch.aminmax(t)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def abs_peak(t: torch.Tensor) -> float:
    """max |t| of a floating tensor (0.0 when empty), nan when it holds a nan."""
    if t.numel() == 0:
        return 0.0
    if t.numel() <= SMALL:
        peak = 0.0
        for v in _floats(t):
            if v != v:
                return math.nan
            peak = max(peak, abs(v))
        return peak
    lo, hi = (v.item() for v in torch.aminmax(t))
    if math.isnan(lo) or math.isnan(hi):
        return math.nan
    return max(-lo, hi)


def has_zero(t: torch.Tensor) -> bool:
    """Some element is 0 or -0."""
    if t.numel() <= SMALL:
        return any(v == 0 for v in _floats(t))
    return int(torch.count_nonzero(t)) < t.numel()
