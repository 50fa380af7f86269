"""The MLIR target's lowering table: how :func:`gawee.backend.mlir.to_mlir` writes each op in StableHLO.

An entry is a StableHLO (or CHLO) op name, applied to the operands broadcast to the result's shape and converted
to its dtype, or ``lower(ctx)``, which emits ops through a :class:`gawee.backend.mlir.MlirLowering` and returns
the result values. An op with no entry cannot be lowered: ``to_mlir`` raises LoweringError naming it. The
entries are grouped as the op registry groups the ops (``creation``, ``elementwise``, ``nn``, ``reduce``,
``shape``).
"""

from gawee.backend.lowering import LoweringTable

MLIR = LoweringTable("mlir")
"""Op name -> StableHLO op name or ``lower(ctx)``."""

from gawee.backend.lower_mlir import creation, elementwise, nn, reduce, shape  # noqa: E402, F401  (registration)
