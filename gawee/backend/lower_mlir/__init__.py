"""The MLIR target's lowering table: how :func:`gawee.backend.stablehlo.to_mlir` writes each op in StableHLO.

An entry is a StableHLO (or CHLO) op name, applied to the operands broadcast to the result's shape and converted
to its dtype, or ``lower(ctx)``, which emits ops through a :class:`gawee.backend.stablehlo.MlirLowering` and returns
the result values. An op with no entry cannot be lowered: ``to_mlir`` raises LoweringError naming it. The
entries are grouped as the op registry groups the ops (``creation``, ``elementwise``, ``nn``, ``pool``,
``reduce``, ``shape``).
"""

from gawee.backend.lowering import LOW_FLOATS, LoweringTable
from gawee.ir.types import DType

MLIR = LoweringTable("mlir")
"""Op name -> StableHLO op name or ``lower(ctx)``."""


def widen(c, v):
    """``v`` in float32 where it is f16/bf16: those compute in float32 and round once, as torch's CPU kernels do
    (see gawee.ops.nn.conv_low_precision)."""
    return c.convert(v, DType.f32) if v is not None and v.dtype in LOW_FLOATS else v


from gawee.backend.lower_mlir import creation, elementwise, nn, pool, reduce, shape  # noqa: E402, F401  (registration)
