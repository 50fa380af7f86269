"""A replacement's constant subexpressions, compiled to closures over tensors (gawee.dsl.const_fold), give what
the general closures give: the same graph, the same constants bit for bit, the same refusals and errors."""

import pytest
import torch

import gawee
from gawee.dsl import ast as A
from gawee.dsl import const_fold
from gawee.dsl.const_fold import constant_vars
from gawee.dsl.parser import parse_rules
from gawee.dsl.scope import _Scope
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.context import RewriteContext
from gawee.rewrite.ruleset import Phase, RuleSet

FOLDS = """
rule bn (priority=1):
    conv2d(x, w, b, residual=none, act=none, ...attrs) |> batch_norm(gamma, beta, mean, var, eps=eps)
    where const(w, mean, var) and (const(gamma) or absent(gamma)) and (const(beta) or absent(beta))
          and (const(b) or absent(b))
    => conv2d(x, w * reshape(s, [-1, 1, 1, 1]), (default(b, 0) - mean) * s + default(beta, 0), ...attrs)
    with s = default(gamma, 1) / sqrt(var + eps)

rule arith:
    y: mul(x, c) where const(c) and c.rank == 1
    => neg(add(x, -(c // 2.0) + c % 3.0 - clamp(c, 0.5, 2.0) * 2 + abs(c)))
"""


def _graph(bias: bool, gamma: bool):
    g = torch.Generator().manual_seed(0)
    b = GraphBuilder("g")
    x = b.input("x", "f32[1,3,5,5]")
    w = b.const(torch.randn(4, 3, 3, 3, generator=g), "w")
    bb = b.const(torch.randn(4, generator=g), "b") if bias else None
    gm = b.const(torch.rand(4, generator=g) + 0.5, "gamma") if gamma else None
    y = b.batch_norm(
        b.conv2d(x, w, bb, padding=[1, 1]),
        gm,
        b.const(torch.randn(4, generator=g), "beta"),
        b.const(torch.randn(4, generator=g), "mean"),
        b.const(torch.rand(4, generator=g) + 0.5, "var"),
        eps=1e-3,
    )
    z = b.input("z", "f32[6]")
    c = b.const(torch.randn(6, generator=g) * 4, "c")
    return b.output(y, b.mul(z, c))


def _general_only(monkeypatch):
    monkeypatch.setattr(const_fold.ConstCompiler, "compile", lambda self, e: None)


def _constants(graph):
    return [(v.name, v.data) for v in graph.constants()]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("gamma", [True, False])
def test_compiled_folds_give_the_general_paths_graph_bit_for_bit(monkeypatch, bias, gamma):
    graph = _graph(bias, gamma)
    fast, fast_report = gawee.rewrite(graph, gawee.load_rules_text(FOLDS), trace=True)
    with monkeypatch.context() as m:
        _general_only(m)
        slow, slow_report = gawee.rewrite(graph, gawee.load_rules_text(FOLDS), trace=True)
    assert fast_report.firings == slow_report.firings == {"bn": 1, "arith": 1}
    assert str(fast) == str(slow)
    assert [f.as_dict() for f in fast_report.trace] == [f.as_dict() for f in slow_report.trace]
    for (na, a), (nb, b) in zip(_constants(fast), _constants(slow), strict=True):
        assert na == nb and a.dtype == b.dtype and torch.equal(a, b)


def _emitted(monkeypatch, rule_name: str) -> list[str]:
    """The ops that went through ``RewriteContext.emit_op`` when the rule of FOLDS named ``rule_name`` fired."""
    ops = []
    real = RewriteContext.emit_op
    monkeypatch.setattr(
        RewriteContext, "emit_op", lambda self, opdef, *a, **k: ops.append(opdef.name) or real(self, opdef, *a, **k)
    )
    (rule,) = [r for r in gawee.load_rules_text(FOLDS).rules if r.name == rule_name]
    _, report = gawee.rewrite(_graph(True, True), RuleSet([Phase("p", [rule])]))
    assert report.total == 1
    return ops


def test_abs_of_a_constant_is_folded_by_its_op(monkeypatch):
    assert _emitted(monkeypatch, "arith") == ["add", "neg"]  # the constant operand, abs(c) included, is one closure


def test_a_fold_subexpression_is_one_new_constant(monkeypatch):
    """Only the node the replacement builds goes through emit_op: the eight constant ops do not."""
    assert _emitted(monkeypatch, "bn") == ["conv2d"]


def test_an_operand_that_is_not_constant_takes_the_general_path():
    # the guard does not make c a constant: the subexpression is not compiled; here it is computed
    rules = gawee.load_rules_text("rule r: y: neg(mul(x, c)) where c.rank == 1 => mul(x, c * -1.0)")
    b = GraphBuilder("g")
    x, c = b.input("x", "f32[3]"), b.input("c", "f32[3]")
    out, report = gawee.rewrite(b.output(b.neg(b.mul(x, c))), rules)
    assert report.total == 1 and [n.op for n in out] == ["mul", "mul"]


def test_an_absent_operand_takes_the_general_path_and_its_error():
    rules = gawee.load_rules_text(
        "rule r: conv2d(x, w, b, ...attrs) |> relu() where const(w) and (const(b) or absent(b))"
        " => conv2d(x, w, b * 2.0, ...attrs)"
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[1,2,4,4]")
    g = b.output(b.relu(b.conv2d(x, b.const(torch.ones(2, 2, 1, 1), "w"))))
    with pytest.raises(gawee.GaweeError, match="uses an absent operand"):
        gawee.rewrite(g, rules)


def test_a_fold_whose_result_is_unsafe_is_refused_as_before(monkeypatch):
    rules = "rule r: y: neg(mul(x, c)) where const(c) => mul(x, c * 60000.0 * 2.0)"
    b = GraphBuilder("g")
    x = b.input("x", "f16[2]")
    g = b.output(b.neg(b.mul(x, b.const(torch.tensor([2.0, 3.0], dtype=torch.float16), "c"))))
    assert gawee.rewrite(g, gawee.load_rules_text(rules))[1].total == 0
    with monkeypatch.context() as m:
        _general_only(m)
        assert gawee.rewrite(g, gawee.load_rules_text(rules))[1].total == 0


def test_a_failing_fold_reports_the_general_paths_error():
    rules = gawee.load_rules_text("rule r: y: neg(mul(x, c)) where const(c) => mul(x, reshape(c, [7]))")
    b = GraphBuilder("g")
    x = b.input("x", "f32[3]")
    g = b.output(b.neg(b.mul(x, b.const(torch.ones(3), "c"))))
    with pytest.raises(gawee.GaweeError, match="reshape"):
        gawee.rewrite(g, rules)


@pytest.mark.parametrize(
    ("guard", "names"),
    [
        ("const(w, m) and (const(g) or absent(g)) and w.rank == 4", {"w", "m", "g"}),
        ("(absent(g) or const(g)) and const(w)", {"w", "g"}),
        ("const(a) or const(b)", set()),  # either: neither is known
        ("(const(g) or absent(h))", set()),
        ("not const(w)", set()),
    ],
)
def test_the_guard_says_which_variables_are_constants(guard, names):
    (rule,) = parse_rules(f"rule r: relu(x) where {guard} => x", "t.rules")
    assert constant_vars(rule.guard, _Scope()) == names


def test_a_helper_named_const_proves_nothing():
    (rule,) = parse_rules("rule r: relu(x) where const(w) => x", "t.rules")
    scope = _Scope(helpers={"const": object()})
    assert isinstance(rule.guard, A.ECall) and constant_vars(rule.guard, scope) == set()
