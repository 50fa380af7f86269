"""Target ops: what one runtime executes as one step, each with reference semantics in torch.

A runtime's target phase (``rules/targets/<runtime>/``, :attr:`gawee.backend.runtime.Runtime.rules`) rewrites
core ops into these, so that every fusion a runtime makes is a rule the harness checks (against the reference
semantics here), ``explain`` traces and the report counts; the interpreter runs a lowered graph like any other,
and a runtime whose kernel cannot take a node runs these semantics instead. A target op's name starts with its
runtime's (``onednn_``). They are never captured (no ATen spelling): rules produce them. Those a rule may match
(a later rule of a phase fusing an activation into one) draw instances for the harness like any op.
"""

from __future__ import annotations

import torch

from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import Attr, OpDef, Operand, get_op, register
from gawee.ops.elementwise import EW
from gawee.ops.nn import (
    PURE,
    _bn_sample,
    _conv_canon,
    _conv_flops,
    _conv_sample,
    _draw_act,
    _no_act_params,
    act_as_op,
    apply_act,
)
from gawee.ops.quantized import LEVELS, SMALL_SCALE, check_requantization, requantize

ONEDNN_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
"""The core ops a oneDNN binary primitive computes (``onednn_binary``'s ``alg``)."""

_EPILOGUE = (Attr("act", "str?", None), Attr("act_params", "floats", ()))

ONEDNN_LAYOUTS = ("blocked", "channels_last", "any")
"""What a convolution's ``layout`` attribute may say (the runtime's layout phases set it:
``rules/targets/onednn/variants/``): its activations in oneDNN's blocked layout (nChw8c/nChw16c) or in channels-last,
or ``any``: every kernel of both layouts raced, each with the reorders of its operands that it would need. Absent,
the module's layout decides. A layout is storage: it never changes a value, so the definitions ignore it."""

_LAYOUT = Attr("layout", "str?", None)


def _check_layout(attrs) -> None:
    if attrs.get("layout") not in (None, *ONEDNN_LAYOUTS):
        raise ValueError(f"layout is one of {', '.join(ONEDNN_LAYOUTS)}, not {attrs['layout']!r}")


def _draw_layout(draw) -> dict:
    return {"layout": draw.choice([None, *ONEDNN_LAYOUTS])}


def _with_act(flops_per_element: int):
    def flops(ins, outs, attrs):
        return outs[0].numel * (flops_per_element + int(attrs.get("act") is not None))

    return flops


def _after_act(t: TensorType, attrs) -> TensorType:
    """The type of ``t`` through the fused activation of ``attrs`` (its standalone op's inference)."""
    if attrs.get("act") is None:
        return t
    op, act_attrs = act_as_op(attrs["act"], tuple(attrs.get("act_params", ())))
    return get_op(op).infer_types([t], act_attrs)[0]


def _bn_type(types, eps: float) -> TensorType:
    """An inference batch norm's result type: its input's, where every operand has the input's float dtype (a
    per-channel scale and shift); else what evaluating it on meta tensors gives."""
    x = types[0]
    if x.dtype.is_float and all(t is None or t.dtype == x.dtype for t in types[1:]):
        return x
    return get_op("batch_norm").infer_types(types, {"eps": eps})[0]


def _binary(self, other, *, alg, act=None, act_params=()):
    if alg not in ONEDNN_BINARY:
        raise ValueError(f"onednn_binary computes {', '.join(ONEDNN_BINARY)}, not {alg!r}")
    return apply_act(get_op(alg).evaluate(self, other), act, act_params)


def _binary_sample(draw, slots, attrs):
    """Two broadcasting tensors, an ``alg`` and an activation (each unless the pattern fixes it)."""
    types, _ = S.elementwise(draw, slots, {})
    return types, {"alg": draw.choice(ONEDNN_BINARY), **_draw_act(draw), **attrs}


register(
    OpDef(
        "onednn_binary",
        (Operand("self"), Operand("other")),
        _binary,
        attrs=(Attr("alg", "str"), *_EPILOGUE),
        traits=EW,
        flops=_with_act(1),
        infer=lambda types, attrs: [_after_act(get_op(attrs["alg"]).infer_types(types, {})[0], attrs)],
        sample=_binary_sample,
        core="attr:alg",
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        doc="act(alg(self, other)): oneDNN's binary primitive (alg: add, sub, mul, div, maximum, minimum; "
        "broadcasting as the core op) with its eltwise post-op",
    )
)


def _binary_int8(self, other, *, alg, act=None, act_params=(), out_scale, out_zero_point, out_levels):
    check_requantization("onednn_binary_int8", out_scale, out_zero_point, out_levels)
    if not out_scale:
        raise ValueError("onednn_binary_int8 requantizes its result: it needs a positive out_scale")
    y = _binary(self, other, alg=alg, act=act, act_params=act_params)
    if y.dtype not in (torch.float32, torch.float64):  # float64: the harness's reference of a float32 graph
        raise ValueError(f"onednn_binary_int8 requantizes a float32 result (as its kernel computes), not {y.dtype}")
    return requantize(y, out_scale, out_zero_point, out_levels)


def _binary_int8_infer(types, attrs):
    out = _after_act(get_op(attrs["alg"]).infer_types(types, {})[0], attrs)
    if out.dtype not in (DType.f32, DType.f64):
        raise ValueError(f"onednn_binary_int8 requantizes a float32 result (as its kernel computes), not {out.dtype}")
    return [out]


def _binary_int8_sample(draw, slots, attrs):
    """``onednn_binary``'s instances on float32 operands, with a grid to requantize to."""
    types, drawn = _binary_sample(draw, slots, attrs)
    if not all(t.dtype is DType.f32 for t in types):
        raise S.Reject("onednn_binary_int8 requantizes a float32 result")
    levels = drawn.setdefault("out_levels", draw.choice(list(LEVELS)))
    drawn.setdefault("out_scale", draw.choice([SMALL_SCALE, 0.05, 0.5]))
    drawn.setdefault("out_zero_point", draw.integers(0, levels) if levels in LEVELS else 0)
    return types, drawn


register(
    OpDef(
        "onednn_binary_int8",
        (Operand("self"), Operand("other")),
        _binary_int8,
        attrs=(
            Attr("alg", "str"),
            *_EPILOGUE,
            Attr("out_scale", "float"),
            Attr("out_zero_point", "int", 0),
            Attr("out_levels", "int", 255),
        ),
        traits=EW,
        flops=_with_act(2),
        infer=_binary_int8_infer,
        sample=_binary_int8_sample,
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        doc="onednn_binary's act(alg(self, other)) requantized to the grid of out_scale, out_zero_point and "
        "out_levels as an int8 convolution quantizes its input (conv2d_int8_static's out_scale): the binary "
        "primitive writes the u8 codes that convolution reads",
    )
)


def _batch_norm(input, weight, bias, running_mean, running_var, *, eps, act=None, act_params=(), layout=None):
    _check_layout({"layout": layout})
    y = get_op("batch_norm").evaluate(input, weight, bias, running_mean, running_var, eps=eps)
    return apply_act(y, act, act_params)


def _batch_norm_infer(types, attrs):
    _check_layout(attrs)
    return [_after_act(_bn_type(types, attrs["eps"]), attrs)]


def _batch_norm_sample(draw, slots, attrs):
    types, drawn = _bn_sample(draw, slots, attrs)
    return types, {**_draw_act(draw), **_draw_layout(draw), **drawn}


register(
    OpDef(
        "onednn_batch_norm",
        get_op("batch_norm").operands,
        _batch_norm,
        attrs=(*get_op("batch_norm").attrs, *_EPILOGUE, _LAYOUT),
        traits=PURE,
        flops=_with_act(2),
        infer=_batch_norm_infer,
        sample=_batch_norm_sample,
        core="batch_norm",
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        doc="act(batch_norm(...)): an inference batch norm as oneDNN's 1x1 depthwise convolution by its scale and "
        "shift, with its eltwise post-op, in the activation layout ``layout`` names (storage only)",
    )
)


def _affine_cat_type(types, attrs) -> TensorType:
    """The batch norm's result type on the concatenation's (cat's own inference)."""
    cat = get_op("cat").infer_types(list(types[4:]), {"dim": attrs["dim"]})[0]
    return _bn_type([cat, *types[:4]], attrs["eps"])


def _affine_cat(weight, bias, running_mean, running_var, *parts, dim, eps, act=None, act_params=()):
    return _batch_norm(
        torch.cat(parts, dim), weight, bias, running_mean, running_var, eps=eps, act=act, act_params=act_params
    )


register(
    OpDef(
        "onednn_affine_cat",
        (
            Operand("weight", optional=True),
            Operand("bias", optional=True),
            Operand("running_mean"),
            Operand("running_var", domain="nonnegative"),
            Operand("tensors", variadic=True),
        ),
        _affine_cat,
        attrs=(Attr("dim", "int", 0), Attr("eps", "float", 1e-5), *_EPILOGUE),
        infer=lambda types, attrs: [_after_act(_affine_cat_type(types, attrs), attrs)],
        traits=PURE,
        flops=_with_act(2),
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        doc="act(batch_norm(cat(tensors, dim), ...)): the batch norm that alone reads a concatenation along "
        "channels, applied as the parts are copied in (gawee's affine_cat kernel beside oneDNN's primitives)",
    )
)


def _conv(
    input,
    weight,
    bias=None,
    residual=None,
    *,
    stride,
    padding,
    dilation,
    groups,
    act=None,
    act_params=(),
    act_in=None,
    layout=None,
):
    _check_layout({"layout": layout})
    return get_op("conv2d").evaluate(
        apply_act(input, act_in),
        weight,
        bias,
        residual,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        act=act,
        act_params=act_params,
    )


def _conv_target_sample(prologue: bool):
    """conv2d's instances, with a layout (and an input activation) drawn unless the pattern fixes them."""
    core = _conv_sample(2, True)

    def sample(draw, slots, attrs):
        types, drawn = core(draw, slots, {k: v for k, v in attrs.items() if k not in ("layout", "act_in")})
        extra = _draw_layout(draw)
        if prologue:
            extra["act_in"] = draw.choice([None, "silu", "relu"])
        return types, {**drawn, **extra, **{k: v for k, v in attrs.items() if k in ("layout", "act_in")}}

    return sample


def _conv_infer(types, attrs):
    _check_layout(attrs)
    core = {k: v for k, v in attrs.items() if k not in ("layout", "act_in")}
    return get_op("conv2d").infer_types(types, core)


def _conv_flops_in(ins, outs, attrs):
    """conv2d's FLOPs, and one per input element for the input activation (``act_in``) where there is one."""
    return _conv_flops(ins, outs, attrs) + ins[0].numel * int(attrs.get("act_in") is not None)


def _register_conv(name: str, prologue: bool, doc: str) -> None:
    """A target op that is conv2d with its epilogues (and, with ``prologue``, an activation of its input first), in
    the activation layout its ``layout`` names."""
    register(
        OpDef(
            name,
            get_op("conv2d").operands,
            _conv,
            attrs=(*get_op("conv2d").attrs, *[Attr("act_in", "str?", None)] * prologue, _LAYOUT),
            traits=PURE,
            flops=_conv_flops_in if prologue else _conv_flops,
            canonicalize=_conv_canon(2),
            infer=_conv_infer,
            sample=_conv_target_sample(prologue),
            core="conv2d",
            doc=doc,
        )
    )


_register_conv(
    "onednn_conv",
    False,
    "conv2d with its epilogues, its activations in the layout ``layout`` names (blocked, channels_last, or any: "
    "raced); storage only: a layout phase of oneDNN's runtime (rules/targets/onednn/variants/) sets it",
)
_register_conv(
    "onednn_depthwise",
    True,
    "conv2d(act_in(input), ...) with conv2d's epilogues: gawee's depthwise kernel, which applies act_in to its input "
    "rows as it reads them (once per element), in the layout ``layout`` names (storage only)",
)

TARGET_OPS = frozenset(
    {"onednn_binary", "onednn_binary_int8", "onednn_batch_norm", "onednn_affine_cat", "onednn_conv", "onednn_depthwise"}
)
"""The target ops defined here: only rules make them (never a capture)."""
