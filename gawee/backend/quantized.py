"""The int8 kernels of the torch target, each on a weight prepacked once at build time.

- two kernels of the op ``linear_int8_dynamic`` (:mod:`gawee.ops.quantized`): the input quantized per tensor to
  [0, levels] (127: ``reduce_range``; 255: 8 bits, exact only where the CPU has VNNI), an integer product, a float32
  dequantization and bias. torch's ``quantized::linear_dynamic`` (fbgemm or oneDNN, as torch's quantized engine
  says) does it all in one call; ``onednn::qlinear_pointwise`` multiplies u8 codes that gawee's own quantizer
  (``quantize_u8.c``: the reference's arithmetic, two vectorized passes) made. Which is faster depends on the CPU
  and the shape (oneDNN's u8 matmul against fbgemm's), so each distinct shape times both once per process
  (:func:`choose_linear`) and keeps the faster.
- oneDNN's int8 convolution with a float32 result (``onednn::qconv2d_pointwise``, what Inductor's x86 int8
  lowering calls), computing what ``conv2d_int8_static`` computes: the input quantized with its fixed scale and
  zero point, an exact integer convolution, dequantized in float32 with bias, residual (oneDNN's sum post-op)
  and relu or hardtanh fused."""

from __future__ import annotations

import ctypes
import math
import time
import warnings
from functools import cache
from pathlib import Path

import torch

from gawee.backend import kernels, native
from gawee.cpu import no_vnni
from gawee.errors import GaweeError
from gawee.ops.nn import apply_act
from gawee.ops.quantized import SMALL_SCALE, activation_qparams
from gawee.ops.quantized import linear_int8_dynamic as reference_linear

ENGINES = frozenset({"x86", "fbgemm", "onednn"})
"""torch's quantized engines whose dynamic linear quantizes the input as the op's reference semantics do."""

KERNEL = "quantized::linear_dynamic"
ONEDNN_KERNEL = "onednn::qlinear_pointwise"
LINEAR_KERNELS = (KERNEL, ONEDNN_KERNEL)
"""The kernels of an int8 linear, in the order they are preferred on a tie."""
LINEAR_CHOICES = ("measure", *LINEAR_KERNELS)
"""Values of ``TorchOptions.int8_linear_kernel``."""
QUANTIZER = Path(__file__).with_name("quantize_u8.c")


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
        return _finish(y.reshape(*x.shape[:-1], y.shape[-1]), bias, self.act, self.act_params)


def _finish(y: torch.Tensor, bias: torch.Tensor | None, act: str | None, params: tuple) -> torch.Tensor:
    """act(y + bias) on a kernel's fresh result: the activation in place where torch has it so."""
    return kernels.act_inplace(y if bias is None else y + bias, act, params)


@cache
def _quantizer() -> tuple[ctypes.CDLL | None, str | None]:
    p, lng, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    return native.load(QUANTIZER, {"gawee_quantize_u8": [p, lng, i, ctypes.c_double, p, p, p]})


def onednn_unavailable(levels: int = 127) -> str | None:
    """Why :class:`OnednnInt8Linear` cannot run here with inputs quantized to [0, levels], or None: it needs what
    torch's kernel needs (an x86 engine), VNNI whatever the levels (without it oneDNN's int8 kernels may halve
    the weights to keep their 16-bit sums from saturating, which is not the op's product), this torch's oneDNN
    int8 linear and gawee's quantizer (a C compiler)."""
    why = unavailable(levels) or no_vnni()
    if why is not None:
        return why
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return f"this torch has no {ONEDNN_KERNEL}"
    return _quantizer()[1]


POST_OPS = {"relu": ("relu", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh")}
"""The activations oneDNN's int8 linear can apply as its post-op: (name, algorithm)."""


@cache
def post_op(act: str | None) -> tuple[str, str] | None:
    """oneDNN's post-op for ``act`` where it computes torch's activation here: relu exactly; a gelu where, tried
    once on values from -10 to 10 and on tiny ones (a weight of zeros, the values as the bias), every result is
    within two float32 ulps of the larger of its input's and torch's result's magnitudes (oneDNN's erf gelu matched
    torch's bit for bit on AVX-512; its tanh gelu, a polynomial of its own, within one ulp, where torch's tanh
    took seven times as long as its erf gelu). None: the activation runs after the kernel."""
    if act == "relu" or act not in POST_OPS:
        return POST_OPS.get(act)
    n, k = 4096, 16
    x = torch.cat([torch.linspace(-10, 10, n // 2), torch.linspace(-1e-3, 1e-3, n // 2)])
    packed = torch.ops.onednn.qlinear_prepack(torch.zeros(n, k, dtype=torch.int8), [1, k])
    common = (torch.zeros(1, k, dtype=torch.uint8), 1.0, 0, packed, torch.ones(n), torch.zeros(n, dtype=torch.int64))
    name, algorithm = POST_OPS[act]
    try:
        got = torch.ops.onednn.qlinear_pointwise(*common, x, 1.0, 0, torch.float32, name, [], algorithm)[0]
    except RuntimeError:
        return None
    want = apply_act(x, act, ())
    ulp = torch.maximum(x.abs(), want.abs()) * 2.0**-23
    return POST_OPS[act] if bool(((got - want).abs() <= 2 * ulp).all()) else None


class OnednnInt8Linear:
    """act(qlinear_pointwise(quantize(x), packed) + bias) for an int8 weight [out, in] with one float32 scale per
    row: the weight prepacked now by oneDNN (for ``rows`` input rows where that is known), the input quantized per
    call by ``quantize_u8.c`` — the codes, scale and zero point the op's reference semantics compute, so the
    integer product is the reference's and only the float32 dequantization may round differently. An input that
    holds a nan or an infinity runs the reference semantics; one whose range takes the rare branches of the
    quantization parameters is quantized by the reference's own code. A relu or a gelu after a bias known now is
    oneDNN's post-op where it computes torch's (:func:`post_op`); any other activation runs in place on the
    result. A named callable (``<node>_int8_linear(x)`` in the generated code)."""

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
        rows: int | None = None,
    ):
        self.__name__ = self.__qualname__ = f"{name}_int8_linear"
        self.weight, self.scale = weight.contiguous(), scale.contiguous()
        self.packed = torch.ops.onednn.qlinear_prepack(self.weight, None if rows is None else [rows, weight.shape[1]])
        self.weight_zero = torch.zeros(weight.shape[0], dtype=torch.int64)
        self.bias = None if bias is None else bias.contiguous()
        self.features, self.levels = weight.shape[1], levels
        self.act, self.act_params = act, act_params
        fused = post_op(act) if not act_params else None
        self.post = ("none", "") if fused is None else fused
        self.lib = native.library(_quantizer())

    def codes(self, flat: torch.Tensor) -> tuple[torch.Tensor, float, int] | None:
        """The u8 codes of the contiguous matrix ``flat`` with their scale and zero point, as the reference
        quantizes it; None where it holds a nan or an infinity."""
        codes = torch.empty(flat.shape, dtype=torch.uint8)
        scale, zero = ctypes.c_float(), ctypes.c_int()
        status = self.lib.gawee_quantize_u8(
            flat.data_ptr(), flat.numel(), self.levels, SMALL_SCALE, codes.data_ptr(),
            ctypes.byref(scale), ctypes.byref(zero),
        )  # fmt: skip
        if status == 0:
            return codes, scale.value, zero.value
        if not bool(torch.isfinite(flat).all()):
            return None
        s, z = activation_qparams(flat, self.levels)
        q = torch.clamp(torch.round(flat * (1 / s)) + z.float(), 0, 255)
        return q.to(torch.uint8), float(s), int(z)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.features).contiguous()
        quantized = self.codes(flat) if flat.numel() else None
        if quantized is None:  # non-finite (or empty): the reference semantics
            b = self.bias if bias is None else bias  # a bias is packed or comes late, never both
            return reference_linear(
                x, self.weight, self.scale, b, act=self.act, act_params=self.act_params, levels=self.levels
            )
        codes, scale, zero = quantized
        post, algorithm = self.post if bias is None else ("none", "")
        y = torch.ops.onednn.qlinear_pointwise(
            codes, scale, zero, self.packed, self.scale, self.weight_zero, self.bias, 1.0, 0, torch.float32,
            post, [], algorithm,
        )  # fmt: skip
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if post != "none" else _finish(y, bias, self.act, self.act_params)


def linear_kernels(levels: int) -> list[str]:
    """The int8 linear kernels that run here with inputs quantized to [0, levels] (torch's first)."""
    found = [] if unavailable(levels) is not None else [KERNEL]
    return found + ([ONEDNN_KERNEL] if found and onednn_unavailable(levels) is None else [])


def make_linear(kernel: str, name: str, weight, scale, bias, act, act_params, levels: int, rows: int | None):
    """The callable of ``kernel`` (one of :data:`LINEAR_KERNELS`) for this weight."""
    if kernel == KERNEL:
        return DynamicInt8Linear(name, weight, scale, bias, act, act_params, levels)
    return OnednnInt8Linear(name, weight, scale, bias, act, act_params, levels, rows)


CHECK_ROWS = 16
"""Rows of the race's input on which each candidate is checked against the reference semantics first."""

_CHOSEN: dict[tuple, kernels.KernelChoice] = {}
"""Per process: (rows, in, out, bias, act, act_params, levels, threads, kernel asked for) → the choice."""


def choose_linear(
    rows: int, k: int, n: int, bias: bool, act: str | None, act_params: tuple, levels: int, forced: str = "measure"
) -> kernels.KernelChoice:
    """The kernel of an int8 linear of this shape: ``forced`` where it runs here (else torch's), or with
    ``"measure"`` the faster of :func:`linear_kernels` on a random weight and input of the shape (calls interleaved
    round by round: :func:`gawee.backend.kernels.best_calls`), each checked against the reference semantics first
    (on :data:`CHECK_ROWS` of its rows); cached per shape for the process."""
    if forced not in LINEAR_CHOICES:
        raise GaweeError(
            f"unknown int8 linear kernel {forced!r}",
            hint=f"TorchOptions.int8_linear_kernel is one of {', '.join(LINEAR_CHOICES)}",
        )
    key = (rows, k, n, bias, act, tuple(act_params), levels, torch.get_num_threads(), forced)
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    candidates = linear_kernels(levels)
    shape = (rows, k, n, bias, act)
    if forced != "measure" or len(candidates) < 2:
        kernel = forced if forced in candidates else KERNEL
        why = "forced" if forced != "measure" else "the only int8 kernel here"
        return _CHOSEN.setdefault(key, kernels.KernelChoice("linear_int8_dynamic", *shape, kernel, unmeasured=why))
    start = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g) * 3
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g) / (127 * math.sqrt(k)) + 1e-4
    b = torch.randn(n, generator=g) if bias else None
    # the reference's float64 product of every row would cost more than the race: the first rows are checked,
    # the others kept within their range, so that the whole input is quantized as those rows alone are
    few = x[:CHECK_ROWS]
    x[CHECK_ROWS:].clamp_(float(few.min()), float(few.max()))
    expected = reference_linear(few, q, s, b, act=act, act_params=tuple(act_params), levels=levels)
    runners = {}
    with torch.no_grad():
        for kernel in candidates:
            try:
                fn = make_linear(kernel, "probe", q, s, b, act, tuple(act_params), levels, rows)
                got = fn(x)[:CHECK_ROWS]
            except RuntimeError:  # the library refused this shape: not a candidate
                continue
            if torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max())):
                runners[kernel] = fn
    best = kernels.best_calls(runners, (x,), min_rounds=3, max_rounds=15, budget_s=0.25)
    kernel = min(best, key=lambda c: (best[c], LINEAR_KERNELS.index(c))) if best else KERNEL
    choice = kernels.KernelChoice("linear_int8_dynamic", *shape, kernel, {c: round(t, 4) for c, t in best.items()})
    kernels.add_measuring_seconds(time.perf_counter() - start)
    return _CHOSEN.setdefault(key, choice)


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
