"""Depthwise convolution with its activation: a candidate kernel of :mod:`gawee.backend.dnnl` (MobileNet's and
EfficientNet's k×k depthwise convolutions).

Why: oneDNN 3.2 applies an expensive activation after its depthwise kernel at a fraction of the speed of the
convolution: its ``jit_dw`` kernel with SiLU as a post-op took more than twice as long as the convolution alone,
slower than ONNX Runtime's convolution and separate SiLU together, and efficientnet_b0's depthwise convolutions
(each followed by SiLU) were a fifth of the model's call (benchmarks/README.md, "Runtime" → "Figures behind the
code").
This kernel (``depthwise.c``) reads and writes the activations where oneDNN keeps them (nChw16c / nChw8c, or
NHWC), one vector of channels per pixel. It keeps the input rows an output row reads in a ring of rows padded with
zeros (no tap checks bounds), computes output pixels in tiles of 8, and the bias, a residual and the activation in
its epilogue (SiLU with a polynomial e^x). It can also apply an activation to its input as the rows enter the ring,
once per element: a SiLU only it reads moves there from its producer's post-op (the onednn target phase's
``rules/targets/onednn/3-depthwise.rules`` makes an ``onednn_depthwise`` with ``act_in``). The runtime times
it beside oneDNN's kernels per convolution and keeps the fastest (:meth:`gawee.backend.dnnl_plan._Plan.fastest`), which
made efficientnet_b0's blocked module about a tenth faster.

The C is compiled once per machine (:mod:`gawee.backend.native`) with floating-point contraction on; its vector
is 16 channels where the compiler targets AVX-512, else 8, and the blocked layout is offered only where oneDNN's
block is that vector (NHWC: where the channels are a multiple of it). Without a C compiler the candidate is not
offered (:func:`unavailable` says why) and nothing else changes.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from gawee.backend import native

SOURCE = Path(__file__).with_name("depthwise.c")

ACTS = {None: 0, "relu": 1, "silu": 2, "hardswish": 3}
"""The activations the epilogue applies, and the prologue to the input as it reads it (their ``act`` codes): each
maps 0 to 0, so a blocked layout's padding lanes (zero weights, zero bias) stay zero, and so does the padding
around the image."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled kernel, or why it cannot be had."""
    i, lng, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    argtypes = [p] * 5 + [i] * 4 + [lng] * 4 + [i] * 2 + [lng] * 4 + [i] * 10
    functions = {"gawee_depthwise_conv": argtypes, "gawee_depthwise_width": [], "gawee_depthwise_ring": []}
    return native.load(SOURCE, functions, flags=("-ffp-contract=fast",))


def unavailable() -> str | None:
    """Why the kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())


def width() -> int:
    """The channels in the kernel's vector (16 on AVX-512, else 8)."""
    return library().gawee_depthwise_width()


def eligible(cin: int, cout: int, groups: int, kernel, stride, padding, dilation, w: int, ow: int, act) -> bool:
    """Whether a convolution of this geometry (``w``, ``ow``: its input's and output's widths) is one the kernel
    computes: its input rows fit the ring (``RING`` in the C) and it applies ``act``."""
    span = (kernel[0] - 1) * dilation[0] + 1
    padded = max((ow - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1, padding[1] + w)
    fits = kernel[0] <= 64 and (span + 1) * padded * width() <= library().gawee_depthwise_ring()
    return groups > 1 and cin == cout == groups and act in ACTS and fits


def weights(weight: torch.Tensor, vector: int) -> torch.Tensor:
    """The filters ``weight`` (C, 1, KH, KW) in the order the kernel reads them, [cb][kh][kw][vector], zero past
    the channels."""
    c, _, kh, kw = weight.shape
    chunks = -(-c // vector)
    w = torch.zeros(chunks * vector, kh, kw)
    w[:c] = weight.detach().to(torch.float32)[:, 0]
    return w.reshape(chunks, vector, kh, kw).permute(0, 2, 3, 1).contiguous().reshape(-1)


def bias(values: torch.Tensor, vector: int) -> torch.Tensor:
    """The bias padded with zeros to whole vectors."""
    c = values.shape[0]
    b = torch.zeros(-(-c // vector) * vector)
    b[:c] = values.detach().to(torch.float32)
    return b
