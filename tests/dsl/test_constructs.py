"""Alternatives (`a | b`) and picking an output of a multi-output op (`split(...)[i]`), in patterns and
replacements: compiled, matched, rewritten, and checked by the harness."""

import pytest
import torch

from gawee import load_rules_text
from gawee.equivalence import assert_equivalent
from gawee.errors import RuleError
from gawee.ir.builder import GraphBuilder
from gawee.ops import all_ops
from gawee.rewrite.driver import rewrite
from gawee.testing import check_rule

SQUARE = """
# x + y*y, however the square is spelled -> x + y*y
rule add_square:
    r: add(x, pow(y, 2.0) | pow(y, 2) | pow(y, 2.0 | 2)) where same_type(r, x) => add(x, mul(y, y))
"""


def test_alternatives_compile_to_one_rule_per_spelling():
    rules = load_rules_text(SQUARE).rules
    assert [r.label for r in rules] == [f"add_square ({i}/4)" for i in range(1, 5)]  # nested: 1 + 1 + 2
    assert {r.name for r in rules} == {"add_square"} and len({r.index for r in rules}) == 4


def test_alternatives_must_bind_the_same_names():
    with pytest.raises(RuleError, match="this alternative binds y, z, the first one y") as info:
        load_rules_text("rule a: add(x, mul(y, y) | mul(y, z)) => x", "my.rules")
    assert str(info.value).startswith("my.rules:1:28:")


def test_each_alternative_rewrites_its_spelling():
    rules = load_rules_text(SQUARE)
    b = GraphBuilder("g")
    x, y = b.input("x", "f32[4]"), b.input("y", "f32[4]")
    g = b.output(b.add(x, b.pow(y, 2.0)))
    after, report = rewrite(g, rules)
    assert report.firings["add_square"] == 1 and [n.op for n in after] == ["mul", "add"]
    assert_equivalent(g, after)


def test_every_alternative_is_checked_on_its_own():
    results = [check_rule(r, examples=60) for r in load_rules_text(SQUARE.replace(" | pow(y, 2.0 | 2)", "")).rules]
    assert [r.verdict for r in results] == ["sound", "sound"]
    assert all(r.fired > 0 for r in results)


SPLIT = """
# cat of the two pieces of a split, in order -> the input
rule split_cat:
    r: cat(split(x, split_sizes=[a, b], dim=d)[0], split(x, split_sizes=[a, b], dim=d)[1], dim=d)
    where same_type(r, x) => x

# relu of one piece -> that piece of relu
rule relu_piece:
    relu(split(x, split_sizes=s, dim=d)[-1]) => split(relu(x), split_sizes=s, dim=d)[-1]
"""


def test_output_index_in_patterns_and_replacements():
    rules = load_rules_text(SPLIT)
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,6]")
    p, q = b.split(x, split_sizes=[2, 4], dim=1)
    g = b.output(b.cat(p, q, dim=1), b.relu(q))
    after, report = rewrite(g, rules)
    assert report.firings == {"split_cat": 1, "relu_piece": 1}
    assert after.outputs[0] is after.inputs[0]
    assert_equivalent(g, after, [torch.randn(2, 6)])


def test_output_index_picks_only_that_output():
    rules = load_rules_text(SPLIT)
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,6]")
    p, _q = b.split(x, split_sizes=[2, 4], dim=1)
    g = b.output(b.relu(p))  # output 0, the rule asks for the last one
    assert rewrite(g, rules)[1].firings["relu_piece"] == 0


@pytest.mark.parametrize("rule", load_rules_text(SPLIT).rules, ids=lambda r: r.name)
def test_output_index_rules_are_checked(rule):
    result = check_rule(rule, examples=60)
    assert result.verdict in ("proven", "sound") and result.fired > 0


def test_indexing_a_single_output_op_is_a_load_error():
    with pytest.raises(RuleError, match=r"relu has one output: `\[0\]` picks an output") as info:
        load_rules_text("rule a: neg(relu(x)[0]) => x")
    assert "split" in info.value.hint and "unbind" in info.value.hint


def test_a_multi_output_replacement_must_pick_an_output():
    with pytest.raises(RuleError, match="the replacement must be a tensor"):
        load_rules_text("rule a: relu(x) => split(x, split_sizes=[1], dim=0)")


def test_ops_with_several_outputs_carry_the_trait():
    multi = {n for n, op in all_ops().items() if op.has_trait("multi_output")}
    assert {"split", "unbind"} <= multi
    b = GraphBuilder("g")
    x = b.input("x", "f32[3,4]")
    assert len(b.unbind(x, dim=0)) == 3 and len(b.split(x, split_sizes=[1, 2], dim=0)) == 2


QKV = """
# three linears of one input -> one linear of the concatenated weights, split three ways
# (each bias as long as its weight has rows: a bias of one element broadcasts, its concatenation would not)
rule fuse_three_linears:
    q: linear(x, wq, bq), k: linear(x, wk, bk), v: linear(x, wv, bv)
    where const(wq, wk, wv, bq, bk, bv) and wq.dtype == wk.dtype and wk.dtype == wv.dtype
      and bq.shape == [wq.shape[0]] and bk.shape == [wk.shape[0]] and bv.shape == [wv.shape[0]]
    => qkv[0], qkv[1], qkv[2]
    with qkv = split(linear(x, cat(wq, wk, wv), cat(bq, bk, bv)),
                     split_sizes=[wq.shape[0], wk.shape[0], wv.shape[0]], dim=-1)
"""


def _projections():
    b = GraphBuilder("attn")
    x, y = b.input("x", "f32[2,5,8]"), b.input("y", "f32[2,5,8]")
    proj = [b.linear(x, b.const(torch.randn(n, 8)), b.const(torch.randn(n))) for n in (8, 4, 4)]
    other = b.linear(y, b.const(torch.randn(3, 8)), b.const(torch.randn(3)))  # another input: not a partner
    return b.output(*(b.relu(p) for p in proj), other)


def test_several_roots_fuse_into_one_node_with_several_results():
    g = _projections()
    after, report = rewrite(g, load_rules_text(QKV), trace=True)
    assert report.firings["fuse_three_linears"] == 1
    assert sorted(n.op for n in after) == ["linear", "linear", "relu", "relu", "relu", "split"]
    (firing,) = report.trace
    assert len(firing.replaces) == 3 and len(firing.results) == 3
    assert_equivalent(g, after)


def test_roots_and_results_must_pair_up():
    with pytest.raises(RuleError, match="2 roots but 1 result"):
        load_rules_text("rule a: p: relu(x), q: neg(x) => relu(x)")


def test_a_replacement_operand_computed_after_the_first_root_abandons_the_match():
    text = "rule pair: a: add(x, y), b: mul(x, z) => sub(x, z), add(x, z)"
    b = GraphBuilder("g")
    x, w = b.input("x", "f32[3]"), b.input("w", "f32[3]")
    first = b.add(x, w)
    z = b.relu(w)  # computed after `first`, where the replacement would have to go
    g = b.output(first, b.mul(x, z))
    after, report = rewrite(g, load_rules_text(text))
    assert report.firings["pair"] == 0 and len(after) == len(g)


def test_several_roots_are_checked_by_the_harness():
    (rule,) = load_rules_text(QKV).rules
    result = check_rule(rule, examples=60)
    assert result.verdict == "sound" and result.fired > 10
    wrong = load_rules_text(QKV.replace("qkv[0], qkv[1], qkv[2]", "qkv[1], qkv[0], qkv[2]")).rules[0]
    assert check_rule(wrong, examples=60).verdict == "UNSOUND"


LINEARS = """
# matmul(x, constant w) -> linear(x, w^T)
rule matmul_linear: matmul(x, w) where const(w) and w.rank == 2 and x.rank >= 1 => linear(x, permute(w, dims=[1, 0]))

# matmul(x, w) + b -> linear(x, w^T, b): larger, so it goes first
rule matmul_add_linear (priority={p}):
    r: add(m: matmul(x, w), b) where const(w, b) and w.rank == 2 and b.rank == 1 and x.rank >= 1 and same_type(r, m)
    => linear(x, permute(w, dims=[1, 0]), b)
"""


@pytest.mark.parametrize(("priority", "wins"), [(1, "matmul_add_linear"), (0, "matmul_linear")])
def test_a_higher_priority_rule_rooted_at_a_user_goes_first(priority, wins):
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,8]")
    g = b.output(b.add(b.matmul(x, b.const(torch.randn(8, 4))), b.const(torch.randn(4))))
    after, report = rewrite(g, load_rules_text(LINEARS.format(p=priority)))
    assert list(report.firings) == [wins]
    assert_equivalent(g, after)


def test_a_positional_none_in_a_replacement_fills_the_operand_slot():
    """`conv2d(x, w, none, ...attrs)`: none leaves the optional bias out (as in a pattern), it is no attribute."""
    rules = load_rules_text(
        "# conv2d(x, w, b) -> conv2d(x, w)\n"
        "rule nobias: conv2d(x, w, b, ...a) where const(b) => conv2d(x, w, none, ...a)"
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[1,2,5,5]")
    w, bias = b.const(torch.randn(3, 2, 3, 3)), b.const(torch.zeros(3))
    g = b.output(b.conv2d(x, w, bias, stride=[2, 2], padding=[1, 1]))
    after, report = rewrite(g, rules)
    (conv,) = [n for n in after if n.op == "conv2d"]
    assert report.firings["nobias"] == 1 and (len(conv.inputs) < 3 or conv.inputs[2] is None)
    assert tuple(conv.attrs["stride"]) == (2, 2) and tuple(conv.attrs["padding"]) == (1, 1)
    assert_equivalent(g, after)


def test_min_max_abs_of_ints_fill_int_attributes():
    """`min`, `max` and `abs` of ints are ints (of a shape's item, known at firing): they fill int attributes."""
    rules = load_rules_text(
        "rule r:\n    reshape(x, shape=[-1]) where x.rank == 1\n"
        "    => slice(x, dim=0, start=min(0, x.numel), end=max(x.shape[0], 1 - 1), step=abs(-1))\n"
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[5]")
    g = b.output(b.reshape(x, shape=[-1]))
    after, report = rewrite(g, rules)
    (node,) = list(after)
    assert report.firings == {"r": 1} and node.op == "slice" and (node.attrs["start"], node.attrs["end"]) == (0, 5)
    with pytest.raises(RuleError, match=r"slice.end is int\?, this is a float"):
        load_rules_text("rule r: reshape(x, shape=[-1]) => slice(x, dim=0, start=0, end=max(1.5, 2.0), step=1)")


def test_default_builds_its_fallback_only_where_the_first_is_absent():
    """`default(b, e)` is `b` when b is present, and evaluates `e` only otherwise: a fallback that cannot be
    built (here `1 / 0`, which abandons a firing) stops only the firing that needs it."""
    rules = load_rules_text(
        "rule r: conv2d(x, w, b, act=none, ...attrs) |> relu() => conv2d(x, w, default(b, 1 / 0), act='relu', ...attrs)"
    )
    fired = []
    for bias in (torch.zeros(2), None):
        b = GraphBuilder("g")
        w = b.const(torch.ones(2, 1, 1, 1), "w")
        bias = None if bias is None else b.const(bias, "b")
        g = b.output(b.relu(b.conv2d(b.input("x", "f32[1,1,4,4]"), w, bias)))
        fired.append(rewrite(g, rules)[1].firings["r"])
    assert fired == [1, 0]
