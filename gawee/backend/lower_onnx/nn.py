"""ONNX lowerings of the neural-network ops (gawee.ops.nn): convolution, matrices, normalization, pooling, attention."""

from __future__ import annotations

import math

import torch

from gawee.backend.lower_onnx import ONNX
from gawee.backend.lowering import LOW_FLOATS, masks_a_whole_row, rms_norm_eps
from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType, TensorType
from gawee.ops.nn import act_as_op, batch_stats_dtype


@ONNX.register("conv1d", "conv2d", "conv3d")
def _conv_onnx(c):
    """Conv (+ Add of the residual) (+ the activation's own nodes): ONNX has no fused convolution."""
    a = c.attrs
    y = c.emit(
        "Conv",
        c.x(0),
        c.x(1),
        c.x(2),
        kernel_shape=list(c.type(1).shape[2:]),
        strides=list(a["stride"]),
        pads=list(a["padding"]) * 2,
        dilations=list(a["dilation"]),
        group=a["groups"],
    )
    if c.arity > 3 and c.x(3):
        y = c.emit("Add", y, c.x(3))
    if a.get("act") is not None:
        op, attrs = act_as_op(a["act"], a["act_params"])
        y = c.lower_as(op, [y], attrs, [c.out])
    return y


@ONNX.register("conv_transpose2d")
def _conv_transpose_onnx(c):
    """ConvTranspose. torch's output_padding (below stride or dilation) adds rows at the end: rows the end padding
    would crop are kept by cropping less, the rest are ONNX's output_padding, which must be below the stride."""
    a = c.attrs
    ends = [max(p - o, 0) for p, o in zip(a["padding"], a["output_padding"])]
    extra = [max(o - p, 0) for p, o in zip(a["padding"], a["output_padding"])]
    if any(e >= s for e, s in zip(extra, a["stride"])):
        c.fail(f"output_padding {list(a['output_padding'])} beyond padding {list(a['padding'])} by the stride or more")
    return c.emit(
        "ConvTranspose",
        c.x(0),
        c.x(1),
        c.x(2),
        kernel_shape=list(c.type(1).shape[2:]),
        strides=list(a["stride"]),
        pads=[*a["padding"], *ends],
        output_padding=extra,
        dilations=list(a["dilation"]),
        group=a["groups"],
    )


@ONNX.register("linear")
def _linear_onnx(c):
    """Gemm for a matrix input, else MatMul by the transposed weight (+ Add of the bias)."""
    if c.type(0).rank == 2:
        return _act_onnx(c, c.emit("Gemm", c.x(0), c.x(1), c.x(2), transB=1))
    w = c.const(1)
    wt = c.constant(w.t().contiguous()) if w is not None else c.emit("Transpose", c.x(1), perm=[1, 0])
    y = c.emit("MatMul", c.x(0), wt)
    y = c.emit("Add", y, c.x(2)) if c.x(2) else y
    return _act_onnx(c, y)


def _act_onnx(c, y: str) -> str:
    """The node's fused activation (``act``), if any, as its standalone op's ONNX nodes."""
    a = c.attrs
    if a.get("act") is None:
        return y
    op, attrs = act_as_op(a["act"], a["act_params"])
    return c.lower_as(op, [y], attrs, [c.out])


def _ones_or(c, index: int, shape, fill: float) -> str:
    """Operand ``index``, or a constant of ``fill`` where the optional operand is absent."""
    return c.x(index) or c.constant(torch.full(tuple(shape), fill, dtype=c.type(0).dtype.torch))


@ONNX.register("batch_norm")
def _batch_norm_onnx(c):
    channels = (c.type(0).shape[1],)
    return c.emit(
        "BatchNormalization",
        c.x(0),
        _ones_or(c, 1, channels, 1.0),
        _ones_or(c, 2, channels, 0.0),
        c.x(3),
        c.x(4),
        epsilon=c.attrs["eps"],
    )


@ONNX.register("layer_norm")
def _layer_norm_onnx(c):
    shape = c.attrs["normalized_shape"]
    return c.emit(
        "LayerNormalization", c.x(0), _ones_or(c, 1, shape, 1.0), c.x(2), axis=-len(shape), epsilon=c.attrs["eps"]
    )


@ONNX.register("rms_norm")
def _rms_norm_onnx(c):
    """x * 1/sqrt(mean(x*x) + eps) [* weight] over the trailing dims (float32 for f16/bf16), as torch computes it."""
    n, t = len(c.attrs["normalized_shape"]), c.type(0)
    x = c.cast(c.x(0), DType.f32) if t.dtype in LOW_FLOATS else c.x(0)
    work = DType.f32 if x != c.x(0) else t.dtype
    axes = c.ints(list(range(t.rank - n, t.rank)))
    ms = c.emit("ReduceMean", c.emit("Mul", x, x), axes, keepdims=1)
    y = c.emit("Mul", x, c.emit("Reciprocal", c.emit("Sqrt", c.emit("Add", ms, c.scalar(rms_norm_eps(c), work)))))
    if work is not t.dtype:
        y = c.cast(y, t.dtype)
    return c.emit("Mul", y, c.x_as(1, t.dtype)) if c.arity > 1 and c.x(1) else y


@ONNX.register("scaled_dot_product_attention")
def _sdpa_onnx(c):
    """softmax(q @ k^T * scale + mask) @ v, spelled out (the attention of ONNX opset 20)."""
    a = c.attrs
    if a["dropout_p"]:
        c.fail("dropout")
    q, k = c.type(0), c.type(1)
    key, value = c.x(1), c.x(2)
    if a["enable_gqa"] and k.shape[-3] != q.shape[-3]:  # key/value head h // n for query head h: repeat each n times
        if has_symbols(k.shape) or has_symbols(c.type(2).shape) or k.rank != 4:
            c.fail("grouped-query attention with symbolic or non-4-D keys")
        key, value = (_repeat_heads(c, x, c.type(i), q.shape[-3] // k.shape[-3]) for i, x in ((1, key), (2, value)))
    dtype = q.dtype
    perm = list(range(k.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    scores = c.emit("Mul", c.emit("MatMul", c.x(0), c.emit("Transpose", key, perm=perm)), c.scalar(scale, dtype))
    length, source = q.shape[-2], k.shape[-2]
    if a["is_causal"]:
        allowed = torch.ones(length, source, dtype=torch.bool).tril()
        scores = c.emit(
            "Add", scores, c.constant(torch.zeros(length, source, dtype=dtype.torch).masked_fill(~allowed, -math.inf))
        )
    if not (c.arity > 3 and c.x(3)):
        return c.emit("MatMul", c.emit("Softmax", scores, axis=-1), value)
    if c.type(3).dtype.name == "bool":
        bias = c.emit("Where", c.x(3), c.scalar(0.0, dtype), c.scalar(-math.inf, dtype))
    else:
        bias = c.x_as(3, dtype)
    scores = c.emit("Add", scores, bias)
    probs = c.emit("Softmax", scores, axis=-1)
    mask = c.const(3)
    if mask is None or masks_a_whole_row(mask):  # torch gives such a row 0, ONNX's Softmax nan
        none = c.emit("Equal", c.emit("ReduceMax", scores, c.ints([-1]), keepdims=1), c.scalar(-math.inf, dtype))
        probs = c.emit("Where", none, c.scalar(0.0, dtype), probs)
    return c.emit("MatMul", probs, value)


@ONNX.register("group_norm")
def _group_norm_onnx(c):
    """[N, C, *] as [N, G, -1]: normalized by each group's mean and biased variance, back to [N, C, *], then the
    per-channel weight and bias."""
    t, g = c.type(0), c.attrs["num_groups"]
    if has_symbols(t.shape):
        c.fail("group norm of a symbolic shape")
    n, ch = t.shape[0], t.shape[1]
    x = c.emit("Reshape", c.x(0), c.ints([n, g, -1]))
    d = c.emit("Sub", x, c.emit("ReduceMean", x, c.ints([2]), keepdims=1))
    var = c.emit("ReduceMean", c.emit("Mul", d, d), c.ints([2]), keepdims=1)
    y = c.emit("Div", d, c.emit("Sqrt", c.emit("Add", var, c.scalar(c.attrs["eps"], t.dtype))))
    y = c.emit("Reshape", y, c.ints(list(t.shape)))
    per_channel = c.ints([ch] + [1] * (t.rank - 2))
    if c.arity > 1 and c.x(1):
        y = c.emit("Mul", y, c.emit("Reshape", c.x_as(1, t.dtype), per_channel))
    if c.arity > 2 and c.x(2):
        y = c.emit("Add", y, c.emit("Reshape", c.x_as(2, t.dtype), per_channel))
    return y


@ONNX.register("baddbmm")
def _baddbmm_onnx(c):
    """beta * self + alpha * (batch1 @ batch2); self is not read when beta is 0 (torch ignores its nan and inf)."""
    dtype, alpha, beta = c.out.dtype, c.attrs["alpha"], c.attrs["beta"]
    y = c.emit("MatMul", c.x_as(1, dtype), c.x_as(2, dtype))
    if alpha != 1:
        y = c.emit("Mul", y, c.scalar(alpha, dtype))
    if beta == 0:
        return y
    x = c.x_as(0, dtype)
    return c.emit("Add", y, x if beta == 1 else c.emit("Mul", x, c.scalar(beta, dtype)))


def _resize_onnx(mode: str):
    """ONNX Resize of the two spatial dims, to the output's sizes, or by the scale factors when torch was given
    them (its source index is then dst / factor, not dst * in / out)."""

    def lower(c):
        t, out, factors = c.type(0), c.out, c.attrs["scale_factors"]
        if t.rank != 4:
            c.fail(f"a {t.rank}-D input")
        extra = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        if mode == "linear":
            align = c.attrs["align_corners"]
            extra = {"mode": "linear", "coordinate_transformation_mode": "align_corners" if align else "half_pixel"}
        if factors and not c.attrs.get("align_corners"):
            scales = c.constant(torch.tensor([1.0, 1.0, *factors], dtype=torch.float32))
            return c.emit("Resize", c.x(0), "", scales, **extra)
        return c.emit("Resize", c.x(0), "", "", c.ints(list(out.shape)), **extra)

    return lower


def _repeat_heads(c, x: str, t: TensorType, n: int) -> str:
    """[b, h, s, d] -> [b, h * n, s, d], each head repeated n times in a row (torch's repeat_kv)."""
    b, h, s, d = t.shape
    grown = c.emit("Expand", c.emit("Unsqueeze", x, c.ints([2])), c.ints([b, h, n, s, d]))
    return c.emit("Reshape", grown, c.ints([b, h * n, s, d]))


@ONNX.register("batch_norm_training")
def _batch_norm_training_onnx(c):
    """Mean and biased variance over every dim but 1 (ReduceMean), then the per-channel weight and bias;
    the statistics computed in float32 for f16/bf16 inputs, as the reference does."""
    t = c.type(0)
    stats = DType.from_torch(batch_stats_dtype(t.dtype.torch))
    x = c.x_as(0, stats)
    axes = c.ints([d for d in range(t.rank) if d != 1])
    mean = c.emit("ReduceMean", x, axes, keepdims=1)
    d = c.emit("Sub", x, mean)
    var = c.emit("ReduceMean", c.emit("Mul", d, d), axes, keepdims=1)
    rstd = c.emit("Reciprocal", c.emit("Sqrt", c.emit("Add", var, c.scalar(c.attrs["eps"], stats))))
    y = c.cast(c.emit("Mul", d, rstd), t.dtype) if stats is not t.dtype else c.emit("Mul", d, rstd)
    per_channel = c.ints([t.shape[1]] + [1] * (t.rank - 2))
    if c.arity > 1 and c.x(1):
        y = c.emit("Mul", y, c.emit("Reshape", c.x_as(1, t.dtype), per_channel))
    if c.arity > 2 and c.x(2):
        y = c.emit("Add", y, c.emit("Reshape", c.x_as(2, t.dtype), per_channel))
    channels = c.ints([t.shape[1]])
    return [y, c.emit("Reshape", mean, channels), c.emit("Reshape", rstd, channels)]


ONNX.add("matmul", "MatMul")
ONNX.add("mm", "MatMul")
ONNX.add("bmm", "MatMul")
ONNX.add(
    "addmm",
    lambda c: c.emit("Gemm", c.x(1), c.x(2), c.x(0), alpha=float(c.attrs["alpha"]), beta=float(c.attrs["beta"])),
)
ONNX.add("einsum", lambda c: c.emit("Einsum", *(c.x(i) for i in range(c.arity)), equation=c.attrs["equation"]))
ONNX.add("softmax", lambda c: c.on_vector(lambda x: c.emit("Softmax", x, axis=c.attrs["dim"])))
ONNX.add("log_softmax", lambda c: c.on_vector(lambda x: c.emit("LogSoftmax", x, axis=c.attrs["dim"])))
ONNX.add(
    "dropout", lambda c: c.emit("Identity", c.x(0)) if not (c.attrs["train"] and c.attrs["p"]) else c.fail("training")
)
ONNX.add("embedding", lambda c: c.emit("Gather", c.x(0), c.x(1), axis=0))
ONNX.add("upsample_nearest2d", _resize_onnx("nearest"))
ONNX.add("upsample_bilinear2d", _resize_onnx("linear"))
