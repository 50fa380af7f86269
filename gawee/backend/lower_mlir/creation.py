"""StableHLO lowerings of the creation ops (gawee.ops.creation)."""

from __future__ import annotations

from gawee.backend.lower_mlir import MLIR
from gawee.backend.lowering import arange_constant

MLIR.add("full", lambda c: c.splat(c.attrs["value"], c.out.dtype, c.out.shape))
MLIR.add("arange", lambda c: c.constant(arange_constant(c)))
MLIR.add("fill", lambda c: c.broadcast(c.convert(c.x(1), c.out.dtype), c.out.shape))
