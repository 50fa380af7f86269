"""The op registry: one OpDef per op, defined by theme in the modules of this package."""

from gawee.ops import creation, elementwise, nn, opaque, pool, quantized, reduce, shape, targets  # noqa: F401  (registration)
from gawee.ops.base import (
    REQUIRED,
    TRAITS,
    AtenBinding,
    Attr,
    OpDef,
    Operand,
    all_ops,
    get_op,
    has_op,
    register,
)
from gawee.ops.nn import ACTIVATIONS, apply_act
from gawee.ops.opaque import OPAQUE

__all__ = [
    "ACTIVATIONS",
    "OPAQUE",
    "REQUIRED",
    "TRAITS",
    "AtenBinding",
    "Attr",
    "OpDef",
    "Operand",
    "all_ops",
    "apply_act",
    "get_op",
    "has_op",
    "register",
]
