"""The solver tier: true rules are proven on every instance, planted wrong ones refuted with a counterexample
replayed through the harness, whatever the drawn data; and the verdict says `proven` only with a scope."""

from pathlib import Path

import pytest
import torch

import gawee
from gawee.ir.types import DType
from gawee.testing import check_rule
from gawee.testing import harness as H
from gawee.testing.smt import prove_instance
from gawee.testing.smt.verdict import NO_SCOPE, RuleProof, prove_rule

DATA = Path(__file__).resolve().parents[1] / "data"
BUNDLED = {r.name: r for r in gawee.default_rules().rules}
PLANTED = {r.name: r for r in gawee.load_rules(DATA / "unsound" / "solver.rules").rules}
TWINS = {r.name: r for r in gawee.load_rules(DATA / "twins" / "solver.rules").rules}


def _instances(rule, n: int = 6, seed: int = 0):
    """Up to n drawn instances the rule fires on (the harness's own sampling, solver off)."""
    kept = []

    def keep(ex, xs):
        kept.append(ex)

    check_rule(rule, examples=n, seed=seed, on_example=keep, solver=False, scope_budget=0)
    out = []
    for ex in kept:
        if H.guard_verdict(rule, ex)[0]:
            after = H._apply(rule, ex, use_guard=True)
            if after is not None:
                out.append((ex, after))
    return out


@pytest.mark.parametrize(
    "name",
    ["permute_permute", "transpose_same", "reshape_reshape", "neg_neg", "mul_one", "relu_relu", "fuse_conv_relu"],
)
def test_true_rules_are_proven_on_every_instance(name):
    rule = BUNDLED[name]
    instances = _instances(rule)
    assert instances
    proof = prove_rule(rule, instances)
    assert proof.proven == proof.instances == len(instances), proof.unknown
    assert proof.counterexample is None and not proof.complete  # drawn instances: no bound, no `proven`
    assert NO_SCOPE in proof.why_not


def test_a_rewrite_that_keeps_every_term_needs_no_query():
    rule = BUNDLED["permute_permute"]
    ex, after = _instances(rule, 2)[0]
    result = prove_instance(rule, ex, after)
    assert result.status == "proven" and result.queries == 0 and result.same == result.elements


SOLVER_REFUTES = [
    "sub_self_zero",
    "div_self_one",
    "mul_zero_nonnegative",
    "maximum_as_select",
    "relu_as_select",
    "widen_after_wrapping_add",
    "abs_as_square_over_abs",
    "eq_self_true",
    "relu_of_abs_int",
    "eq_self_true_nonzero",
]


@pytest.mark.parametrize("name", SOLVER_REFUTES)
@pytest.mark.parametrize("seed", [0, 1])
def test_planted_rules_are_refuted_by_the_solver(name, seed):
    rule = PLANTED[name]
    proof = prove_rule(rule, _instances(rule, 4, seed))
    cx = proof.counterexample
    assert cx is not None, proof.unknown
    assert "SMT solver" in cx.reason and "values:" in str(cx)


def test_the_overflow_of_a_late_sum_is_found():
    rule = PLANTED["halves_summed_late_f16"]
    proof = prove_rule(rule, _instances(rule, 4))
    assert proof.counterexample is not None and "SMT solver" in proof.counterexample.reason


@pytest.mark.parametrize("name", ["sub_self_zero_finite", "mul_zero_finite", "narrow_after_wide_add", "ne_self_isnan"])
def test_twins_are_proven_under_their_assumptions(name):
    rule = TWINS[name]
    proof = prove_rule(rule, _instances(rule, 4))
    assert proof.instances and proof.proven == proof.instances, proof.unknown


def test_what_has_no_encoding_is_named():
    rule = BUNDLED["conv2d_zero_bias"]
    proof = prove_rule(rule, _instances(rule, 4))
    assert proof.proven == 0 and "conv2d" in proof.why_not and "no encoding" in proof.why_not


def test_proven_needs_a_whole_level_of_the_scope():
    """The solver over the enumerated instances: every instance of the first level (ranks <= 1, dims <= 1,
    every dtype) proven makes the verdict *proven* with that bound; a budget that cuts the first level short
    leaves the rule *tested*, saying why, even though every instance it reached was proven."""
    rule = BUNDLED["neg_neg"]
    result = check_rule(rule, examples=5)
    assert result.verdict == "proven" and result.tier == "proven" and result.ok
    assert result.proof_note.startswith("proven within rank <= ")
    short = check_rule(rule, examples=5, scope_budget=4, scope_complete=0)
    assert short.tier == "tested" and short.proof.proven == short.proof.instances > 0
    assert NO_SCOPE in short.proof_note
    unscoped = RuleProof(None, instances=3, proven=3)
    assert not unscoped.complete and NO_SCOPE in unscoped.summary()


def test_an_unsigned_fact_keeps_the_upper_half_of_the_range():
    # nonnegative(x) of a u8 holds for 0..255: read as a signed comparison it dropped 128..255, and the
    # solver proved a rule whose every counterexample lies there
    rule = PLANTED["u8_sum_never_below"]
    instances = _instances(rule, 4)[:3]
    assert instances
    for ex, after in instances:
        result = prove_instance(rule, ex, after)
        assert result.status == "refuted", result.reason
        assert result.counterexample.found_by == "the SMT solver"


def test_a_verdict_does_not_depend_on_the_queries_asked_before(monkeypatch):
    # the solver's work on a query once depended on the terms earlier queries had made in z3's shared
    # context: the same query took 0.15 or 2.4 million steps, past its limit in a loaded test worker
    import z3.z3

    rule = PLANTED["abs_as_square_over_abs"]
    ex, after = _instances(rule, 4, 1)[0]
    monkeypatch.setattr(z3.z3, "_main_ctx", None)  # as in a new process
    alone = prove_instance(rule, ex, after)
    for name in ("sub_self_zero", "div_self_one", "maximum_as_select", "widen_after_wrapping_add"):
        other = PLANTED[name]
        for o_ex, o_after in _instances(other, 2, 1):
            prove_instance(other, o_ex, o_after)
    later = prove_instance(rule, ex, after)
    assert alone.status == later.status == "refuted"
    assert alone.rlimit == later.rlimit and alone.queries == later.queries


FACT_VALUES = {
    "float": [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -2.5, 3.0],
    "int": [0, 1, -1, 127, -128],
    "u8": [0, 1, 127, 128, 255],
    "bool": [False, True],
}


@pytest.mark.parametrize(
    "dtype",
    [DType.f16, DType.bf16, DType.f32, DType.f64, DType.i8, DType.i32, DType.i64, DType.u8, DType.bool],
    ids=str,
)
def test_the_solver_reads_each_assumption_as_the_harness_does(dtype):
    # what the solver assumes of an element must be what the harness's draws satisfy, value for value: assuming
    # more (nonzero excluding nan, nonnegative of a u8 as a signed comparison) let it prove rules wrong there
    from gawee.dsl.library import ASSUMPTIONS
    from gawee.testing.smt import encode as E
    from gawee.testing.smt.solve import _fact
    from gawee.testing.smt.terms import const_key

    kind = "float" if dtype.is_float else "u8" if dtype is DType.u8 else "bool" if dtype is DType.bool else "int"
    for value in FACT_VALUES[kind]:
        t = torch.tensor([value], dtype=dtype.torch)
        element = t.item() if dtype is not DType.bool else bool(value)
        literal = E.literal(dtype, const_key(dtype, element))
        for name, fact in ASSUMPTIONS.items():
            want = bool(fact.holds(t).item())
            got = E.z3mod().simplify(_fact(name, literal, dtype))
            assert E.z3mod().is_true(got) == want and E.z3mod().is_false(got) != want, (name, dtype, value)
