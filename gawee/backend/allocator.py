"""The process's memory allocator: activation memory a call frees is kept for the next call, not given back to the OS.

A module that torch runs allocates its activations on every call (torch's CPU allocator is ``malloc``). glibc's
``malloc`` gives a freed block back to the operating system when the block was mapped on its own (above the *mmap
threshold*) or when the free memory at the top of its heap exceeds the *trim threshold*. Both thresholds adapt to
the sizes freed so far, and on a graph whose activations come in many sizes they lag behind: the next call's
first writes to the returned pages fault again, one minor page fault per 4 KiB page. ONNX Runtime never pays for
this, as its arena keeps the memory of one run for the next.

On densenet121 under oneDNN Graph's runtime, plain glibc faulted thousands of pages on every call and ran slower
than with the settings below, which faulted none (``benchmarks/bench_allocator.py``; the figures are in
benchmarks/README.md, "Runtime" → Notes). Models whose calls did not fault ran within the spread between
processes either way.

:func:`keep_freed_memory` fixes both thresholds (``mallopt``): blocks up to 32 MiB, the largest glibc allows
for the mmap threshold, come from the heap, and the heap's top is kept up to 1 GiB. The process then holds on
to the peak of its heap, as ONNX Runtime's arena and torch's CUDA caching allocator do. Blocks above 32 MiB
are still mapped one by one. The setting is process-wide and lasts for the rest of the process.
``gawee.compile`` applies it unless ``TorchOptions.keep_freed_memory`` is False. It also applies it before
it measures anything, so the layout and runtime choices are timed with it. Other C libraries (musl, macOS)
are left alone, and the report says why.
"""

from __future__ import annotations

import ctypes
import platform
import threading

from gawee.machine import minor_faults  # noqa: F401  (re-exported: time_call counts them)

MMAP_THRESHOLD = 32 << 20
"""glibc's largest mmap threshold on 64-bit machines (``DEFAULT_MMAP_THRESHOLD_MAX``): smaller blocks come from
the heap."""

TRIM_THRESHOLD = 1 << 30
"""Free memory at the top of the heap is kept up to this much."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (``<malloc.h>``)."""

_lock = threading.Lock()
_state: str | None = None
"""What :func:`keep_freed_memory` did in this process (None: not called yet)."""


def keep_freed_memory() -> str:
    """Set glibc's thresholds (once per process) so freed activation memory stays in the process.
    Returns what was done, for the compile report. Where the C library is not glibc, or ``mallopt``
    refuses a value, it says so and changes nothing more."""
    global _state
    with _lock:
        if _state is None:
            _state = _apply()
        return _state


def _apply() -> str:
    libc_name, version = platform.libc_ver()
    if libc_name != "glibc":
        return f"allocator left as it is: the C library is {libc_name or 'not glibc'}, not glibc"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError) as e:
        return f"allocator left as it is: glibc's mallopt is not reachable ({e})"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for param, value, name in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD, "M_MMAP_THRESHOLD"),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD, "M_TRIM_THRESHOLD"),
    ):
        if mallopt(param, value) != 1:
            return f"allocator: glibc {version} refused mallopt({name}, {value})"
    return (
        f"freed memory kept in the process (glibc {version}: mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 30} GiB)"
    )
