"""Choosing between equivalent compiled modules by timing them on this machine.

Which of two lowerings is faster depends on the CPU (its vector width, the kernels a library has
for it) and on the model, so gawee measures instead of guessing: the activation layout
(:mod:`gawee.backend.layout`) and the runtime (``gawee.compile(backend="auto")``) are both picked
here. The candidates run in rounds on the same inputs within a small time budget, each making one
timed call per round, so slow drift of a shared machine hits all of them alike. Candidates on
different runtimes each get a pause and :data:`UNTIMED` untimed calls first (they absorb what the
previous candidate left behind: a runtime's spin-waiting threads) and make :data:`CALLS` timed
calls. The first candidate is the default: another is chosen only when its median is faster by
more than ``margin`` (a noisy tie keeps the default).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

BUDGET_S = 0.3
"""Time spent timing the candidates (at least :data:`MIN_ROUNDS` and at most :data:`MAX_ROUNDS` rounds)."""

MIN_ROUNDS = 3
MAX_ROUNDS = 25
MIN_BLOCK_ROUNDS = 2
"""At least this many rounds when each round is a block of calls per candidate (different runtimes)."""

CALLS = 2
"""Timed calls per candidate and round, when the candidates are different runtimes (else 1)."""

UNTIMED = 2
"""Untimed calls before them (the candidate's threads awake, its buffers in cache); one when every
candidate's call is LONG_CALL_S or more."""

LONG_CALL_S = 0.05
"""A call this long is not moved by what a previous runtime leaves behind (its threads spin for
milliseconds) and its data does not fit in cache anyway: one untimed call per round suffices. On
vit_b_16 at batch 8 (0.7 s per call) ``backend="auto"`` compiled in 18.0-18.5 s with one, 21.1 s with two
(each in a process of its own)."""

SETTLE_S = 0.1
"""Pause before each candidate's calls when they are different runtimes: the previous one's
spin-waiting threads (ONNX Runtime's pool, OpenMP's) go idle instead of taking the cores from it.
Measured on mobilenet_v3_large at batch 1 on an Intel Xeon (torch lowering 9.0 ms alone, ORT 4.5 ms):
single calls alternating with ORT's read 21 ms after a 10 ms pause and one untimed call; with this
pause and two untimed calls, 8.9–9.9 ms."""


@dataclass(frozen=True)
class Timings:
    """Median seconds per call of each candidate, and the one chosen."""

    seconds: dict[str, float]
    chosen: str


def fastest(
    candidates: dict[str, Callable[..., object]],
    inputs: Sequence[torch.Tensor],
    *,
    margin: float = 0.05,
    budget_s: float = BUDGET_S,
    settle_s: float = 0.0,
) -> Timings:
    """Time each of ``candidates`` (name → callable) on ``inputs``; the first unless another's median is
    more than ``margin`` (a fraction of the first's time) faster, then the fastest. ``settle_s``: the
    pause before each candidate's calls (:data:`SETTLE_S` when the candidates are different runtimes,
    whose thread pools spin between calls; none is needed between modules on torch's one pool)."""
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    with torch.no_grad():
        second = []
        for fn in candidates.values():  # first calls: primitive creation, allocation: nobody's steady time
            fn(*inputs)
            t0 = time.perf_counter()
            fn(*inputs)
            second.append(time.perf_counter() - t0)
        untimed = 1 if min(second) >= LONG_CALL_S else UNTIMED
        start = time.perf_counter()
        rounds = 0
        while rounds < (MIN_BLOCK_ROUNDS if settle_s else MIN_ROUNDS) or time.perf_counter() - start < budget_s:
            for name, fn in candidates.items():
                if settle_s:
                    time.sleep(settle_s)
                    for _ in range(untimed):
                        fn(*inputs)
                for _ in range(CALLS if settle_s else 1):
                    t0 = time.perf_counter()
                    fn(*inputs)
                    times[name].append(time.perf_counter() - t0)
            rounds += 1
            if rounds >= MAX_ROUNDS:
                break
    seconds = {name: statistics.median(ts) for name, ts in times.items()}
    default = names[0]
    best = min(names, key=seconds.__getitem__)
    chosen = best if seconds[best] < seconds[default] * (1 - margin) else default
    return Timings(seconds, chosen)
