"""One instance of a rule decided by execution into terms and, where the terms differ, by z3.

``prove_instance(rule, ex, after)`` asks: is there an input (satisfying the rule's ``assume`` facts)
on which an output element of the rewritten graph differs from the original's — a different number,
or nan on one side only? Elements whose terms are the same object agree on every input (they are
the same computation). The others are grouped by the shape of their term pair (elements of an
elementwise rewrite all share one), and one query per group goes to z3 with a deterministic
resource limit. Equality is stronger than the harness's criterion (a tolerance around the float64
truth), so ``proven`` implies the harness accepts every input; a model z3 finds is replayed
through the harness's own comparison, and only what that confirms is a counterexample.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from gawee.dsl.compiler import Rule
from gawee.errors import GaweeError
from gawee.interp import run_observed
from gawee.ir.core import Graph
from gawee.ir.types import DType
from gawee.ops import sampling as S
from gawee.testing.generate import Example, in_layout
from gawee.testing.smt import encode as E
from gawee.testing.smt.execute import Executor, Unsupported
from gawee.testing.smt.terms import Interner, SymTensor, Term, leaves

RLIMIT = 3_000_000
"""z3's resource limit per query: a count of its internal steps, so a verdict does not depend on the
machine's speed or load (a wall-clock timeout would). A float64 division query needs about 2 million."""

FAR_MODELS = 4
"""Inputs asked of the solver, each unlike the ones before, where the two sides are farther apart than the
tolerance: the harness may allow one (a swing the original has too, a sum past the dtype's range) and still
refute another. Which input z3 answers first depends on the terms made before in the process."""

OPEN = frozenset({"uf", "opaque", "choice"})


@dataclass
class InstanceProof:
    """What the solver found for one instance: ``proven``, ``refuted`` or ``unknown`` (with why)."""

    status: str
    reason: str = ""
    counterexample: object | None = None
    """The harness's Counterexample, replayed through the reference semantics (refuted only)."""
    elements: int = 0
    """Output elements compared."""
    same: int = 0
    """Of them, the same term on both sides (agree without a query)."""
    queries: int = 0
    rlimit: int = 0
    """z3's resource count over the queries."""
    seconds: float = 0.0


@dataclass
class _Query:
    before: Term
    after: Term
    dtype: DType
    facts: list = field(default_factory=list)
    """(fact name, term) pairs the query assumes."""


def prove_instance(
    rule: Rule, ex: Example, after: Graph, rlimit: int = RLIMIT, known: dict | None = None
) -> InstanceProof:
    """Decide ``after`` (the rule applied to ``ex.graph``) against the original on every input.

    ``known``: answers of earlier instances of the same rule by query shape (see ``_shape_key``),
    shared so that a question is asked once per rule; proofs and give-ups are kept (a found input is
    replayed on every instance: whether it reproduces depends on the rest of the graph)."""
    t0 = time.perf_counter()
    result = _prove(rule, ex, after, rlimit, {} if known is None else known)
    result.seconds = time.perf_counter() - t0
    return result


def _prove(rule: Rule, ex: Example, after: Graph, rlimit: int, known: dict) -> InstanceProof:
    from gawee.testing.harness import _compare  # the harness imports this module

    xs = ex.inputs(nonfinite=False)
    for vb, va in zip(ex.graph.outputs, after.outputs):
        if not vb.type.same_shape_dtype(va.type):
            return _replayed(_compare(rule, ex, after, xs), "an output changed type")
    interner = Interner()
    executor = Executor(interner)
    try:
        before_env = executor.run(ex.graph, _observe(ex.graph, xs))
        after_env = executor.run(after, _observe(after, xs))
    except Unsupported as e:
        return InstanceProof("unknown", str(e))
    except GaweeError as e:
        return InstanceProof("unknown", f"the graphs do not run on a drawn input: {e.message}")
    facts = _facts(rule, ex, before_env)
    groups: dict[tuple, _Query] = {}
    elements = same = 0
    for vb, va in zip(ex.graph.outputs, after.outputs):
        tb, ta = before_env[vb], after_env[va]
        for b, a in zip(tb.terms, ta.terms):
            elements += 1
            if b is a:
                same += 1
                continue
            query = _Query(b, a, vb.dtype, _related(facts, b, a))
            groups.setdefault(_shape_key(query), query)
    proof = InstanceProof("proven", elements=elements, same=same)
    for shape, query in groups.items():
        if shape in known:
            status, reason, cx = *known[shape], None
        else:
            proof.queries += 1
            status, reason, cx, used = _decide(rule, ex, after, query, rlimit)
            proof.rlimit += used
            if status != "refuted":
                known[shape] = (status, reason)
        if status == "refuted":
            return InstanceProof("refuted", reason, cx, elements, same, proof.queries, proof.rlimit)
        if status == "unknown" and proof.status == "proven":
            proof.status, proof.reason = "unknown", reason
    return proof


def _observe(graph: Graph, xs: list[torch.Tensor]) -> dict:
    """Every value of a concrete run (the kernel contexts: shapes and strides)."""
    values = [v for node in graph for v in node.outputs]
    _, seen = run_observed(graph, xs, values)
    return {**dict(zip(graph.inputs, xs)), **seen}


def _facts(rule: Rule, ex: Example, env: dict) -> list[tuple[str, Term]]:
    out = []
    for a in rule.assumptions:
        v = ex.bindings.get(a.var)
        if v is not None and v in env:
            out += [(a.fact.name, t) for t in env[v].terms]
    return out


def _vars(t: Term) -> frozenset:
    return frozenset(id(u) for u in leaves(t, frozenset({"var", "choice", "opaque"})))


def _related(facts: list[tuple[str, Term]], b: Term, a: Term) -> list[tuple[str, Term]]:
    """The facts about elements that share an input (or an open value) with this pair."""
    if not facts:
        return []
    mine = _vars(b) | _vars(a)
    return [(name, t) for name, t in facts if _vars(t) & mine]


def _shape_key(q: _Query) -> tuple:
    """The query up to renaming of its inputs, open values and kernel contexts: equal keys, the same
    question (so one answer serves the whole group)."""
    index: dict[int, int] = {}
    names: dict[object, int] = {}
    program: list[tuple] = []

    def visit(t: Term) -> int:
        stack = [(t, False)]
        while stack:
            u, ready = stack.pop()
            if id(u) in index:
                continue
            if not ready:
                stack.append((u, True))
                stack.extend((a, False) for a in u.args if id(a) not in index)
                continue
            if u.kind in ("var", "choice", "opaque"):
                name = names.setdefault((u.kind, u.key), len(names))
                label = (u.kind, u.dtype, u.op if u.kind == "opaque" else "", name)
            elif u.kind == "uf":
                label = ("uf", u.dtype, u.key[0], u.key[1], names.setdefault(("uf", u.key), len(names)))
            else:
                label = (u.kind, u.dtype, u.key)
            program.append((label, tuple(index[id(a)] for a in u.args)))
            index[id(u)] = len(program) - 1
        return index[id(t)]

    roots = (visit(q.before), visit(q.after), tuple((name, visit(t)) for name, t in q.facts))
    return tuple(program), roots


def _fact(name: str, e, dtype: DType):
    z3 = E.z3mod()
    if dtype is DType.bool:  # as torch compares a bool tensor with 0: True is 1
        return {"finite": z3.BoolVal(True), "positive": e, "nonnegative": z3.BoolVal(True), "nonzero": e}[name]
    if dtype is DType.u8:  # unsigned: z3's > and >= on bit-vectors are the signed comparisons
        zero = E.literal(dtype, 0)
        return {
            "finite": z3.BoolVal(True),
            "positive": z3.UGT(e, zero),
            "nonnegative": z3.BoolVal(True),
            "nonzero": e != zero,
        }[name]
    if not dtype.is_float:
        zero = E.literal(dtype, 0)
        return {"finite": z3.BoolVal(True), "positive": e > zero, "nonnegative": e >= zero, "nonzero": e != zero}[name]
    zero = z3.fpPlusZero(E.sort(dtype))
    return {
        "finite": z3.Not(z3.Or(z3.fpIsNaN(e), z3.fpIsInf(e))),
        "positive": z3.fpGT(e, zero),
        "nonnegative": z3.fpGEQ(e, zero),
        "nonzero": z3.Not(z3.fpIsZero(e)),  # as the harness reads it (t != 0): nan is nonzero
    }[name]


def _open_ops(t: Term) -> Counter:
    return Counter(u.op for u in leaves(t, OPEN) if u.kind != "choice")


def _decide(rule: Rule, ex: Example, after: Graph, q: _Query, rlimit: int):
    """(status, reason, counterexample, resources used) of one query."""
    with E.fresh_context():
        return _decide_in_context(rule, ex, after, q, rlimit)


def _decide_in_context(rule: Rule, ex: Example, after: Graph, q: _Query, rlimit: int):
    from gawee.equivalence import TOLERANCE

    z3 = E.z3mod()
    open_b, open_a = _opaque_set(q.before), _opaque_set(q.after)
    if open_b != open_a:
        ops = sorted({u.op for u in open_b ^ open_a})
        return "unknown", f"{', '.join(ops)} on different operands on the two sides (no encoding)", None, 0
    translate = E.Translator()
    b, a = translate(q.before), translate(q.after)
    if b.eq(a):  # two spellings with one encoding (floor_divide, div floor): the same function of the same inputs
        return "proven", "", None, 0
    facts = [_fact(name, translate(t), t.dtype) for name, t in q.facts]
    uninterpreted = bool(_open_ops(q.before) + _open_ops(q.after))
    functions = any(
        u.kind == "uf" or u.op == "floor_divide" or (u.op == "div" and ("rounding_mode", "floor") in u.key[1])
        for t in (q.before, q.after)
        for u in leaves(t, frozenset({"uf", "op"}))
    )  # (floor division's encoding has an uninterpreted function too: see encode._fmod)
    used = 0

    def check(goal):
        # a fresh solver per question: z3's incremental mode (push/pop) solves floats far more slowly
        # than bit-blasting to SAT, which handles no uninterpreted function
        nonlocal used
        solver = z3.Solver() if functions else z3.Then("simplify", "fpa2bv", "simplify", "bit-blast", "sat").solver()
        solver.set("rlimit", rlimit)
        solver.add(*facts, *translate.side, goal)
        before = _rlimit_count(solver)
        answer = solver.check()
        used += max(0, _rlimit_count(solver) - before)
        model = solver.model() if answer == z3.sat else None
        reason = solver.reason_unknown() if answer == z3.unknown else ""
        return answer, model, reason

    answer, model, why = check(z3.Not(E.equal(q.dtype, b, a)))
    if answer == z3.unsat:
        return "proven", "", None, used
    if answer == z3.unknown:
        return "unknown", f"solver gave up ({why}) on {_describe(q)}", None, used
    cx, why = _replay(rule, ex, after, _inputs_from_model(ex, model))
    if cx is None and q.dtype.is_float:  # a mere rounding difference? look for a large one
        goal = E.far_apart(q.dtype, b, a, TOLERANCE.get(q.dtype, 0.0))
        for _ in range(FAR_MODELS):
            answer, model, _ = check(goal)
            if answer != z3.sat:
                break
            cx, why = _replay(rule, ex, after, _inputs_from_model(ex, model))
            if cx is not None:
                break
            # the harness allows this one (a swing the original has too, a sum past the range): another input
            goal = z3.And(
                goal, z3.Or([d() != model[d] for d in model.decls() if d.arity() == 0] or [z3.BoolVal(False)])
            )
    if cx is not None:
        cx.reason = f"{cx.reason} (an input the SMT solver found)"
        cx.found_by = "the SMT solver"
        return "refuted", cx.reason, cx, used
    if uninterpreted:
        ops = sorted((_open_ops(q.before) + _open_ops(q.after)).keys())
        return "unknown", f"depends on {', '.join(ops)} (no exact encoding)", None, used
    return "unknown", f"the outputs differ on an input the solver found, within the tolerance ({why})", None, used


def _rlimit_count(solver) -> int:
    """z3's resource count so far (it counts over the whole z3 context)."""
    stats = solver.statistics()
    return int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0  # noqa: SIM118


def _describe(q: _Query) -> str:
    kinds = frozenset({"op", "uf"})
    ops = sorted({u.op for t in (q.before, q.after) for u in leaves(t, kinds)})
    return f"an element of {', '.join(ops) or 'constants'} in {q.dtype}"


def _opaque_set(t: Term) -> frozenset:
    return frozenset(leaves(t, frozenset({"opaque"})))


def _inputs_from_model(ex: Example, model) -> list[torch.Tensor]:
    """The graph's inputs with the model's values where it names them, 1 (or False) elsewhere."""
    values: dict[tuple[int, int], object] = {}
    for d in model.decls():
        name = d.name()
        if name.startswith("x") and "_" in name:
            k, _, i = name[1:].partition("_")
            if k.isdigit() and i.isdigit():
                values[(int(k), int(i))] = model[d]
    xs = []
    for k, v in enumerate(ex.graph.inputs):
        dtype = v.dtype
        flat = [1.0 if dtype.is_float else (False if dtype is DType.bool else 1)] * v.type.numel
        for (kk, i), val in values.items():
            if kk == k:
                flat[i] = E.value_of(dtype, val)
        if dtype.is_float:
            x = torch.tensor(flat, dtype=torch.float64).to(dtype.torch)
        else:
            x = torch.tensor(flat, dtype=dtype.torch)
        xs.append(in_layout(x.reshape(v.shape), v.type.layout))
    return xs


def _replay(rule: Rule, ex: Example, after: Graph, xs: list[torch.Tensor]):
    """(counterexample or None, why not) for inputs ``xs``, judged by the harness itself."""
    from gawee.testing.harness import _compare, facts_hold

    if not facts_hold(rule, ex, xs):
        return None, "the input breaks an assumption elsewhere"
    try:
        cx = _compare(rule, ex, after, xs)
    except S.Reject:
        return None, "the original does not run on it"
    return cx, "the harness accepts it"


def _replayed(cx, reason: str) -> InstanceProof:
    if cx is None:
        return InstanceProof("unknown", reason)
    return InstanceProof("refuted", cx.reason, cx)


__all__ = ["RLIMIT", "InstanceProof", "SymTensor", "prove_instance"]
