"""Choosing between equivalent compiled modules by timing them on this machine.

Which of two lowerings is faster depends on the CPU (its vector width, the kernels a library has
for it) and on the model, so gawee measures instead of guessing: the activation layout
(:mod:`gawee.backend.layout`) and the runtime (``gawee.compile(backend="auto")``) are both picked
here. The candidates run in rounds on the same inputs within a small time budget, each making one
timed call per round, so slow drift of a shared machine hits all of them alike. Candidates on
different runtimes each get a pause and :data:`UNTIMED` untimed calls first (they absorb what the
previous candidate left behind: a runtime's spin-waiting threads) and make :data:`CALLS` timed
calls. Each candidate is judged by its times *relative to the other candidates' in the same round*
(:func:`_paired`): the machine's speed, which moves by 10-30% between seconds on a shared VM, cancels
out. After the first round, one far slower than the quickest (:data:`FAR`, or :data:`FAR_ONE` on one call) is
dropped; after :data:`MIN_ROUNDS`, a candidate clearly slower than the best (:data:`CLOSE`), slower in every
round (:data:`STEADILY`), or shown by its rounds' spread to be at most :data:`TIED` faster than the best
(:data:`SURE`), is dropped and the close ones go on to :data:`FINAL_ROUNDS` unless they are a tie (:data:`TIED`);
one many times slower on its first calls (:data:`HOPELESS`) runs no round. The first candidate is the default:
another is chosen only when it is faster by more than ``margin`` (a noisy tie keeps the default).
"""

from __future__ import annotations

import math
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

CLOSE = 0.10
"""After the first rounds, a candidate whose relative time is more than this fraction above the best's is dropped:
the rounds left go to the close ones."""

FINAL_ROUNDS = 9
"""Rounds the close candidates get, past the time budget, up to :data:`FINAL_BUDGET_S` more. Between candidates
within a few percent of each other (resnet50's three oneDNN layouts at batch 1), three rounds of whole calls chose
wrongly about twice as often as nine (benchmarks/README.md, "Runtime" → "Figures behind the code")."""

FINAL_BUDGET_S = 1.5
"""At most this much more time, past the budget, for the close candidates' rounds."""

HOPELESS = 4.0
"""A candidate whose second call (the first is creation's) took this many times the quickest candidate's is not
timed further: it cannot win, and timing it could cost more than the compile (a module that runs oneDNN's
reference convolutions, as regnet_y_400mf's blocked module once did on AVX-512, is hundreds of times slower than
the others). Its seconds are that call's. The default is always timed."""

FAR = 1.3
"""Once each candidate has made two timed calls (its second call and the first round's; with ``warm``, the first two
rounds), and after each round since, a candidate whose fastest call took more than this many times the quickest
one's is dropped, the default too (its time stands: another wins by far more than the margin): it would not be
within :data:`CLOSE` after the first rounds either, and they are the longest part of timing a CNN's candidates
(the torch lowering's calls beside oneDNN's modules)."""

STEADILY = 0.03
"""After :data:`MIN_ROUNDS`, a close candidate slower than the best by more than this fraction in every round is
dropped: with rounds that move by a percent or two relative to each other, three such rounds do not happen to a
candidate as fast as the best, while one a few percent behind would otherwise run all of :data:`FINAL_ROUNDS`
beside the best (benchmarks/README.md, "Runtime: the oneDNN fusions as a target phase")."""

FAR_ONE = 1.5
""":data:`FAR` where each candidate has made one timed call (``fastest(warm=True)``: each one's first call there, its
outputs checked before, is the first round): a candidate this many times the quickest is dropped before the second
round; :data:`FAR` applies after it, on the fastest of two calls."""

TIED = 0.01
"""After :data:`MIN_ROUNDS`, when the close candidates are all within this fraction of the best, measuring ends:
whichever of them runs, the call takes about the same, and telling them apart would take all of
:data:`FINAL_ROUNDS`."""

SURE = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753, 1.746)
"""Student's t at 95% (one-sided) for 1, 2, ... degrees of freedom (the last for more). After :data:`MIN_ROUNDS`, a
candidate whose time relative to the best's in the same rounds (the mean of the logarithms of the ratios) is above
``-TIED`` by this many standard errors of that mean is dropped: with 95% confidence it is at most :data:`TIED`
faster than the best, so timing it on could only change the choice by less than that. Rounds that move together
(a candidate 2% behind in each, the spread a fraction of that) decide after the first rounds; noisy ones (a burst
of load in one round) go on to :data:`FINAL_ROUNDS`."""

CALLS = 2
"""Timed calls per candidate and round, when the candidates are different runtimes (else 1)."""

UNTIMED = 2
"""Untimed calls before them (the candidate's threads awake, its buffers in cache); one when every
candidate's call is LONG_CALL_S or more."""

LONG_CALL_S = 0.05
"""A call this long is not moved by what a previous runtime leaves behind (its threads spin for
milliseconds) and its data does not fit in cache anyway: one untimed call per round suffices, and a second
only lengthens the compile (by a sixth on vit_b_16 at batch 8)."""

SETTLE_S = 0.1
"""Pause before each candidate's calls when they are different runtimes: the previous one's
spin-waiting threads (ONNX Runtime's pool, OpenMP's) go idle instead of taking the cores from it.
Without it, the torch lowering's calls alternating with ONNX Runtime's read more than twice their time alone
(mobilenet_v3_large at batch 1); with this pause and two untimed calls, about their time alone."""


@dataclass(frozen=True)
class Timings:
    """Seconds per call of each candidate, and the one chosen. A candidate's seconds are its median time relative
    to the close candidates' in the same rounds, scaled by their typical time (:func:`_paired`): what it would take
    when they take what they took."""

    seconds: dict[str, float]
    chosen: str


def fastest(
    candidates: dict[str, Callable[..., object]],
    inputs: Sequence[torch.Tensor],
    *,
    margin: float = 0.05,
    budget_s: float = BUDGET_S,
    settle_s: float = 0.0,
    warm: bool = False,
) -> Timings:
    """Time each of ``candidates`` (name → callable) on ``inputs``; the first unless another is more than
    ``margin`` (a fraction of the first's time) faster, then the fastest. ``settle_s``: the pause before each
    candidate's calls (:data:`SETTLE_S` when the candidates are different runtimes, whose thread pools spin between
    calls; none is needed between modules on torch's one pool). ``warm``: each candidate has made its first call
    already (its outputs were checked), so none is made untimed first."""
    names = list(candidates)
    rounds: list[dict[str, float]] = []  # per round, each candidate's time in it
    min_rounds = MIN_BLOCK_ROUNDS if settle_s else MIN_ROUNDS
    # With ``warm``, the first round is each candidate's first call here, which can be slower than its steady calls
    # for a candidate that ran last before other work (a fork since leaves its written pages to fault again):
    # judged only for the far slower (FAR_ONE, FAR), not among the close ones.
    skip = 1 if warm and not settle_s else 0
    with torch.no_grad():
        second = []
        for fn in candidates.values():  # first calls: primitive creation, allocation: nobody's steady time
            if not warm:
                fn(*inputs)
            t0 = time.perf_counter()
            fn(*inputs)
            second.append(time.perf_counter() - t0)
        untimed = 1 if min(second) >= LONG_CALL_S else UNTIMED
        hopeless = {name: t for name, t in zip(names, second) if name != names[0] and t > HOPELESS * min(second)}
        alive = [name for name in names if name not in hopeless]
        if warm and not settle_s:  # each call so far was a steady one (the first was its check): the first round
            rounds.append({name: second[names.index(name)] for name in alive})
            alive = _near(rounds, alive, FAR_ONE)
        start = time.perf_counter()
        while len(alive) > 1 or not rounds:
            times = {}
            for name in alive:
                fn = candidates[name]
                if settle_s:
                    time.sleep(settle_s)
                    for _ in range(untimed):
                        fn(*inputs)
                calls = []
                for _ in range(CALLS if settle_s else 1):
                    t0 = time.perf_counter()
                    fn(*inputs)
                    calls.append(max(time.perf_counter() - t0, 1e-9))  # a ratio's operand
                times[name] = statistics.median(calls)
            rounds.append(times)
            # the far slower go no further, judged again each round on their fastest call so far (without
            # ``warm``, their second call was a sample too; with it, that call was the first round)
            if not skip:
                alive = _near([*rounds, {name: second[names.index(name)] for name in names}], alive, FAR)
            elif len(rounds) >= 2:
                alive = _near(rounds, alive, FAR)
            if len(rounds) >= MAX_ROUNDS or len(alive) == 1:
                break
            spent = time.perf_counter() - start
            steady = rounds[skip:]
            if len(steady) < min_rounds:
                continue
            seconds = _paired(steady, alive)
            best = min(seconds[name] for name in alive)  # not a candidate dropped earlier: none would stay alive
            alive = [name for name in alive if seconds[name] <= best * (1 + CLOSE)]
            leader = min(alive, key=seconds.__getitem__)
            if len(steady) >= MIN_ROUNDS:  # blocks of calls of different runtimes: not after their first two
                alive = [
                    name
                    for name in alive
                    if name == leader
                    or (
                        min(r[name] / r[leader] for r in steady) <= 1 + STEADILY
                        and not surely_not_faster([r[name] / r[leader] for r in steady], TIED)
                    )
                ]
            tied = all(seconds[name] <= best * (1 + TIED) for name in alive)
            if (
                len(alive) == 1
                or tied
                or (spent >= budget_s and (len(rounds) >= FINAL_ROUNDS or spent >= budget_s + FINAL_BUDGET_S))
            ):
                break
    steady = rounds[skip:]
    seconds = {**_paired(rounds, alive), **(_paired(steady, alive) if steady else {}), **hopeless}
    default = names[0]
    best = min(alive, key=seconds.__getitem__)
    chosen = best if seconds[best] < seconds[default] * (1 - margin) else default
    return Timings(seconds, chosen)


def surely_not_faster(ratios: Sequence[float], fraction: float) -> bool:
    """Whether a candidate's times divided by another's in the same rounds (two or more) show, with :data:`SURE`'s
    confidence, that it is at most ``fraction`` faster than the other: the mean of their logarithms, less that many
    standard errors of it, is at least ``log(1 - fraction)``."""
    logs = [math.log(r) for r in ratios]
    error = statistics.stdev(logs) / math.sqrt(len(logs))
    return statistics.fmean(logs) - SURE[min(len(logs) - 1, len(SURE)) - 1] * error >= math.log(1 - fraction)


def _near(samples: list[dict[str, float]], alive: list[str], far: float) -> list[str]:
    """The candidates of ``alive`` whose fastest call in ``samples`` (rounds of calls) is at most ``far`` times the
    quickest one's."""
    quickest = {name: min(s[name] for s in samples) for name in alive}
    return [name for name in alive if quickest[name] <= far * min(quickest.values())]


def _paired(rounds: list[dict[str, float]], close: list[str]) -> dict[str, float]:
    """Each candidate's median over the rounds it ran of its time divided by the geometric mean of the ``close``
    candidates' times in the same round (they ran in every round), times the geometric mean of their medians."""
    scale = [statistics.geometric_mean([r[name] for name in close]) for r in rounds]
    typical = statistics.geometric_mean([statistics.median(r[name] for r in rounds) for name in close])
    return {  # every candidate ran in the first round
        name: typical * statistics.median(r[name] / s for r, s in zip(rounds, scale) if name in r) for name in rounds[0]
    }
