"""Kinds: the static types of rule-language expressions, checked when a rule file loads."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Base(enum.Enum):
    TENSOR = "tensor"  # a Value (possibly absent)
    TENSORS = "outputs"  # the outputs of a multi-output op (split, unbind): pick one with [i]
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    DTYPE = "dtype"
    LIST = "list"
    NONE = "none"
    REST = "rest"  # the record bound by `...name`
    ANY = "any"


NUMERIC = {Base.INT, Base.FLOAT, Base.BOOL}


@dataclass(frozen=True)
class Kind:
    base: Base
    nullable: bool = False

    def __str__(self) -> str:
        return self.base.value + ("?" if self.nullable and self.base is not Base.NONE else "")

    @property
    def is_tensor(self) -> bool:
        return self.base is Base.TENSOR

    @property
    def is_data(self) -> bool:
        """Plain data (what attributes hold), as opposed to a tensor or a rest record."""
        return self.base not in (Base.TENSOR, Base.TENSORS, Base.REST)


TENSOR = Kind(Base.TENSOR)
TENSORS = Kind(Base.TENSORS)
INT = Kind(Base.INT)
FLOAT = Kind(Base.FLOAT)
BOOL = Kind(Base.BOOL)
STR = Kind(Base.STR)
DTYPE = Kind(Base.DTYPE)
LIST = Kind(Base.LIST)
NONE = Kind(Base.NONE, nullable=True)
REST = Kind(Base.REST)
ANY = Kind(Base.ANY, nullable=True)


def of_attr(kind: str) -> Kind:
    """The Kind of an OpDef attribute kind string (``ints?`` → list, nullable)."""
    base = {
        "int": Base.INT,
        "float": Base.FLOAT,
        "bool": Base.BOOL,
        "str": Base.STR,
        "ints": Base.LIST,
        "floats": Base.LIST,
        "scalar": Base.FLOAT,
        "dtype": Base.DTYPE,
        "any": Base.ANY,
    }[kind.rstrip("?")]
    return Kind(base, kind.endswith("?") or base is Base.ANY)


def of_value(v) -> Kind:
    """The Kind of a literal Python value."""
    if v is None:
        return NONE
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return INT
    if isinstance(v, float):
        return FLOAT
    if isinstance(v, str):
        return STR
    if isinstance(v, (list, tuple)):
        return LIST
    return ANY


def comparable(a: Kind, b: Kind) -> bool:
    """Whether ``a == b`` (and ordering, for numbers) can ever be meaningful."""
    if Base.ANY in (a.base, b.base):
        return True
    if a.base is Base.NONE or b.base is Base.NONE:
        return a.nullable or b.nullable
    if a.base in NUMERIC and b.base in NUMERIC:
        return True
    if {a.base, b.base} == {Base.STR, Base.DTYPE}:
        return True
    return a.base == b.base and a.base not in (Base.TENSOR, Base.REST)


def accepts(param: Kind, arg: Kind) -> bool:
    """Whether an argument of kind ``arg`` may be passed where ``param`` is expected."""
    if Base.ANY in (param.base, arg.base):
        return True
    if arg.base is Base.NONE:
        return param.nullable or param.base is Base.TENSOR
    if param.base is Base.FLOAT and arg.base in NUMERIC:
        return True
    if param.base is Base.INT and arg.base in (Base.INT, Base.BOOL):
        return True
    if {param.base, arg.base} == {Base.STR, Base.DTYPE}:
        return True
    return param.base == arg.base
