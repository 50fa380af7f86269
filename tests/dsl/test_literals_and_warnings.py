"""`inf`/`nan` literals, the unused-variable warning and the `assume` clause, checked at load time."""

import logging

import pytest
import torch

from gawee import load_rules_text
from gawee.dsl.matcher import MatchContext
from gawee.errors import RuleError
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite


def _relu6_graph(max_val: float):
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    return b.output(b.hardtanh(x, min_val=0.0, max_val=max_val))


def test_inf_is_a_literal_that_matches_only_inf():
    rules = load_rules_text("rule open_relu: hardtanh(x, min_val=0.0, max_val=inf) => relu(x)")
    assert rewrite(_relu6_graph(float("inf")), rules)[1].firings["open_relu"] == 1
    assert rewrite(_relu6_graph(6.0), rules)[1].firings["open_relu"] == 0
    assert not rules.rules[0].warnings


def test_negative_inf_and_nan_literals():
    rules = load_rules_text("rule lo: hardtanh(x, min_val=-inf, max_val=inf) => x\nrule n: add(x, nan) => add(x, nan)")
    assert [r.name for r in rules.rules] == ["lo", "n"]

    def matches(fill: float) -> bool:
        b = GraphBuilder("g")
        x = b.input("x", "f32[3]")
        g = b.output(b.add(x, b.const(torch.full((3,), fill))))
        return any(True for _ in rules.rules[1].matcher.match(g.outputs[0], {}, MatchContext(), 0))

    assert matches(float("nan")) and not matches(1.0)  # a nan literal matches a constant of nans


def test_a_variable_bound_and_never_used_warns_with_a_caret(caplog):
    with caplog.at_level(logging.WARNING, logger="gawee.rules"):
        rules = load_rules_text("rule trap:\n    hardtanh(x, min_val=0.0, max_val=six) => relu(x)\n", "my.rules")
    (w,) = rules.rules[0].warnings
    text = str(w)
    assert text.startswith("my.rules:2:38: warning: `six` is bound here and never used")
    assert "^^^" in text and "`_six`" in w.hint
    assert "never used" in caplog.text


@pytest.mark.parametrize(
    "text",
    [
        "rule a: relu(relu(x)) => relu(x)",  # used on the right
        "rule a: add(x, x) => mul(x, 2.0)",  # used twice in the pattern
        "rule a: relu(relu(_x)) => relu(relu(_x))",  # `_name` says it is meant
        "rule a: y: relu(x) where uses(y) == 1 => relu(x)",  # used in the guard
        "rule a: relu(x) assume finite(x) => relu(x)",
    ],
)
def test_no_warning_when_every_variable_is_used(text):
    assert not [w for w in load_rules_text(text).rules[0].warnings if "never used" in w.message]


def test_the_bundled_rules_have_no_warnings():
    import gawee

    assert [str(w) for r in gawee.default_rules().rules for w in r.warnings] == []


def test_assume_is_compiled_with_its_text():
    (rule,) = load_rules_text("rule a: mul(x, 0.0) assume finite(x), nonzero(x) => mul(x, 0.0)").rules
    assert [(a.fact.name, a.var, a.text) for a in rule.assumptions] == [
        ("finite", "x", "finite(x)"),
        ("nonzero", "x", "nonzero(x)"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rule a: relu(x) assume bounded(x) => relu(x)", "`assume` takes facts about runtime values"),
        ("rule a: relu(x) assume finite(y) => relu(x)", "`y` is not an operand bound by the pattern"),
        ("rule a: relu(x) assume finite(x, x) => relu(x)", "takes one variable of the pattern"),
    ],
)
def test_bad_assumptions_are_rule_errors(text, message):
    with pytest.raises(RuleError, match=message) as info:
        load_rules_text(text, "my.rules")
    assert str(info.value).startswith("my.rules:1:")
