"""This machine as gawee's measurements see it: timing a call, counting page faults, the CPU's name and flags.

Below the backends (which time kernel candidates) and the cache (whose answers are keyed by the CPU); the
runtime profile of a compiled graph (:mod:`gawee.profile`) is built on it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gawee.cpu import cpu_info


@dataclass
class Timing:
    """Seconds per call over ``samples`` timed calls."""

    samples: list[float]
    page_faults: float | None = None
    """Minor page faults of the process per timed call (None where not counted): memory the allocator gave back
    to the OS and the call faulted in again (``gawee.backend.allocator``)."""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> tuple[float, float]:
        """(10th, 90th) percentile."""
        s = sorted(self.samples)
        return s[len(s) // 10], s[(len(s) * 9) // 10]

    def __str__(self) -> str:
        lo, hi = self.spread
        faults = "" if self.page_faults is None else f", {self.page_faults:.0f} page faults per call"
        return f"{self.median * 1e3:.2f} ms (p10 {lo * 1e3:.2f}, p90 {hi * 1e3:.2f}, n={len(self.samples)}{faults})"

    def as_dict(self) -> dict:
        lo, hi = self.spread
        return {
            "median_s": self.median,
            "p10_s": lo,
            "p90_s": hi,
            "samples": len(self.samples),
            "page_faults_per_call": self.page_faults,
        }


def minor_faults() -> int:
    """Minor page faults of this process so far (``getrusage``): first writes to pages the OS handed out."""
    import resource  # POSIX only

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_call(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 20, budget_s: float = 10.0) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones (fewer if they would take
    longer than ``budget_s``, never fewer than 3)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        samples: list[float] = []
        faults = minor_faults()
        start = time.perf_counter()
        while len(samples) < repeats and (len(samples) < 3 or time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return Timing(samples, (minor_faults() - faults) / len(samples))


def cpu_name() -> str:
    """The CPU's model name (the figures depend on it), or the platform's processor string."""
    import platform

    return cpu_info().get("model name") or platform.processor() or "unknown CPU"


BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 flags (``/proc/cpuinfo``) of bf16 arithmetic: AVX512-BF16's dot products and conversions, AMX's tiles."""


def no_bf16(device: torch.device | None = None) -> str | None:
    """Why ``device`` (default: this CPU) has no bf16 arithmetic of its own — its bf16 kernels convert to float32 and
    back around every op, slower than float32 and less exact —, or None where it has (an x86 CPU with
    :data:`BF16_FLAGS`, an Arm one with ``bf16`` among its features, a CUDA device torch says supports it) or where
    nothing says (no ``/proc/cpuinfo``)."""
    if device is not None and device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        return None if supported else f"{torch.cuda.get_device_name(device)} has no bf16 arithmetic"
    if device is not None and device.type != "cpu":
        return None
    info = cpu_info()
    if "flags" in info:
        if any(flag in info["flags"].split() for flag in BF16_FLAGS):
            return None
        return f"this CPU has no bf16 instructions (neither of {', '.join(BF16_FLAGS)} among /proc/cpuinfo's flags)"
    if "Features" in info:  # Arm
        return None if "bf16" in info["Features"].split() else "this CPU has no bf16 instructions (Arm's bf16 feature)"
    return None
