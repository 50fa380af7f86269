"""A target's lowering table: op name -> how a node of that op lowers to the target.

Lowering is attached from the target's side (as TVM's ``@register_legalize`` tables and MLIR's conversion
patterns are): the op registry (:mod:`gawee.ops`) says what an op means, and each target keeps one table of
how it runs the ops it lowers itself (:mod:`gawee.backend.lower_torch`, ...). An op missing from a table takes
the target's default (the torch backend runs the op's reference semantics) or cannot be lowered there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LoweringTable:
    """One target's lowerings, keyed by op name; each op registers at most once."""

    def __init__(self, target: str):
        self.target = target
        self._lowerings: dict[str, Any] = {}

    def add(self, op: str, lowering: Any) -> None:
        """Register ``lowering`` for ``op`` (a function of the target's lowering context, or target-specific
        data such as an op name). Raises ValueError for an op registered twice."""
        if op in self._lowerings:
            raise ValueError(f"op {op!r} has two {self.target} lowerings")
        self._lowerings[op] = lowering

    def register(self, *ops: str) -> Callable[[Any], Any]:
        """Decorator: ``@TABLE.register("conv2d")`` registers the function for each op named."""

        def decorate(fn: Any) -> Any:
            for op in ops:
                self.add(op, fn)
            return fn

        return decorate

    def get(self, op: str) -> Any | None:
        """The lowering of ``op``, or None where this table has none."""
        return self._lowerings.get(op)

    def __contains__(self, op: str) -> bool:
        return op in self._lowerings

    def ops(self) -> list[str]:
        """The ops this table lowers, in registration order."""
        return list(self._lowerings)
