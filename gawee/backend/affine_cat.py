"""Concatenation along channels with a per-channel affine map and ReLU in the same pass: a kernel of
:mod:`gawee.backend.dnnl` for a batch norm (and its ReLU) whose input is a concatenation read by it alone.

Why: DenseNet's every layer concatenates all earlier features and normalizes the result (cat → batch norm → ReLU
→ 1×1 convolution). Run as oneDNN's concatenation and then the batch norm, that is two passes over the
concatenated tensor, each reading and writing all of it; here one pass reads the parts and writes the normalized
result. Those two passes were a sixth of densenet121's call (benchmarks/README.md, "Runtime" → "Figures behind
the code").
The C source (``affine_cat.c``) is compiled once per machine (:mod:`gawee.backend.native`); without a C compiler
the runtime concatenates and normalizes in two steps, as before.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

from gawee.backend import native

SOURCE = Path(__file__).with_name("affine_cat.c")

ACTS = {None: 0, "relu": 1}
"""The activations the kernel applies (its ``relu`` flag)."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    i, lng, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    return native.load(SOURCE, {"gawee_affine_cat": [p, p, i, p, p, p, i, i, lng, i]})


def unavailable() -> str | None:
    """Why the kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())
