"""oneDNN on CPU: which fused kernels this torch has, how fused activations are spelled for them, prepacking.

These are the kernels TorchInductor's freezing path emits (``torch/_inductor/fx_passes/
mkldnn_fusion.py``): ``mkldnn._convolution_pointwise`` (convolution + one unary post-op),
``mkldnn._convolution_pointwise.binary`` (convolution + ``add`` of a second tensor, then
optionally ``relu``), with weights reordered once into oneDNN's blocked format for the
known input size. (Its fused linear, ``mkldnn._linear_pointwise``, measured slower than
torch's GEMM plus the activation here, so linear does not use it.) Op lowerings (:mod:`gawee.backend.lower_torch`)
ask here whether a node qualifies and fall back to plain torch ops when it does not.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import cache

import torch

from gawee.ir.types import DType
from gawee.machine import no_bf16

POST_OPS: dict[str, tuple[str, str | None]] = {
    "relu": ("relu", None),
    "sigmoid": ("sigmoid", None),
    "tanh": ("tanh", None),
    "silu": ("swish", None),
    "hardswish": ("hardswish", None),
    "hardsigmoid": ("hardsigmoid", None),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "hardtanh": ("hardtanh", None),
    "leaky_relu": ("leaky_relu", None),
}
"""gawee's fused activation (``gawee.ops.ACTIVATIONS``) → oneDNN unary post-op (attr, algorithm).
The activation parameters (``act_params``) are the post-op's scalars, in the same order."""

BINARY_POST_OPS = frozenset({None, "relu"})
"""Activations oneDNN's binary (residual) convolution applies after the add; others run unfused."""


def binary_fuses(in_place: bool, channels_last: bool, groups: int) -> bool:
    """Whether torch's residual convolution (``mkldnn._convolution_pointwise_.binary`` in place on the residual,
    ``mkldnn._convolution_pointwise.binary`` into a new tensor) on a packed weight runs oneDNN's fused kernel. In
    torch 2.14.1's ``Conv.cpp`` the in-place one fuses only where the residual is channels-last and the other only
    for one group; otherwise it convolves, then adds the residual and applies its ReLU with ``add_relu``, which
    has no bf16 kernel (an internal assert): a bf16 convolution there applies its activation after the op."""
    return channels_last if in_place else groups == 1


@cache
def unavailable() -> str | None:
    """Why this torch build has no oneDNN fused CPU kernels (x86 and Arm builds with MKLDNN have them), or None."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "this torch has no MKLDNN, or it is disabled (torch.backends.mkldnn.enabled)"
    mkldnn = torch.ops.mkldnn
    missing = [name for name in ("_convolution_pointwise", "_reorder_convolution_weight") if not hasattr(mkldnn, name)]
    return f"this torch has no torch.ops.mkldnn.{missing[0]}" if missing else None


@cache
def supports(dtype: DType) -> bool:
    """Whether gawee lowers a ``dtype`` convolution onto oneDNN's fused kernels: f32 always, bf16 on a CPU with
    bf16 arithmetic of its own (:func:`gawee.machine.no_bf16`) where torch runs oneDNN's bf16 kernels, f16 never.

    On such a CPU oneDNN's bf16 convolution multiplies bf16 operands (each product exact in float32), accumulates
    in float32 and rounds once: the op's semantics (``gawee.ops.nn.conv_low_precision``) up to the order of the
    float32 sum. Without bf16 instructions its kernels would convert around every op, so there the op's reference
    lowering runs. f16 is excluded even where the ISA advertises it
    (``torch.ops.mkldnn._is_mkldnn_fp16_supported()``): torch 2.14.1's oneDNN f16 convolution segfaults on
    AVX-512/AMX CPUs for valid strided/padded/dilated geometries. (Some geometries crash or compute wrong values
    in f32 and bf16 too: :func:`safe_geometry`.)
    """
    if unavailable() is not None:
        return False
    return dtype is DType.f32 or (dtype is DType.bf16 and no_bf16() is None and _torch_bf16())


def effective_dilation(kernel: Sequence, dilation: Sequence[int]) -> list[int]:
    """``dilation`` with 1 where the kernel's size is 1 (the same convolution: a window of one tap has nothing to
    spread). oneDNN's convolution on a packed weight (torch 2.14.1) segfaults on a dilated kernel dimension of 1
    in some geometries (stride 2 and padding 1 over a width of 1), f32 and bf16 alike."""
    return [1 if k == 1 else d for k, d in zip(kernel, dilation)]


def _torch_bf16() -> bool:
    """Whether this torch runs oneDNN's bf16 kernels here (it refuses them on a CPU without AVX-512 or AVX-NE)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def safe_geometry(input_shape: Sequence, stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether oneDNN's fused convolution (torch 2.14.1) may run this geometry, ``dilation`` the effective one
    (:func:`effective_dilation`): not a dilated window over an input with a spatial size of 1, on which it
    segfaults (either memory format, on a packed weight), and not a stride of 1 in height and more in width, on
    which it computes wrong values in some geometries (f32 and bf16 on a packed weight, bf16 channels-last on the
    plain one too; benchmarks/onednn_conv_fuzz.py finds them). Such a convolution runs the op's reference
    semantics, whose float32 convolution computes it right."""
    spatial = tuple(input_shape)[2:]
    dilated_over_1 = 1 in spatial and any(d > 1 for d in dilation)
    return not dilated_over_1 and not (len(stride) == 2 and stride[0] == 1 and stride[1] > 1)


def window_in_padding(
    input_shape: Sequence, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> bool:
    """Whether some output of the convolution reads no input element: every tap of its window (``dilation`` the
    effective one) lies in the padding. oneDNN's int8 convolution (torch 2.14.1) computes wrong values in some such
    geometries, either memory format, with or without a zero point (every wrong case of
    ``benchmarks/onednn_conv_fuzz.py --int8`` has one; networks pad less than a window, and have none)."""
    for n, k, s, p, d in zip(tuple(input_shape)[2:], kernel, stride, padding, dilation):
        if not isinstance(n, int):
            return True  # a symbolic size: not known to be safe
        for o in range((n + 2 * p - d * (k - 1) - 1) // s + 1):
            first = o * s - p
            if all(not 0 <= first + t * d < n for t in range(k)):
                return True
    return False


def post_op(act: str | None, params: Sequence[float]) -> tuple[str, list[float], str | None] | None:
    """The oneDNN spelling ``(attr, scalars, algorithm)`` of a fused activation; None if it has none."""
    if act is None:
        return ("none", [], None)
    spelled = POST_OPS.get(act)
    if spelled is None:
        return None
    attr, algorithm = spelled
    return (attr, [float(p) for p in params], algorithm)


def pack_conv_weight(
    weight: torch.Tensor,
    *,
    padding: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    input_shape: Sequence[int],
    channels_last: bool,
) -> torch.Tensor:
    """``weight`` reordered once into the blocked format oneDNN picks for this input size and memory format.

    oneDNN chooses the weight format from the weight's own memory format, so the weight
    is made channels-last first when activations are (as Inductor's freezing does).
    """
    if channels_last:
        weight = weight.contiguous(memory_format=torch.channels_last)
    return torch.ops.mkldnn._reorder_convolution_weight(
        weight, list(padding), list(stride), list(dilation), groups, list(input_shape)
    )


class PackedPerSize:
    """A weight packed for each input size a dynamic-shape module meets: oneDNN's blocked convolution
    and matmul formats and MKL's packed GEMM depend on the input size, and a weight packed for one
    size, run at another, is reordered again inside every call (measured 6x slower on a depthwise
    convolution at batch 1 with the weight packed for batch 2). ``pack(input_shape=size)`` packs for an
    input of that shape; the first call at a size packs once, the ``keep`` most recent sizes stay packed (a size
    that changes every call costs one reorder per call, as an unpacked weight would, and memory stays
    bounded).

    A named callable (``<node>_packed_for(x)`` in the generated code), so fx can print it.
    """

    __module__ = "gawee"

    def __init__(self, name: str, pack: Callable[..., torch.Tensor], keep: int = 4):
        self.__name__ = self.__qualname__ = f"{name}_packed_for"
        self.pack, self.keep = pack, keep
        self.packed: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.for_size(tuple(x.shape))

    def for_size(self, size: tuple[int, ...]) -> torch.Tensor:
        got = self.packed.get(size)
        if got is None:
            got = self.packed[size] = self.pack(input_shape=size)
            if len(self.packed) > self.keep:
                self.packed.popitem(last=False)
        else:
            self.packed.move_to_end(size)
        return got

    def __repr__(self) -> str:
        return f"<{self.__name__} sizes={list(self.packed)}>"
