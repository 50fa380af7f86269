"""Approximate rules in the soundness harness: judged by their declared bound, in float64, never by the solver."""

import re

import pytest

from gawee import load_rules_text
from gawee.rewrite.ruleset import PRECISIONS, load_rules
from gawee.testing.harness import APPROXIMATE_NOTE, check_rule

BF16 = load_rules(PRECISIONS["bf16"])


def _tight_twins() -> list:
    """The bundled bf16 rules with each bound cut to what float32 alone would allow (bf16 operands declared with
    an f32 bound): the roundings to bf16 are left out."""
    text = PRECISIONS["bf16"].read_text()
    text = re.sub(
        r"\(4 \* u \+ 8 \* u \* u \+ (2 \* \((?:x\.shape\[-1\]|n) \+ 2\) \* roundoff\(f32\))\)", r"(\1)", text
    )
    text = re.sub(  # the attention's logits and its weighted mean
        r"\(4 \* u \+ 8 \* u \* u \+ (4 \* \((?:e \+ 2|sl \+ 16)\) \* roundoff\(f32\))\)", r"(\1)", text
    )
    text = text.replace("roundoff(bf16) * abs(x) + underflow(bf16)", "roundoff(f32) * abs(x)")
    text = text.replace("(u + 128 * roundoff(f32))", "(128 * roundoff(f32))")  # the activation's rounding to bf16
    assert "(4 * u +" not in text
    twins = [r for r in load_rules_text(text, "tight.rules").rules if r.approximate]
    assert len(twins) == 11 and all("roundoff(bf16)" not in r.bound_text for r in twins)
    return twins


@pytest.mark.parametrize("rule", BF16.rules, ids=lambda r: r.name)
def test_the_bundled_bf16_rules_pass_check(rule):
    result = check_rule(rule, examples=60)
    assert result.ok, result.counterexample or result.error
    if rule.approximate:  # never proven (an exact rule of the file may be)
        assert result.verdict == "sound" and result.tier == "tested"
        assert result.proof is None and result.proof_note == APPROXIMATE_NOTE
        assert "f32" in result.dtypes


@pytest.mark.parametrize("rule", _tight_twins(), ids=lambda r: r.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_bound_too_tight_is_refuted_on_every_seed(rule, seed):
    assert_refuted_by_its_bound(rule, 100, seed)


def assert_refuted_by_its_bound(rule, examples: int, seed: int) -> None:
    """``check`` refutes ``rule`` with a counterexample that names the element past its declared bound."""
    result = check_rule(rule, examples=examples, seed=seed)
    assert result.verdict == "UNSOUND"
    cx = result.counterexample
    assert "exceeds its declared bound at element" in cx.reason and f"the bound `{rule.bound_text}` is" in cx.reason
    assert cx.max_error > cx.allowed


def test_the_bound_replaces_the_tolerance():
    """relu(x) => x is wrong by |x| wherever x < 0: unsound as an exact rule, sound within abs(x), refuted within
    half of that."""
    exact, loose, tight = load_rules_text(
        "rule exact: relu(x) => x\n"
        "rule loose: relu(x) => x within abs(x)\n"
        "rule tight: relu(x) => x within 0.5 * abs(x)\n"
    ).rules
    assert check_rule(exact, examples=50).verdict == "UNSOUND"
    assert check_rule(loose, examples=50).verdict == "sound"
    cx = check_rule(tight, examples=50).counterexample
    assert cx is not None and "exceeds its declared bound" in cx.reason and "0.5 * abs(x)" in cx.reason


def test_the_bound_is_evaluated_in_float64():
    """In float16, abs(x) / 65536 / 65536 underflows to 0 before it is scaled back: a bound evaluated in the
    model's dtype would refute the rule; evaluated in float64 it is abs(x)."""
    (rule,) = load_rules_text(
        "rule r: relu(x) where x.dtype == f16 => x within abs(x) / 65536 / 65536 * 65536 * 65536"
    ).rules
    result = check_rule(rule, examples=50)
    assert result.verdict == "sound" and "f16" in result.dtypes


def test_a_bound_that_does_not_broadcast_is_a_counterexample():
    (rule,) = load_rules_text("rule r: relu(x) where x.rank == 1 => x within cat(abs(x), abs(x))").rules
    cx = check_rule(rule, examples=50).counterexample
    assert cx is not None and "does not broadcast to a result's" in cx.reason


def test_exact_rules_still_go_to_the_solver():
    (rule,) = load_rules_text("rule r: relu(relu(x)) => relu(x)").rules
    result = check_rule(rule, examples=30)
    assert not rule.approximate and result.proof is not None and result.verdict == "proven"
    assert result.proof_note != APPROXIMATE_NOTE


def test_an_inf_bound_claims_nothing_even_a_nan_result():
    """A bound of inf (as a rule's `where(..., inf)` past the range it can speak for) accepts any result, nan
    included; a finite bound refutes the same rewrite."""
    free, held = load_rules_text(
        "rule free: relu(x) where x.dtype == f32 => x * nan within inf\n"
        "rule held: relu(x) where x.dtype == f32 => x * nan within abs(x) + 1\n"
    ).rules
    assert check_rule(free, examples=30).verdict == "sound"
    cx = check_rule(held, examples=30).counterexample
    assert cx is not None and "exceeds its declared bound" in cx.reason
