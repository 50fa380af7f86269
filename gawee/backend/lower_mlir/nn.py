"""StableHLO lowerings of the neural-network ops (gawee.ops.nn): convolution, matrices, normalization, pooling."""

from __future__ import annotations

import math

import numpy as np
import torch

from gawee.backend.lower_mlir import MLIR, widen
from gawee.backend.lowering import LOW_FLOATS, masks_a_whole_row, rms_norm_eps
from gawee.ir.types import DType, TensorType
from gawee.ops.nn import act_as_op


def _act_mlir(c, y, act, params=()):
    """A fused activation as its standalone op's lowering."""
    if act is None:
        return y
    op, attrs = act_as_op(act, tuple(params))
    return c.lower_as(op, [y], attrs)


@MLIR.register("conv1d", "conv2d", "conv3d")
def _conv_mlir(c):
    """stablehlo.convolution (+ bias) (+ residual) (+ the activation's ops): IREE fuses them again."""
    a, x, out = c.attrs, widen(c, c.x(0)), c.out
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


@MLIR.register("conv_transpose2d")
def _conv_transpose_mlir(c):
    """A convolution of the stride-dilated input with the flipped kernel (in and out channels swapped per group)."""
    a, x, w, out = c.attrs, widen(c, c.x(0)), c.x(1), c.out
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
    a, b = widen(c, a), c.convert(widen(c, b), widen(c, a).dtype)
    a2 = a if a.rank > 1 else c.reshape(a, (1, a.shape[0]))
    b2 = b if b.rank > 1 else c.reshape(b, (b.shape[0], 1))
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    a3, b3, nb = c.broadcast(a2, batch + a2.shape[-2:]), c.broadcast(b2, batch + b2.shape[-2:]), len(batch)
    y = c.dot_general(a3, b3, contract=([nb + 1], [nb]), batch=(list(range(nb)), list(range(nb))))
    return c.convert(c.reshape(y, out.shape), out.dtype)


@MLIR.register("linear")
def _linear_mlir(c):
    """dot_general contracting the input's last dim with the weight's second (+ bias)."""
    x, out = widen(c, c.x(0)), c.out
    y = c.dot_general(x, c.convert(c.x(1), x.dtype), contract=([x.rank - 1], [1]))
    if c.x(2) is not None:
        y = c.add(y, c.convert(c.x(2), y.dtype))
    return _act_mlir(c, c.convert(y, out.dtype), c.attrs.get("act"), c.attrs.get("act_params", ()))


@MLIR.register("addmm", "baddbmm")
def _addmm_mlir(c):
    """beta * self + alpha * (mat1 @ mat2), in float32 for f16/bf16."""
    a, prod = (
        c.attrs,
        _matmul_v(c, c.x(1), c.x(2), TensorType(c.out.shape, DType.f32 if c.out.dtype in LOW_FLOATS else c.out.dtype)),
    )
    if a["alpha"] != 1:
        prod = c.mul(prod, a["alpha"])
    base = widen(c, c.x(0))
    if a["beta"] != 1:
        base = c.mul(base, a["beta"]) if a["beta"] else None
    return c.convert(prod if base is None else c.add(prod, base, prod.dtype), c.out.dtype)


@MLIR.register("batch_norm")
def _batch_norm_mlir(c):
    """(x - mean) * (rsqrt(var + eps) * weight) + bias, per channel (dim 1)."""
    x = widen(c, c.x(0))
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


@MLIR.register("layer_norm")
def _layer_norm_mlir(c):
    x, n = widen(c, c.x(0)), len(c.attrs["normalized_shape"])
    y = _normalize(c, x, list(range(x.rank - n, x.rank)), c.attrs["eps"])
    if c.x(1) is not None:
        y = c.mul(y, c.convert(c.x(1), x.dtype))
    if c.x(2) is not None:
        y = c.add(y, c.convert(c.x(2), x.dtype))
    return c.convert(y, c.out.dtype)


@MLIR.register("rms_norm")
def _rms_norm_mlir(c):
    x, n = widen(c, c.x(0)), len(c.attrs["normalized_shape"])
    dims = list(range(x.rank - n, x.rank))
    ms = c.div(c.reduce(c.mul(x, x), dims, "add", keepdim=True), math.prod(x.shape[d] for d in dims))
    y = c.convert(c.mul(x, c.unary("stablehlo.rsqrt", c.add(ms, rms_norm_eps(c)))), c.out.dtype)
    return c.mul(y, c.x(1)) if c.arity > 1 and c.x(1) is not None else y


@MLIR.register("group_norm")
def _group_norm_mlir(c):
    x, g = widen(c, c.x(0)), c.attrs["num_groups"]
    n = x.shape[0]
    y = _normalize(c, c.reshape(x, (n, g, math.prod(x.shape) // (n * g))), [2], c.attrs["eps"])
    y = c.reshape(y, x.shape)
    for i, op in ((1, c.mul), (2, c.add)):
        if c.x(i) is not None:
            y = op(y, c.broadcast_dims(c.convert(c.x(i), x.dtype), x.shape, [1]))
    return c.convert(y, c.out.dtype)


def _softmax_v(c, x, dim: int, log: bool = False):
    """exp(x - max) / sum, over ``dim`` (float32 for f16/bf16); log: (x - max) - log(sum)."""
    xf = widen(c, x)
    z = c.sub(xf, c.reduce(xf, [dim], "max", keepdim=True))
    e = c.unary("stablehlo.exponential", z)
    s = c.reduce(e, [dim], "add", keepdim=True)
    y = c.sub(z, c.unary("stablehlo.log", s)) if log else c.div(e, s)
    return c.convert(y, x.dtype)


@MLIR.register("scaled_dot_product_attention")
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
    dtype = DType.f32 if q.dtype in LOW_FLOATS else q.dtype
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
    if mask is not None and (data is None or masks_a_whole_row(data)):  # torch gives such a row 0, exp(-inf - -inf) nan
        none = c.compare("EQ", c.reduce(scores, [scores.rank - 1], "max", keepdim=True), -math.inf)
        probs = c.select(c.broadcast(none, probs.shape), 0.0, probs, dtype)
    return _matmul_v(c, probs, v, c.out)


@MLIR.register("einsum")
def _einsum_mlir(c):
    """One or two operands, explicit output, no ellipsis or repeated letters: letters only one operand
    has and the output lacks are summed first; then one dot_general (shared letters the output keeps are
    batch dims, the others contracted) and a transpose into the output's order."""
    eq = c.attrs["equation"].replace(" ", "")
    terms, _, out = eq.partition("->")
    terms = terms.split(",")
    xs = [widen(c, v) for v in c.xs]
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


@MLIR.register("upsample_nearest2d")
def _upsample_nearest_mlir(c):
    """Two index selections with torch's source indices: min(floor(dst * scale), n - 1), scale in float32."""

    x, out, factors = c.x(0), c.out, c.attrs["scale_factors"]
    y = x
    for i in (0, 1):
        dim = x.rank - 2 + i
        n, o = x.shape[dim], out.shape[dim]
        scale = np.float32(1 / factors[i]) if factors else np.float32(n / o)
        idx = np.minimum(np.floor(np.arange(o, dtype=np.float32) * scale), n - 1).astype(np.int64)
        y = c.index_select(y, c.constant(torch.from_numpy(idx)), dim)
    return y


@MLIR.register("upsample_bilinear2d")
def _upsample_bilinear_mlir(c):
    """One contraction per spatial dim with the matrix of interpolation weights, taken from torch's
    own kernel applied to one-hot rows (align_corners, scale factors and edge clamping as torch has them)."""
    x, out, factors = widen(c, c.x(0)), c.out, c.attrs["scale_factors"]
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


@MLIR.register("batch_norm_training")
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


MLIR.add("matmul", lambda c: _matmul_v(c, c.x(0), c.x(1), c.out))
MLIR.add("mm", lambda c: _matmul_v(c, c.x(0), c.x(1), c.out))
MLIR.add("bmm", lambda c: _matmul_v(c, c.x(0), c.x(1), c.out))
MLIR.add("softmax", lambda c: _softmax_v(c, c.x(0), c.attrs["dim"] % max(c.x(0).rank, 1)))
MLIR.add("log_softmax", lambda c: _softmax_v(c, c.x(0), c.attrs["dim"] % max(c.x(0).rank, 1), True))
MLIR.add("dropout", lambda c: c.x(0) if not (c.attrs["train"] and c.attrs["p"]) else c.fail("dropout in training"))
MLIR.add("embedding", lambda c: c.index_select(c.x(0), c.x(1), 0))
