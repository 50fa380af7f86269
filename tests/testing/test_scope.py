"""Small-scope enumeration, boundary classes of values and guard-directed sizes: found every time, not by luck."""

import contextlib
from pathlib import Path

import pytest
import torch

import gawee
from gawee.cli import main
from gawee.ir.types import DType, TensorType
from gawee.testing import check_rule
from gawee.testing.generate import small
from gawee.testing.scope import LEVELS, Scope, enumerate_scope
from gawee.testing.values import CLASSES, classes_for, fill_class

DATA = Path(__file__).resolve().parents[1] / "data"
PLANTED = gawee.load_rules(DATA / "unsound" / "scope.rules").rules
TWINS = {r.name: r for r in gawee.load_rules(DATA / "twins" / "scope.rules").rules}


def _rule(text: str):
    from gawee.rewrite.ruleset import load_phase

    return load_phase(text, "<test>", "test", None).rules[0]


@pytest.mark.parametrize("rule", PLANTED, ids=[r.name for r in PLANTED])
def test_planted_rules_are_refuted_on_every_seed(rule):
    # the enumeration does not depend on the seed: few random examples, several seeds, the same verdict
    for seed in (1, 7):
        result = check_rule(rule, examples=5, seed=seed)
        assert result.verdict == "UNSOUND", f"{rule.name} on seed {seed}: {result.verdict}"
        assert result.scope_refuted  # by the enumeration (sampling may have shown a smaller instance)


@pytest.mark.parametrize("name", ["two_strided_pools_are_one", "neg_neg_rank6", "relu_through_max_pool_undilated"])
def test_twins_that_need_large_instances_pass(name):
    result = check_rule(TWINS[name], examples=40)
    assert result.verdict in ("proven", "sound", "weak"), result.error or str(result.counterexample)
    assert result.fired and not result.error


def test_the_enumeration_is_deterministic_and_reports_its_bound():
    rule = _rule("rule neg_neg: neg(neg(x)) => x")
    a, b = Scope(budget=20, complete=0), Scope(budget=20, complete=0)
    first = [i.path for i in enumerate_scope(rule, a)]
    assert first == [i.path for i in enumerate_scope(rule, b)]
    assert len(first) == a.report.instances == 20
    assert a.report.truncated and a.report.partial in LEVELS  # 20 instances do not cover the scope
    big = Scope(budget=10_000, levels=1)
    every = list(enumerate_scope(rule, big))
    assert big.report.covered == LEVELS[0] and not big.report.truncated  # every dtype, every shape
    shapes = {(i.example.dtype, i.example.graph.inputs[0].type.shape) for i in every if i.level == 0}
    assert {(d, s) for d in (DType.f16, DType.i8) for s in [(), (0,), (1,)]} <= shapes


def test_a_small_level_is_enumerated_whole_past_the_budget():
    """A level of at most ``complete`` instances is covered whole, whatever the budget, while the levels below it
    were; its instances past the budget's share are the same on every run."""
    rule = _rule("rule neg_neg: neg(neg(x)) => x")
    small = Scope(budget=20, complete=600)
    insts = list(enumerate_scope(rule, small))
    assert small.report.covered == LEVELS[1] and small.report.partial == LEVELS[2]
    assert len(insts) == small.report.instances > 20
    assert [i.path for i in insts] == [i.path for i in enumerate_scope(rule, Scope(budget=20, complete=600))]
    tight = Scope(budget=20, complete=10)  # the first level has more than 10: nothing is probed past it
    assert len(list(enumerate_scope(rule, tight))) == 20 and tight.report.covered is None


def test_a_guard_on_sizes_and_ranks_is_satisfied_by_construction():
    rule = _rule("rule r: softmax(x, dim=1) where x.shape[1] >= 5 and x.rank == 5 => softmax(x, dim=1)")
    found = [i.example.graph.inputs[0].type for i in enumerate_scope(rule, Scope(budget=6))]
    assert found and all(t.rank == 5 and t.shape[1] >= 5 for t in found)
    result = check_rule(rule, examples=10)
    assert result.extent.rank >= 5 and max(result.extent.shape) >= 5


def test_a_conv_fed_by_a_mul_is_checked_like_any_rule():
    rule = _rule(
        "rule conv_mul_negneg: conv2d(mul(x, c), w, b, ...attrs) where const(c)"
        " => conv2d(neg(neg(mul(x, c))), w, b, ...attrs)"
    )  # (the rule rebuilt its own pattern, which never fires now: a rewrite that changes nothing)
    result = check_rule(rule, examples=20)
    assert result.verdict == "sound" and not result.error
    assert result.scope_instances and result.extent.kernel >= 1


def test_every_value_class_reaches_a_rule_and_eps_constants_add_theirs():
    rule = TWINS["rms_eps_inside_root"]  # `value(c) <= 0.001`: rows at 0.001 and at its square root
    assert {"scaled:0.001", "scaled:0.0316228"} <= set(classes_for(rule))
    result = check_rule(rule, examples=5)
    assert result.verdict in ("sound", "weak") and set(CLASSES) <= result.value_classes


def test_the_enumeration_finds_what_sampling_hides_in_a_literal():
    # a literal matches a constant of any shape whose elements all equal it: a [1]-shaped 1e-6 broadcasts a
    # 0-d x up, and the replacement's 0-d literal does not; the smallest instance shows it
    rule = _rule("rule r: div(x, sqrt(add(mul(x, x), 1e-6))) => mul(x, rsqrt(add(mul(x, x), 1e-6)))")
    result = check_rule(rule, examples=5)
    assert result.verdict == "UNSOUND" and "f64[1]" in str(result.counterexample)


def test_value_classes_hold_the_values_they_promise():
    gen = torch.Generator().manual_seed(0)
    i8 = fill_class(TensorType((64,), DType.i8), "limits", gen)
    assert {-128, 127} <= set(i8.tolist())
    f16 = fill_class(TensorType((64,), DType.f16), "overflow", gen)
    assert torch.isinf(f16[:2].float().sum().half()) and torch.isfinite(f16).all()
    past = fill_class(TensorType((64,), DType.i32), "past_exact", gen)
    assert (past.to(torch.bfloat16).to(torch.int32) != past).any()
    finite = fill_class(TensorType((256,), DType.f32), "limits!finite", gen)
    assert torch.isfinite(finite).all()


def test_a_summary_of_many_values_is_not_poisoned_by_nan():
    t = torch.arange(100, dtype=torch.float32)
    t[3] = float("nan")
    t[4] = float("inf")
    text = small(t)
    assert "finite in [0, 99]" in text and "1 nan" in text and "1 inf" in text


def test_the_summary_line_counts_harness_errors_apart(tmp_path, capsys):
    rules = tmp_path / "r.rules"
    pattern = "conv2d(mul(x, c), w, b, ...attrs)"
    rules.write_text(f"rule conv_mul_self:\n    {pattern} where const(c) => {pattern}\n")
    main(["check", str(rules), "--examples", "5", "--jobs", "1"])
    out = capsys.readouterr().out
    assert "0 untested, 0 harness errors" in out and "largest" in out and "scope" in out


def test_every_sampler_draws_or_rejects_when_enumerated():
    """Each sampler walked by the enumerating draw at every level: a draw or a typed Reject (sizes of 0,
    the guard's sizes past the level, ranks 5 and 6 included), never another exception."""
    import random

    from gawee.ops import all_ops
    from gawee.ops import sampling as S
    from gawee.testing.generate import Hints
    from gawee.testing.scope import RandomDraw, ScopeDraw, _Node, _Walk

    hints = Hints(sizes={5, 6}, rank_values={5, 6})
    for op in sorted((op for op in all_ops().values() if op.sample is not None), key=lambda op: op.name):
        for bound in LEVELS:
            root, rng = _Node(), random.Random(op.name)
            for k in range(3):
                walk = _Walk(root, rng)
                draw = ScopeDraw(walk, bound, DType.f32, hints, RandomDraw(k, DType.f32))
                with contextlib.suppress(S.Reject):
                    op.sample(draw, [S.FREE] * len(op.operands), {})
                walk.finish()


def test_indices_of_topk_and_sort_are_usable_and_checked_with_ties():
    rules = gawee.load_rules_text(
        "rule topk_index: squeeze(topk(x, k=1, dim=d, largest=true, sorted=true)[1], dims=[d])"
        " where x.dtype in {f32, f64} assume finite(x) => argmax(x, dim=d, keepdim=false)\n"
        "rule sort_index: neg(sort(x, dim=d, descending=false)[1]) assume finite(x)"
        " => neg(sort(x, dim=d, descending=false)[1])\n",
        "idx.rules",
    )
    topk, sort = (check_rule(r, examples=10) for r in rules.rules)
    # ties (all-equal rows): torch's topk need not pick the first of equal values, argmax does
    assert topk.verdict == "UNSOUND" and not topk.error
    assert sort.verdict in ("proven", "sound", "weak") and "ties" in sort.value_classes
