"""Fuzzing gawee-rewrite's input handling: mutated rule files through `check`, mutated saved graphs through `show`.

A fixed, deterministic budget of benchmarks/fuzz_cli.py's cases (the script runs any number): each must end
with an exit code of README's table, at most one screen on stderr, and no traceback. tests/test_fuzz.py fuzzes
the rule loader and the rewriter from Python; this goes through the command line, as a user does.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz_cli

RULE_CASES, GRAPH_CASES = 24, 60


@pytest.fixture(scope="module")
def outcomes():
    import logging

    from gawee.rewrite.ruleset import load_rules_text
    from gawee.testing import check_rule

    # the harness's first run in a process pays for its set-up: here once, inherited by every forked check
    check_rule(load_rules_text("rule warm: relu(relu(x)) => relu(x)").rules[0], examples=1)
    logging.disable(logging.WARNING)  # the mutants' rule warnings
    try:
        rules = fuzz_cli.fuzz(RULE_CASES, seed=0, kinds=("rules",), check_timeout=2)  # `crashed` past it: exit 1
        graphs = fuzz_cli.fuzz(GRAPH_CASES, seed=0, kinds=("json",))
    finally:
        logging.disable(logging.NOTSET)
    return rules + graphs


def test_every_mutant_ends_in_a_documented_exit_code_and_one_screen(outcomes):
    broken = [f"{c.name} ({c.command}, {c.mutation}): {'; '.join(o.problems)}" for c, o in outcomes if o.problems]
    escaped = [o.escaped for _, o in outcomes if o.escaped]
    assert not broken, "\n".join(broken + escaped[:1])


def test_the_mutants_reach_every_kind_of_failure(outcomes):
    """The budget is small: it must still cover each mutation, both commands, errors and successes."""
    kinds = {(c.command, c.mutation) for c, _ in outcomes}
    assert {m for cmd, m in kinds if cmd == "show"} >= {"deep", "number", "wrong type", "unknown field", "npz"}
    assert {m for cmd, m in kinds if cmd == "check"} >= {"tokens", "deep", "number", "name"}
    codes = {(c.command, o.code) for c, o in outcomes}
    assert {("show", 0), ("show", 2), ("check", 2)} <= codes and ({("check", 0), ("check", 1)} & codes)


def test_the_judge_catches_what_breaks_the_contract():
    ok = fuzz_cli.Outcome(2, "", "x.rules:1:1: syntax error: unexpected `(`\nhint: ...")
    assert fuzz_cli.judge(ok) == []
    assert fuzz_cli.judge(fuzz_cli.Outcome(None, "", "", escaped="Traceback ...\nValueError: x")) == [
        "an exception escaped main: ValueError: x"
    ]
    assert fuzz_cli.judge(fuzz_cli.Outcome(3, "", "")) == ["exit code 3"]
    assert "a traceback was printed" in fuzz_cli.judge(fuzz_cli.Outcome(2, "", "Traceback (most recent call last):"))
    long = fuzz_cli.Outcome(2, "", "line\n" * (fuzz_cli.MAX_ERROR_LINES + 1))
    assert fuzz_cli.judge(long) == [f"{fuzz_cli.MAX_ERROR_LINES + 1} lines on stderr (more than one screen)"]


def test_the_cases_are_deterministic(tmp_path):
    a = fuzz_cli.cases(12, 7, ("rules", "json"), tmp_path)
    b = fuzz_cli.cases(12, 7, ("rules", "json"), tmp_path)
    assert [(c.name, c.mutation, c.data) for c in a] == [(c.name, c.mutation, c.data) for c in b]
    assert [c.command for c in a[:4]] == ["check", "show", "check", "show"]


def test_the_script_reports_and_exits_0_when_nothing_breaks(capsys):
    assert fuzz_cli.main(["--cases", "6", "--kinds", "json", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 cases in ") and "0 of 6 cases broke the contract" in out
