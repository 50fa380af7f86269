"""Grouped convolution of 8 channels per group: a candidate kernel of :mod:`gawee.backend.dnnl` (RegNet's 3×3s).

Why: oneDNN 3.2 runs a convolution whose groups have 8 input and 8 output channels (RegNet's group width) on its
generic ``jit:avx2`` kernel at a third of an AVX2 CPU's peak of fused multiply-adds or less, and those
convolutions were a quarter of regnet_y_400mf's call at batch 1 (benchmarks/README.md, "Runtime" → "Figures
behind the code").
A group's 8 channels are contiguous in each of oneDNN's layouts (nChw8c, nChw16c, NHWC), so this kernel
(``grouped.c``) reads and writes the activations where they are and computes a group's 8 output channels as one
AVX2 vector: a tile of up to 12 output pixels of a row keeps 12 accumulators in registers, each loaded weight
vector serving all of them. The input rows
an output row reads are copied once into a zero-padded band, so no tile checks bounds. The runtime times it
beside oneDNN's kernels per convolution and keeps the fastest (:meth:`gawee.backend.dnnl_plan._Plan.fastest`).

It computes the bias, a residual and ReLU in its epilogue, for strides 1 and 2 along the width, any kernel
size, padding and dilation, in every layout (in blocks of 16, the AVX-512 ones, only where the channels fill the
last block: it leaves padding lanes unwritten). The C
is compiled once per machine (:mod:`gawee.backend.native`) with floating-point contraction on, so that
``acc += x * w`` is one fused multiply-add (C11 alone forbids it); without a C compiler the candidate is not
offered (:func:`unavailable` says why) and nothing else changes.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from gawee.backend import native

SOURCE = Path(__file__).with_name("grouped.c")

WIDTH = 8
"""Input and output channels per group."""

ACTS = {None: 0, "relu": 1}
"""The activations the epilogue applies (its ``act`` code)."""

BAND_FLOATS = 16384
"""The zero-padded band of input rows a work item reads (``BAND`` in the C): kernel rows × band columns × 8."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled kernel, or why it cannot be had."""
    i, lng, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    argtypes = [p] * 5 + [i] * 4 + [lng] * 4 + [i] * 3 + [lng] * 4 + [i] * 10
    return native.load(SOURCE, {"gawee_group8_conv": argtypes}, flags=("-ffp-contract=fast",))


def unavailable() -> str | None:
    """Why the kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())


def eligible(cin: int, cout: int, groups: int, kernel, stride, dilation, ow: int, act: str | None) -> bool:
    """Whether a convolution of this geometry (``ow``: its output's width) is one the kernel computes."""
    band = kernel[0] * ((ow - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1) * WIDTH
    return groups > 1 and cin == cout == WIDTH * groups and stride[1] in (1, 2) and band <= BAND_FLOATS and act in ACTS


def weights(weight: torch.Tensor) -> torch.Tensor:
    """The filters ``weight`` (8·G, 8, KH, KW) in the order the kernel reads them: [g][kh][kw][c][k]."""
    k, c, kh, kw = weight.shape
    w = weight.detach().to(torch.float32).reshape(k // WIDTH, WIDTH, c, kh, kw)
    return w.permute(0, 3, 4, 2, 1).contiguous().reshape(-1)
