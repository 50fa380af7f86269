"""ONNX lowerings of the pooling ops (gawee.ops.pool): MaxPool, AveragePool, and Reduce* for global pooling."""

from __future__ import annotations

from gawee.backend.lower_onnx import ONNX


def _pool_onnx(op_type: str):
    def lower(c):
        a = c.attrs
        extra = (
            {"dilations": list(a["dilation"])}
            if "dilation" in a
            else {"count_include_pad": int(a["count_include_pad"])}
        )
        if a.get("divisor_override") is not None:
            c.fail("divisor_override")
        return c.on_batched(
            len(a["kernel_size"]),
            lambda x: c.emit(
                op_type,
                x,
                kernel_shape=list(a["kernel_size"]),
                strides=list(a["stride"]),
                pads=list(a["padding"]) * 2,
                ceil_mode=int(a["ceil_mode"]),
                **extra,
            ),
        )

    return lower


def _adaptive_pool_onnx(reduce_op: str, window_op: str):
    def lower(c):
        out = tuple(c.attrs["output_size"])
        size, rank = c.type(0).shape[-len(out) :], c.type(0).rank
        if all(o == 1 for o in out):  # a reduction over the spatial dims: ONNX Runtime's Reduce* beat GlobalAveragePool
            return c.emit(reduce_op, c.x(0), c.ints(list(range(rank - len(out), rank))), keepdims=1)
        if any(s % o for s, o in zip(size, out)):
            c.fail(f"output size {list(out)} does not divide the input's {list(size)}")
        kernel = [s // o for s, o in zip(size, out)]
        return c.on_batched(len(out), lambda x: c.emit(window_op, x, kernel_shape=kernel, strides=kernel))

    return lower


ONNX.add("max_pool2d", _pool_onnx("MaxPool"))
ONNX.add("avg_pool2d", _pool_onnx("AveragePool"))
ONNX.add("adaptive_avg_pool2d", _adaptive_pool_onnx("ReduceMean", "AveragePool"))
ONNX.add("adaptive_max_pool2d", _adaptive_pool_onnx("ReduceMax", "MaxPool"))
ONNX.add("max_pool3d", _pool_onnx("MaxPool"))
ONNX.add("avg_pool3d", _pool_onnx("AveragePool"))
ONNX.add("adaptive_avg_pool3d", _adaptive_pool_onnx("ReduceMean", "AveragePool"))
ONNX.add("adaptive_max_pool3d", _adaptive_pool_onnx("ReduceMax", "MaxPool"))
