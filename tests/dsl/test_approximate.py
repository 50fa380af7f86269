"""The `within` clause: approximate rules, their error bound's syntax, kinds and load-time diagnostics."""

import pytest

from gawee import load_rules_text
from gawee.dsl import ast_cache
from gawee.dsl.library import BUILTINS, GuardFailed
from gawee.dsl.parser import parse_rules
from gawee.errors import RuleSyntaxError
from tests.dsl.test_diagnostics import caret_under, diagnose

LINEAR_BF16 = """
# linear -> linear on bf16 operands
rule linear_bf16:
    y: linear(x, w) where y.dtype == f32
    => cast(linear(cast(x, bf16), cast(w, bf16)), f32)
    within 3 * roundoff(bf16) * linear(abs(x), abs(w))
"""


def test_a_rule_with_a_bound_is_approximate_and_keeps_its_text():
    (rule,) = load_rules_text(LINEAR_BF16).rules
    assert rule.approximate and rule.bound is not None
    assert rule.bound_text == "3 * roundoff(bf16) * linear(abs(x), abs(w))"


def test_a_rule_without_one_is_exact():
    (rule,) = load_rules_text("rule r: relu(relu(x)) => relu(x)").rules
    assert not rule.approximate and rule.bound is None and rule.bound_text == ""


def test_the_bound_comes_after_the_with_bindings():
    src = "rule r: y: linear(x, w) => cast(z, f32) with z = linear(cast(x, bf16), cast(w, bf16)) within 0.5"
    (rule,) = load_rules_text(src).rules
    assert rule.approximate and rule.bound_text == "0.5"
    err, text = diagnose("rule r: relu(x) => x within 1 with y = x", RuleSyntaxError)
    assert "unexpected `with`" in text and "`within`" in err.hint and caret_under(text, "with y")


def test_the_bound_survives_the_parsed_rules_cache():
    asts = parse_rules(LINEAR_BF16, "my.rules")
    back = ast_cache.from_json(ast_cache.to_json(asts), LINEAR_BF16)
    assert back == asts and back[0].bound is not None
    assert back[0].bound.text == "3 * roundoff(bf16) * linear(abs(x), abs(w))"


def test_an_unknown_name_in_the_bound():
    err, text = diagnose("rule r: relu(x) => x within 2 * abs(xx)")
    assert text.startswith("my.rules:1:37: rule error: `xx` is never bound") and caret_under(text, "xx)")
    assert "did you mean x" in err.hint


@pytest.mark.parametrize(
    ("bound", "kind", "at"),
    [
        ("x.shape", "a list", "x.shape"),
        ("true", "a bool", "true"),
        ('"tiny"', "a str", '"tiny"'),
        ("f32", "a dtype", "f32"),
    ],
)
def test_a_bound_must_be_a_number_or_a_tensor(bound, kind, at):
    err, text = diagnose(f"rule r: relu(x) => x within {bound}")
    assert f"an error bound must be a number or a tensor, this is {kind}" in text and caret_under(text, at)
    assert "within" in err.hint


def test_the_bound_is_type_checked_like_a_replacement():
    _, text = diagnose("rule r: relu(x) => x within roundoff(x)")
    assert "argument 1 of `roundoff` must be a dtype, this is a tensor" in text
    _, text = diagnose("rule r: relu(x) => x within relu(x, y=1)")
    assert "relu has no operand or attribute 'y'" in text
    _, text = diagnose("rule r: relu(x) => x within fold(x)")
    assert "an error bound is of the matched values only" in text and caret_under(text, "fold")


def test_a_bound_may_use_with_bindings_and_numbers():
    src = "rule r: y: relu(x) => z with z = relu(x) within roundoff(x.dtype) * abs(z) + 1"
    (rule,) = load_rules_text(src).rules
    assert rule.approximate


def test_dtype_helpers():
    roundoff, underflow = BUILTINS["roundoff"].impl, BUILTINS["underflow"].impl
    assert roundoff(None, "bf16") == 2**-8 and roundoff(None, "f32") == 2**-24 and roundoff(None, "f16") == 2**-11
    assert underflow(None, "bf16") == 2**-134 and underflow(None, "f32") == 2**-150
    with pytest.raises(GuardFailed, match="i32 is not a floating-point dtype"):
        roundoff(None, "i32")


def test_int8_levels_follow_the_cpus_vnni(monkeypatch):
    from gawee.dsl import library

    levels = BUILTINS["int8_levels"].impl
    monkeypatch.setattr(library, "no_vnni", lambda: None)
    assert levels(None) == 255
    monkeypatch.setattr(library, "no_vnni", lambda: "no VNNI (planted)")
    assert levels(None) == 127
