"""Exact facts about constant tensors — finite, largest magnitude, smallest magnitude.

Guards (``finite(w)``) and the checks of a folded constant ask these of every weight a rule
touches. Each answer is exact. ``torch.aminmax`` gives the extremes (nan when any element is nan)
in one pass without a temporary, from which finiteness and the largest magnitude follow. Where the
smallest magnitude is wanted too (a folded constant: overflow and underflow; a weight whose fold's
result is then bounded from it), ``abs_range`` takes the extremes of ``|t|``, a chunk at a time into
a small buffer, and keeps them with a tensor of ``KEPT`` elements or more while it lives unmodified.
Tensors of at most ``SMALL`` elements are read into Python floats instead (exact for every floating
dtype), which costs less than dispatching a torch op on them.
"""

from __future__ import annotations

import math
import threading
import weakref

import torch

try:
    import cython
except ImportError:  # Cython is optional (the accel extra): the declarations below then do nothing
    from gawee import cython_shim as cython

SMALL = 16
"""Elements up to which a tensor is examined in Python rather than by a torch reduction."""

KEPT = 64
"""Elements from which a tensor's ``abs_range`` is kept with it (while it lives, unmodified): a weight is
asked again by the fold that follows its guard's ``finite(w)``, by the next rule, or by the next rewrite of the
same graph, and keeping an answer costs less than a second reduction over this many elements."""

_KEPT: dict[int, tuple[weakref.ref, int, tuple[float, float]]] = {}
"""id(tensor) -> (a reference to it, its version counter then, its abs_range); an entry whose tensor died or
was written to since is not used."""


def elements(t: torch.Tensor) -> list:
    """The elements of a (small) tensor as Python numbers, in order: exact for every float and integer dtype.
    A tensor of several dimensions is read as nested lists and flattened here (a ``reshape`` first would be a
    torch dispatch costing more than the reading)."""
    rank = t.dim()
    if rank == 1:
        return t.tolist()
    if rank == 0:
        return [t.item()]
    values = t.tolist()
    for _ in range(rank - 1):
        values = [x for row in values for x in row]
    return values


@cython.locals(x=cython.double, lo=cython.double, hi=cython.double)
def _small_abs_range(t: torch.Tensor) -> tuple[float, float]:
    """(min |t|, max |t|) of a small floating tensor read into Python floats, (inf, 0.0) when it is empty;
    (nan, nan) when it holds a nan."""
    lo, hi = math.inf, 0.0
    for x in elements(t):
        if x != x:
            return math.nan, math.nan
        x = abs(x)
        if x < lo:
            lo = x
        if x > hi:
            hi = x
    return lo, hi


@cython.locals(x=cython.double)
def all_finite(t: torch.Tensor) -> bool:
    """No element is inf or nan (always true of integer and bool tensors)."""
    if not t.is_floating_point():
        return not t.is_complex() or bool(torch.isfinite(t).all())
    n = t.numel()
    if n <= SMALL:
        for x in elements(t):  # noqa: SIM110 (a typed C loop: no generator)
            if x - x != 0.0:  # inf - inf and nan - nan are nan
                return False
        return True
    if n >= KEPT:  # a weight that a fold reads next: its magnitudes bound the fold's result
        return math.isfinite(abs_range(t)[1])
    lo, hi = torch.aminmax(t)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def abs_peak(t: torch.Tensor) -> float:
    """max |t| of a floating tensor (0.0 when empty), nan when it holds a nan."""
    if t.numel() == 0:
        return 0.0
    if t.numel() <= SMALL:
        return _small_abs_range(t)[1]
    lo, hi = (v.item() for v in torch.aminmax(t))
    if math.isnan(lo) or math.isnan(hi):
        return math.nan
    return max(-lo, hi)


def abs_range(t: torch.Tensor) -> tuple[float, float]:
    """(min |t|, max |t|) of a non-empty floating tensor; (nan, nan) when it holds a nan."""
    if t.numel() <= SMALL:
        return _small_abs_range(t)
    known = kept_abs_range(t)
    if known is not None:
        return known
    lo, hi = _abs_extremes(t)
    found = (math.nan, math.nan) if math.isnan(lo) or math.isnan(hi) else (lo, hi)
    if t.numel() >= KEPT:
        try:
            version = t._version
        except RuntimeError:  # an inference tensor: no version counter to tell a later write by
            return found
        if len(_KEPT) > 65536:
            _KEPT.clear()
        _KEPT[id(t)] = (weakref.ref(t), version, found)
    return found


CHUNK = 1 << 18
"""Elements of a large tensor whose magnitudes are taken at a time, into a buffer that stays in cache."""

_scratch = threading.local()


def _abs_extremes(t: torch.Tensor) -> tuple[float, float]:
    """(min, max) of |t| (nan if it holds one). A large contiguous tensor is read a chunk at a time, each chunk's
    magnitudes written to a small buffer kept per thread and reduced there: no temporary of the tensor's size
    (which would be new pages to fault in, then a second pass from memory)."""
    if t.numel() <= CHUNK or not t.is_contiguous() or t.is_complex():
        lo, hi = torch.aminmax(t.abs())
        return lo.item(), hi.item()
    flat = t.view(-1)
    buffers = _scratch.__dict__.setdefault("buffers", {})
    key = (t.dtype, t.device)
    buf = buffers.get(key)
    if buf is None:
        buf = buffers[key] = torch.empty(CHUNK, dtype=t.dtype, device=t.device)
    lows, highs = [], []
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start : start + CHUNK]
        out = buf[: part.numel()]
        torch.abs(part, out=out)
        lo, hi = torch.aminmax(out)
        lows.append(lo)
        highs.append(hi)
    lo, hi = torch.stack(lows).min().item(), torch.stack(highs).max().item()  # nan propagates through both
    return lo, hi


def kept_abs_range(t: torch.Tensor) -> tuple[float, float] | None:
    """``abs_range(t)`` when it was computed before on this tensor, unmodified since; else None (nothing is
    computed)."""
    entry = _KEPT.get(id(t))
    if entry is None or entry[0]() is not t or entry[1] != t._version:
        return None
    return entry[2]
