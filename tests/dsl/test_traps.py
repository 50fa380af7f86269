"""Rule-language traps of issue 36: an output of a multi-output op as the root, dtype literals in attribute
patterns, and integer differences printed as integers."""

import pytest
import torch

from gawee import load_rules_text, rewrite
from gawee.equivalence import format_error, output_error, verify_rewrite
from gawee.errors import RuleError
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.explain import explain
from gawee.testing import check_rule
from tests.dsl.test_constructs import assert_equivalent

PIECE = """
# the second piece of a split in two along dim 1 -> a slice
rule split_piece_as_slice:
    split(x, split_sizes=[a, b], dim=1)[1] where x.rank == 2 => slice(x, dim=1, start=a, end=a + b)

# a named last piece of a split along the last dim, negated twice -> the piece
rule named_piece:
    y: unbind(x, dim=-1)[-1] where y.rank >= 1 => neg(neg(select(x, dim=-1, index=-1)))
"""


def _split_graph():
    b = GraphBuilder("g")
    x = b.input("x", "f32[3,6]")
    p, q = b.split(x, split_sizes=[2, 4], dim=1)
    return b.output(b.relu(p), b.sigmoid(q), q)


def test_an_output_of_a_multi_output_op_can_be_the_root():
    graph = _split_graph()
    rules = load_rules_text(PIECE)
    assert [r.root_output for r in rules.rules] == [1, -1] and rules.rules[0].root_op == "split"
    after, report = rewrite(graph, rules, trace=True)
    assert report.firings == {"split_piece_as_slice": 1}
    assert report.trace[0].replaces == (graph.outputs[2].name,)  # only output 1; output 0 keeps its split
    ops = sorted(n.op for n in after)
    assert ops == ["relu", "sigmoid", "slice", "split"]
    split = next(n for n in after if n.op == "split")
    assert split.outputs[0].num_uses == 1 and split.outputs[1].num_uses == 0
    assert_equivalent(graph, after, [torch.randn(3, 6)])


def test_an_output_root_matches_only_its_output():
    b = GraphBuilder("g")
    x = b.input("x", "f32[3,6]")
    p, _ = b.split(x, split_sizes=[2, 4], dim=1)
    graph = b.output(b.relu(p))  # output 1 is unused: the rule has nothing to replace
    rules = load_rules_text(PIECE)
    assert rewrite(graph, rules)[1].total == 0
    split = next(n for n in graph if n.op == "split")
    (why,) = [e for e in explain(graph, split, rules) if e.rule == "split_piece_as_slice"]
    assert why.outcome == "pattern" and why.reason == "split has no used output 1 (it has 2): nothing to replace"


@pytest.mark.parametrize("rule", load_rules_text(PIECE).rules, ids=lambda r: r.name)
def test_output_roots_are_checked_by_the_harness(rule):
    result = check_rule(rule, examples=40)
    assert result.verdict in ("proven", "sound") and result.fired > 0


def test_the_harness_catches_an_unsound_output_root(monkeypatch):
    from gawee.testing import harness

    monkeypatch.setattr(harness, "SHRINK_SECONDS", 1)  # the verdict is the point here, not the smallest example
    (rule,) = load_rules_text(
        "rule wrong_piece: split(x, split_sizes=[a, b], dim=1)[1] where x.rank == 2 and a == b"
        " => slice(x, dim=1, start=0, end=b)"
    ).rules
    assert check_rule(rule, examples=40).verdict == "UNSOUND"


def test_an_output_root_may_be_a_later_root():
    rules = load_rules_text(
        "rule pair: r: relu(x), s: split(x, split_sizes=[a, b], dim=1)[0] where x.rank == 2"
        " => relu(x), slice(x, dim=1, start=0, end=a)"
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[3,6]")
    p, q = b.split(x, split_sizes=[2, 4], dim=1)
    graph = b.output(b.relu(x), p, q)
    after, report = rewrite(graph, rules)
    assert report.firings == {"pair": 1} and sorted(n.op for n in after) == ["relu", "slice", "split"]
    assert_equivalent(graph, after, [torch.randn(3, 6)])


def test_an_output_of_a_single_output_op_as_root_is_still_refused():
    with pytest.raises(RuleError, match=r"relu has one output"):
        load_rules_text("rule a: relu(x)[0] => x")


# -- dtype literals -----------------------------------------------------------------------------
CASTS = """
# a round trip through f64 of an f32 -> the f32
rule cast_round_trip:
    cast(cast(x, dtype=f64), dtype=f32) where x.dtype == f32 => x
"""


def test_a_dtype_literal_matches_that_dtype_only():
    rules = load_rules_text(CASTS + "rule to_i64: cast(x, dtype=i64) => cast(x, dtype=i64)")
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    graph = b.output(b.cast(b.cast(x, dtype="f64"), dtype="f32"), b.cast(b.cast(x, dtype="f16"), dtype="f32"))
    after, report = rewrite(graph, rules)
    assert report.firings == {"cast_round_trip": 1} and sorted(n.op for n in after) == ["cast", "cast"]
    assert_equivalent(graph, after, [torch.randn(4)])
    result = check_rule(rules.rules[0], examples=40)
    assert result.verdict in ("proven", "sound") and result.fired > 0


def test_a_dtype_literal_where_no_dtype_fits_is_a_load_error():
    with pytest.raises(RuleError, match=r"softmax.dim is int; the dtype i64 can never match"):
        load_rules_text("rule a: softmax(x, dim=i64) => x")
    with pytest.raises(RuleError, match="names a dtype; pick another variable name"):
        load_rules_text("rule a: add(x, f32) => x")  # an operand is a tensor, never a dtype


# -- integer differences -----------------------------------------------------------------------
def test_an_integer_difference_is_the_integer():
    ref = torch.tensor([1, 2, 3])
    assert output_error(ref, ref + torch.tensor([0, 2**32, 0])) == 2**32
    assert output_error(torch.tensor([True, False]), torch.tensor([True, True])) == 1
    big = torch.tensor([2**63 - 1, -(2**63)])
    assert output_error(big, big.flip(0)) == float(2**64 - 1)  # int64's own subtraction would wrap around
    assert output_error(ref, torch.tensor([1, 2])) == float("inf")  # another shape
    assert format_error(2.0**32) == "4294967296" and format_error(2.5e-6) == "2.5e-06"


def test_a_rewrite_off_by_two_to_the_32_prints_the_integer():
    b = GraphBuilder("g")
    x = b.input("x", "i64[3]")
    graph = b.output(b.neg(x))
    rules = load_rules_text("rule off: neg(x) where x.dtype == i64 => (0 - x) + 4294967296")
    after, report = rewrite(graph, rules, trace=True)
    result = verify_rewrite(graph, after, report.trace, rules=rules)
    assert not result.ok and "max error 4294967296 > allowed 0" in str(result)
