"""The op table the IR consults: name -> op record, filled by the op definitions of :mod:`gawee.ops`.

The IR needs an op's record to create, print and verify nodes (operands, attributes, type inference), but
the records themselves are defined above the IR, by theme, in ``gawee/ops/``; each registers itself here when
its module is imported (importing :mod:`gawee` imports them all). This keeps the IR below the op definitions,
as an MLIR context holds the operations its dialects register. The records are ``gawee.ops.OpDef`` objects;
this module only needs their ``name``.
"""

from __future__ import annotations

import difflib
from typing import Any

from gawee.errors import UnknownOpError

OPAQUE = "aten"
"""The opaque op: an ATen call no OpDef binds, run through torch and skipped by rules (gawee/ops/opaque.py)."""

_REGISTRY: dict[str, Any] = {}


def register(opdef: Any) -> Any:
    """Add an op to the registry (its name must be new). Returns it, for chaining."""
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name!r} is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> Any:
    """The OpDef called ``name``; raises UnknownOpError with close matches."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "see `gawee.ops.all_ops()` for the list"
        raise UnknownOpError(f"no op named {name!r} in the registry", hint=hint) from None


def has_op(name: str) -> bool:
    return name in _REGISTRY


def all_ops() -> dict[str, Any]:
    """Name -> OpDef for every registered op, in registration order."""
    return dict(_REGISTRY)
