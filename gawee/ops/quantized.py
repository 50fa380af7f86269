"""Integer-quantized ops: weights quantized per channel to int8 (folded at rewrite time), a linear layer that
quantizes its input at run time, a convolution that quantizes its input with a scale fixed by calibration, and
the annotation that carries a calibrated range into the graph (rules/precision/int8.rules makes and reads them).

Their reference semantics compute what torch's dynamic quantized linear kernel (``quantized::linear_dynamic``,
fbgemm and oneDNN alike) computes: the input's scale and zero point chosen from its range as
``ChooseQuantizationParams`` chooses them, the input rounded to unsigned integers in [0, levels] — 255 (8 bits),
or 127 (7 bits, ``reduce_range``: a pair of u8 x s8 products summed in 16 bits cannot saturate, on CPUs without
VNNI) —, an exact integer product, and a float32 dequantization.
The static convolution computes what oneDNN's int8 convolution with a float32 result computes (torch's
``onednn::qconv2d_pointwise``): the input rounded to [0, levels] with a fixed scale and zero point, an exact
integer convolution with the int8 weight, a float32 dequantization, bias, residual and activation.
Capture never produces these ops: only rules and calibration do (they have no ATen spelling)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.errors import InferenceError
from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import Attr, OpDef, Operand, get_op, meta_tensor, register
from gawee.ops.nn import _conv_canon, _conv_flops, _conv_sample, _draw_act, _no_act_params, apply_act

INT8_MAX = 127
"""The largest magnitude of a symmetric int8 weight: [-127, 127], zero point 0 (-128 is never used)."""

LEVELS = (127, 255)
"""The largest quantized input value ``levels`` may name: 7 bits (``reduce_range``) or 8."""

SMALL_SCALE = float(torch.tensor(6.1e-5, dtype=torch.float32))
"""The smallest input scale ``ChooseQuantizationParams`` gives (its ``SMALL_SCALE_THRESHOLD``, a float32)."""

RULE_ONLY = frozenset({"quantize_per_channel_symmetric", "linear_int8_dynamic", "conv2d_int8_static", "calibrated"})
"""The ops of this module: made by rules, never by capture (no ATen call maps to them)."""


def quantize_per_channel_symmetric(input: torch.Tensor, *, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input`` as int8 values in [-127, 127] and one scale per index of ``axis`` (in ``input``'s dtype), such
    that ``values * scale`` (scale broadcast along ``axis``) approximates ``input``: the scale is the channel's
    largest magnitude over 127 (1 for a channel of zeros), and each value is ``input / scale`` rounded to nearest
    (ties to even), computed in float64 from the scale as stored."""
    if not input.dtype.is_floating_point:
        raise ValueError(f"quantize_per_channel_symmetric quantizes a float tensor, not {input.dtype}")
    if input.dim() == 0:
        raise ValueError("quantize_per_channel_symmetric needs a channel axis (rank >= 1)")
    axis = axis % input.dim()
    channels = input.shape[axis]
    wide = input.double()
    per_channel = wide.abs().movedim(axis, 0).reshape(channels, input.numel() // max(channels, 1))
    peak = per_channel.amax(dim=1) if per_channel.shape[1] else per_channel.new_zeros(channels)
    scale = (peak / INT8_MAX).to(input.dtype)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    shape = [1] * input.dim()
    shape[axis] = -1
    values = torch.clamp(torch.round(wide / scale.double().reshape(shape)), -INT8_MAX, INT8_MAX)
    return values.to(torch.int8), scale


def activation_qparams(x: torch.Tensor, levels: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 scale and the zero point (a float64 integer) with which the kernel quantizes ``x`` to
    [0, levels]: torch's ``ChooseQuantizationParams`` over [min(x, 0), max(x, 0)] — the range over ``levels`` in
    float64, 0.1 where that is 0 in float32 or its inverse overflows, at least SMALL_SCALE (the range widened to
    match), and the zero point from whichever end loses less, rounded and kept in [0, levels]."""
    flat = torch.cat([x.reshape(-1), x.new_zeros(1)])
    lo, hi = flat.amin(), flat.amax()  # float32, 0 included
    scale = (hi.double() - lo.double()) / levels
    as_f32 = scale.float()
    scale = torch.where((as_f32 == 0) | torch.isinf(1 / as_f32), torch.full_like(scale, 0.1), scale)
    small = scale < SMALL_SCALE
    amplifier = SMALL_SCALE / scale.float()  # float32, as the widened ends are
    widest = lo.new_tensor(SMALL_SCALE * levels)
    lo, hi = (
        torch.where(small, torch.where(lo == 0, lo, torch.where(hi == 0, -widest, lo * amplifier)), lo),
        torch.where(small, torch.where(lo == 0, widest, torch.where(hi == 0, hi, hi * amplifier)), hi),
    )
    scale = torch.where(small, torch.full_like(scale, SMALL_SCALE), scale)
    from_min, from_max = -lo.double() / scale, levels - hi.double() / scale
    min_error, max_error = -(lo.double() / scale).abs(), levels - (hi.double() / scale).abs()
    zero = torch.where(min_error < max_error, from_min, from_max)
    return scale.float(), torch.clamp(torch.round(zero), 0, levels)


def linear_int8_dynamic(
    input: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act: str | None = None,
    act_params: tuple = (),
    levels: int = 127,
) -> torch.Tensor:
    """act(dequantized(quantized(input) @ weight.T) + bias): ``input`` (float32) quantized per tensor to
    [0, levels] with ``activation_qparams``, ``round(input * (1 / scale)) + zero_point`` in float32 kept in
    [0, 255] (what the kernel's vector loop does), the integer product of ``q - zero_point`` with the int8
    ``weight`` [out, in] accumulated exactly (the kernel's int32 is exact for fewer than 66,000 input features),
    and dequantized in float32 as ``product * (scale * weight_scale)`` before the bias is added.

    The product is a float64 matrix product: each term is an integer of magnitude at most 255 * 127 and every
    partial sum an integer below 2**53 (for fewer than 2.7e11 input features), which float64 holds exactly in any
    order of summation, so BLAS computes the integer product exactly (an int64 matmul has no BLAS kernel, and the
    interpreter runs this op wherever a compile checks an int8 model), and its rounding to float32 is the
    integer's."""
    if input.dtype != torch.float32 or weight.dtype != torch.int8 or weight_scale.dtype != torch.float32:
        raise ValueError(
            f"linear_int8_dynamic takes a float32 input, an int8 weight and float32 scales, "
            f"not {input.dtype}, {weight.dtype}, {weight_scale.dtype}"
        )
    if weight.dim() != 2 or weight_scale.shape != weight.shape[:1]:
        raise ValueError(
            f"linear_int8_dynamic needs a 2-D weight with one scale per row, not {tuple(weight.shape)} and "
            f"{tuple(weight_scale.shape)}"
        )
    if bias is not None and bias.dtype != torch.float32:
        raise ValueError(f"linear_int8_dynamic adds a float32 bias, not {bias.dtype}")
    if levels not in LEVELS:
        raise ValueError(f"linear_int8_dynamic quantizes its input to [0, 127] or [0, 255], not [0, {levels}]")
    scale, zero = activation_qparams(input, levels)
    q = torch.clamp(torch.round(input * (1 / scale)) + zero.float(), 0, 255)
    product = torch.matmul(q.double() - zero, weight.double().T)
    y = product.float() * (scale * weight_scale)
    if bias is not None:
        y = y + bias
    return apply_act(y, act, act_params)


def static_qparams(low: float, high: float, levels: int) -> tuple[float, int]:
    """The float32 scale and the zero point that quantize the calibrated range [low, high] (0 included) to
    [0, levels]: scale = (high - low) / levels rounded to float32, at least SMALL_SCALE, and the zero point
    -low / scale rounded to nearest and kept in [0, levels] (so 0 is exactly representable, as zero padding
    needs). ValueError for a range that is not finite or a ``levels`` not in LEVELS."""
    if levels not in LEVELS:
        raise ValueError(f"an activation is quantized to [0, 127] or [0, 255], not [0, {levels}]")
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"a calibrated range must be finite, not [{low}, {high}]")
    scale = max(float(torch.tensor((high - low) / levels, dtype=torch.float32)), SMALL_SCALE)
    if not math.isfinite(scale):
        raise ValueError(f"the calibrated range [{low}, {high}] is too wide for a float32 scale")
    return scale, min(max(round(-low / scale), 0), levels)


def calibrated(input: torch.Tensor, *, low: float, high: float) -> torch.Tensor:
    """``input`` itself (a copy): the node records that ``input`` ranged over [low, high] on the calibration
    batches, for the rules that choose a fixed quantization scale (:func:`gawee.rewrite.calibration.calibrate`
    puts it in; the precision phase takes it out). Numerically it is the identity, so a rule that reads
    ``low`` and ``high`` is sound for any range: its bound must hold where ``input`` leaves it."""
    return input.clone()


def conv2d_int8_static(
    input: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    stride,
    padding,
    dilation,
    groups: int,
    act: str | None = None,
    act_params: tuple = (),
    scale: float,
    zero_point: int,
    levels: int = 255,
    out_scale: float = 0.0,
    out_zero_point: int = 0,
    out_levels: int = 255,
) -> torch.Tensor:
    """act(dequantized(conv2d(quantized(input), weight)) + bias + residual): ``input`` (float32) rounded to
    ``round(input * (1 / scale)) + zero_point`` in float32, kept in [0, levels] (values beyond the range the
    scale covers are clamped to its ends), convolved exactly with the int8 ``weight`` (zero padding is the zero
    point, i.e. 0), dequantized in float32 as ``product * (scale * weight_scale)``, then bias, residual and act
    added in float32.

    With ``out_scale`` > 0 the result is requantized as the next convolution would quantize its input —
    ``round(y * (1 / out_scale)) + out_zero_point`` kept in [0, out_levels] — and given back on that grid,
    ``(code - out_zero_point) * out_scale``: a convolution with that scale, zero point and levels reading it
    rounds it to the same code, so the kernel may hand it over as the code itself (u8).

    The convolution runs in float64: each term is an integer of magnitude at most 255 * 127 and every partial
    sum an integer below 2**53, exact in any order (the kernel's int32 accumulation is exact below 66,000 terms
    per window, which the rules require).

    In float64 — the input, the weight's scales, bias and residual all float64 — the same steps are taken in
    float64: the counterpart in which the harness computes an approximate rule's reference result
    (:func:`gawee.numerics.upcast`) where the original holds an int8 convolution (``requantize_calibrated_int8``)."""
    real = input.dtype
    _check_conv_int8(input, weight, weight_scale, bias, residual, scale, zero_point, levels)
    check_requantization("conv2d_int8_static", out_scale, out_zero_point, out_levels)
    inverse = 1 / torch.tensor(scale, dtype=real)
    q = torch.clamp(torch.round(input * inverse) + zero_point, 0, levels)
    product = F.conv2d(q.double() - zero_point, weight.double(), None, stride, padding, dilation, groups)
    y = product.to(real) * (torch.tensor(scale, dtype=real) * weight_scale).reshape(1, -1, 1, 1)
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1)
    if residual is not None:
        if residual.shape != y.shape:
            raise ValueError(f"residual {list(residual.shape)} must have the output's shape {list(y.shape)}")
        y = y + residual
    return requantize(apply_act(y, act, act_params), out_scale, out_zero_point, out_levels)


def _check_conv_int8(input, weight, weight_scale, bias, residual, scale: float, zero_point: int, levels: int) -> None:
    """ValueError unless conv2d_int8_static takes these operands (tensors, meta ones included) and its input grid."""
    real = input.dtype
    if real not in (torch.float32, torch.float64) or weight.dtype != torch.int8 or weight_scale.dtype != real:
        raise ValueError(
            f"conv2d_int8_static takes a float32 input, an int8 weight and float32 scales (or float64 input and "
            f"scales), not {input.dtype}, {weight.dtype}, {weight_scale.dtype}"
        )
    if input.dim() != 4 or weight.dim() != 4 or weight_scale.shape != weight.shape[:1]:
        raise ValueError(
            f"conv2d_int8_static needs a 4-D input and weight with one scale per output channel, not "
            f"{tuple(input.shape)}, {tuple(weight.shape)} and {tuple(weight_scale.shape)}"
        )
    for name, t in (("bias", bias), ("residual", residual)):
        if t is not None and t.dtype != real:
            raise ValueError(f"conv2d_int8_static adds a {name} of its input's type {real}, not {t.dtype}")
    if levels not in LEVELS or not 0 <= zero_point <= levels or not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"conv2d_int8_static quantizes to [0, 127] or [0, 255] with a positive finite scale and a zero point "
            f"in range, not levels {levels}, scale {scale}, zero point {zero_point}"
        )


def _conv_int8_infer(types, attrs) -> list[TensorType]:
    """conv2d_int8_static's result type without running it (its quantizing steps are slow on meta tensors): its
    operands checked as it checks them, and the type conv2d gives for the same geometry, activation and residual."""
    x, w, s, b, r = [*types, None, None][:5]
    meta = [None if t is None else meta_tensor(t) for t in (x, w, s, b, r)]
    _check_conv_int8(*meta, attrs.get("scale", 1.0), attrs.get("zero_point", 0), attrs.get("levels", 255))
    check_requantization(
        "conv2d_int8_static", attrs.get("out_scale", 0.0), attrs.get("out_zero_point", 0), attrs.get("out_levels", 255)
    )
    conv = {k: attrs[k] for k in ("stride", "padding", "dilation", "groups", "act", "act_params") if k in attrs}
    try:
        return get_op("conv2d").infer_types([x, TensorType(w.shape, x.dtype), b, r], conv)
    except InferenceError as e:  # told as this op's error (OpDef.infer_types names the op and its operands)
        raise ValueError(e.message.split(" is invalid: ", 1)[-1]) from None


def check_requantization(op: str, out_scale: float, out_zero_point: int, out_levels: int) -> None:
    """ValueError unless ``out_scale`` is 0 (no requantization) or a grid :func:`requantize` takes."""
    if out_scale != 0 and (
        out_levels not in LEVELS
        or not 0 <= out_zero_point <= out_levels
        or not (math.isfinite(out_scale) and out_scale > 0)
    ):
        raise ValueError(
            f"{op} requantizes to [0, 127] or [0, 255] with a positive finite scale and a zero point "
            f"in range, not levels {out_levels}, scale {out_scale}, zero point {out_zero_point}"
        )


def requantize(y: torch.Tensor, out_scale: float, out_zero_point: int, out_levels: int) -> torch.Tensor:
    """``y`` (float) itself where ``out_scale`` is 0; else requantized as an int8 convolution with that scale, zero
    point and levels quantizes its input — ``round(y * (1 / out_scale)) + out_zero_point`` kept in [0, out_levels]
    — and given back on that grid, ``(code - out_zero_point) * out_scale``: such a convolution reading it rounds it
    to the same code, so a kernel may hand it over as the code itself (u8)."""
    if not out_scale:
        return y
    step = torch.tensor(out_scale, dtype=y.dtype)
    code = torch.clamp(torch.round(y * (1 / step)) + out_zero_point, 0, out_levels)
    return (code - out_zero_point) * step


def _quantize_sample(draw, slots, attrs):
    (x,) = slots
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(1, 4))
    if x.rank == 0 or not x.dtype.is_float:
        raise S.Reject("quantize_per_channel_symmetric needs a float tensor of rank >= 1")
    if "axis" not in attrs:
        attrs = {**attrs, "axis": draw.integers(-x.rank, x.rank - 1)}
    return [x], attrs


def _linear_int8_sample(draw, slots, attrs):
    x, w, s, b = slots
    if isinstance(x, TensorType) and (x.rank == 0 or x.dtype is not DType.f32):
        raise S.Reject("linear_int8_dynamic needs a float32 input of rank >= 1")
    if isinstance(w, TensorType) and (w.rank != 2 or w.dtype is not DType.i8):
        raise S.Reject("linear_int8_dynamic needs a 2-D int8 weight")
    k = x.shape[-1] if isinstance(x, TensorType) else (w.shape[1] if isinstance(w, TensorType) else draw.size(1, 4))
    n = w.shape[0] if isinstance(w, TensorType) else (s.shape[0] if isinstance(s, TensorType) and s.rank else None)
    n = draw.size(1, 4) if n is None else n
    if not isinstance(x, TensorType):
        x = TensorType((*S.shape(draw, draw.integers(0, 2)), k), DType.f32)
    if not isinstance(w, TensorType):
        w = TensorType((n, k), DType.i8)
    if w.shape[1] != k:
        raise S.Reject(f"linear_int8_dynamic: input features {k}, weight {w}")
    if not isinstance(s, TensorType):
        s = TensorType((n,), DType.f32)
    if s.shape != (n,) or s.dtype is not DType.f32:
        raise S.Reject("linear_int8_dynamic needs one float32 scale per weight row")
    if b is S.FREE:
        b = draw.choice([None, TensorType((n,), DType.f32)])
    if "act" not in attrs:
        attrs = {**attrs, **{k: v for k, v in _draw_act(draw).items() if k not in attrs}}
    if "levels" not in attrs:
        attrs = {**attrs, "levels": draw.choice(list(LEVELS))}
    elif attrs["levels"] not in LEVELS:
        raise S.Reject(f"linear_int8_dynamic quantizes its input to [0, 127] or [0, 255], not [0, {attrs['levels']}]")
    return [x, w, s, None if b is S.ABSENT else b], attrs


register(
    OpDef(
        "quantize_per_channel_symmetric",
        (Operand("input"),),
        quantize_per_channel_symmetric,
        attrs=(Attr("axis", "int", 0),),
        traits=frozenset({"pure", "multi_output"}),
        flops=lambda ins, outs, attrs: 3 * ins[0].numel,
        sample=_quantize_sample,
        doc="(int8 values in [-127, 127], one scale per index of axis): symmetric per-channel quantization",
    )
)
register(
    OpDef(
        "linear_int8_dynamic",
        (Operand("input"), Operand("weight"), Operand("weight_scale"), Operand("bias", optional=True)),
        linear_int8_dynamic,
        attrs=(Attr("act", "str?", None), Attr("act_params", "floats", ()), Attr("levels", "int", 127)),
        traits=frozenset({"pure"}),
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        flops=lambda ins, outs, attrs: 2 * outs[0].numel * ins[0].shape[-1] + 3 * ins[0].numel,
        sample=_linear_int8_sample,
        doc="act(input quantized per tensor to [0, levels] at run time @ int8 weight.T, dequantized + bias)",
    )
)


def _calibrated_sample(draw, slots, attrs):
    (x,) = slots
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(0, 4))
    if not x.dtype.is_float:
        raise S.Reject("calibrated annotates a float tensor")
    ends = [0.0, 0.25, 1.0, 3.0, 100.0]  # ranges narrower than the data as often as wider
    attrs = {"low": -draw.choice(ends), "high": draw.choice(ends), **attrs}
    return [x], attrs


def _conv_int8_sample(draw, slots, attrs):
    """A float32 convolution's operands (conv2d's sampler), its weight as int8 with one float32 scale per output
    channel, and a scale and zero point for the input."""
    x, w, s, b, r = slots
    if isinstance(x, TensorType) and x.dtype is not DType.f32:
        raise S.Reject("conv2d_int8_static needs a float32 input")
    if isinstance(w, TensorType) and w.dtype is not DType.i8:
        raise S.Reject("conv2d_int8_static needs an int8 weight")
    as_float = w if not isinstance(w, TensorType) else TensorType(w.shape, DType.f32)
    geometry = {k: v for k, v in attrs.items() if k in ("stride", "padding", "dilation", "groups", "act", "act_params")}
    (x, w, b, r), drawn = _conv_sample(2, True)(draw, [x, as_float, b, r], geometry)
    x, w = TensorType(x.shape, DType.f32), TensorType(w.shape, DType.i8)
    if not isinstance(s, TensorType):
        s = TensorType(w.shape[:1], DType.f32)
    if s.shape != w.shape[:1] or s.dtype is not DType.f32:
        raise S.Reject("conv2d_int8_static needs one float32 scale per output channel")
    b = None if b is None else TensorType(b.shape, DType.f32)
    r = None if r is None else TensorType(r.shape, DType.f32)
    levels = attrs.get("levels", draw.choice(list(LEVELS)))
    if levels not in LEVELS:
        raise S.Reject(f"conv2d_int8_static quantizes its input to [0, 127] or [0, 255], not [0, {levels}]")
    drawn = {**drawn, "levels": levels, **attrs}
    drawn.setdefault("scale", draw.choice([SMALL_SCALE, 0.01, 0.1, 1.0]))
    drawn.setdefault("zero_point", draw.integers(0, levels))
    if "out_scale" not in drawn:
        drawn["out_scale"] = draw.choice([0.0, 0.0, 0.05, 0.5])
    if drawn["out_scale"]:
        drawn.setdefault("out_levels", draw.choice(list(LEVELS)))
        drawn.setdefault("out_zero_point", draw.integers(0, drawn["out_levels"]))
    return [x, w, s, b, r], drawn


register(
    OpDef(
        "calibrated",
        (Operand("input"),),
        calibrated,
        attrs=(Attr("low", "float", 0.0), Attr("high", "float", 0.0)),
        traits=frozenset({"pure"}),
        flops=lambda ins, outs, attrs: 0,
        sample=_calibrated_sample,
        doc="input itself, annotated with the range [low, high] it took on the calibration batches",
    )
)
register(
    OpDef(
        "conv2d_int8_static",
        (
            Operand("input"),
            Operand("weight"),
            Operand("weight_scale"),
            Operand("bias", optional=True),
            Operand("residual", optional=True),
        ),
        conv2d_int8_static,
        attrs=(
            Attr("stride", "ints", (1, 1)),
            Attr("padding", "ints", (0, 0)),
            Attr("dilation", "ints", (1, 1)),
            Attr("groups", "int", 1),
            Attr("act", "str?", None),
            Attr("act_params", "floats", ()),
            Attr("scale", "float", 1.0),
            Attr("zero_point", "int", 0),
            Attr("levels", "int", 255),
            Attr("out_scale", "float", 0.0),
            Attr("out_zero_point", "int", 0),
            Attr("out_levels", "int", 255),
        ),
        traits=frozenset({"pure"}),
        canonicalize=_conv_canon(2),
        flops=lambda ins, outs, attrs: _conv_flops(ins, outs, attrs) + 3 * ins[0].numel,
        infer=_conv_int8_infer,
        sample=_conv_int8_sample,
        doc="act(conv2d(input quantized per tensor with a fixed scale and zero point, int8 weight) dequantized "
        "+ bias + residual)",
    )
)
