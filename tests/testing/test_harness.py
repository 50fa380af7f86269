"""The harness is itself tested: every planted unsound rule is caught, every correct twin passes."""

import re
from pathlib import Path

import pytest
import torch

import gawee
from gawee.cli import main
from gawee.testing import check_rule
from gawee.testing.harness import _no_worse
from tests.conftest import HARNESS

DATA = Path(__file__).resolve().parents[1] / "data"
UNSOUND = gawee.load_rules(DATA / "unsound").rules
TWINS = gawee.load_rules(DATA / "twins").rules


def test_the_corpus_is_big_enough():
    assert len(UNSOUND) >= 15 and len(TWINS) >= 15


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_planted_unsound_rule_is_caught(rule):
    result = check_rule(rule, examples=200)
    HARNESS["planted unsound"] += 1
    HARNESS["caught"] += result.verdict == "UNSOUND"
    HARNESS["examples"] += result.examples
    HARNESS["seconds"] += result.seconds
    assert result.verdict == "UNSOUND", f"{rule.name} ({rule.location}) slipped through: {result.verdict}"
    cx = str(result.counterexample)
    assert rule.name in cx and "before:" in cx and "values:" in cx


@pytest.mark.parametrize("rule", TWINS, ids=[r.name for r in TWINS])
def test_correct_twin_passes(rule):
    result = check_rule(rule, examples=200)
    HARNESS["correct twins"] += 1
    HARNESS["twins passing"] += result.verdict == "sound"
    HARNESS["examples"] += result.examples
    HARNESS["seconds"] += result.seconds
    assert result.verdict == "sound", str(result.counterexample or result.guard_failures)


def test_counterexamples_are_shrunk_and_readable():
    rule = next(r for r in UNSOUND if r.name == "reassociate_floats")
    cx = check_rule(rule, examples=200).counterexample
    text = str(cx)
    assert "max abs error" in text and "> allowed" in text
    assert re.search(r"%x: f\d\d\[1?\] =", text)  # shrunk to a single element
    assert cx.max_error > cx.allowed


def test_runs_are_reproducible_with_a_seed():
    rule = next(r for r in TWINS if r.name == "bias_per_channel")
    a, b = check_rule(rule, 60, seed=7), check_rule(rule, 60, seed=7)
    assert (a.examples, a.guard_hits, a.fired) == (b.examples, b.guard_hits, b.fired)


def test_guard_coverage_and_necessity_are_reported():
    rules = gawee.load_rules_text(
        "rule rare: y: relu(x) where x.rank == 4 and x.shape[0] == 3 and x.shape[1] == 3 and x.shape[2] == 3 "
        "and x.shape[3] == 3 => y\n"
        "rule needed: y: reshape(x, shape=_) where y.shape == x.shape => x\n"
        "rule vacuous: y: relu(x) where x.rank >= 0 and x.rank < 100 => relu(relu(x))\n",
        "cov.rules",
    )
    rare, needed, vacuous = (check_rule(r, 100) for r in rules.rules)
    assert rare.verdict in ("untested", "weak") and rare.hit_rate < 0.05
    assert needed.guard_verdict == "needed" and needed.guard_needed > 0
    assert vacuous.guard_verdict == "always true"


def test_check_cli_exit_codes(capsys):
    assert main(["check", str(DATA / "twins" / "algebra.rules"), "--examples", "50"]) == 0
    out = capsys.readouterr().out
    assert "softmax_with_max" in out and "0 unsound" in out
    assert (
        main(["check", str(DATA / "unsound" / "algebra.rules"), "--examples", "100", "--rule", "cast_any_dtype"]) == 1
    )
    out = capsys.readouterr().out
    assert "cast_any_dtype" in out and "is unsound" in out and "f16" in out
    assert main(["check", str(DATA / "nope.rules")]) == 2
    assert "no such rules file" in capsys.readouterr().err


def test_a_rewrite_that_avoids_an_overflow_of_the_original_is_not_flagged():
    """f16 linear + add folded into the bias: the original overflows in one element (-inf where float64
    gives -40942), the rewrite does not; another element overflows in both. Element by element the
    rewrite is no farther from the truth, so it is accepted; one that is farther is not."""
    ref = torch.tensor([float("-inf"), float("inf"), 3.0], dtype=torch.float16)
    truth = torch.tensor([-40942.3, 79222.0, 3.0], dtype=torch.float64)
    better = torch.tensor([-40960.0, float("inf"), 3.0], dtype=torch.float16)
    assert _no_worse(ref, better, truth, allowed=0.5)
    assert not _no_worse(ref, torch.tensor([-40960.0, float("inf"), 4.0], dtype=torch.float16), truth, allowed=0.5)
    assert not _no_worse(ref, better, None, allowed=0.5)
