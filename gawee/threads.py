"""torch's intra-op thread count, set for a block and restored after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads. Small tensor work (rewriting, the harness) is
    faster on one thread: waking a pool costs more than the arithmetic, and far more when
    other processes hold the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
