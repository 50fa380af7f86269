"""A target's lowering table: op name -> how a node of that op lowers to the target; and what the ONNX and MLIR
tables share.

Lowering is attached from the target's side (as TVM's ``@register_legalize`` tables and MLIR's conversion
patterns are): the op registry (:mod:`gawee.ops`) says what an op means, and each target keeps one table of
how it runs the ops it lowers itself (:mod:`gawee.backend.lower_torch`, ...). An op missing from a table takes
the target's default (the torch backend runs the op's reference semantics) or cannot be lowered there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType


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


# -- shared by the ONNX and MLIR tables ------------------------------------------------------
LOW_FLOATS = (DType.f16, DType.bf16)
"""The float types torch's CPU kernels compute in float32, rounding once at the end."""


def rms_norm_eps(c) -> float:
    """rms_norm's eps: the attribute, or (None) the machine epsilon of the dtype torch computes in (float32 for
    f16/bf16 inputs, else the input's)."""
    eps, dtype = c.attrs["eps"], c.type(0).dtype
    return torch.finfo(torch.float32 if dtype in LOW_FLOATS else dtype.torch).eps if eps is None else eps


def masks_a_whole_row(mask: torch.Tensor) -> bool:
    """Whether an attention mask (bool: True attends; float: added to the scores) shuts a query out of every key."""
    shut = ~mask if mask.dtype == torch.bool else mask == -math.inf
    return mask.numel() > 0 and bool(shut.all(dim=-1).any())


def arange_constant(c) -> torch.Tensor:
    """The values of a static arange, as an ONNX or MLIR constant; a length that is a size symbol (the
    batch of a dynamic capture: `arange(batch)`) has no constant form there."""
    if has_symbols(tuple(c.attrs[k] for k in ("start", "end", "step"))):
        c.fail("arange of a symbolic length (it runs through gawee.run and gawee.compile)")
    return c.opdef.evaluate(**c.attrs)
