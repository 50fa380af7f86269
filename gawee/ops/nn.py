"""Neural-network ops: convolution, linear algebra, normalization, pooling, attention, softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.errors import InferenceError
from gawee.ir.symbolic import broadcast_shapes, has_symbols, prove
from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import (
    AtenBinding,
    Attr,
    OpDef,
    Operand,
    get_op,
    numel,
    out_numel,
    per_element,
    register,
    zero_flops,
)
from gawee.ops.elementwise import hardtanh

PURE = frozenset({"pure"})

# The activations a fused node may carry in its `act` attribute, with how many
# `act_params` each takes. A rule may fuse only these (the compiler checks), and the
# torch backend maps each onto oneDNN's fused post-op or runs it unfused.
ACTIVATIONS = {
    "relu": (0, lambda x: torch.relu(x)),
    "sigmoid": (0, lambda x: torch.sigmoid(x)),
    "tanh": (0, lambda x: torch.tanh(x)),
    "silu": (0, lambda x: F.silu(x)),
    "hardswish": (0, lambda x: F.hardswish(x)),
    "hardsigmoid": (0, lambda x: F.hardsigmoid(x)),
    "gelu": (0, lambda x: F.gelu(x)),
    "gelu_tanh": (0, lambda x: F.gelu(x, approximate="tanh")),
    "hardtanh": (2, lambda x, lo, hi: hardtanh(x, lo, hi)),
    "leaky_relu": (1, lambda x, slope: F.leaky_relu(x, slope)),
}


def apply_act(y: torch.Tensor, act: str | None, params: tuple = ()) -> torch.Tensor:
    """Reference semantics of a fused activation."""
    if act is None:
        return y
    n, fn = ACTIVATIONS[act]
    if len(params) != n:
        raise ValueError(f"activation {act} takes {n} parameters, got {len(params)}")
    return fn(y, *params)


# -- ONNX lowerings (OpDef.onnx; see gawee.backend.onnx) ---------------------------------
def act_as_op(act: str, params: tuple = ()) -> tuple[str, dict]:
    """A fused activation as its standalone op and attributes: ``gelu_tanh`` is ``gelu(approximate="tanh")``."""
    if act == "gelu_tanh":
        return "gelu", {"approximate": "tanh"}
    if act == "hardtanh":
        return "hardtanh", {"min_val": params[0], "max_val": params[1]}
    if act == "leaky_relu":
        return "leaky_relu", {"negative_slope": params[0]}
    return act, {}


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


def _layer_norm_onnx(c):
    shape = c.attrs["normalized_shape"]
    return c.emit(
        "LayerNormalization", c.x(0), _ones_or(c, 1, shape, 1.0), c.x(2), axis=-len(shape), epsilon=c.attrs["eps"]
    )


def _rms_eps(c) -> float:
    """rms_norm's eps: the attribute, or (None) the machine epsilon of the dtype torch computes in (float32 for
    f16/bf16 inputs, else the input's)."""
    eps, dtype = c.attrs["eps"], c.type(0).dtype
    return torch.finfo(torch.float32 if dtype in _LOW_FLOATS else dtype.torch).eps if eps is None else eps


def _rms_norm_onnx(c):
    """x * 1/sqrt(mean(x*x) + eps) [* weight] over the trailing dims (float32 for f16/bf16), as torch computes it."""
    n, t = len(c.attrs["normalized_shape"]), c.type(0)
    x = c.cast(c.x(0), DType.f32) if t.dtype in _LOW_FLOATS else c.x(0)
    work = DType.f32 if x != c.x(0) else t.dtype
    axes = c.ints(list(range(t.rank - n, t.rank)))
    ms = c.emit("ReduceMean", c.emit("Mul", x, x), axes, keepdims=1)
    y = c.emit("Mul", x, c.emit("Reciprocal", c.emit("Sqrt", c.emit("Add", ms, c.scalar(_rms_eps(c), work)))))
    if work is not t.dtype:
        y = c.cast(y, t.dtype)
    return c.emit("Mul", y, c.x_as(1, t.dtype)) if c.arity > 1 and c.x(1) else y


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
    if mask is None or _masks_a_whole_row(mask):  # torch gives such a row 0, ONNX's Softmax nan
        none = c.emit("Equal", c.emit("ReduceMax", scores, c.ints([-1]), keepdims=1), c.scalar(-math.inf, dtype))
        probs = c.emit("Where", none, c.scalar(0.0, dtype), probs)
    return c.emit("MatMul", probs, value)


def _masks_a_whole_row(mask: torch.Tensor) -> bool:
    """Whether an attention mask (bool: True attends; float: added to the scores) shuts a query out of every key."""
    shut = ~mask if mask.dtype == torch.bool else mask == -math.inf
    return mask.numel() > 0 and bool(shut.all(dim=-1).any())


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


# -- MLIR lowerings (OpDef.mlir; see gawee.backend.mlir) ---------------------------------
_LOW_FLOATS = (DType.f16, DType.bf16)


def _up(c, v):
    """f16/bf16 compute in float32 and round once, as torch's CPU kernels do (see conv_low_precision)."""
    return c.convert(v, DType.f32) if v is not None and v.dtype in _LOW_FLOATS else v


def _act_mlir(c, y, act, params=()):
    """A fused activation as its standalone op's lowering."""
    if act is None:
        return y
    op, attrs = act_as_op(act, tuple(params))
    return c.lower_as(op, [y], attrs)


def _conv_mlir(c):
    """stablehlo.convolution (+ bias) (+ residual) (+ the activation's ops): IREE fuses them again."""
    a, x, out = c.attrs, _up(c, c.x(0)), c.out
    w = c.const(1)
    if w is not None:  # a constant weight goes in spatial-first (HWIO): no transpose left to IREE
        w = c.constant(w.to(x.dtype.torch).permute(*range(2, w.dim()), 1, 0).contiguous())
    y = c.convolution(
        x,
        w if w is not None else c.convert(c.x(1), x.dtype),
        TensorType(out.shape, x.dtype),
        a["stride"],
        [(p, p) for p in a["padding"]],
        rhs_dilation=a["dilation"],
        groups=a["groups"],
        weight_spatial_first=w is not None,
    )
    if c.x(2) is not None:
        y = c.add(y, c.broadcast_dims(c.convert(c.x(2), y.dtype), y.shape, [1]))
    y = c.convert(y, out.dtype)
    if c.arity > 3 and c.x(3) is not None:
        y = c.add(y, c.x(3))
    return _act_mlir(c, y, a.get("act"), a.get("act_params", ()))


def _conv_transpose_mlir(c):
    """A convolution of the stride-dilated input with the flipped kernel (in and out channels swapped per group)."""
    a, x, w, out = c.attrs, _up(c, c.x(0)), c.x(1), c.out
    g, (cin, cout_g, *ks) = a["groups"], w.shape
    w = c.convert(w, x.dtype)
    w = c.reshape(c.transpose(c.reshape(w, (g, cin // g, cout_g, *ks)), [0, 2, 1, 3, 4]), (g * cout_g, cin // g, *ks))
    w = c.reverse(w, [2, 3])
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, op, d in zip(ks, a["padding"], a["output_padding"], a["dilation"])
    ]
    y = c.convolution(
        x,
        w,
        TensorType(out.shape, x.dtype),
        [1, 1],
        pads,
        lhs_dilation=a["stride"],
        rhs_dilation=a["dilation"],
        groups=g,
    )
    if c.x(2) is not None:
        y = c.add(y, c.broadcast_dims(c.convert(c.x(2), y.dtype), y.shape, [1]))
    return c.convert(y, out.dtype)


def _matmul_v(c, a, b, out: TensorType):
    """torch.matmul of two values (1-D operands, broadcast batch dims) as one batched dot_general."""
    a, b = _up(c, a), c.convert(_up(c, b), _up(c, a).dtype)
    a2 = a if a.rank > 1 else c.reshape(a, (1, a.shape[0]))
    b2 = b if b.rank > 1 else c.reshape(b, (b.shape[0], 1))
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    a3, b3, nb = c.broadcast(a2, batch + a2.shape[-2:]), c.broadcast(b2, batch + b2.shape[-2:]), len(batch)
    y = c.dot_general(a3, b3, contract=([nb + 1], [nb]), batch=(list(range(nb)), list(range(nb))))
    return c.convert(c.reshape(y, out.shape), out.dtype)


def _linear_mlir(c):
    """dot_general contracting the input's last dim with the weight's second (+ bias)."""
    x, out = _up(c, c.x(0)), c.out
    y = c.dot_general(x, c.convert(c.x(1), x.dtype), contract=([x.rank - 1], [1]))
    if c.x(2) is not None:
        y = c.add(y, c.convert(c.x(2), y.dtype))
    return _act_mlir(c, c.convert(y, out.dtype), c.attrs.get("act"), c.attrs.get("act_params", ()))


def _addmm_mlir(c):
    """beta * self + alpha * (mat1 @ mat2), in float32 for f16/bf16."""
    a, prod = (
        c.attrs,
        _matmul_v(c, c.x(1), c.x(2), TensorType(c.out.shape, DType.f32 if c.out.dtype in _LOW_FLOATS else c.out.dtype)),
    )
    if a["alpha"] != 1:
        prod = c.mul(prod, a["alpha"])
    base = _up(c, c.x(0))
    if a["beta"] != 1:
        base = c.mul(base, a["beta"]) if a["beta"] else None
    return c.convert(prod if base is None else c.add(prod, base, prod.dtype), c.out.dtype)


def _batch_norm_mlir(c):
    """(x - mean) * (rsqrt(var + eps) * weight) + bias, per channel (dim 1)."""
    x = _up(c, c.x(0))
    chan = lambda v: c.broadcast_dims(c.convert(v, x.dtype), x.shape, [1])
    scale = c.unary("stablehlo.rsqrt", c.add(c.convert(c.x(4), x.dtype), c.attrs["eps"]))
    if c.x(1) is not None:
        scale = c.mul(scale, c.convert(c.x(1), x.dtype))
    y = c.mul(c.sub(x, chan(c.x(3))), chan(scale))
    if c.x(2) is not None:
        y = c.add(y, chan(c.x(2)))
    return c.convert(y, c.out.dtype)


def _normalize(c, x, dims, eps):
    """(x - mean) * rsqrt(var + eps) over ``dims`` (biased variance)."""
    count = math.prod(x.shape[d] for d in dims)
    mean = c.div(c.reduce(x, dims, "add", keepdim=True), count)
    d = c.sub(x, mean)
    var = c.div(c.reduce(c.mul(d, d), dims, "add", keepdim=True), count)
    return c.mul(d, c.unary("stablehlo.rsqrt", c.add(var, eps)))


def _layer_norm_mlir(c):
    x, n = _up(c, c.x(0)), len(c.attrs["normalized_shape"])
    y = _normalize(c, x, list(range(x.rank - n, x.rank)), c.attrs["eps"])
    if c.x(1) is not None:
        y = c.mul(y, c.convert(c.x(1), x.dtype))
    if c.x(2) is not None:
        y = c.add(y, c.convert(c.x(2), x.dtype))
    return c.convert(y, c.out.dtype)


def _rms_norm_mlir(c):
    x, n = _up(c, c.x(0)), len(c.attrs["normalized_shape"])
    dims = list(range(x.rank - n, x.rank))
    ms = c.div(c.reduce(c.mul(x, x), dims, "add", keepdim=True), math.prod(x.shape[d] for d in dims))
    y = c.convert(c.mul(x, c.unary("stablehlo.rsqrt", c.add(ms, _rms_eps(c)))), c.out.dtype)
    return c.mul(y, c.x(1)) if c.arity > 1 and c.x(1) is not None else y


def _group_norm_mlir(c):
    x, g = _up(c, c.x(0)), c.attrs["num_groups"]
    n = x.shape[0]
    y = _normalize(c, c.reshape(x, (n, g, math.prod(x.shape) // (n * g))), [2], c.attrs["eps"])
    y = c.reshape(y, x.shape)
    for i, op in ((1, c.mul), (2, c.add)):
        if c.x(i) is not None:
            y = op(y, c.broadcast_dims(c.convert(c.x(i), x.dtype), x.shape, [1]))
    return c.convert(y, c.out.dtype)


def _window_padding(c, nd: int, padding, dilation=None):
    """(low, high) padding per dim of a pooling window: high grows so that ceil_mode's last window fits."""
    a, x, out = c.attrs, c.x(0), c.out
    lead, dilation = x.rank - nd, dilation or (1,) * nd
    pads = [(0, 0)] * lead
    for i in range(nd):
        n, o, k, s, p, d = (
            x.shape[lead + i],
            out.shape[lead + i],
            a["kernel_size"][i],
            a["stride"][i],
            padding[i],
            dilation[i],
        )
        pads.append((p, max(p, (o - 1) * s + d * (k - 1) + 1 - n - p)))
    return lead, pads


def _max_pool_mlir(c):
    a, x = c.attrs, c.x(0)
    nd = len(a["kernel_size"])
    lead, pads = _window_padding(c, nd, a["padding"], a["dilation"])
    one = [1] * lead
    return c.reduce_window(
        x, "max", one + list(a["kernel_size"]), one + list(a["stride"]), pads, one + list(a["dilation"])
    )


def _avg_pool_mlir(c):
    """Window sums times 1/divisor per output position; the divisors (padding counted or not, ceil-mode
    windows cut short, divisor_override) come from torch's own pooling of ones, so they match it exactly."""
    a, x = c.attrs, _up(c, c.x(0))
    nd = len(a["kernel_size"])
    lead, pads = _window_padding(c, nd, a["padding"])
    one = [1] * lead
    total = c.reduce_window(x, "add", one + list(a["kernel_size"]), one + list(a["stride"]), pads)
    pool = (F.avg_pool2d, F.avg_pool3d)[nd - 2]
    ones = torch.ones((1,) * max(lead, 1) + x.shape[lead:], dtype=torch.float64)
    args = (a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"])
    avg = pool(ones, *args, a["count_include_pad"], a["divisor_override"])
    count = pool(ones, *args, False, 1)
    scale = (avg / count.clamp(min=1)).reshape((1,) * lead + tuple(avg.shape[-nd:]))
    y = c.mul(total, c.constant(scale.to(x.dtype.torch)))
    return c.convert(y, c.out.dtype)


def _adaptive_pool_mlir(kind: str):
    """Equal bins: a reduction (output 1) or a window; unequal bins (avg only): one contraction per
    spatial dim with the matrix of bin weights 1/len over [floor(i*n/o), ceil((i+1)*n/o))."""

    def lower(c):
        out_size, x = tuple(c.attrs["output_size"]), _up(c, c.x(0)) if kind == "add" else c.x(0)
        nd = len(out_size)
        lead, size = x.rank - nd, x.shape[x.rank - nd :]
        if all(o == 1 for o in out_size):
            dims = list(range(lead, x.rank))
            y = c.reduce(x, dims, kind, keepdim=True)
            y = c.div(y, math.prod(size)) if kind == "add" else y
        elif all(s % o == 0 for s, o in zip(size, out_size)):
            k = [1] * lead + [s // o for s, o in zip(size, out_size)]
            y = c.reduce_window(x, kind, k, k, [(0, 0)] * x.rank)
            y = c.div(y, math.prod(k)) if kind == "add" else y
        elif kind == "max":
            c.fail(f"adaptive max pooling to {list(out_size)} from {list(size)} (unequal bins)")
        else:
            y = x
            for i, (n, o) in enumerate(zip(size, out_size)):
                m = torch.zeros(o, n, dtype=torch.float64)
                for j in range(o):
                    lo, hi = (j * n) // o, -(-((j + 1) * n) // o)
                    m[j, lo:hi] = 1 / (hi - lo)
                y = c.dot_general(y, c.constant(m.to(x.dtype.torch)), contract=([lead + i], [1]))
                perm = [*range(lead + i), y.rank - 1, *range(lead + i, y.rank - 1)]
                y = c.transpose(y, perm)
        return c.convert(y, c.out.dtype)

    return lower


def _softmax_v(c, x, dim: int, log: bool = False):
    """exp(x - max) / sum, over ``dim`` (float32 for f16/bf16); log: (x - max) - log(sum)."""
    xf = _up(c, x)
    z = c.sub(xf, c.reduce(xf, [dim], "max", keepdim=True))
    e = c.unary("stablehlo.exponential", z)
    s = c.reduce(e, [dim], "add", keepdim=True)
    y = c.sub(z, c.unary("stablehlo.log", s)) if log else c.div(e, s)
    return c.convert(y, x.dtype)


def _sdpa_mlir(c):
    """softmax(q @ k^T * scale + mask) @ v, spelled out (causal: a lower-triangular mask); not IREE's
    fused attention op, which IREE 3.13 runs 5x slower on CPU than these batch matmuls (docs/mlir.md)."""
    a = c.attrs
    if a["dropout_p"]:
        c.fail("dropout in attention")
    q, k, v = c.x(0), c.x(1), c.x(2)
    if a["enable_gqa"] and k.shape[-3] != q.shape[-3]:  # repeat each key/value head for its query group
        r = q.shape[-3] // k.shape[-3]

        def repeat(t):
            shape = (*t.shape[:-2], r, *t.shape[-2:])
            b = c.broadcast_dims(t, shape, [*range(t.rank - 2), t.rank - 1, t.rank])
            return c.reshape(b, (*t.shape[:-3], t.shape[-3] * r, *t.shape[-2:]))

        k, v = repeat(k), repeat(v)
    dtype = DType.f32 if q.dtype in _LOW_FLOATS else q.dtype
    length, source = q.shape[-2], k.shape[-2]
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    mask = c.x(3) if c.arity > 3 else None
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    scores = _matmul_v(
        c, q, c.transpose(k, [*range(k.rank - 2), k.rank - 1, k.rank - 2]), TensorType((*batch, length, source), dtype)
    )
    scores = c.mul(scores, scale)
    if a["is_causal"]:
        allowed = c.constant(torch.ones(length, source, dtype=torch.bool).tril())
        scores = c.select(allowed, scores, -math.inf)
    if mask is not None:
        scores = c.select(mask, scores, -math.inf) if mask.dtype is DType.bool else c.add(scores, mask, dtype)
    probs = _softmax_v(c, scores, scores.rank - 1)
    data = c.const(3) if mask is not None else None
    if mask is not None and (
        data is None or _masks_a_whole_row(data)
    ):  # torch gives such a row 0, exp(-inf - -inf) nan
        none = c.compare("EQ", c.reduce(scores, [scores.rank - 1], "max", keepdim=True), -math.inf)
        probs = c.select(c.broadcast(none, probs.shape), 0.0, probs, dtype)
    return _matmul_v(c, probs, v, c.out)


def _einsum_mlir(c):
    """One or two operands, explicit output, no ellipsis or repeated letters: letters only one operand
    has and the output lacks are summed first; then one dot_general (shared letters the output keeps are
    batch dims, the others contracted) and a transpose into the output's order."""
    eq = c.attrs["equation"].replace(" ", "")
    terms, _, out = eq.partition("->")
    terms = terms.split(",")
    xs = [_up(c, v) for v in c.xs]
    if not _ or "." in eq or len(xs) > 2 or len(terms) != len(xs) or any(len(set(t)) != len(t) for t in terms):
        c.fail(f"einsum {c.attrs['equation']!r} (one or two operands, explicit output, no ellipsis or diagonals)")

    def presum(v, term, other):
        drop = [i for i, ch in enumerate(term) if ch not in out and ch not in other]
        return c.reduce(v, drop, "add"), "".join(ch for i, ch in enumerate(term) if i not in drop)

    if len(xs) == 1:
        v, t = presum(xs[0], terms[0], "")
        return c.convert(c.transpose(v, [t.index(ch) for ch in out]), c.out.dtype)
    a, ta = presum(xs[0], terms[0], terms[1])
    b, tb = presum(c.convert(xs[1], a.dtype), terms[1], ta)
    shared = [ch for ch in ta if ch in tb]
    if any(a.shape[ta.index(ch)] != b.shape[tb.index(ch)] for ch in shared):
        c.fail(f"einsum {c.attrs['equation']!r} broadcasts a size-1 dim")
    batch, contract = [ch for ch in shared if ch in out], [ch for ch in shared if ch not in out]
    y = c.dot_general(
        a,
        b,
        contract=([ta.index(ch) for ch in contract], [tb.index(ch) for ch in contract]),
        batch=([ta.index(ch) for ch in batch], [tb.index(ch) for ch in batch]),
    )
    order = batch + [ch for ch in ta if ch not in tb] + [ch for ch in tb if ch not in ta]
    return c.convert(c.transpose(y, [order.index(ch) for ch in out]), c.out.dtype)


def _upsample_nearest_mlir(c):
    """Two index selections with torch's source indices: min(floor(dst * scale), n - 1), scale in float32."""
    import numpy as np

    x, out, factors = c.x(0), c.out, c.attrs["scale_factors"]
    y = x
    for i in (0, 1):
        dim = x.rank - 2 + i
        n, o = x.shape[dim], out.shape[dim]
        scale = np.float32(1 / factors[i]) if factors else np.float32(n / o)
        idx = np.minimum(np.floor(np.arange(o, dtype=np.float32) * scale), n - 1).astype(np.int64)
        y = c.index_select(y, c.constant(torch.from_numpy(idx)), dim)
    return y


def _upsample_bilinear_mlir(c):
    """One contraction per spatial dim with the matrix of interpolation weights, taken from torch's
    own kernel applied to one-hot rows (align_corners, scale factors and edge clamping as torch has them)."""
    x, out, factors = _up(c, c.x(0)), c.out, c.attrs["scale_factors"]
    y = x
    for i in (0, 1):
        dim = x.rank - 2 + i
        n, o = x.shape[dim], out.shape[dim]
        eye = torch.eye(n).reshape((1, n, n, 1) if i == 0 else (1, n, 1, n))
        size, scales = None, None
        if factors:
            scales = [1.0, 1.0]
            scales[i] = factors[i]
        else:
            size = [1, 1]
            size[i] = o
        w = torch.ops.aten.upsample_bilinear2d.vec(eye, size, c.attrs["align_corners"], scales)
        m = w.reshape(n, o).T.contiguous()  # m[j, k]: weight of input row k in output row j
        y = c.dot_general(y, c.constant(m), contract=([dim], [1]))
        y = c.transpose(y, [*range(dim), y.rank - 1, *range(dim, y.rank - 1)])
    return c.convert(y, out.dtype)


def _pair(v, n=2):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


# -- convolution ----------------------------------------------------------------------
def _conv_canon(nd):
    def canon(attrs, _types):
        for k in ("stride", "padding", "dilation"):
            attrs[k] = _pair(attrs[k], nd)
        return attrs

    return canon


def _conv_flops(ins, outs, attrs):
    # 2 x MACs, bias not counted (as torch.utils.flop_counter); fused epilogues 1/element.
    w = ins[1]
    macs = outs[0].numel * math.prod(w.shape[1:])
    extra = outs[0].numel * int((attrs.get("act") is not None) + (len(ins) > 3 and ins[3] is not None))
    return 2 * macs + extra


def _same_padding(args, types):
    pad = args.get("padding")
    if isinstance(pad, str):
        if pad == "valid":
            args["padding"] = [0] * (types["weight"].rank - 2)
        elif pad == "same":
            k = types["weight"].shape[2:]
            dil = _pair(args.get("dilation", 1), len(k))
            total = [d * (kk - 1) for d, kk in zip(dil, k)]
            if any(t % 2 for t in total):
                return None  # asymmetric padding: not expressible, stays opaque
            args["padding"] = [t // 2 for t in total]
        else:
            return None
    return args


def _from_convolution(nd, transposed):
    def convert(args, types):
        if bool(args.get("transposed")) != transposed or types["weight"].rank != nd + 2:
            return None
        if not transposed and any(args.get("output_padding") or ()):
            return None
        args = dict(args)
        args.pop("transposed", None)
        if not transposed:
            args.pop("output_padding", None)
        return args

    return convert


def _draw_act(draw) -> dict:
    act = draw.choice([None, None, *ACTIVATIONS])
    params: tuple = ()
    if act == "hardtanh":
        params = tuple(sorted((draw.floats(-2, 1), draw.floats(0, 6))))
    elif act == "leaky_relu":
        params = (draw.floats(-1, 1),)
    return {"act": act, "act_params": params}


def _conv_sample(nd: int, fused: bool):
    def sample(draw, slots, attrs):
        x, w = slots[0], slots[1]
        attrs = dict(attrs)
        if isinstance(w, TensorType):
            if w.rank != nd + 2:
                raise S.Reject("weight rank")
            cout, cin_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
        else:
            cout, cin_g, kernel = None, None, None
        groups = attrs.get("groups")
        if isinstance(x, TensorType):
            if x.rank != nd + 2:
                raise S.Reject("input rank")
            cin = x.shape[1]
            if groups is None:
                groups = cin // cin_g if cin_g else draw.choice([g for g in (1, 2, cin) if g > 0 and cin % g == 0])
        else:
            if groups is None:  # grouped convolutions as often as plain ones: where group bugs hide
                groups = draw.choice([1, 2, 3])
            cin = groups * (cin_g or draw.integers(1, 3))
        if groups < 1 or cin % groups or (cin_g is not None and cin_g * groups != cin):
            raise S.Reject("groups")
        if cout is None:
            cout = groups * draw.integers(1, 3)
        if cout % groups:
            raise S.Reject("groups")
        for k, lo, hi in (("stride", 1, 2), ("padding", 0, 1), ("dilation", 1, 2)):
            if k not in attrs:
                attrs[k] = tuple(draw.integers(lo, hi) for _ in range(nd))
        attrs["groups"] = groups
        if kernel is None and isinstance(x, TensorType):  # a kernel that fits the given input (a conv fed by a mul)
            fits = [
                (n + 2 * p - 1) // d + 1
                for n, d, p in zip(x.shape[2:], _pair(attrs["dilation"], nd), _pair(attrs["padding"], nd))
            ]
            kernel = tuple(draw.integers(1, min(k, 3)) for k in fits)
        elif kernel is None:
            kernel = tuple(draw.integers(1, 3) for _ in range(nd))
        if not isinstance(x, TensorType):
            need = [
                (kk - 1) * d + 1 - 2 * p
                for kk, d, p in zip(kernel, _pair(attrs["dilation"], nd), _pair(attrs["padding"], nd))
            ]
            spatial = tuple(max(n, 1) + draw.size(0, 3) for n in need)
            x = TensorType((draw.integers(1, 2), cin, *spatial), draw.dtype)
        if not isinstance(w, TensorType):
            w = TensorType((cout, cin // groups, *kernel), x.dtype)
        bias = slots[2] if slots[2] is not S.FREE else (None if draw.boolean(0.3) else TensorType((cout,), x.dtype))
        types = [x, w, None if bias is S.ABSENT else bias]
        if fused:
            if "act" not in attrs:
                attrs.update({k: v for k, v in _draw_act(draw).items() if k not in attrs})
            res = slots[3]
            if res is S.FREE and draw.boolean(0.3):
                try:
                    res = get_op("conv2d").infer_types([*types, None], {**attrs, "act": None, "act_params": ()})[0]
                except InferenceError as e:
                    raise S.Reject(e.message) from None
            types.append(None if res in (S.FREE, S.ABSENT) else res)
        return types, attrs

    return sample


def conv_low_precision(fn, input, weight, bias, *args):
    """``fn(input, weight, bias, *args)`` (a torch convolution) for every dtype, safe on every CPU.

    f16/bf16 on CPU compute in float32 and round once to the input dtype. Why not torch's own
    low-precision kernels: oneDNN's f16 convolution (torch 2.14.1) segfaults on Sapphire Rapids
    (AVX-512/AMX) for valid strided/padded/dilated geometries, and its result depends on the ISA;
    the non-oneDNN path (``mkldnn.flags(enabled=False)``, a process-global switch) rounds partial
    sums to f16/bf16: against float64, its f16 conv_transpose2d differed from the correctly rounded
    result in 41% of the elements with 2.6x the max error (tests/ops/test_conv_low_precision.py
    checks the bound). float32 accumulation then one rounding is within one ulp of the float64
    result (it differs from the correctly rounded one only at rare near-ties), uses only the
    f32 kernels every CPU runs, and is what CUDA's f16 convolutions compute. Mixed dtypes are
    passed through, so torch reports them as before.
    """
    low = input.dtype in (torch.float16, torch.bfloat16)
    if (
        low
        and input.device.type == "cpu"
        and weight.dtype == input.dtype
        and (bias is None or bias.dtype == input.dtype)
    ):
        y = fn(input.float(), weight.float(), None if bias is None else bias.float(), *args)
        return y.to(input.dtype)
    return fn(input, weight, bias, *args)


def _conv(name: str, nd: int, fused: bool = False, doc: str = "") -> OpDef:
    operands = (Operand("input"), Operand("weight"), Operand("bias", optional=True))
    attrs = (
        Attr("stride", "ints", (1,) * nd),
        Attr("padding", "ints", (0,) * nd),
        Attr("dilation", "ints", (1,) * nd),
        Attr("groups", "int", 1),
    )
    if fused:
        operands += (Operand("residual", optional=True),)
        attrs += (Attr("act", "str?", None), Attr("act_params", "floats", ()))

    def evaluate(
        input, weight, bias=None, residual=None, *, stride, padding, dilation, groups, act=None, act_params=()
    ):
        fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        y = conv_low_precision(fn, input, weight, bias, stride, padding, dilation, groups)
        if residual is not None:
            if residual.shape != y.shape or residual.dtype != y.dtype:
                raise ValueError(
                    f"residual {list(residual.shape)} {residual.dtype} must have the output's shape "
                    f"{list(y.shape)} and dtype {y.dtype}"
                )
            y = y + residual
        return apply_act(y, act, act_params)

    return register(
        OpDef(
            name,
            operands,
            evaluate,
            attrs=attrs,
            traits=PURE,
            flops=_conv_flops,
            canonicalize=_conv_canon(nd),
            sample=_conv_sample(nd, fused),
            onnx=_conv_onnx,
            mlir=_conv_mlir,
            aten=(
                f"aten.{name}.default",
                AtenBinding(f"aten.{name}.padding", convert=_same_padding),
                AtenBinding("aten.convolution.default", convert=_from_convolution(nd, False)),
            ),
            doc=doc,
        )
    )


_conv("conv1d", 1)
_conv(
    "conv2d",
    2,
    fused=True,
    doc="act(conv2d(input, weight, bias) + residual): residual and act are optional fused epilogues",
)
_conv("conv3d", 3)


def _convt_flops(ins, outs, attrs):
    x, w = ins[0], ins[1]
    return 2 * x.shape[0] * math.prod(x.shape[2:]) * math.prod(w.shape)


def _conv_transpose_sample(draw, slots, attrs):
    """[N, C_in, H, W] and a [C_in, C_out / groups, kh, kw] weight; output_padding below stride or dilation, as
    torch requires."""
    x, w = slots[0], slots[1]
    attrs = dict(attrs)
    groups = attrs.setdefault("groups", draw.choice([1, 2]) if not isinstance(w, TensorType) else 1)
    if isinstance(w, TensorType):
        if w.rank != 4:
            raise S.Reject("weight rank")
        cin, cout_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    else:
        cin, cout_g, kernel = (
            groups * draw.integers(1, 2),
            draw.integers(1, 2),
            (draw.integers(1, 3), draw.integers(1, 3)),
        )
    if isinstance(x, TensorType) and (x.rank != 4 or x.shape[1] != cin):
        raise S.Reject("input channels")
    if groups < 1 or cin % groups:
        raise S.Reject("groups")
    for k, lo, hi in (("stride", 1, 2), ("padding", 0, 1), ("dilation", 1, 2)):
        attrs.setdefault(k, (draw.integers(lo, hi), draw.integers(lo, hi)))
    stride, dilation = _pair(attrs["stride"]), _pair(attrs["dilation"])
    attrs.setdefault("output_padding", tuple(draw.integers(0, max(s, d) - 1) for s, d in zip(stride, dilation)))
    if not isinstance(x, TensorType):
        x = TensorType((draw.integers(1, 2), cin, draw.integers(1, 4), draw.integers(1, 4)), draw.dtype)
    if not isinstance(w, TensorType):
        w = TensorType((cin, cout_g, *kernel), x.dtype)
    bias = (
        slots[2] if slots[2] is not S.FREE else (None if draw.boolean(0.3) else TensorType((cout_g * groups,), x.dtype))
    )
    return [x, w, None if bias is S.ABSENT else bias], attrs


register(
    OpDef(
        "conv_transpose2d",
        (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
        lambda input, weight, bias=None, *, stride, padding, output_padding, groups, dilation: conv_low_precision(
            F.conv_transpose2d, input, weight, bias, stride, padding, output_padding, groups, dilation
        ),
        attrs=(
            Attr("stride", "ints", (1, 1)),
            Attr("padding", "ints", (0, 0)),
            Attr("output_padding", "ints", (0, 0)),
            Attr("groups", "int", 1),
            Attr("dilation", "ints", (1, 1)),
        ),
        traits=PURE,
        flops=_convt_flops,
        sample=_conv_transpose_sample,
        onnx=_conv_transpose_onnx,
        mlir=_conv_transpose_mlir,
        canonicalize=lambda a, t: {
            **a,
            **{k: _pair(a[k]) for k in ("stride", "padding", "output_padding", "dilation")},
        },
        aten=(
            "aten.conv_transpose2d.input",
            AtenBinding("aten.convolution.default", convert=_from_convolution(2, True)),
        ),
    )
)


# -- linear algebra -------------------------------------------------------------------
def _contract_flops(ins, outs, attrs):
    """2 x MACs of a (batched) matrix product: out elements x the contracted size."""
    return 2 * outs[0].numel * ins[0].shape[-1]


def _linear_sample(draw, slots, attrs):
    x, w, b = slots
    if isinstance(x, TensorType) and x.rank == 0:
        raise S.Reject("linear needs rank >= 1")
    if isinstance(w, TensorType) and w.rank != 2:
        raise S.Reject("linear needs a 2-D weight")
    k = x.shape[-1] if isinstance(x, TensorType) else (w.shape[1] if isinstance(w, TensorType) else draw.integers(1, 4))
    if isinstance(w, TensorType) and w.shape[1] != k:
        raise S.Reject(f"linear: input features {k}, weight {w}")
    if not isinstance(x, TensorType):
        x = TensorType((*S.shape(draw, draw.integers(0, 3)), k), draw.dtype)
    if not isinstance(w, TensorType):
        w = TensorType((draw.integers(1, 4), k), x.dtype)
    if b is S.FREE:  # absent, per feature, or a scalar (F.linear broadcasts the bias)
        b = draw.choice([None, TensorType((w.shape[0],), x.dtype), TensorType((w.shape[0],), x.dtype)])
        if b is not None and draw.boolean(0.1):
            b = TensorType((), x.dtype)
    if "act" not in attrs:
        attrs = {**attrs, **{k: v for k, v in _draw_act(draw).items() if k not in attrs}}
    return [x, w, None if b is S.ABSENT else b], attrs


def _batch_like(draw, batch: tuple[int, ...]) -> tuple[int, ...]:
    """Batch dims that broadcast against ``batch``: the same, fewer, size-1 ones, or more."""
    kind = draw.choice(["same", "same", "fewer", "ones", "more"])
    if kind == "fewer":
        return batch[draw.integers(0, len(batch)) :]
    if kind == "ones":
        return tuple(1 if draw.boolean() else d for d in batch)
    if kind == "more":
        return (draw.integers(1, 3), *batch) if len(batch) < 3 else batch
    return batch


def _matmul_sample(draw, slots, attrs):
    """Every shape combination of torch.matmul: vectors, matrices, batched with broadcasting."""
    a, b = slots
    for t in (a, b):
        if isinstance(t, TensorType) and t.rank == 0:
            raise S.Reject("matmul needs rank >= 1")
    if not isinstance(a, TensorType):
        if isinstance(b, TensorType):
            k = b.shape[-2] if b.rank >= 2 else b.shape[0]
            dtype = b.dtype
            batch = _batch_like(draw, b.shape[:-2])
        else:
            k, dtype, batch = draw.integers(1, 4), draw.dtype, S.shape(draw, draw.integers(0, 2))
        rank = draw.choice([1, 2, 2, 3])
        a = TensorType((k,) if rank == 1 else (*batch, draw.integers(1, 4), k), dtype)
    if not isinstance(b, TensorType):
        k = a.shape[-1]
        if draw.boolean(0.2):
            b = TensorType((k,), a.dtype)
        else:
            b = TensorType((*_batch_like(draw, a.shape[:-2]), k, draw.integers(1, 4)), a.dtype)
    return [a, b], attrs


def _mm_sample(batched: bool, extra: bool):
    """mm / bmm (``batched``), and addmm / baddbmm (``extra``: a broadcasting first operand)."""

    def sample(draw, slots, attrs):
        slots = list(slots)
        c = slots.pop(0) if extra else None
        a, b = slots
        rank = 3 if batched else 2
        for t in (a, b):
            if isinstance(t, TensorType) and t.rank != rank:
                raise S.Reject(f"needs rank {rank}")
        batch = (
            (a.shape[0],)
            if isinstance(a, TensorType) and batched
            else ((b.shape[0],) if isinstance(b, TensorType) and batched else S.shape(draw, 1) if batched else ())
        )
        if not isinstance(a, TensorType):
            k = b.shape[-2] if isinstance(b, TensorType) else draw.integers(1, 4)
            a = TensorType((*batch, draw.integers(1, 4), k), b.dtype if isinstance(b, TensorType) else draw.dtype)
        if not isinstance(b, TensorType):
            b = TensorType((*batch, a.shape[-1], draw.integers(1, 4)), a.dtype)
        types = [a, b]
        if extra:
            out = TensorType((*batch, a.shape[-2], b.shape[-1]), a.dtype)
            bias = TensorType(out.shape[-1:], out.dtype)  # the usual addmm(bias, x, w): one per output column
            types.insert(0, c if isinstance(c, TensorType) else draw.choice([bias, S.broadcast_partner(draw, out)]))
            attrs = {"beta": draw.choice([1, 1, 0, 0.5]), "alpha": draw.choice([1, 1, 2.0]), **attrs}
        return types, attrs

    return sample


def _sdpa_sample(draw, slots, attrs):
    """(batch..., L, E) queries, (batch..., S, E) keys, (batch..., S, Ev) values, an optional mask."""
    q, k, v, m = slots
    fixed = [t for t in (q, k, v) if isinstance(t, TensorType)]
    if any(t.rank < 2 for t in fixed):
        raise S.Reject("attention needs rank >= 2")
    ref = fixed[0] if fixed else None
    batch = ref.shape[:-2] if ref is not None else S.shape(draw, draw.integers(0, 2))
    dtype = ref.dtype if ref is not None else draw.dtype
    e = q.shape[-1] if isinstance(q, TensorType) else k.shape[-1] if isinstance(k, TensorType) else draw.integers(1, 4)
    length = q.shape[-2] if isinstance(q, TensorType) else draw.integers(1, 4)
    src = (
        k.shape[-2] if isinstance(k, TensorType) else v.shape[-2] if isinstance(v, TensorType) else draw.integers(1, 4)
    )
    q = q if isinstance(q, TensorType) else TensorType((*batch, length, e), dtype)
    k = k if isinstance(k, TensorType) else TensorType((*batch, src, e), dtype)
    v = v if isinstance(v, TensorType) else TensorType((*batch, src, draw.integers(1, 4)), dtype)
    if m is S.FREE:
        mask = TensorType((length, src), draw.choice([dtype, DType.bool]))
        m = None if draw.boolean(0.5) else S.broadcast_partner(draw, mask)
    attrs = {"is_causal": draw.boolean(0.3) and m is None, "scale": draw.choice([None, None, 0.5]), **attrs}
    return [q, k, v, None if m is S.ABSENT else m], attrs


def _linear(input, weight, bias=None, *, act=None, act_params=()):
    return apply_act(F.linear(input, weight, bias), act, act_params)


def _linear_flops(ins, outs, attrs):
    return _contract_flops(ins, outs, attrs) + outs[0].numel * int(attrs.get("act") is not None)


register(
    OpDef(
        "linear",
        (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
        _linear,
        attrs=(Attr("act", "str?", None), Attr("act_params", "floats", ())),
        traits=PURE,
        flops=_linear_flops,
        sample=_linear_sample,
        onnx=_linear_onnx,
        mlir=_linear_mlir,
        aten=("aten.linear.default",),
        doc="act(input @ weight.T + bias): act is an optional fused epilogue",
    )
)
register(
    OpDef(
        "matmul",
        (Operand("self"), Operand("other")),
        torch.matmul,
        traits=PURE,
        flops=_contract_flops,
        sample=_matmul_sample,
        aten=("aten.matmul.default",),
        onnx="MatMul",
        mlir=lambda c: _matmul_v(c, c.x(0), c.x(1), c.out),
        doc="numpy-style matmul with broadcasting",
    )
)
register(
    OpDef(
        "mm",
        (Operand("self"), Operand("mat2")),
        torch.mm,
        traits=PURE,
        flops=_contract_flops,
        sample=_mm_sample(False, False),
        aten=("aten.mm.default",),
        onnx="MatMul",
        mlir=lambda c: _matmul_v(c, c.x(0), c.x(1), c.out),
    )
)
register(
    OpDef(
        "bmm",
        (Operand("self"), Operand("mat2")),
        torch.bmm,
        traits=PURE,
        flops=_contract_flops,
        sample=_mm_sample(True, False),
        aten=("aten.bmm.default",),
        onnx="MatMul",
        mlir=lambda c: _matmul_v(c, c.x(0), c.x(1), c.out),
    )
)
register(
    OpDef(
        "addmm",
        (Operand("self"), Operand("mat1"), Operand("mat2")),
        lambda self, mat1, mat2, beta=1, alpha=1: torch.addmm(self, mat1, mat2, beta=beta, alpha=alpha),
        attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
        traits=PURE,
        sample=_mm_sample(False, True),
        flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1],
        mlir=_addmm_mlir,
        aten=("aten.addmm.default",),
        onnx=lambda c: c.emit(
            "Gemm", c.x(1), c.x(2), c.x(0), alpha=float(c.attrs["alpha"]), beta=float(c.attrs["beta"])
        ),
        doc="beta * self + alpha * (mat1 @ mat2)",
    )
)


def _baddbmm_shape(types, attrs):
    """[b, n, m] @ [b, m, p] -> [b, n, p], which self must broadcast to without growing it (torch's kernel
    pins the batch of a 0-d self)."""
    x, a, b = types
    if a.rank != 3 or b.rank != 3 or prove(a.shape[0], "==", b.shape[0]) is not True:
        raise ValueError("batch1 and batch2 must be 3-D with one batch size")
    if prove(a.shape[2], "==", b.shape[1]) is not True:
        raise ValueError(f"batch1's columns {a.shape[2]} must be batch2's rows {b.shape[1]}")
    out = (a.shape[0], a.shape[1], b.shape[2])
    if broadcast_shapes(x.shape, out) != out:
        raise ValueError(f"self {list(x.shape)} does not broadcast to {list(out)}")
    return [out]


register(
    OpDef(
        "baddbmm",
        (Operand("self"), Operand("batch1"), Operand("batch2")),
        lambda self, batch1, batch2, beta=1, alpha=1: torch.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha),
        attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
        traits=PURE,
        shape_formula=_baddbmm_shape,
        sample=_mm_sample(True, True),
        flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1],
        mlir=_addmm_mlir,
        onnx=_baddbmm_onnx,
        aten=("aten.baddbmm.default",),
    )
)


def _einsum_flops(ins, outs, attrs):
    eq = attrs["equation"].replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(lhs, ins):
        letters = [c for c in term if c.isalpha()]
        dims = t.shape[len(t.shape) - len(letters) :] if "..." in term else t.shape
        for c, d in zip(letters, dims):
            sizes[c] = max(sizes.get(c, 1), d)
    total = math.prod(sizes.values())
    if "..." in eq:
        total *= outs[0].numel // max(1, math.prod(sizes[c] for c in eq.split("->")[-1] if c.isalpha()))
    return 2 * total if len(ins) > 1 else numel(ins[0])


register(
    OpDef(
        "einsum",
        (Operand("tensors", variadic=True),),
        lambda *tensors, equation: torch.einsum(equation, *tensors),
        attrs=(Attr("equation", "str"),),
        traits=PURE,
        flops=_einsum_flops,
        onnx=lambda c: c.emit("Einsum", *(c.x(i) for i in range(c.arity)), equation=c.attrs["equation"]),
        mlir=_einsum_mlir,
        aten=(AtenBinding("aten.einsum.default", drop=frozenset({"path"})),),
        doc="Einstein summation; FLOPs counted as 2 x the full index space (naive evaluation)",
    )
)


# -- normalization ----------------------------------------------------------------------
def _bn_sample(draw, slots, attrs):
    x = slots[0]
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(2, 4))
    if x.rank < 2:
        raise S.Reject("batch_norm needs rank >= 2")
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [
        None
        if s is S.ABSENT or (s is S.FREE and opt and draw.boolean(0.2))
        else (s if isinstance(s, TensorType) else c)
        for s, opt in zip(slots[1:], (True, True, False, False))
    ]
    return types, {"eps": draw.choice([1e-5, 1e-3, 0.1]), **attrs}


def _embedding_sample(draw, slots, attrs):
    """A [rows, width] table with rows to spare for the drawn ids; padding_idx none or a row."""
    weight = slots[0] if isinstance(slots[0], TensorType) else TensorType((S.INDEXED, draw.integers(1, 4)), draw.dtype)
    if weight.rank != 2:
        raise S.Reject("embedding takes a 2-D table")
    ids = slots[1] if isinstance(slots[1], TensorType) else S.indices(draw)
    rows = weight.shape[0] if isinstance(weight.shape[0], int) else S.INDEXED
    return [weight, ids], {"padding_idx": draw.choice([-1, draw.integers(0, rows - 1)]), **attrs}


def _gn_sample(draw, slots, attrs):
    """[N, C, *] with num_groups dividing C; per-channel weight and bias, each maybe absent."""
    x = slots[0]
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(2, 4))
    if x.rank < 2 or has_symbols(x.shape[1:2]) or not x.shape[1]:
        raise S.Reject("group_norm needs rank >= 2 and a known, nonzero channel count")
    groups = attrs.get("num_groups") or draw.choice([g for g in range(1, x.shape[1] + 1) if x.shape[1] % g == 0])
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else c for s in slots[1:]]
    return types, {"eps": draw.choice([1e-5, 1e-3, 0.1]), **attrs, "num_groups": groups}


def _ln_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.rank(1, 4))
    if x.rank == 0:
        raise S.Reject("layer_norm needs rank >= 1")
    attrs = dict(attrs)
    if "normalized_shape" not in attrs:
        attrs["normalized_shape"] = x.shape[x.rank - draw.integers(1, x.rank) :]
    norm = TensorType(tuple(attrs["normalized_shape"]), x.dtype)
    types = [x] + [
        None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else (s if isinstance(s, TensorType) else norm)
        for s in slots[1:]
    ]
    return types, {"eps": draw.choice([1e-5, 1e-3]), **attrs}


register(
    OpDef(
        "batch_norm",
        (
            Operand("input"),
            Operand("weight", optional=True),
            Operand("bias", optional=True),
            Operand("running_mean"),
            Operand("running_var", domain="nonnegative"),
        ),
        lambda input, weight, bias, running_mean, running_var, *, eps: F.batch_norm(
            input, running_mean, running_var, weight, bias, False, 0.0, eps
        ),
        attrs=(Attr("eps", "float", 1e-5),),
        traits=PURE,
        flops=per_element(2),
        sample=_bn_sample,
        onnx=_batch_norm_onnx,
        mlir=_batch_norm_mlir,
        aten=(
            AtenBinding(
                "aten._native_batch_norm_legit_no_training.default", drop=frozenset({"momentum"}), outputs=(0,)
            ),
            AtenBinding(
                "aten.batch_norm.default", fixed={"training": False}, drop=frozenset({"momentum", "cudnn_enabled"})
            ),
        ),
        doc="inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias, per channel (dim 1)",
    )
)


def _batch_stats_dtype(t: torch.dtype) -> torch.dtype:
    """The dtype of batch_norm_training's mean and rstd: float32 for f16/bf16 inputs (ATen's meta and CUDA
    kernels; its CPU kernel returns the input's dtype), else the input's."""
    return torch.float32 if t in (torch.float16, torch.bfloat16) else t


def _batch_norm_training(input, weight=None, bias=None, *, eps):
    out, mean, rstd = torch.ops.aten._native_batch_norm_legit.no_stats(input, weight, bias, True, 0.0, eps)
    stats = _batch_stats_dtype(input.dtype)
    return out, mean.to(stats), rstd.to(stats)


def _bn_training_sample(draw, slots, attrs):
    """[N, C, *] of rank 2-4 with per-channel weight and bias, each maybe absent."""
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.integers(2, 4))
    if x.rank < 2 or not x.dtype.is_float:
        raise S.Reject("batch_norm_training needs a float tensor of rank >= 2")
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [
        None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else (s if isinstance(s, TensorType) else c)
        for s in slots[1:]
    ]
    return types, {"eps": draw.choice([1e-6, 1e-5, 1e-3]), **attrs}


def _batch_norm_training_onnx(c):
    """Mean and biased variance over every dim but 1 (ReduceMean), then the per-channel weight and bias;
    the statistics computed in float32 for f16/bf16 inputs, as the reference does."""
    t = c.type(0)
    stats = DType.from_torch(_batch_stats_dtype(t.dtype.torch))
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


def _batch_norm_training_mlir(c):
    """Mean and biased variance over every dim but 1, then the per-channel weight and bias; the statistics
    in float32 for f16/bf16 inputs, as the reference computes them."""
    t = c.x(0)
    stats = c.outs[1].dtype
    x = c.convert(t, stats)
    dims = [d for d in range(t.rank) if d != 1]
    count = math.prod(t.shape[d] for d in dims)
    mean = c.div(c.reduce(x, dims, "add", keepdim=True), count)
    d = c.sub(x, mean)
    var = c.div(c.reduce(c.mul(d, d), dims, "add", keepdim=True), count)
    rstd = c.unary("stablehlo.rsqrt", c.add(var, c.attrs["eps"]))
    y = c.convert(c.mul(d, rstd), t.dtype)
    for i, op in ((1, c.mul), (2, c.add)):
        if c.arity > i and c.x(i) is not None:
            y = op(y, c.broadcast_dims(c.convert(c.x(i), t.dtype), t.shape, [1]))
    channels = (t.shape[1],)
    return [y, c.reshape(mean, channels), c.reshape(rstd, channels)]


register(
    OpDef(
        "batch_norm_training",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        _batch_norm_training,
        attrs=(Attr("eps", "float", 1e-5),),
        traits=frozenset({"pure", "multi_output"}),
        flops=per_element(5),
        sample=_bn_training_sample,
        onnx=_batch_norm_training_onnx,
        mlir=_batch_norm_training_mlir,
        aten=(
            AtenBinding(
                "aten._native_batch_norm_legit.no_stats", fixed={"training": True}, drop=frozenset({"momentum"})
            ),
            AtenBinding(
                "aten.batch_norm.default",
                fixed={"training": True, "running_mean": None, "running_var": None},
                drop=frozenset({"momentum", "cudnn_enabled"}),
                outputs=(0,),
            ),
        ),
        doc="batch norm by the batch's own statistics (training mode, no running statistics), per channel (dim 1) "
        "over every other dim: outputs (x - mean) * rstd * weight + bias, the mean, and rstd = 1 / sqrt(var + eps) "
        "(biased variance; f16/bf16 statistics in float32). Weight standardization (timm's StdConv2d, NFNets) "
        "computes it on constant weights, so constant folding removes it",
    )
)
register(
    OpDef(
        "layer_norm",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        lambda input, weight=None, bias=None, *, normalized_shape, eps: F.layer_norm(
            input, normalized_shape, weight, bias, eps
        ),
        attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float", 1e-5)),
        traits=PURE,
        flops=per_element(5),
        sample=_ln_sample,
        onnx=_layer_norm_onnx,
        mlir=_layer_norm_mlir,
        aten=(AtenBinding("aten.layer_norm.default", drop=frozenset({"cudnn_enable"})),),
    )
)
register(
    OpDef(
        "rms_norm",
        (Operand("input"), Operand("weight", optional=True)),
        lambda input, weight=None, *, normalized_shape, eps: F.rms_norm(input, normalized_shape, weight, eps),
        attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float?", None)),
        traits=PURE,
        flops=per_element(4),
        sample=_ln_sample,
        onnx=_rms_norm_onnx,
        mlir=_rms_norm_mlir,
        aten=("aten.rms_norm.default",),
        doc="x / sqrt(mean(x^2) + eps) * weight over the trailing normalized_shape dims; f16/bf16 compute in "
        "float32 and round once (eps None: float32's machine epsilon for them, else the dtype's); T5's and "
        "Llama's RMSNorm",
    )
)
register(
    OpDef(
        "group_norm",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        lambda input, weight=None, bias=None, *, num_groups, eps: F.group_norm(input, num_groups, weight, bias, eps),
        attrs=(Attr("num_groups", "int"), Attr("eps", "float", 1e-5)),
        traits=PURE,
        flops=per_element(5),
        mlir=_group_norm_mlir,
        onnx=_group_norm_onnx,
        sample=_gn_sample,
        aten=(AtenBinding("aten.group_norm.default", drop=frozenset({"cudnn_enabled"})),),
    )
)


# -- pooling ----------------------------------------------------------------------------
def _pool_canon(attrs, _types):
    attrs["kernel_size"] = _pair(attrs["kernel_size"])
    attrs["stride"] = _pair(attrs["stride"]) if attrs["stride"] else attrs["kernel_size"]
    attrs["padding"] = _pair(attrs["padding"])
    if "dilation" in attrs:
        attrs["dilation"] = _pair(attrs["dilation"])
    return attrs


POOL_KERNEL = 5
"""The largest pooling window a sampler draws (windows of 4 and 5 included: where stride and padding bugs show)."""


def _pool_sample(has_dilation: bool):
    def sample(draw, slots, attrs):
        x = slots[0]
        if attrs.get("kernel_size"):
            k = attrs["kernel_size"]
        elif isinstance(x, TensorType) and x.rank in (3, 4):  # a window that fits the given input
            k = tuple(draw.integers(1, max(1, min(POOL_KERNEL, n))) for n in x.shape[-2:])
        else:
            k = (draw.integers(1, POOL_KERNEL), draw.integers(1, POOL_KERNEL))
        if any(kk < 1 for kk in _pair(k)):
            raise S.Reject(f"kernel_size {k}")
        drawn = {
            "kernel_size": k,
            "stride": draw.choice([(), (1, 1), (2, 2), (1, 2), (draw.integers(1, 3),)]),
            "padding": tuple(draw.integers(0, kk // 2) for kk in _pair(k)),
            "ceil_mode": draw.boolean(0.2),
        }
        if has_dilation:
            drawn["dilation"] = draw.choice([(1, 1), (1, 1), (2, 2), (1, 2)])
        else:
            drawn["count_include_pad"] = draw.boolean(0.7)
            drawn["divisor_override"] = None if draw.boolean(0.8) else draw.integers(1, 5)
        drawn = {**drawn, **attrs}
        if not isinstance(x, TensorType):  # big enough for the window
            need = [
                (kk - 1) * d + 1 - 2 * p
                for kk, d, p in zip(_pair(k), _pair(drawn.get("dilation", 1)), _pair(drawn["padding"]))
            ]
            spatial = tuple(max(n, 1) + draw.size(0, 3) for n in need)
            x = TensorType((*S.shape(draw, draw.integers(1, 2)), *spatial), draw.dtype)
        if x.rank not in (3, 4):
            raise S.Reject("pooling needs rank 3 or 4")
        return [x], drawn

    return sample


def _adaptive_pool_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.integers(3, 4))
    if x.rank not in (3, 4):
        raise S.Reject("pooling needs rank 3 or 4")
    size = draw.choice([(1, 1), (1,), tuple(draw.integers(1, d + 1) for d in x.shape[-2:])])
    return [x], {"output_size": size, **attrs}


def _window_flops(ins, outs, attrs):
    return outs[0].numel * math.prod(attrs["kernel_size"])


register(
    OpDef(
        "max_pool2d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool2d(
            self, kernel_size, stride, padding, dilation, ceil_mode
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0)),
            Attr("dilation", "ints", (1, 1)),
            Attr("ceil_mode", "bool", False),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool_canon,
        sample=_pool_sample(True),
        onnx=_pool_onnx("MaxPool"),
        mlir=_max_pool_mlir,
        aten=("aten.max_pool2d.default", AtenBinding("aten.max_pool2d_with_indices.default", outputs=(0,))),
    )
)
register(
    OpDef(
        "avg_pool2d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: F.avg_pool2d(
            self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0)),
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool_canon,
        sample=_pool_sample(False),
        onnx=_pool_onnx("AveragePool"),
        mlir=_avg_pool_mlir,
        aten=("aten.avg_pool2d.default",),
    )
)
register(
    OpDef(
        "adaptive_avg_pool2d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_avg_pool2d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        sample=_adaptive_pool_sample,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
        onnx=_adaptive_pool_onnx("ReduceMean", "AveragePool"),
        mlir=_adaptive_pool_mlir("add"),
        aten=("aten.adaptive_avg_pool2d.default",),
    )
)
register(
    OpDef(
        "adaptive_max_pool2d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_max_pool2d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        sample=_adaptive_pool_sample,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
        onnx=_adaptive_pool_onnx("ReduceMax", "MaxPool"),
        mlir=_adaptive_pool_mlir("max"),
        aten=(AtenBinding("aten.adaptive_max_pool2d.default", outputs=(0,)),),
    )
)


def _pool3d_canon(attrs, _types):
    attrs["kernel_size"] = _pair(attrs["kernel_size"], 3)
    attrs["stride"] = _pair(attrs["stride"], 3) if attrs["stride"] else attrs["kernel_size"]
    attrs["padding"] = _pair(attrs["padding"], 3)
    if "dilation" in attrs:
        attrs["dilation"] = _pair(attrs["dilation"], 3)
    return attrs


def _pool3d_sample(has_dilation: bool):
    """A (N,) C, D, H, W input and a window that fits it (padding at most half the kernel, as torch requires)."""

    def sample(draw, slots, attrs):
        x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.choice([4, 5]))
        if x.rank not in (4, 5):
            raise S.Reject("3-D pooling needs rank 4 or 5")
        k = _pair(attrs.get("kernel_size") or tuple(draw.integers(1, 2) for _ in range(3)), 3)
        if any(kk > d for kk, d in zip(k, x.shape[-3:])):
            raise S.Reject("kernel larger than the input")
        drawn = {
            "kernel_size": k,
            "stride": tuple(draw.integers(1, 2) for _ in range(3)),
            "padding": tuple(draw.integers(0, kk // 2) for kk in k),
            "ceil_mode": draw.boolean(0.2),
        }
        if has_dilation:
            drawn["dilation"] = (1, 1, 1)
        return [x], {**drawn, **attrs}

    return sample


def _adaptive3d_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.choice([4, 5]))
    if x.rank not in (4, 5):
        raise S.Reject("3-D adaptive pooling needs rank 4 or 5")
    size = tuple(draw.choice([1, d]) if draw.boolean(0.5) else draw.integers(1, max(d, 1)) for d in x.shape[-3:])
    return [x], {"output_size": size, **attrs}


register(
    OpDef(
        "max_pool3d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool3d(
            self, kernel_size, stride, padding, dilation, ceil_mode
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0, 0)),
            Attr("dilation", "ints", (1, 1, 1)),
            Attr("ceil_mode", "bool", False),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool3d_canon,
        sample=_pool3d_sample(True),
        onnx=_pool_onnx("MaxPool"),
        mlir=_max_pool_mlir,
        aten=("aten.max_pool3d.default", AtenBinding("aten.max_pool3d_with_indices.default", outputs=(0,))),
        doc="max over (D, H, W) windows (video models: r3d, mc3, s3d)",
    )
)
register(
    OpDef(
        "avg_pool3d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: F.avg_pool3d(
            self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0, 0)),
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool3d_canon,
        sample=_pool3d_sample(False),
        onnx=_pool_onnx("AveragePool"),
        mlir=_avg_pool_mlir,
        aten=("aten.avg_pool3d.default",),
        doc="mean over (D, H, W) windows",
    )
)
register(
    OpDef(
        "adaptive_avg_pool3d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_avg_pool3d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"], 3)},
        sample=_adaptive3d_sample,
        onnx=_adaptive_pool_onnx("ReduceMean", "AveragePool"),
        mlir=_adaptive_pool_mlir("add"),
        aten=("aten.adaptive_avg_pool3d.default",),
        doc="mean over adaptive (D, H, W) bins; (1, 1, 1) is the global pooling of video classifiers",
    )
)
register(
    OpDef(
        "adaptive_max_pool3d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_max_pool3d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"], 3)},
        sample=_adaptive3d_sample,
        onnx=_adaptive_pool_onnx("ReduceMax", "MaxPool"),
        mlir=_adaptive_pool_mlir("max"),
        aten=(AtenBinding("aten.adaptive_max_pool3d.default", outputs=(0,)),),
        doc="max over adaptive (D, H, W) bins",
    )
)


# -- attention, softmax -------------------------------------------------------------------
def _sdpa(query, key, value, attn_mask=None, *, dropout_p, is_causal, scale, enable_gqa):
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)


def _sdpa_flops(ins, outs, attrs):
    q, k, v = ins[0], ins[1], ins[2]
    batch = math.prod(q.shape[:-2])
    length, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * batch * length * s * e + 2 * batch * length * s * ev


def _sdpa_shape(types, attrs):
    """[..., L, E], [..., S, E], [..., S, Ev] -> [..., L, Ev] (batch dims broadcast; a mask must broadcast
    to [..., L, S]); torch's math kernel fails on a 0-d mask beside a symbolic batch."""
    q, k, v, mask = types
    if attrs["enable_gqa"] or min(q.rank, k.rank, v.rank) < 2:
        raise ValueError("no formula for grouped-query or 1-D attention")
    if prove(q.shape[-1], "==", k.shape[-1]) is not True or prove(k.shape[-2], "==", v.shape[-2]) is not True:
        raise ValueError("query/key widths or key/value lengths differ for some sizes")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        scores = (*batch, q.shape[-2], k.shape[-2])
        if broadcast_shapes(mask.shape, scores) != scores:
            raise ValueError(f"the mask {list(mask.shape)} does not broadcast to the scores {list(scores)}")
    return [(*batch, q.shape[-2], v.shape[-1])]


register(
    OpDef(
        "scaled_dot_product_attention",
        (Operand("query"), Operand("key"), Operand("value"), Operand("attn_mask", optional=True)),
        _sdpa,
        attrs=(
            Attr("dropout_p", "float", 0.0),
            Attr("is_causal", "bool", False),
            Attr("scale", "float?", None),
            Attr("enable_gqa", "bool", False),
        ),
        traits=PURE,
        flops=_sdpa_flops,
        shape_formula=_sdpa_shape,
        sample=_sdpa_sample,
        aten=("aten.scaled_dot_product_attention.default",),
        onnx=_sdpa_onnx,
        mlir=_sdpa_mlir,
        doc="softmax(q @ k.T * scale + mask) @ v; FLOPs: the two matrix products (as flop_counter)",
    )
)

for _name, _fn in [("softmax", F.softmax), ("log_softmax", F.log_softmax)]:
    register(
        OpDef(
            _name,
            (Operand("self"),),
            (lambda fn: lambda self, *, dim: fn(self, dim))(_fn),
            attrs=(Attr("dim", "int"),),
            traits=PURE,
            flops=per_element(5),
            onnx=(lambda op_type: lambda c: c.on_vector(lambda x: c.emit(op_type, x, axis=c.attrs["dim"])))(
                "Softmax" if _name == "softmax" else "LogSoftmax"
            ),
            mlir=(lambda log: lambda c: _softmax_v(c, c.x(0), c.attrs["dim"] % max(c.x(0).rank, 1), log))(
                _name == "log_softmax"
            ),
            sample=lambda d, sl, a: (lambda t: ([t], {"dim": S.dim(d, max(t.rank, 1)), **a}))(
                S.same_as_input(d, sl, a)
            ),
            aten=(
                AtenBinding(f"aten.{_name}.int", fixed={"dtype": None}),
                AtenBinding(f"aten._{_name}.default", fixed={"half_to_float": False}),
            ),
        )
    )

register(
    OpDef(
        "dropout",
        (Operand("input"),),
        lambda input, *, p, train: F.dropout(input, p, training=train),
        attrs=(Attr("p", "float", 0.5), Attr("train", "bool", False)),
        traits=frozenset(),
        sample=lambda d, sl, a: (
            [S.same_as_input(d, sl, a)],
            {"p": d.choice([0.0, 0.1, 0.5]), "train": d.boolean(0.3), **a},
        ),
        flops=out_numel,
        aten=("aten.dropout.default",),
        onnx=lambda c: c.emit("Identity", c.x(0)) if not (c.attrs["train"] and c.attrs["p"]) else c.fail("training"),
        mlir=lambda c: c.x(0) if not (c.attrs["train"] and c.attrs["p"]) else c.fail("dropout in training"),
        doc="not pure: random when train; the identity when not train",
    )
)

register(
    OpDef(
        "embedding",
        (Operand("weight"), Operand("indices", domain="nonnegative")),
        lambda weight, indices, *, padding_idx: F.embedding(indices, weight, padding_idx if padding_idx >= 0 else None),
        attrs=(Attr("padding_idx", "int", -1),),
        traits=PURE,
        flops=zero_flops,
        sample=_embedding_sample,
        onnx=lambda c: c.emit("Gather", c.x(0), c.x(1), axis=0),
        mlir=lambda c: c.index_select(c.x(0), c.x(1), 0),
        aten=(AtenBinding("aten.embedding.default", fixed={"scale_grad_by_freq": False, "sparse": False}),),
    )
)

register(
    OpDef(
        "upsample_nearest2d",
        (Operand("input"),),
        lambda input, *, output_size, scale_factors: torch.ops.aten.upsample_nearest2d.vec(
            input, output_size, scale_factors
        ),
        attrs=(Attr("output_size", "ints?", None), Attr("scale_factors", "floats?", None)),
        traits=PURE,
        flops=zero_flops,
        mlir=_upsample_nearest_mlir,
        onnx=_resize_onnx("nearest"),
        aten=("aten.upsample_nearest2d.vec",),
    )
)
register(
    OpDef(
        "upsample_bilinear2d",
        (Operand("input"),),
        lambda input, *, output_size, align_corners, scale_factors: torch.ops.aten.upsample_bilinear2d.vec(
            input, output_size, align_corners, scale_factors
        ),
        attrs=(
            Attr("output_size", "ints?", None),
            Attr("align_corners", "bool", False),
            Attr("scale_factors", "floats?", None),
        ),
        traits=PURE,
        flops=per_element(4),
        mlir=_upsample_bilinear_mlir,
        onnx=_resize_onnx("linear"),
        aten=("aten.upsample_bilinear2d.vec",),
    )
)
