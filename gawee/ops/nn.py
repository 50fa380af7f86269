"""Neural-network ops: convolution, linear algebra, normalization, pooling, attention, softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.ops.base import AtenBinding, Attr, OpDef, Operand, numel, out_numel, per_element, register, zero_flops
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
    extra = outs[0].numel * ((attrs.get("act") is not None) + (len(ins) > 3 and ins[3] is not None))
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


def _conv(name: str, nd: int, fused: bool = False, doc: str = "") -> OpDef:
    operands = (Operand("input"), Operand("weight"), Operand("bias", optional=True))
    attrs = (Attr("stride", "ints", (1,) * nd), Attr("padding", "ints", (0,) * nd),
             Attr("dilation", "ints", (1,) * nd), Attr("groups", "int", 1))
    if fused:
        operands += (Operand("residual", optional=True),)
        attrs += (Attr("act", "str?", None), Attr("act_params", "floats", ()))

    def evaluate(input, weight, bias=None, residual=None, *, stride, padding, dilation, groups,
                 act=None, act_params=()):
        fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        y = fn(input, weight, bias, stride, padding, dilation, groups)
        if residual is not None:
            y = y + residual
        return apply_act(y, act, act_params)

    return register(OpDef(
        name, operands, evaluate, attrs=attrs, traits=PURE, flops=_conv_flops, canonicalize=_conv_canon(nd),
        aten=(f"aten.{name}.default", AtenBinding(f"aten.{name}.padding", convert=_same_padding),
              AtenBinding("aten.convolution.default", convert=_from_convolution(nd, False))),
        doc=doc))


_conv("conv1d", 1)
_conv("conv2d", 2, fused=True,
      doc="act(conv2d(input, weight, bias) + residual): residual and act are optional fused epilogues")
_conv("conv3d", 3)


def _convt_flops(ins, outs, attrs):
    x, w = ins[0], ins[1]
    return 2 * x.shape[0] * math.prod(x.shape[2:]) * math.prod(w.shape)


register(OpDef(
    "conv_transpose2d", (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
    lambda input, weight, bias=None, *, stride, padding, output_padding, groups, dilation:
        F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation),
    attrs=(Attr("stride", "ints", (1, 1)), Attr("padding", "ints", (0, 0)), Attr("output_padding", "ints", (0, 0)),
           Attr("groups", "int", 1), Attr("dilation", "ints", (1, 1))),
    traits=PURE, flops=_convt_flops,
    canonicalize=lambda a, t: {**a, **{k: _pair(a[k]) for k in ("stride", "padding", "output_padding", "dilation")}},
    aten=("aten.conv_transpose2d.input", AtenBinding("aten.convolution.default", convert=_from_convolution(2, True)))))


# -- linear algebra -------------------------------------------------------------------
def _contract_flops(ins, outs, attrs):
    """2 x MACs of a (batched) matrix product: out elements x the contracted size."""
    return 2 * outs[0].numel * ins[0].shape[-1]


register(OpDef(
    "linear", (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
    lambda input, weight, bias=None: F.linear(input, weight, bias), traits=PURE, flops=_contract_flops,
    aten=("aten.linear.default",), doc="input @ weight.T + bias"))
register(OpDef("matmul", (Operand("self"), Operand("other")), torch.matmul, traits=PURE,
               flops=_contract_flops, aten=("aten.matmul.default",), doc="numpy-style matmul with broadcasting"))
register(OpDef("mm", (Operand("self"), Operand("mat2")), torch.mm, traits=PURE, flops=_contract_flops,
               aten=("aten.mm.default",)))
register(OpDef("bmm", (Operand("self"), Operand("mat2")), torch.bmm, traits=PURE, flops=_contract_flops,
               aten=("aten.bmm.default",)))
register(OpDef(
    "addmm", (Operand("self"), Operand("mat1"), Operand("mat2")),
    lambda self, mat1, mat2, beta=1, alpha=1: torch.addmm(self, mat1, mat2, beta=beta, alpha=alpha),
    attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)), traits=PURE,
    flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1], aten=("aten.addmm.default",),
    doc="beta * self + alpha * (mat1 @ mat2)"))
register(OpDef(
    "baddbmm", (Operand("self"), Operand("batch1"), Operand("batch2")),
    lambda self, batch1, batch2, beta=1, alpha=1: torch.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha),
    attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)), traits=PURE,
    flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1], aten=("aten.baddbmm.default",)))


def _einsum_flops(ins, outs, attrs):
    eq = attrs["equation"].replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(lhs, ins):
        letters = [c for c in term if c.isalpha()]
        dims = t.shape[len(t.shape) - len(letters):] if "..." in term else t.shape
        for c, d in zip(letters, dims):
            sizes[c] = max(sizes.get(c, 1), d)
    total = math.prod(sizes.values())
    if "..." in eq:
        total *= outs[0].numel // max(1, math.prod(sizes[c] for c in eq.split("->")[-1] if c.isalpha()))
    return 2 * total if len(ins) > 1 else numel(ins[0])


register(OpDef(
    "einsum", (Operand("tensors", variadic=True),),
    lambda *tensors, equation: torch.einsum(equation, *tensors),
    attrs=(Attr("equation", "str"),), traits=PURE, flops=_einsum_flops,
    aten=(AtenBinding("aten.einsum.default", drop=frozenset({"path"})),),
    doc="Einstein summation; FLOPs counted as 2 x the full index space (naive evaluation)"))


# -- normalization ----------------------------------------------------------------------
register(OpDef(
    "batch_norm",
    (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True),
     Operand("running_mean"), Operand("running_var")),
    lambda input, weight, bias, running_mean, running_var, *, eps:
        F.batch_norm(input, running_mean, running_var, weight, bias, False, 0.0, eps),
    attrs=(Attr("eps", "float", 1e-5),), traits=PURE, flops=per_element(2),
    aten=(AtenBinding("aten._native_batch_norm_legit_no_training.default", drop=frozenset({"momentum"}),
                      outputs=(0,)),
          AtenBinding("aten.batch_norm.default", fixed={"training": False},
                      drop=frozenset({"momentum", "cudnn_enabled"}))),
    doc="inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias, per channel (dim 1)"))
register(OpDef(
    "layer_norm", (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
    lambda input, weight=None, bias=None, *, normalized_shape, eps:
        F.layer_norm(input, normalized_shape, weight, bias, eps),
    attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float", 1e-5)), traits=PURE, flops=per_element(5),
    aten=(AtenBinding("aten.layer_norm.default", drop=frozenset({"cudnn_enable"})),)))
register(OpDef(
    "group_norm", (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
    lambda input, weight=None, bias=None, *, num_groups, eps: F.group_norm(input, num_groups, weight, bias, eps),
    attrs=(Attr("num_groups", "int"), Attr("eps", "float", 1e-5)), traits=PURE, flops=per_element(5),
    aten=(AtenBinding("aten.group_norm.default", drop=frozenset({"cudnn_enabled"})),)))


# -- pooling ----------------------------------------------------------------------------
def _pool_canon(attrs, _types):
    attrs["kernel_size"] = _pair(attrs["kernel_size"])
    attrs["stride"] = _pair(attrs["stride"]) if attrs["stride"] else attrs["kernel_size"]
    attrs["padding"] = _pair(attrs["padding"])
    if "dilation" in attrs:
        attrs["dilation"] = _pair(attrs["dilation"])
    return attrs


def _window_flops(ins, outs, attrs):
    return outs[0].numel * math.prod(attrs["kernel_size"])


register(OpDef(
    "max_pool2d", (Operand("self"),),
    lambda self, *, kernel_size, stride, padding, dilation, ceil_mode:
        F.max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode),
    attrs=(Attr("kernel_size", "ints"), Attr("stride", "ints", ()), Attr("padding", "ints", (0, 0)),
           Attr("dilation", "ints", (1, 1)), Attr("ceil_mode", "bool", False)),
    traits=PURE, flops=_window_flops, canonicalize=_pool_canon,
    aten=("aten.max_pool2d.default", AtenBinding("aten.max_pool2d_with_indices.default", outputs=(0,)))))
register(OpDef(
    "avg_pool2d", (Operand("self"),),
    lambda self, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override:
        F.avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
    attrs=(Attr("kernel_size", "ints"), Attr("stride", "ints", ()), Attr("padding", "ints", (0, 0)),
           Attr("ceil_mode", "bool", False), Attr("count_include_pad", "bool", True),
           Attr("divisor_override", "int?", None)),
    traits=PURE, flops=_window_flops, canonicalize=_pool_canon, aten=("aten.avg_pool2d.default",)))
register(OpDef(
    "adaptive_avg_pool2d", (Operand("self"),),
    lambda self, *, output_size: F.adaptive_avg_pool2d(self, output_size),
    attrs=(Attr("output_size", "ints"),), traits=PURE,
    flops=lambda ins, outs, a: numel(ins[0]),
    canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
    aten=("aten.adaptive_avg_pool2d.default",)))
register(OpDef(
    "adaptive_max_pool2d", (Operand("self"),),
    lambda self, *, output_size: F.adaptive_max_pool2d(self, output_size),
    attrs=(Attr("output_size", "ints"),), traits=PURE,
    flops=lambda ins, outs, a: numel(ins[0]),
    canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
    aten=(AtenBinding("aten.adaptive_max_pool2d.default", outputs=(0,)),)))


# -- attention, softmax -------------------------------------------------------------------
def _sdpa(query, key, value, attn_mask=None, *, dropout_p, is_causal, scale, enable_gqa):
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                          **kwargs)


def _sdpa_flops(ins, outs, attrs):
    q, k, v = ins[0], ins[1], ins[2]
    batch = math.prod(q.shape[:-2])
    length, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * batch * length * s * e + 2 * batch * length * s * ev


register(OpDef(
    "scaled_dot_product_attention",
    (Operand("query"), Operand("key"), Operand("value"), Operand("attn_mask", optional=True)),
    _sdpa, attrs=(Attr("dropout_p", "float", 0.0), Attr("is_causal", "bool", False), Attr("scale", "float?", None),
                  Attr("enable_gqa", "bool", False)),
    traits=PURE, flops=_sdpa_flops, aten=("aten.scaled_dot_product_attention.default",),
    doc="softmax(q @ k.T * scale + mask) @ v; FLOPs: the two matrix products (as flop_counter)"))

for _name, _fn in [("softmax", F.softmax), ("log_softmax", F.log_softmax)]:
    register(OpDef(
        _name, (Operand("self"),), (lambda fn: lambda self, *, dim: fn(self, dim))(_fn),
        attrs=(Attr("dim", "int"),), traits=PURE, flops=per_element(5),
        aten=(AtenBinding(f"aten.{_name}.int", fixed={"dtype": None}),
              AtenBinding(f"aten._{_name}.default", fixed={"half_to_float": False}))))

register(OpDef(
    "dropout", (Operand("input"),),
    lambda input, *, p, train: F.dropout(input, p, training=train),
    attrs=(Attr("p", "float", 0.5), Attr("train", "bool", False)), traits=frozenset(),
    flops=out_numel, aten=("aten.dropout.default",),
    doc="not pure: random when train; the identity when not train"))

register(OpDef(
    "embedding", (Operand("weight"), Operand("indices")),
    lambda weight, indices, *, padding_idx: F.embedding(indices, weight, padding_idx if padding_idx >= 0 else None),
    attrs=(Attr("padding_idx", "int", -1),), traits=PURE, flops=zero_flops,
    aten=(AtenBinding("aten.embedding.default", fixed={"scale_grad_by_freq": False, "sparse": False}),)))

register(OpDef(
    "upsample_nearest2d", (Operand("input"),),
    lambda input, *, output_size, scale_factors:
        torch.ops.aten.upsample_nearest2d.vec(input, output_size, scale_factors),
    attrs=(Attr("output_size", "ints?", None), Attr("scale_factors", "floats?", None)), traits=PURE,
    flops=zero_flops, aten=("aten.upsample_nearest2d.vec",)))
register(OpDef(
    "upsample_bilinear2d", (Operand("input"),),
    lambda input, *, output_size, align_corners, scale_factors:
        torch.ops.aten.upsample_bilinear2d.vec(input, output_size, align_corners, scale_factors),
    attrs=(Attr("output_size", "ints?", None), Attr("align_corners", "bool", False),
           Attr("scale_factors", "floats?", None)), traits=PURE,
    flops=per_element(4), aten=("aten.upsample_bilinear2d.vec",)))
