"""Drawing valid instances of an op: operand types and attributes (used by the soundness harness).

An OpDef's ``sample(draw, slots, attrs)`` receives, per operand slot, a fixed
TensorType (the operand already exists), ``ABSENT`` (the pattern needs no operand
there) or ``FREE`` (the sampler chooses: a type, or None for an absent optional
operand), plus the attributes already fixed by the pattern. It returns the full
operand type list and the full attribute dict. It raises ``Reject`` when the fixed
part admits no valid instance. ``draw`` is any object with the ``Draw`` methods
(the harness adapts hypothesis to it), so the registry does not depend on hypothesis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from gawee.ir.types import DType, TensorType


class Draw(Protocol):
    dtype: DType
    """The floating dtype this example prefers for free operands."""

    def integers(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]; raises :class:`Reject` when the range is empty (the fixed part of the draw,
        a dim of size 0 say, leaves no valid value)."""

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options``; raises :class:`Reject` when there are none."""

    def boolean(self, p: float = 0.5) -> bool: ...
    def floats(self, lo: float, hi: float) -> float: ...

    def size(self, lo: int, hi: int) -> int:
        """The size of one dimension, typically in [lo, hi]: ``hi`` is the usual end, not a limit of validity
        (a draw may go past it, to sizes a guard asks for or to large instances), ``lo`` is a limit (a draw
        enumerating small scopes may give 0 for ``lo == 1``)."""

    def rank(self, lo: int, hi: int) -> int:
        """A rank, typically in [lo, hi]; like ``size``, a draw may go past ``hi`` (ranks 5 and 6)."""


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


FREE = _Marker("FREE")
ABSENT = _Marker("ABSENT")


class Reject(Exception):
    """No valid instance exists for the fixed part of this draw."""


Slot = Any  # TensorType | FREE | ABSENT


MAX_ELEMENTS = 4096
"""The most elements a drawn tensor holds (``shape`` halves its largest dims past it): large sizes and ranks
stay cheap to run."""


def shape(draw: Draw, rank: int | None = None, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
    """A shape of ``rank`` dims (drawn when None) whose sizes are ``draw.size(lo, hi)``, at most MAX_ELEMENTS
    elements."""
    rank = draw.rank(0, 4) if rank is None else rank
    dims = [draw.size(lo, hi) for _ in range(rank)]
    while math.prod(dims) > MAX_ELEMENTS:
        i = dims.index(max(dims))
        dims[i] = max(lo, dims[i] // 2)
    return tuple(dims)


def tensor(draw: Draw, rank: int | None = None, dtype: DType | None = None) -> TensorType:
    return TensorType(shape(draw, rank), dtype or draw.dtype)


def broadcast_partner(draw: Draw, other: TensorType, dtype: DType | None = None) -> TensorType:
    """A type that broadcasts against ``other``: mostly without growing it (the same shape, size-1 dims,
    trailing dims, a scalar), sometimes growing it (a size where ``other`` has 1, extra leading dims)."""
    kind = draw.choice(["same", "same", "ones", "trailing", "scalar", "grow"])
    dims = other.shape
    if kind == "same" or (not dims and kind != "grow"):
        out = dims
    elif kind == "ones":
        out = tuple(d if draw.boolean() else 1 for d in dims)
    elif kind == "trailing":
        out = dims[draw.integers(0, len(dims)) :]
    elif kind == "grow":
        lead = tuple(draw.integers(1, 3) for _ in range(draw.integers(0 if 1 in dims else 1, 2)))
        out = lead + tuple(draw.integers(2, 3) if d == 1 and draw.boolean() else d for d in dims)
    else:
        out = ()
    return TensorType(tuple(out), dtype or other.dtype)


def primes(n: int) -> list[int]:
    """The prime factors of n >= 1, with multiplicity."""
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def factor_shape(draw: Draw, numel: int, rank: int) -> tuple[int, ...] | None:
    """A random shape of ``rank`` dims with ``numel`` elements (None if there is none: rank 0, numel != 1)."""
    if rank == 0:
        return () if numel == 1 else None
    if numel == 0:
        dims = [draw.integers(0, 3) for _ in range(rank)]
        dims[draw.integers(0, rank - 1)] = 0
        return tuple(dims)
    dims = [1] * rank
    for p in primes(numel):
        dims[draw.integers(0, rank - 1)] *= p
    return tuple(dims)


def normalize_dim(d: int, rank: int) -> int:
    """``d`` in 0 .. rank-1 (negative dims count from the end); Reject if out of range."""
    if not -rank <= d < rank:
        raise Reject(f"dim {d} is out of range for rank {rank}")
    return d + rank if d < 0 else d


def first_fixed(slots: Sequence[Slot]) -> TensorType | None:
    return next((s for s in slots if isinstance(s, TensorType)), None)


def fill_free(
    draw: Draw, slots: Sequence[Slot], optional: Sequence[bool], like: TensorType | None, p_absent: float = 0.3
) -> list[TensorType | None]:
    """Free slots become broadcast partners of ``like`` (or fresh tensors); optional ones may be absent."""
    out: list[TensorType | None] = []
    for s, opt in zip(slots, optional):
        if s is ABSENT:
            out.append(None)
        elif s is FREE:
            if opt and draw.boolean(p_absent):
                out.append(None)
            else:
                out.append(broadcast_partner(draw, like) if like is not None else tensor(draw))
        else:
            out.append(s)
    return out


def elementwise(draw: Draw, slots: Sequence[Slot], attrs: dict[str, Any]) -> tuple[list, dict]:
    """Free operands broadcast against the first fixed one (or a fresh tensor for the first)."""
    if any(s is ABSENT for s in slots):
        raise Reject("an elementwise op needs all its operands")
    like = first_fixed(slots)
    if like is None:
        like = tensor(draw)
        slots = [like, *slots[1:]] if slots and slots[0] is FREE else list(slots)
    return fill_free(draw, slots, [False] * len(slots), like), attrs


def same_as_input(draw: Draw, slots: Sequence[Slot], attrs: dict[str, Any], rank: int | None = None) -> TensorType:
    """The type of operand 0: fixed, or drawn (optionally of a given rank)."""
    s = slots[0]
    if isinstance(s, TensorType):
        if rank is not None and s.rank != rank:
            raise Reject(f"needs rank {rank}")
        return s
    return tensor(draw, rank)


def dim(draw: Draw, rank: int, extra: int = 0) -> int:
    """A dimension index (possibly negative) for a tensor of ``rank`` (+extra for unsqueeze)."""
    n = rank + extra
    if n == 0:
        raise Reject("no dims")
    d = draw.integers(0, n - 1)
    return d - n if draw.boolean(0.3) else d


def permutation(draw: Draw, n: int) -> tuple[int, ...]:
    """A permutation of range(n), some items spelled as negative dims."""
    items = list(range(n))
    out = []
    while items:
        out.append(items.pop(draw.integers(0, len(items) - 1)))
    return tuple(d - n if draw.boolean(0.15) else d for d in out)


def attr_value(draw: Draw, kind: str, rank: int) -> Any:
    """A value of an attribute kind (see gawee.ops.base.ATTR_KINDS) for ops without a sampler: ints look
    like dims of an operand of ``rank`` (negative ones included), floats like small scales."""
    base = kind.rstrip("?")
    if kind.endswith("?") and draw.boolean(0.2):
        return None
    if base == "int":
        return dim(draw, rank) if rank and draw.boolean(0.7) else draw.integers(0, 3)
    if base == "ints":
        return tuple(dim(draw, rank) if rank else draw.integers(0, 3) for _ in range(draw.integers(1, 2)))
    if base in ("float", "scalar"):
        return draw.choice([0.0, 0.5, 1.0, -1.0, 2.0, 1e-5])
    if base == "floats":
        return tuple(draw.choice([0.5, 1.0, 2.0]) for _ in range(draw.integers(1, 2)))
    if base == "bool":
        return draw.boolean()
    if base == "dtype":
        return draw.choice(["f32", "f16", "bf16", "f64", "i32", "i64"])
    if base == "str":
        raise Reject("a free str attribute: the op needs a sampler")
    raise Reject(f"cannot draw a {kind} attribute")


INDEXED = 4
"""The smallest size of a dim that index operands pick from: their data is drawn in [0, 3] (ints of the
``nonnegative`` domain), so every index is in range."""


def indices(draw: Draw, rank: int | None = None) -> TensorType:
    """An int64 index tensor (its values are drawn in range of an INDEXED-sized dim)."""
    return TensorType(shape(draw, draw.integers(0, 2) if rank is None else rank), DType.i64)


def indexed(draw: Draw, slots: Sequence[Slot]) -> TensorType:
    """The indexed operand: slot 0's type if fixed, else drawn with INDEXED or more elements along every dim."""
    fixed = slots[0]
    if isinstance(fixed, TensorType):
        return fixed
    return TensorType(shape(draw, draw.integers(1, 3), INDEXED, INDEXED + 2), draw.dtype)
