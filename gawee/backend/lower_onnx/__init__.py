"""The ONNX target's lowering table: how :func:`gawee.backend.onnx.to_onnx` writes each op as ONNX nodes.

An entry is an ONNX op type (one node of that type on the node's operands, in order) or ``lower(ctx)``, which
emits nodes through a :class:`gawee.backend.onnx.OnnxLowering` and returns the name of each output. An op with
no entry cannot be exported: ``to_onnx`` raises ExportError naming it. The entries are grouped as the op
registry groups the ops (``creation``, ``elementwise``, ``nn``, ``pool``, ``reduce``,
``shape``).
"""

from gawee.backend.lowering import LoweringTable

ONNX = LoweringTable("onnx")
"""Op name -> ONNX op type or ``lower(ctx)``."""

from gawee.backend.lower_onnx import creation, elementwise, nn, pool, reduce, shape  # noqa: E402, F401  (registration)
