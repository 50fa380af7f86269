"""Every load-time check reports file:line:col, the source line and a caret, as a GaweeError."""

import pytest

from gawee import load_rules_text
from gawee.errors import RuleError, RuleSyntaxError


def diagnose(text: str, exc=RuleError):
    with pytest.raises(exc) as info:
        load_rules_text(text, "my.rules")
    return info.value, str(info.value)


def caret_under(rendered: str, snippet: str) -> bool:
    """The caret line starts under the first character of ``snippet`` in the quoted source line."""
    lines = rendered.splitlines()
    for i, line in enumerate(lines[:-1]):
        if snippet in line and lines[i + 1].strip().startswith("^"):
            return lines[i + 1].index("^") == line.index(snippet)
    return False


def test_syntax_error():
    err, text = diagnose("rule a: relu(x) = x", RuleSyntaxError)
    assert text.startswith("my.rules:1:17: syntax error: unexpected `=`")
    assert caret_under(text, "= x") and "`=>`" in err.hint


def test_syntax_error_on_a_later_line():
    src = "rule a: relu(x) => x\n\nrule b:\n    relu(x) where => x\n"
    err, text = diagnose(src, RuleSyntaxError)
    assert err.span.line == 4 and caret_under(text, "=> x")


def test_unknown_op_with_suggestion():
    err, text = diagnose("rule a: relux(x) => x")
    assert "my.rules:1:9" in text and "unknown op 'relux'" in text and "relu" in err.hint
    assert caret_under(text, "relux")


def test_unknown_op_in_replacement():
    err, text = diagnose("rule a: relu(x) => sigmoidd(x)")
    assert "unknown function 'sigmoidd'" in text and "sigmoid" in err.hint


def test_unknown_attribute():
    err, text = diagnose("rule a: permute(x, dimz=p) => x")
    assert "permute has no operand or attribute 'dimz'" in text and "dims" in err.hint
    assert caret_under(text, "dimz")


def test_wrong_arity():
    _, text = diagnose("rule a: relu(x, y) => x")
    assert "relu takes at most 1 operands" in text and caret_under(text, "y)")
    _, text = diagnose("rule a: conv2d(x) => x")
    assert "conv2d takes at least 2 operands" in text
    _, text = diagnose("rule a: relu(x) => add(x)")
    assert "add takes at least 2 operands" in text


def test_unbound_name():
    err, text = diagnose("rule a: relu(x) => mul(x, s)")
    assert "`s` is never bound" in text and caret_under(text, "s)") and "x" in err.hint


def test_unknown_predicate():
    err, text = diagnose("rule a: relu(x) where constt(x) => x")
    assert "unknown function 'constt'" in text and "const" in err.hint


def test_guard_that_does_not_type_check():
    _, text = diagnose("rule a: relu(x) where x.shape > 3 => x")
    assert "comparing a list with an int" in text
    _, text = diagnose("rule a: dropout(x, p=p, train=_) where const(p) => x")
    assert "argument 1 of `const` must be a tensor, this is a float" in text
    _, text = diagnose("rule a: relu(x) where x.rank => x")
    assert "a guard must be a boolean" in text
    _, text = diagnose("rule a: relu(x) where x.shapes == [1] => x")
    assert "a tensor has no field 'shapes'" in text


def test_required_attribute_left_unmatched():
    err, _ = diagnose("rule a: max_pool2d(x) => x")
    assert "required attribute 'kernel_size'" in err.message and "`...`" in err.hint


def test_rest_that_would_drop_operands():
    err, _ = diagnose("rule a: conv2d(x, w, b, ...attrs) |> relu() => linear(x, w, b, ...attrs)")
    assert "may carry residual, act, act_params" in err.message or "may carry" in err.message


def test_variable_used_as_tensor_and_attribute():
    _, text = diagnose("rule a: permute(x, dims=x) => x")
    assert "`x` is used as a list" in text


def test_ops_cannot_be_built_in_guards():
    _, text = diagnose("rule a: relu(x) where relu(x) => x")
    assert "cannot appear in a guard" in text


def test_replacement_must_be_a_tensor():
    _, text = diagnose("rule a: relu(x) => x.shape")
    assert "the replacement must be a tensor" in text


def test_unknown_activation():
    err, _ = diagnose('rule a: conv2d(x, w, b, act=none, ...r) |> relu() => conv2d(x, w, b, act="relux", ...r)')
    assert "unknown activation 'relux'" in err.message and "relu" in err.hint


def test_duplicate_rule_names():
    err, _ = diagnose("rule a: relu(x) => x\nrule a: neg(x) => x")
    assert "defined twice" in err.message and err.span.line == 2


def test_helpers_are_opt_in():
    _, text = diagnose("rule a: relu(x) where my_check(x) => x")
    assert "unknown function 'my_check'" in text and "helpers" in text
    rules = load_rules_text(
        "rule a: y: relu(x) where my_check(x) => x", "h.rules", helpers={"my_check": lambda v: v.type.rank == 2}
    )
    assert rules.rules[0].name == "a"


def test_every_error_is_a_gawee_error_never_a_crash():
    from gawee.errors import GaweeError

    for text in [
        "rule",
        "rule a:",
        "rule a: _ => x",
        "rule a: x => x",
        "rule a: 1 => x",
        "rule a: relu(...) => x",
        "rule a: relu(x) => x with",
        "rule a: _(x) => x",
        "rule a (prio=1): relu(x) => x",
        "rule a: relu(x) where x in {1} => x",
        "rule a: cat(x, ...r) => cat(x, ...q)",
    ]:
        with pytest.raises(GaweeError):
            load_rules_text(text, "t.rules")
