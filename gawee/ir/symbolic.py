"""Symbolic dimensions: named size symbols with ranges, and sympy expressions of them.

A dimension of a ``TensorType`` is a plain ``int`` (static, as before) or a sympy
expression over ``Sym`` symbols (``s0``, ``2*s0``, ``s0*s1``), as torch.export reports
them. A ``Sym`` carries its range (``lo..hi``, ``hi`` None for unbounded) and the example
value it was captured at, so a type is self-describing: inference, guards and costs need
nothing but the type. Static shapes never create a sympy object.

Decisions over symbols are sound: ``prove`` says True only when a relation holds for
every value of its symbols in range (structural equality after sympy's canonical form,
else interval reasoning over the ranges), False only when it fails for all of them, and
None otherwise — a rule guard treats None as False.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sympy

from gawee.errors import GaweeError, IRError


class Sym(sympy.Symbol):
    """A size symbol: an integer in ``lo..hi`` (``hi`` None: unbounded), captured at ``example``."""

    __slots__ = ("example", "hi", "lo")

    def __new__(cls, name: str, lo: int = 1, hi: int | None = None, example: int = 2):
        obj = sympy.Symbol.__xnew__(cls, name, integer=True, positive=lo >= 1, nonnegative=True)
        obj.lo, obj.hi, obj.example = int(lo), (None if hi is None else int(hi)), int(example)
        return obj

    def __getnewargs_ex__(self):
        return ((self.name, self.lo, self.hi, self.example), {})

    def __getstate__(self):
        return {}

    def _hashable_content(self):
        return (self.name, self.lo, self.hi, self.example)

    @property
    def range_text(self) -> str:
        return f"{self.lo}..{'inf' if self.hi is None else self.hi}"

    def contains(self, value: int) -> bool:
        return value >= self.lo and (self.hi is None or value <= self.hi)


Dim = int | sympy.Expr


class ShapeOutOfRange(GaweeError, ValueError):
    """A concrete input shape that the shape of a graph input does not admit: another rank, another static size,
    a size outside its symbol's range."""

    kind = "shape error"


def dim(d: Any) -> Dim:
    """Normalize one dimension: ints (and integral sympy numbers) become ``int``; symbolic stays sympy."""
    if isinstance(d, int):
        return d
    if isinstance(d, sympy.Basic):
        if d.is_Integer:
            return int(d)
        return d
    from torch import SymInt

    if isinstance(d, SymInt):
        return dim(d.node.expr)
    return int(d)


def is_symbolic(d: Any) -> bool:
    return isinstance(d, sympy.Basic) and not d.is_Integer


def has_symbols(items: Any) -> bool:
    """Whether a shape, type, or nested tuple of dims/types holds a symbolic dimension."""
    if isinstance(items, sympy.Basic):
        return not items.is_Integer
    if isinstance(items, (tuple, list)):
        return any(has_symbols(x) for x in items)
    shape = getattr(items, "shape", None)
    return isinstance(shape, tuple) and any(isinstance(d, sympy.Basic) for d in shape)


def symbols_of(items: Any) -> set[Sym]:
    """Every ``Sym`` in a dim, shape, type, or nested tuples/lists/dicts of them."""
    out: set[Sym] = set()

    def walk(x):
        if isinstance(x, sympy.Basic):
            out.update(s for s in x.free_symbols if isinstance(s, Sym))
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif isinstance(getattr(x, "shape", None), tuple):
            walk(x.shape)

    walk(items)
    return out


def text(d: Dim) -> str:
    """A stable text form: ``3``, ``s0``, ``2*s0``, ``s0*s1 + 1`` (sympy's canonical print, no spaces around ``*``)."""
    return str(d)


def parse(src: str, symbols: Mapping[str, Sym]) -> Dim:
    """A dimension from its text form over the given symbols; IRError naming the unknown ones."""
    src = src.strip()
    if src.lstrip("-").isdigit():
        return int(src)
    try:
        expr = sympy.sympify(src, locals=dict(symbols), rational=True)
    except (sympy.SympifyError, SyntaxError, TypeError) as e:
        raise IRError(f"cannot read dimension {src!r}: {e}") from None
    unknown = [s for s in expr.free_symbols if not isinstance(s, Sym)]
    if unknown:
        raise IRError(
            f"dimension {src!r} uses undeclared symbol(s) {', '.join(sorted(map(str, unknown)))}",
            hint="declare every symbol in the graph's symbol table",
        )
    return dim(expr)


def subs(d: Any, values: Mapping[Sym, int]) -> Any:
    """``d`` with its symbols replaced by values (recursing through tuples/lists); ints pass through."""
    if isinstance(d, sympy.Basic):
        return dim(d.xreplace({k: sympy.Integer(v) for k, v in values.items()}))
    if isinstance(d, tuple):
        return tuple(subs(x, values) for x in d)
    if isinstance(d, list):
        return [subs(x, values) for x in d]
    return d


def example_values(syms: Iterable[Sym]) -> dict[Sym, int]:
    return {s: s.example for s in syms}


def at_example(d: Any) -> Any:
    """``d`` evaluated at its symbols' example values (a concrete number)."""
    return subs(d, example_values(symbols_of(d))) if isinstance(d, (sympy.Basic, tuple, list)) else d


def draw_values(syms: Iterable[Sym], k: int) -> list[dict[Sym, int]]:
    """``k`` assignments of the symbols spread over their ranges (the low end, the example, a middle and
    a high value, the high end capped at 4x the example to keep checks cheap), for checking a claim at
    several points."""
    syms = sorted(syms, key=lambda s: s.name)
    if not syms:
        return [{} for _ in range(k)]
    picks = []
    for i in range(k):
        row = {}
        for s in syms:
            cap = max(s.lo, 4 * s.example, 8)
            hi = cap if s.hi is None else min(s.hi, cap)
            cands = list(dict.fromkeys([s.lo, s.example, hi, (s.lo + hi) // 2, min(hi, s.lo + 1)]))
            row[s] = cands[(i + syms.index(s)) % len(cands)]
        picks.append(row)
    return picks


# -- sound decisions over the symbols' ranges -------------------------------------------


MAX_SIZE = 2**63 - 1
"""The largest size a tensor dimension can have (int64): the upper end of an unbounded symbol's range, so
``x[:, :9223372036854775807]`` (how torch spells "to the end") provably covers a dynamic size."""


def bounds(expr: Dim) -> tuple[float, float]:
    """An interval holding every value of ``expr`` over its symbols' ranges (may be loose)."""
    if isinstance(expr, int):
        return expr, expr
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    ranges = {s: ValueRanges(s.lo, MAX_SIZE if s.hi is None else s.hi) for s in symbols_of(expr)}
    vr = bound_sympy(expr, ranges)
    return float(vr.lower), float(vr.upper)


def prove(lhs: Dim, op: str, rhs: Dim) -> bool | None:
    """True if ``lhs op rhs`` holds for every value of the symbols in range, False if it holds for
    none, None if it depends on the values. ``op`` is one of ``== != < <= > >=``."""
    if isinstance(lhs, int) and isinstance(rhs, int):
        return _COMPARE[op](lhs, rhs)
    diff = sympy.expand(sympy.sympify(lhs) - sympy.sympify(rhs))
    if diff.is_Integer:
        return _COMPARE[op](int(diff), 0)
    lo, hi = bounds(diff)
    always = {"==": lo == hi == 0, "!=": lo > 0 or hi < 0, "<": hi < 0, "<=": hi <= 0, ">": lo > 0, ">=": lo >= 0}
    never = {"==": lo > 0 or hi < 0, "!=": lo == hi == 0, "<": lo >= 0, "<=": lo > 0, ">": hi <= 0, ">=": hi < 0}
    if always[op]:
        return True
    if never[op]:
        return False
    return None


_COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


# -- binding concrete shapes -------------------------------------------------------------


def bind(symbolic: Sequence[tuple[str, Sequence[Dim]]], concrete: Sequence[Sequence[int]]) -> dict[Sym, int]:
    """Solve the symbols from concrete input shapes, checking ranks, static dims and ranges.

    ``symbolic`` is ``[(input name, shape)]``; a symbol is read off the first dim that is the
    bare symbol, and every dim is then checked against its value. Raises ShapeOutOfRange naming
    the input, the dimension, and the symbol's range.
    """
    values: dict[Sym, int] = {}
    for (name, shape), got in zip(symbolic, concrete):
        got = tuple(int(g) for g in got)
        if len(got) != len(shape):
            raise ShapeOutOfRange(
                f"input {name} has rank {len(got)} (shape {list(got)}), the graph takes rank {len(shape)}",
                hint=f"the graph's input type is [{', '.join(map(text, shape))}]",
            )
        for i, (d, g) in enumerate(zip(shape, got)):
            if isinstance(d, Sym) and d not in values:
                if not d.contains(g):
                    raise ShapeOutOfRange(
                        f"input {name} dimension {i} is {g}, outside the range of {d.name}: {d.range_text}",
                        hint=f"capture again with a wider range for {d.name} (torch.export.Dim(min=..., max=...))",
                    )
                values[d] = g
    for (name, shape), got in zip(symbolic, concrete):
        for i, (d, g) in enumerate(zip(shape, got)):
            want = subs(d, values)
            if not isinstance(want, int):
                raise ShapeOutOfRange(
                    f"input {name} dimension {i} ({text(d)}) cannot be solved from the input shapes",
                    hint="every symbol must appear alone as some input dimension",
                )
            if want != int(g):
                what = "static" if isinstance(d, int) else f"{text(d)} = {want}"
                raise ShapeOutOfRange(f"input {name} dimension {i} is {int(g)}, the graph needs {want} ({what})")
    return values


def numel(shape: Sequence[Dim]) -> Dim:
    return dim(math.prod(shape)) if shape else 1


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """torch's broadcast of shapes whose dims may be symbolic, valid for every value of the symbols:
    a size-1 dim takes the other size; any other dims must be provably equal. ValueError otherwise
    (``s0`` against ``3`` broadcasts only when ``s0`` is 1 or 3)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        sizes = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        grown = [d for d in sizes if not (isinstance(d, int) and d == 1)]
        if any(prove(d, "==", grown[0]) is not True for d in grown[1:]):
            raise ValueError(f"sizes {', '.join(map(text, grown))} broadcast only for some values of the symbols")
        out.append(dim(grown[0]) if grown else 1)
    return tuple(out)
