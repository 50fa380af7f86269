"""Integer-quantized ops: weights quantized per channel to int8 (folded at rewrite time), and a linear layer that
quantizes its input at run time, multiplies in integers and dequantizes (rules/precision/int8.rules makes them).

Their reference semantics compute what torch's dynamic quantized linear kernel (``quantized::linear_dynamic``,
fbgemm and oneDNN alike) computes: the input's scale and zero point chosen from its range as
``ChooseQuantizationParams`` chooses them, the input rounded to unsigned integers in [0, levels] — 255 (8 bits),
or 127 (7 bits, ``reduce_range``: a pair of u8 x s8 products summed in 16 bits cannot saturate, on CPUs without
VNNI) —, an exact integer product, and a float32 dequantization.
Capture never produces these ops: only rules do (they have no ATen spelling)."""

from __future__ import annotations

import torch

from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import Attr, OpDef, Operand, register
from gawee.ops.nn import _draw_act, _no_act_params, apply_act

INT8_MAX = 127
"""The largest magnitude of a symmetric int8 weight: [-127, 127], zero point 0 (-128 is never used)."""

LEVELS = (127, 255)
"""The largest quantized input value ``levels`` may name: 7 bits (``reduce_range``) or 8."""

SMALL_SCALE = float(torch.tensor(6.1e-5, dtype=torch.float32))
"""The smallest input scale ``ChooseQuantizationParams`` gives (its ``SMALL_SCALE_THRESHOLD``, a float32)."""

RULE_ONLY = frozenset({"quantize_per_channel_symmetric", "linear_int8_dynamic"})
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
