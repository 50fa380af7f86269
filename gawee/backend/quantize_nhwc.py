"""Static quantization of a float32 NCHW tensor into u8 codes held channels-last: a kernel of
:mod:`gawee.backend.dnnl` for an int8 network's input (its stem convolution's codes, ``conv2d_int8_static``).

Why: oneDNN 3.2's scaled reorder from a planar float32 image into interleaved u8 codes took several times as long as
this one pass over a 224×224 image (benchmarks/README.md, static int8 notes), a sizeable part of a small int8
network's call. Both compute the same codes (``quantize_nhwc.c``: the reorder's float32 steps); they
are raced where the source is plain NCHW and the codes channels-last, and the faster kept. The C source is compiled
once per machine (:mod:`gawee.backend.native`); without a C compiler oneDNN's reorder runs, as before.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

from gawee.backend import native

SOURCE = Path(__file__).with_name("quantize_nhwc.c")
KERNEL = "gawee:quantize_nhwc_u8"
"""The kernel's name in a module's steps (``DnnlModule.kernels``)."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lng, p, f = ctypes.c_long, ctypes.c_void_p, ctypes.c_float
    return native.load(SOURCE, {"gawee_quantize_nhwc_u8": [p, p, lng, lng, lng, f, f]})


def unavailable() -> str | None:
    """Why the kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())


def args(src_at, dst: int, shape, inverse: float, zero_point: int) -> tuple:
    """The kernel's arguments after its function: where the source's address is (a ``ctypes.byref`` of a pointer),
    the destination's address, the sizes, the float32 inverse scale and the zero point."""
    n, c, h, w = shape
    return (src_at, dst, n, c, h * w, inverse, float(zero_point))
