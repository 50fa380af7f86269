"""Tensor types of the IR: DType, Layout and TensorType (shape, dtype, layout)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from gawee.errors import IRError


def _dim(d, symbols: dict | None = None):
    from gawee.ir.symbolic import dim

    d = dim(d)
    if symbols and not isinstance(d, int):
        d = dim(d.xreplace(symbols))
    return d


class DType(enum.Enum):
    """Element types, spelled the short way (``f32``) in text, JSON and rules."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    bool = "bool"
    c64 = "c64"
    c128 = "c128"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize

    @property
    def is_float(self) -> bool:
        return self.torch.is_floating_point

    @property
    def is_complex(self) -> bool:
        return self.torch.is_complex

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DType:
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise IRError(
                f"torch dtype {dtype} has no gawee DType", hint="supported: " + ", ".join(d.value for d in DType)
            ) from None

    @staticmethod
    def parse(name: str) -> DType:
        try:
            return DType(name)
        except ValueError:
            raise IRError(f"unknown dtype {name!r}", hint="use one of " + ", ".join(d.value for d in DType)) from None

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__
    __hash__ = object.__hash__  # members are singletons: identity, hashed in C (Enum's hashes the name in Python)


_TO_TORCH = {
    DType.f64: torch.float64,
    DType.f32: torch.float32,
    DType.f16: torch.float16,
    DType.bf16: torch.bfloat16,
    DType.i64: torch.int64,
    DType.i32: torch.int32,
    DType.i16: torch.int16,
    DType.i8: torch.int8,
    DType.u8: torch.uint8,
    DType.bool: torch.bool,
    DType.c64: torch.complex64,
    DType.c128: torch.complex128,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}

# numpy has no bfloat16: bf16 data is stored as its raw 16 bits (uint16).
NUMPY_STORAGE = {d: (np.uint16 if d is DType.bf16 else torch.empty(0, dtype=d.torch).numpy().dtype) for d in DType}


class Layout(enum.Enum):
    """Memory format of a tensor, a hint for backends: values never depend on it.

    Strides of views (a permute's output) are an implementation detail of torch and
    are not tracked: such tensors count as contiguous.
    """

    contiguous = "contiguous"
    channels_last = "channels_last"

    __hash__ = object.__hash__  # as DType's

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
            return Layout.channels_last
        return Layout.contiguous

    def __repr__(self) -> str:
        return self.value


Shape = tuple  # of Dim: int, or a sympy expression over gawee.ir.symbolic.Sym


@dataclass(frozen=True, slots=True)
class TensorType:
    """The static type of a Value: shape, element type and memory layout.

    A dimension is a plain ``int``, or — for a dynamic dimension — a sympy expression over
    ``Sym`` symbols (``s0``, ``2*s0``; see ``gawee.ir.symbolic``). Static types hold ints
    only; ``numel`` and ``nbytes`` of a symbolic type are expressions too.
    """

    shape: Shape
    dtype: DType
    layout: Layout = Layout.contiguous
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    """The hash, computed on first use (the type is immutable): every inference and node cache lookup hashes
    the operand types, each a tuple of the shape and two enum members to hash again."""

    # __eq__ and __hash__ written out as the dataclass would generate them: every inference and node cache lookup
    # hashes and compares types, and these run compiled with this module (gawee.accel), generated ones do not
    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.shape, self.dtype, self.layout) == (other.shape, other.dtype, other.layout)
        return NotImplemented

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((self.shape, self.dtype, self.layout))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self):
        # rebuilt from its fields: a hash kept from another process would be wrong here (str hashes are salted)
        return TensorType, (self.shape, self.dtype, self.layout)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = math.prod(self.shape)
        return n if isinstance(n, int) else _dim(n)

    @property
    def symbolic(self) -> bool:
        """Whether some dimension is symbolic."""
        return not all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def at(self, values: dict) -> TensorType:
        """This type with its symbols replaced by values (``Sym -> int``; missing ones at their example)."""
        if not self.symbolic:
            return self
        from gawee.ir.symbolic import example_values, subs, symbols_of

        return TensorType(subs(self.shape, {**example_values(symbols_of(self)), **values}), self.dtype, self.layout)

    def same_shape_dtype(self, other: TensorType) -> bool:
        return self.shape == other.shape and self.dtype == other.dtype

    @staticmethod
    def of(t: torch.Tensor, symbols: dict | None = None) -> TensorType:
        """The type of a tensor; symbolic sizes (fake tensors) become expressions, their torch
        symbols renamed through ``symbols`` (torch's sympy Symbol -> gawee Sym) when given.
        Types of plain tensors (int sizes) are made once per shape, dtype and layout and shared
        (they are immutable): constant folding asks for one per folded constant."""
        if type(t) in _PLAIN_TENSORS:
            # Layout.of inlined (one call fewer per folded constant), the layout keyed as a flag
            channels_last = (
                t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
            )
            key = (t.shape, t.dtype, channels_last)
            try:
                known = _TYPES_OF.get(key)
            except TypeError:  # a symbolic size (unhashable)
                known = key = None
            if known is not None:
                return known
            if key is not None and all(type(s) is int for s in t.shape):
                if len(_TYPES_OF) > 65536:
                    _TYPES_OF.clear()
                layout = Layout.channels_last if channels_last else Layout.contiguous
                known = _TYPES_OF[key] = TensorType(tuple(t.shape), DType.from_torch(t.dtype), layout)
                return known
        shape = tuple(s if type(s) is int else _dim(s, symbols) for s in t.shape)
        return TensorType(shape, DType.from_torch(t.dtype), Layout.of(t))

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        suffix = "" if self.layout is Layout.contiguous else f"@{self.layout.value}"
        return f"{self.dtype.value}[{dims}]{suffix}"

    __repr__ = __str__


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
"""Tensor classes whose sizes are plain ints (fake and other subclass tensors may hold symbolic sizes)."""
_TYPES_OF: dict[tuple, TensorType] = {}
"""(torch.Size, torch dtype, whether channels-last) -> the TensorType of a plain tensor (``TensorType.of``)."""
