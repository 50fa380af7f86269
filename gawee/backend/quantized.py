"""The int8 kernels of the torch target, each on a weight prepacked once at build time.

- torch's ``quantized::linear_dynamic`` (fbgemm or oneDNN, as torch's quantized engine says), computing what the op
  ``linear_int8_dynamic`` (:mod:`gawee.ops.quantized`) computes: the input quantized per tensor to [0, levels]
  (127: ``reduce_range``; 255: 8 bits, exact only where the CPU has VNNI), an integer product, a float32
  dequantization and bias.
- oneDNN's int8 convolution with a float32 result (``onednn::qconv2d_pointwise``, what Inductor's x86 int8
  lowering calls), computing what ``conv2d_int8_static`` computes: the input quantized with its fixed scale and
  zero point, an exact integer convolution, dequantized in float32 with bias, residual (oneDNN's sum post-op)
  and relu or hardtanh fused."""

from __future__ import annotations

import warnings

import torch

from gawee.cpu import no_vnni
from gawee.ops.nn import apply_act

ENGINES = frozenset({"x86", "fbgemm", "onednn"})
"""torch's quantized engines whose dynamic linear quantizes the input as the op's reference semantics do."""

KERNEL = "quantized::linear_dynamic"


def unavailable(levels: int = 127) -> str | None:
    """Why this torch's current quantized engine cannot run the kernel with inputs quantized to [0, levels] (x86
    CPUs can: fbgemm or oneDNN; 8-bit inputs only with VNNI, :func:`gawee.cpu.no_vnni`), or None."""
    engine = torch.backends.quantized.engine
    if engine not in ENGINES:
        return f"torch's quantized engine is {engine!r}, not one of {', '.join(sorted(ENGINES))}"
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return f"this torch has no {KERNEL}"
    if levels != 127:
        why = no_vnni()
        if why is not None:
            return f"{why}: its kernel computes 8-bit inputs inexactly"
    return None


class DynamicInt8Linear:
    """act(linear_dynamic(x, packed) + bias) for an int8 weight [out, in] with one float32 scale per row, packed
    now (with the bias when it is a constant of one element per row; otherwise the bias is added after). A named
    callable (``<node>_int8_linear(x)`` in the generated code), so fx can print it."""

    __module__ = "gawee"

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        act: str | None,
        act_params: tuple,
        levels: int = 127,
    ):
        self.__name__ = self.__qualname__ = f"{name}_int8_linear"
        rows = weight.shape[0]
        with warnings.catch_warnings():  # torch deprecates quantized tensors; its dynamic kernels still take them
            warnings.simplefilter("ignore")
            q = torch._make_per_channel_quantized_tensor(
                weight.contiguous(), scale.double(), torch.zeros(rows, dtype=torch.int64), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(q, bias)
        self.features = weight.shape[1]
        self.act, self.act_params = act, act_params
        self.reduce_range = levels == 127

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.features)
        y = torch.ops.quantized.linear_dynamic(flat, self.packed, self.reduce_range)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if bias is not None:
            y = y + bias
        if self.act == "relu":
            return y.relu_()
        return apply_act(y, self.act, self.act_params)


CONV_KERNEL = "onednn::qconv2d_pointwise"
CONV_ACTS = (None, "relu", "hardtanh", "hardswish", "silu")
"""The activations the int8 convolution fuses (oneDNN post-ops; hardtanh with its min and max, silu as torch's
``swish``)."""


def conv_unavailable(levels: int = 255) -> str | None:
    """Why this torch cannot run oneDNN's int8 convolution on inputs quantized to [0, levels] here, or None."""
    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN"
    if not hasattr(torch.ops.onednn, "qconv2d_pointwise") or not hasattr(torch.ops.onednn, "qconv_prepack"):
        return f"this torch has no {CONV_KERNEL}"
    return unavailable(levels)


class StaticInt8Conv:
    """act(qconv2d_pointwise(quantize(x), packed) [+ residual]) for an int8 weight [out, in / groups, kh, kw] with
    one float32 scale per output channel, the input's scale and zero point fixed, prepacked now for inputs of
    ``input_shape`` (None: any). The input is quantized by torch's ``quantize_per_tensor`` (``round(x * (1 /
    scale)) + zero_point``, kept in [0, 255]; in [0, 127] too where ``levels`` is 127), or taken as it comes where
    it already is u8 codes (a producer's requantized result); a residual is summed into by oneDNN, so a live one
    is copied first. ``requantize`` (scale, zero point, levels): the result requantized, as u8 codes where
    ``codes`` (every reader takes them), else back on the grid in float32. A named callable
    (``<node>_int8_conv(x)`` in the generated code)."""

    __module__ = "gawee"

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        geometry: tuple[list[int], list[int], list[int], int],
        act: str | None,
        act_params: tuple,
        scale: float,
        zero_point: int,
        levels: int,
        input_shape: tuple[int, ...] | None,
        channels_last: bool,
        requantize: tuple[float, int, int] | None = None,
        codes: bool = False,
    ):
        self.__name__ = self.__qualname__ = f"{name}_int8_conv"
        stride, padding, dilation, groups = geometry
        self.geometry = (list(stride), list(padding), list(dilation), groups)
        self.scale, self.zero_point, self.levels = float(scale), int(zero_point), levels
        self.weight_scale = weight_scale.contiguous()
        self.weight_zero = torch.zeros(weight.shape[0], dtype=torch.int64)
        shape = None if input_shape is None else list(input_shape)
        self.packed = torch.ops.onednn.qconv_prepack(
            weight.contiguous(), self.weight_scale, self.scale, self.zero_point, *self.geometry, shape
        )
        self.bias = None if bias is None else bias.contiguous()
        self.act = act
        self.unary = ({"silu": "swish"}.get(act, act or "none"), [float(p) for p in act_params])
        """oneDNN's activation post-op (:data:`CONV_ACTS`): hardtanh with its (min, max)."""
        self.channels_last = channels_last
        self.requantize, self.codes = requantize, codes

    def quantize(self, x: torch.Tensor, scale: float | None = None, zero_point: int = 0, levels: int = 0):
        """``x``'s uint8 codes (with this kernel's input grid, or the one given): torch's quantizer (one vectorized
        pass; torch deprecates quantized tensors, and this is still its fastest) and its storage read as uint8 in
        place (``int_repr`` would copy it)."""
        if scale is None:
            scale, zero_point, levels = self.scale, self.zero_point, self.levels
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_tensor(x, scale, zero_point, torch.quint8)
        codes = torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage(), q.storage_offset(), q.shape, q.stride())
        return codes.clamp_(max=levels) if levels < 255 else codes

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, owned: bool = False) -> torch.Tensor:
        q = x if x.dtype is torch.uint8 else self.quantize(x)
        common = (q, self.scale, self.zero_point, self.packed, self.weight_scale, self.weight_zero)
        unary, scalars = self.unary
        if residual is None and self.requantize is not None:  # oneDNN requantizes its accumulator to u8 itself
            out_scale, out_zero, out_levels = self.requantize
            y = torch.ops.onednn.qconv2d_pointwise(
                *common, self.bias, *self.geometry, out_scale, out_zero, None, unary, scalars, ""
            )
            y = y.clamp_(max=out_levels) if out_levels < 255 else y
            return self._laid_out(y if self.codes else (y.float() - out_zero) * out_scale)
        if residual is None:
            y = torch.ops.onednn.qconv2d_pointwise(
                *common, self.bias, *self.geometry, 1.0, 0, torch.float32, unary, scalars, ""
            )
        else:
            accum = residual if owned else residual.clone(memory_format=torch.channels_last)
            fused = unary == "relu"  # torch's sum post-op takes relu after it, nothing else: the others come after
            y = torch.ops.onednn.qconv2d_pointwise.binary(
                *common, accum, self.bias, *self.geometry, 1.0, 0, torch.float32, 1.0, 0, "sum", 1.0,
                "relu" if fused else None, [], None,
            )  # fmt: skip
            if not fused and unary != "none":
                y = apply_act(y, self.act, scalars)
        if self.requantize is not None:  # with a residual: the float32 sum requantized by torch's quantizer
            codes = self.quantize(y, *self.requantize)
            y = codes if self.codes else (codes.float() - self.requantize[1]) * self.requantize[0]
        return self._laid_out(y)

    def _laid_out(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.channels_last else y.contiguous()
