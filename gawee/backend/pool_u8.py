"""Max pooling of u8 codes held channels-last: a kernel of :mod:`gawee.backend.dnnl` for a max pool that reads the
codes an int8 convolution wrote (rules/precision/int8.rules' ``requantize_through_max_pool``: a ResNet's stem).

Why: oneDNN 3.2's u8 pooling kernel took several times OpenVINO's on resnet50's stem pool, in some processes
(benchmarks/README.md, static int8 notes); this one pass over the codes, a vector max of each pixel's channels, is
raced against it where the codes are held channels-last, and the faster kept. The C source (``pool_u8.c``) is
compiled once per machine (:mod:`gawee.backend.native`); without a C compiler oneDNN's kernel runs, as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from gawee.backend import native

SOURCE = Path(__file__).with_name("pool_u8.c")
KERNEL = "gawee:max_pool_u8"
"""The kernel's name in a module's steps (``DnnlModule.kernels``)."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lng, p = ctypes.c_long, ctypes.c_void_p
    return native.load(SOURCE, {"gawee_max_pool_u8": [p, p, *([lng] * 14)]})


def unavailable() -> str | None:
    """Why the kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())


def windows_reach_the_image(
    size: Sequence[int], out: Sequence[int], kernel: Sequence[int], stride, padding, dilation
) -> bool:
    """Whether every output position's window holds a position inside the image, in each spatial dimension (the
    kernel's max starts from the smallest code, 0, and skips the padding: a window of padding only would be 0
    where the pooled value is -inf). torch's padding of at most half the window always does."""
    for i, o, k, s, p, d in zip(size, out, kernel, stride, padding, dilation):
        for y in range(o):
            start = y * s - p
            if not any(0 <= start + j * d < i for j in range(k)):
                return False
    return True


def args(src: int, dst: int, shape: Sequence[int], out: Sequence[int], kernel, stride, padding, dilation) -> tuple:
    """The kernel's arguments after its function: source and destination addresses, then the sizes."""
    n, c, h, w = shape
    return (src, dst, n, c, h, w, out[2], out[3], *kernel, *stride, *padding, *dilation)
