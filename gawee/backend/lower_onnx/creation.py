"""ONNX lowerings of the creation ops (gawee.ops.creation): constants and Expand."""

from __future__ import annotations

from gawee.backend.lower_onnx import ONNX
from gawee.backend.lowering import arange_constant

ONNX.add("full", lambda c: c.constant(c.opdef.evaluate(**c.attrs)))
ONNX.add("arange", lambda c: c.constant(arange_constant(c)))
ONNX.add("fill", lambda c: c.emit("Expand", c.x_as(1, c.out.dtype), c.ints(c.out.shape)))
