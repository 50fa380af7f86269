"""measure.fastest on a scripted clock: candidates judged against each other round by round, the clearly slower
dropped after the first rounds, the close ones timed on."""

from __future__ import annotations

import pytest

from gawee.backend import measure


class FakeClock:
    """time.perf_counter and time.sleep on a fake clock that only the candidates' calls advance."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure, "time", clock)
    return clock


def candidate(clock: FakeClock, seconds: float, slowdown=lambda call: 1.0):
    """A callable taking ``seconds`` times ``slowdown(call)`` (its calls counted from 0, first calls included)."""
    calls = []

    def run(*_):
        clock.now += seconds * slowdown(len(calls))
        calls.append(clock.now)

    run.calls = calls
    return run


def _noisy(spread: float = 0.08, start: int = 0):
    """A slowdown whose calls from ``start`` on take 1, 1 + spread, 1 - spread times the time, in turn: rounds whose
    spread hides a difference of a few percent (their median is the time)."""
    return lambda call: 1.0 if call < start else (1.0, 1.0 + spread, 1.0 - spread)[(call - start) % 3]


def test_times_are_judged_against_the_same_rounds_others(clock):
    """A burst of load that hits one candidate's call, then the whole machine slowing down threefold: plain medians
    of each candidate's times would keep the default (10 ms: 10, 10, 30; the other: 9, 18, 27), its times relative
    to the other's in the same round show it 10% faster."""
    # each makes two first calls, then one timed call per round
    default = candidate(clock, 0.010, lambda call: [1, 1, 1, 1, 3][call])
    other = candidate(clock, 0.009, lambda call: [1, 1, 1, 2, 3][call])
    timed = measure.fastest({"default": default, "other": other}, [], budget_s=0.0)
    assert len(other.calls) == 5  # three rounds, then the default is more than CLOSE slower and dropped
    assert timed.chosen == "other"
    assert timed.seconds["other"] < 0.95 * timed.seconds["default"]


def test_the_clearly_slower_are_dropped_and_the_close_timed_on(clock):
    default = candidate(clock, 0.010)
    close = candidate(clock, 0.0102, _noisy(start=2))
    slower = candidate(clock, 0.012)  # not within CLOSE, not FAR behind
    slow = candidate(clock, 0.020)
    candidates = {"default": default, "close": close, "slower": slower, "slow": slow}
    timed = measure.fastest(candidates, [], budget_s=0.0)
    assert len(slow.calls) == 2 + 1  # FAR behind after the first round
    assert len(slower.calls) == 2 + measure.MIN_ROUNDS
    assert len(default.calls) == len(close.calls) == 2 + measure.FINAL_ROUNDS
    assert timed.chosen == "default"  # a 2% difference is within the margin
    want = {"default": 0.010, "close": 0.0102, "slower": 0.012, "slow": 0.020}
    assert timed.seconds == pytest.approx(want, rel=0.02)


def test_close_candidates_whose_rounds_agree_are_decided_after_the_first_rounds(clock):
    """Rounds that put a candidate 2% behind the best in each, with no spread, show it is not faster than the best
    (SURE): it is dropped after MIN_ROUNDS, where rounds with a spread of 8% go on to FINAL_ROUNDS
    (test_the_clearly_slower_are_dropped_and_the_close_timed_on)."""
    default, close = candidate(clock, 0.010), candidate(clock, 0.0102)
    timed = measure.fastest({"default": default, "close": close}, [], budget_s=0.0)
    assert len(default.calls) == len(close.calls) == 2 + measure.MIN_ROUNDS
    assert timed.chosen == "default" and timed.seconds == pytest.approx({"default": 0.010, "close": 0.0102})
    # a candidate 2% ahead of the default is not dropped by its rounds' agreement: the default is
    default, ahead = candidate(clock, 0.0102), candidate(clock, 0.010)
    timed = measure.fastest({"default": default, "ahead": ahead}, [], budget_s=0.0)
    assert len(ahead.calls) == 2 + measure.MIN_ROUNDS and timed.chosen == "default"  # within the margin


def test_candidates_that_ran_already_make_no_untimed_first_call(clock):
    """``warm``: each candidate was called before (its outputs checked), so its first call here is timed, and is
    the first round."""
    a, b = candidate(clock, 0.010, lambda call: 5.0 if call == 0 else 1.0), candidate(clock, 0.0102, _noisy(start=1))
    a(), b()  # the calls that checked them
    timed = measure.fastest({"a": a, "b": b}, [], budget_s=0.0, warm=True)
    assert len(a.calls) == len(b.calls) == 1 + measure.FINAL_ROUNDS
    assert timed.seconds == pytest.approx({"a": 0.010, "b": 0.0102})


def test_a_warm_first_round_only_drops_the_far_slower(clock):
    """With ``warm``, a candidate's first call here can be slower than its steady ones (built before a fork, its
    written pages fault again): the first round drops the far slower (FAR_ONE) but the close ones are judged on
    the rounds after it. Counted among them, a first call 20% slow would hide that the other is 3% behind in every
    round after it, and keep both timed to FINAL_ROUNDS."""
    a = candidate(clock, 0.010, lambda call: 1.2 if call == 1 else 1.0)
    b = candidate(clock, 0.0103)
    a(), b()  # the calls that checked them
    timed = measure.fastest({"a": a, "b": b}, [], budget_s=0.0, warm=True)
    assert len(a.calls) == len(b.calls) == 1 + 1 + measure.MIN_ROUNDS
    assert timed.chosen == "a" and timed.seconds == pytest.approx({"a": 0.010, "b": 0.0103})


def test_warm_candidates_far_behind_are_dropped_after_one_call_or_two(clock):
    """With ``warm``, a candidate FAR_ONE times the quickest on its one call so far runs no second round; one
    FAR behind (but not FAR_ONE) is dropped after the second round, its fastest of two calls."""
    quick, far_one = candidate(clock, 0.010), candidate(clock, 0.010 * (measure.FAR_ONE + 0.1))
    far, close = candidate(clock, 0.010 * (measure.FAR + 0.1)), candidate(clock, 0.0102, _noisy(start=1))
    candidates = {"quick": quick, "far_one": far_one, "far": far, "close": close}
    for fn in candidates.values():
        fn()  # the calls that checked them
    timed = measure.fastest(candidates, [], budget_s=0.0, warm=True)
    assert len(far_one.calls) == 1 + 1 and len(far.calls) == 1 + 2
    assert len(quick.calls) == len(close.calls) == 1 + measure.FINAL_ROUNDS
    assert timed.chosen == "quick"
    assert timed.seconds["far_one"] == pytest.approx(0.010 * (measure.FAR_ONE + 0.1), rel=0.02)


def test_a_tie_ends_the_timing_after_the_first_rounds(clock):
    """Candidates within TIED of each other after MIN_ROUNDS are not timed on to FINAL_ROUNDS: whichever runs, the
    call takes about the same. Ones 2% apart are (test_the_clearly_slower_are_dropped_and_the_close_timed_on)."""
    a, b, c = candidate(clock, 0.010), candidate(clock, 0.01005), candidate(clock, 0.030)
    timed = measure.fastest({"a": a, "b": b, "c": c}, [], budget_s=0.0)
    assert len(a.calls) == len(b.calls) == 2 + measure.MIN_ROUNDS
    assert len(c.calls) == 2 + 1  # FAR behind
    assert timed.chosen == "a"
    # one behind in every round is dropped, and the tie of the others ends the timing
    a, b, c = candidate(clock, 0.010), candidate(clock, 0.01005), candidate(clock, 0.0105)
    timed = measure.fastest({"a": a, "b": b, "c": c}, [], budget_s=0.0)
    assert len(a.calls) == len(b.calls) == len(c.calls) == 2 + measure.MIN_ROUNDS
    assert timed.chosen == "a" and timed.seconds["c"] == pytest.approx(0.0105, rel=0.01)


def test_long_calls_stop_at_the_final_budget(clock):
    """Past the budget the close candidates get FINAL_BUDGET_S more, not FINAL_ROUNDS whatever they cost."""
    a, b = candidate(clock, 0.2), candidate(clock, 0.2 * 1.03, _noisy(start=2))  # close, not a tie, noisy
    measure.fastest({"a": a, "b": b}, [], budget_s=0.0)
    rounds = len(a.calls) - 2
    assert measure.MIN_ROUNDS < rounds < measure.FINAL_ROUNDS
    assert (rounds - 1) * 0.4 < measure.FINAL_BUDGET_S <= rounds * 0.4


def test_a_hopeless_candidate_is_not_timed_past_its_first_calls(clock):
    """A candidate many times slower than the quickest on its second call (a module on a reference kernel) runs no
    round: its time is that call's. Three times slower is not hopeless: it runs the first round (then it is FAR
    behind)."""
    default = candidate(clock, 0.010)
    hopeless = candidate(clock, 0.010 * (measure.HOPELESS + 1))
    slower = candidate(clock, 0.030)
    timed = measure.fastest({"default": default, "hopeless": hopeless, "slower": slower}, [], budget_s=0.0)
    assert len(hopeless.calls) == 2
    assert len(slower.calls) == len(default.calls) == 2 + 1  # FAR behind: the first round ends it
    assert timed.chosen == "default"
    assert timed.seconds["hopeless"] == pytest.approx(0.010 * (measure.HOPELESS + 1))
    # a default FAR behind is dropped after the first round like the others, its time that round's
    quick, slow_default = candidate(clock, 0.010), candidate(clock, 0.010 * (measure.FAR + 0.5))
    other, close = candidate(clock, 0.010 * (measure.FAR + 0.5)), candidate(clock, 0.0102, _noisy(start=2))
    candidates = {"default": slow_default, "quick": quick, "other": other, "close": close}
    timed = measure.fastest(candidates, [], budget_s=0.0)
    assert timed.chosen == "quick" and len(other.calls) == len(slow_default.calls) == 2 + 1
    assert len(quick.calls) == 2 + measure.FINAL_ROUNDS
    assert timed.seconds["default"] == pytest.approx(0.010 * (measure.FAR + 0.5), rel=0.02)
    # the default runs the first round whatever it costs
    slow_default, quick = candidate(clock, 0.010 * (measure.HOPELESS + 1)), candidate(clock, 0.010)
    timed = measure.fastest({"default": slow_default, "quick": quick}, [], budget_s=0.0)
    assert len(slow_default.calls) == 2 + 1 and timed.chosen == "quick"


def test_far_behind_is_judged_again_after_each_round(clock):
    """A candidate within FAR of the quickest's first calls (slow to start: 12.5 ms) but FAR behind its fastest call
    since is dropped after the round that shows it, not timed on to MIN_ROUNDS."""
    quick = candidate(clock, 0.010, lambda call: 1.25 if call < 3 else 1.0)
    behind = candidate(clock, 0.015)
    timed = measure.fastest({"quick": quick, "behind": behind}, [], budget_s=0.0)
    assert len(behind.calls) == len(quick.calls) == 2 + 2
    assert timed.chosen == "quick"
