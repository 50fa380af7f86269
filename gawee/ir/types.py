"""Tensor types of the IR: DType, Layout and TensorType (shape, dtype, layout)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import torch

from gawee.errors import IRError


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

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
            return Layout.channels_last
        return Layout.contiguous

    def __repr__(self) -> str:
        return self.value


Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorType:
    """The static type of a Value: concrete shape, element type and memory layout.

    Shapes are concrete ints; a symbolic batch dimension would be a new ``Dim`` kind
    in ``shape`` and is not supported yet.
    """

    shape: Shape
    dtype: DType
    layout: Layout = Layout.contiguous

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def same_shape_dtype(self, other: TensorType) -> bool:
        return self.shape == other.shape and self.dtype == other.dtype

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        return TensorType(tuple(int(s) for s in t.shape), DType.from_torch(t.dtype), Layout.of(t))

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        suffix = "" if self.layout is Layout.contiguous else f"@{self.layout.value}"
        return f"{self.dtype.value}[{dims}]{suffix}"

    __repr__ = __str__
