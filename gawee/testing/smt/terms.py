"""Element terms: the value of one tensor element as a hash-consed expression over input elements.

Two graphs executed element by element (``execute``) over one ``Interner`` give the same ``Term``
object to two elements exactly when they are the same operation tree over the same input elements:
then the two elements are computed identically, and no solver is needed to see that they agree.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

from gawee.ir.types import DType

KINDS = frozenset({"var", "const", "op", "uf", "opaque", "choice"})
"""var: one input element; const: a concrete element; op: an op with an exact encoding (see ``encode``);
uf: an elementwise op without one, an uninterpreted function of its operands in one kernel context;
opaque: one output element of a non-elementwise op without an encoding (a convolution, a reduction);
choice: a value the reference leaves open (the sign of a zero ``maximum`` returns)."""


class Term:
    """One element's value. Interned: build terms only through an ``Interner``; compare with ``is``."""

    __slots__ = ("__weakref__", "args", "dtype", "key", "kind")

    def __init__(self, kind: str, dtype: DType, key: Any, args: tuple[Term, ...]):
        self.kind = kind
        self.dtype = dtype
        self.key = key
        """var: (input index, flat index); const: the element's bits (NAN_KEY for every nan); op: (name,
        attrs); uf: (name, attrs, context); opaque: (name, attrs, context, output, position); choice: a number."""
        self.args = args

    @property
    def op(self) -> str:
        """The op a term applies (op, uf, opaque), else its kind."""
        return self.key[0] if self.kind in ("op", "uf", "opaque") else self.kind

    def __repr__(self) -> str:
        if self.kind == "var":
            return f"x{self.key[0]}[{self.key[1]}]"
        if self.kind == "const":
            return f"{const_value(self)!r}:{self.dtype}"
        if not self.args:
            return f"{self.kind}:{self.op}"
        return f"{self.op}({', '.join(map(repr, self.args))})"


NAN_KEY = "nan"
"""The key of every nan constant: nan payloads and signs are not numbers the harness compares."""


class Interner:
    """Makes each distinct term once, so that equal terms are the same object (hash-consing)."""

    def __init__(self):
        self._terms: dict[tuple, Term] = {}
        self._choices = itertools.count()

    def make(self, kind: str, dtype: DType, key: Any, args: tuple[Term, ...] = ()) -> Term:
        k = (kind, dtype, key, tuple(id(a) for a in args))
        t = self._terms.get(k)
        if t is None:
            t = self._terms[k] = Term(kind, dtype, key, args)
        return t

    def var(self, dtype: DType, tensor: int, flat: int) -> Term:
        return self.make("var", dtype, (tensor, flat))

    def const(self, dtype: DType, value: float | int | bool) -> Term:
        return self.make("const", dtype, const_key(dtype, value))

    def choice(self, dtype: DType) -> Term:
        """A fresh open value (never equal to another one)."""
        return self.make("choice", dtype, next(self._choices))


_BITS = {DType.f16: torch.int16, DType.bf16: torch.int16, DType.f32: torch.int32, DType.f64: torch.int64}


def const_key(dtype: DType, value: float | int | bool) -> Any:
    """The key of a constant element: its bit pattern for floats (so -0.0 and 0.0 differ), else its value."""
    if dtype.is_float:
        if math.isnan(float(value)):
            return NAN_KEY
        return int(torch.tensor(float(value), dtype=dtype.torch).view(_BITS[dtype]).item())
    if dtype is DType.bool:
        return bool(value)
    return int(value)


def const_value(t: Term) -> float | int | bool:
    """A const term's value as a Python number."""
    if t.dtype.is_float:
        if t.key == NAN_KEY:
            return math.nan
        return torch.tensor(t.key, dtype=_BITS[t.dtype]).view(t.dtype.torch).item()
    return t.key


def float_bits(dtype: DType, x: float) -> int:
    """The bit pattern (unsigned) of ``x`` rounded to float ``dtype``."""
    width = dtype.itemsize * 8
    return const_key(dtype, x) % (1 << width) if not math.isnan(x) else (1 << width) - 1


def from_bits(dtype: DType, bits: int) -> float:
    """The float of ``dtype`` with this unsigned bit pattern."""
    width = dtype.itemsize * 8
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    return torch.tensor(signed, dtype=_BITS[dtype]).view(dtype.torch).item()


@dataclass
class SymTensor:
    """A tensor of element terms, flat in row-major order, with the shape and dtype of the graph's value."""

    shape: tuple[int, ...]
    dtype: DType
    terms: list[Term]
    data: torch.Tensor | None = None
    """The concrete values when every element is known (constants, and what is computed from them only)."""

    @property
    def concrete(self) -> bool:
        return self.data is not None

    @staticmethod
    def of_data(interner: Interner, data: torch.Tensor) -> SymTensor:
        dtype = DType.from_torch(data.dtype)
        flat = data.detach().reshape(-1).tolist()
        return SymTensor(tuple(data.shape), dtype, [interner.const(dtype, x) for x in flat], data)


def leaves(t: Term, kinds: frozenset[str] = frozenset({"var"})) -> list[Term]:
    """The distinct sub-terms of ``t`` of the given kinds, in depth-first order."""
    out: dict[int, Term] = {}
    seen: set[int] = set()
    stack = [t]
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if u.kind in kinds:
            out[id(u)] = u
        stack.extend(reversed(u.args))
    return list(out.values())
