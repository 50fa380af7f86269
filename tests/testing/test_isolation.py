"""A crash, a hang or an exception while checking one rule is that rule's verdict; the others are still judged.
Stated assumptions (`assume finite(x)`) are honoured, and never hide a counterexample on data that satisfies them."""

import os
import signal
import time

import pytest

from gawee import load_rules_text
from gawee.cli import main
from gawee.ops.base import OpDef
from gawee.testing import check_rule, check_rules
from gawee.testing.isolate import can_isolate

pytestmark = pytest.mark.skipif(not can_isolate(), reason="worker processes need fork")

SOUND = "rule relu_relu: relu(y: relu(_)) => y\n"
UNSOUND = "rule neg_is_x: neg(x) => x\n"


def _segfault(v):
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang(v):
    time.sleep(600)


def _boom(v):
    raise RuntimeError("boom")


def _rules(helpers, extra: str):
    return load_rules_text(SOUND + extra + UNSOUND, "mixed.rules", helpers=helpers).rules


def test_a_rule_that_crashes_its_worker_is_reported_and_the_others_are_judged():
    rules = _rules({"crash": _segfault}, "rule crasher: neg(neg(x)) where crash(x) => x\n")
    results = check_rules(rules, examples=30, jobs=2)
    assert [r.rule.name for r in results] == ["relu_relu", "crasher", "neg_is_x"]
    assert [r.verdict for r in results] == ["proven", "crashed", "UNSOUND"]
    crash = results[1].crash
    assert "SIGSEGV" in crash and "running this instance" in crash and "neg(" in crash and "values:" in crash
    assert not results[1].ok


def test_a_rule_that_outlives_the_time_limit_is_crashed():
    rules = _rules({"hang": _hang}, "rule hanger: neg(neg(x)) where hang(x) => x\n")
    t0 = time.perf_counter()
    results = check_rules(rules, examples=20, jobs=1, timeout=8)
    assert time.perf_counter() - t0 < 60
    assert [r.verdict for r in results] == ["proven", "crashed", "UNSOUND"]
    assert "time limit" in results[1].crash


def test_an_exception_inside_the_check_is_an_error_verdict_naming_it():
    (rule,) = load_rules_text("rule thrower: neg(neg(x)) where boom(x) => x", helpers={"boom": _boom}).rules
    result = check_rule(rule, examples=10)
    assert (
        result.verdict == "error"
        and "raised RuntimeError: boom" in result.error
        and "test_isolation.py" in result.error
    )
    assert "report" not in result.error  # raised in the user's helper, not a harness bug


def test_cli_check_survives_a_kernel_crash(tmp_path, capsys, monkeypatch):
    path = tmp_path / "mixed.rules"
    path.write_text(SOUND + "rule erf_odd: neg(erf(neg(x))) => erf(x)\n" + UNSOUND)
    run = OpDef.run

    def crashing_erf(self, inputs, attrs):  # stands in for a kernel that segfaults on some CPU
        if self.name == "erf":
            os.kill(os.getpid(), signal.SIGSEGV)
        return run(self, inputs, attrs)

    monkeypatch.setattr(OpDef, "run", crashing_erf)
    code = main(["check", str(path), "--examples", "30", "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "erf_odd" in out and "crashed the harness" in out and "SIGSEGV" in out
    assert "neg_is_x" in out and "is unsound" in out  # judged after the crash
    assert "1 unsound" in out and "1 crashed" in out


MUL_ZERO = (
    "rule mul_zero:\n    y: mul(x, 0.0) where same_type(y, x) {assume}=> full(shape=x.shape, value=0, dtype=x.dtype)\n"
)


def test_an_assumption_makes_a_rule_sound_only_where_it_holds():
    (wrong,) = load_rules_text(MUL_ZERO.format(assume="")).rules
    (assumed,) = load_rules_text(MUL_ZERO.format(assume="assume finite(x) ")).rules
    assert check_rule(wrong, examples=100).verdict == "UNSOUND"  # inf * 0 is nan
    assert check_rule(assumed, examples=100).verdict in ("proven", "sound")


def test_an_assumption_never_hides_a_counterexample_on_data_that_satisfies_it():
    (rule,) = load_rules_text(UNSOUND.replace(" =>", " assume finite(x) =>")).rules
    result = check_rule(rule, examples=100)
    assert result.verdict == "UNSOUND"
    assert "assuming finite(x) (true for these values)" in str(result.counterexample)


def test_an_assumption_on_an_inner_value_sets_aside_only_the_draws_that_break_it():
    text = (
        "rule exp_mul_zero:\n    r: mul(y: exp(x), 0.0) where same_type(r, x)\n"
        "    {assume}=> full(shape=x.shape, value=0, dtype=x.dtype)\n"
    )
    (wrong,) = load_rules_text(text.format(assume="")).rules
    (assumed,) = load_rules_text(text.format(assume="assume finite(y) ")).rules
    assert check_rule(wrong, examples=100).verdict == "UNSOUND"  # exp overflows to inf, inf * 0 is nan
    result = check_rule(assumed, examples=100)
    assert result.verdict in ("proven", "sound") and result.assumption_false > 0
