"""Winograd F(4×4, 3×3) convolution: a candidate kernel of :mod:`gawee.backend.dnnl` for 3×3 stride-1 convolutions.

Why: on an AVX2 CPU the direct convolutions of oneDNN 3.2 and of ONNX Runtime (MLAS's NCHWc kernels) run close to
the machine's peak of floating-point operations, so no direct kernel can be much faster. Winograd's algorithm
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016) does fewer of them: each 6×6 input tile
and 3×3 filter are transformed so that a 4×4 block of outputs needs 36 multiplications per input-output channel
pair instead of 144. The products become 36 independent matrix products over the channels, which oneDNN's matmul
primitive runs near peak; the transforms are a pass over the input and one over the output (``winograd.c``).
resnet's 3×3 convolutions at batch 1 ran about twice as fast this way as ONNX Runtime's. Where the channels are many
and the image small (512 channels at 7×7) the transformed weights, 4× the plain ones, make it slower: the runtime
times it beside oneDNN's kernels and keeps the fastest per convolution. Its rounding differs from the direct
convolution's by a few units in the sixth digit (relative to the output's magnitude; float32).

The transforms are C, compiled once per machine (:mod:`gawee.backend.native`). Without a C compiler the candidate
is not offered (:func:`unavailable` says why); nothing else changes.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from gawee.backend import native

SOURCE = Path(__file__).with_name("winograd.c")

TILE, ALPHA = 4, 6
"""Outputs per tile side, and the transformed tile's side (TILE + 3 - 1)."""

ACTS = {None: 0, "relu": 1}
"""The activations the output transform applies (its ``act`` code)."""

_G = torch.tensor(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    dtype=torch.float64,
)
"""The filter transform: U = G g Gᵀ."""

_GG = torch.kron(_G, _G).float()
"""G ⊗ G, rounded once to float32: the 36 × 9 matrix that takes a filter's taps to its transformed tile."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled transforms, or why they cannot be had."""
    i, lng, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    return native.load(
        SOURCE,
        {
            "gawee_wino_input": [p, p, i, i, i, lng, lng, lng, lng, i, i, i, i, i, i, i],
            "gawee_wino_output": [p, p, p, p, i, i, i, i, lng, lng, lng, lng, i, i, i, i, i],
        },
    )


def unavailable() -> str | None:
    """Why the Winograd kernel cannot run here, or None."""
    return _load()[1]


def library() -> ctypes.CDLL:
    return native.library(_load())


def tiles(size: int, padding: int) -> int:
    """Tiles along one side for an output of ``size + 2·padding - 2``."""
    return -(-(size + 2 * padding - 2) // TILE)


CHUNK_BYTES = (8 << 20, 2 << 20)
"""Besides the whole batch at once, chunks whose transformed input and output fit these many bytes (the last
levels of cache): the runtime times each chunking and keeps the fastest. Batch 8 of 64 channels at 56×56 ran up
to twice as fast in chunks of a few megabytes as whole (tens of megabytes of transformed tiles); with 512
channels at 7×7 the whole batch was fastest (the matmul's rows are the tiles: fewer rows, less reuse of the
weights)."""


def chunkings(n: int, cin: int, cout: int, h: int, w: int, padding) -> list[int]:
    """The rows of tiles per chunk to time for a batch of ``n`` images: all ``n × tiles`` rows, and the most that
    fit each of :data:`CHUNK_BYTES` (a divisor of the rows, so every chunk is alike)."""
    rows, row_bytes = n * tiles(h, padding[0]), ALPHA * ALPHA * tiles(w, padding[1]) * (cin + cout) * 4
    found = [rows]
    for budget in CHUNK_BYTES:
        fit = [r for r in range(1, rows + 1) if rows % r == 0 and r * row_bytes <= budget]
        if fit and fit[-1] not in found:
            found.append(fit[-1])
    return found


def weights(weight: torch.Tensor) -> torch.Tensor:
    """The filters ``weight`` (K, C, 3, 3) transformed, as the 36 matrices (36, C, K) the products take."""
    k, c = weight.shape[:2]
    # G w Gᵀ for every filter at once: (G ⊗ G) times the filters as columns, read in (c, k) order. In float32, each
    # tap a sum of nine products: a few units in the last place from the float64 transform, as the kernel's own
    # input and output transforms round, at less than half float64's time (its products are twice the bytes).
    columns = weight.detach().permute(1, 0, 2, 3).reshape(c * k, 9).float()
    return (_GG @ columns.T).reshape(ALPHA * ALPHA, c, k)


def eligible(cin: int, cout: int, kernel, stride, dilation, groups: int, act: str | None) -> bool:
    """Whether a convolution of this geometry is one the kernel computes."""
    return (
        list(kernel) == [3, 3]
        and list(stride) == [1, 1]
        and list(dilation) == [1, 1]
        and groups == 1
        and cin % 8 == 0
        and cout % 8 == 0
        and act in ACTS
    )
