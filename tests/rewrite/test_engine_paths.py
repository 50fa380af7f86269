"""The rewriter's shortcuts give what the general paths give: guard chains in Kleene logic, attributes prepared
when a replacement is compiled, the host fold, a new node's attributes and types from one cache, the graph's
copy, and the small-tensor facts read in Python."""

import math

import pytest
import torch

import gawee
from gawee.analysis.tensor_facts import SMALL, abs_peak, abs_range, all_finite, elements
from gawee.ir.builder import GraphBuilder
from gawee.ir.symbolic import Sym
from gawee.ir.types import DType, TensorType
from gawee.ir.verify import verify
from gawee.ops import base, get_op
from gawee.rewrite import context

S = Sym("s0", 1, 16, 4)


def _fires(guard: str, shape=(S, 3)) -> bool:
    b = GraphBuilder("g")
    b.output(b.relu(b.input("x", TensorType(shape, DType.f32))))
    _, report = gawee.rewrite(b.graph, gawee.load_rules_text(f"rule r: relu(x) where {guard} => x"))
    return report.total == 1


UNKNOWN = "x.shape[0] == 4"  # holds for s0 = 4 only: neither true nor false for every size (None)


@pytest.mark.parametrize(
    ("guard", "fires"),
    [
        (f"{UNKNOWN} and x.rank == 2", False),  # unknown and true: unknown, which does not fire
        (f"x.rank == 2 and {UNKNOWN} and x.rank == 2", False),
        (f"{UNKNOWN} or x.rank == 2", True),  # unknown or true: true
        (f"x.rank == 7 or {UNKNOWN} or x.rank == 2", True),
        (f"x.rank == 7 or {UNKNOWN}", False),  # false or unknown: unknown
        (f"not ({UNKNOWN} and x.rank == 7)", True),  # unknown and false is false: its negation holds
        (f"not ({UNKNOWN} or x.rank == 7)", False),  # unknown or false is unknown, and so is its negation
        ("x.rank == 2 and (x.rank == 7 or x.shape[1] == 3) and x.shape[1] > 2", True),
    ],
)
def test_guard_chains_decide_in_kleene_logic(guard, fires):
    assert _fires(guard) is fires


@pytest.mark.parametrize(("guard", "fires"), [("absent(b) or finite(b)", True), ("present(b) and finite(b)", False)])
def test_a_guard_chain_stops_at_its_first_decisive_term(guard, fires):
    # finite(b) of an absent b fails the whole guard (GuardFailed): it fires only if `absent(b)` decided first
    rules = gawee.load_rules_text(
        f'rule r: conv2d(x, w, b, act=none, ...attrs) |> relu() where {guard} => conv2d(x, w, b, act="relu", ...attrs)'
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[1,2,4,4]")
    b.output(b.relu(b.conv2d(x, b.const(torch.randn(2, 2, 1, 1), "w"))))
    _, report = gawee.rewrite(b.graph, rules)
    assert report.total == int(fires)


RESHAPE_SCALE = """
rule r:
    y: neg(mul(x, c)) where const(c) and c.rank == 1
    => mul(x, reshape(c * -2.0 + 1.0, [-1]))
"""


def test_literal_attributes_are_prepared_once_and_fold_as_before(monkeypatch):
    rules = gawee.load_rules_text(RESHAPE_SCALE)
    b = GraphBuilder("g")
    x = b.input("x", "f32[3]")
    c = torch.tensor([1.0, -2.0, 0.5])
    b.output(b.neg(b.mul(x, b.const(c, "c"))))
    calls = []
    real = base.OpDef._prepare
    monkeypatch.setattr(base.OpDef, "_prepare", lambda *a: calls.append(a[0].name) or real(*a))
    base._PREPARED.clear()
    out, report = gawee.rewrite(b.graph, rules)
    assert report.firings["r"] == 1
    (folded,) = [v for n in out for v in n.inputs if v is not None and v.data is not None]
    assert torch.equal(folded.data, c * -2.0 + 1.0)
    # ops of literal attributes and no canonicalization (mul, add) were prepared when the rule was compiled; a
    # reshape's canonicalization reads its operand's type: it is prepared as it fires
    assert "add" not in calls and "mul" not in calls and "reshape" in calls


def test_the_host_fold_refuses_what_the_general_fold_refuses():
    # an f16 weight scaled past f16's range: the fold's result check turns the firing down on both paths
    rules = gawee.load_rules_text("rule r: y: mul(x, c) where const(c) => mul(x, c * 60000.0)")
    b = GraphBuilder("g")
    x = b.input("x", "f16[2]")
    b.output(b.mul(x, b.const(torch.tensor([2.0, 3.0], dtype=torch.float16), "c")))
    _, report = gawee.rewrite(b.graph, rules)
    assert report.total == 0


def test_the_host_fold_leaves_failures_to_the_general_path():
    g = GraphBuilder("g")
    x = g.input("x", "f32[2]")
    g.output(g.relu(x))
    rule = gawee.load_rules_text("rule r: relu(x) => x").rules[0]
    ctx = context.RewriteContext(g.graph, rule, next(iter(g.graph)), {})
    a = context.detached_constant(torch.ones(2))
    b_ = context.detached_constant(torch.ones(3))
    add = get_op("add")
    prepared = add.prepare_attrs({}, None, shared=True)
    assert ctx._fold_host(add, [a, b_], prepared) is None  # shapes that do not broadcast: not folded here
    with pytest.raises(gawee.GaweeError, match="evaluating add on constants failed"):
        ctx.emit_op(add, [a, b_], {}, prepared=prepared)  # the general path words the failure
    assert ctx._fold_host(add, [a, None], prepared) is None  # an absent operand: the general path's error
    assert torch.equal(ctx._fold_host(add, [a, a], prepared).data, torch.full((2,), 2.0))


def test_a_new_nodes_attributes_and_types_come_from_one_cache():
    conv = get_op("conv2d")
    types = [TensorType((1, 2, 5, 5), DType.f32), TensorType((3, 2, 3, 3), DType.f32), None, None]
    base._NODE_CACHE.clear()
    attrs, out = conv.prepare_and_infer({"padding": [1, 1]}, types)
    assert attrs == conv.prepare_attrs({"padding": [1, 1]}, types)
    assert list(out) == conv.infer_types(types, attrs) == [TensorType((1, 3, 5, 5), DType.f32)]
    assert conv.prepare_and_infer({"padding": [1, 1]}, types) is conv.prepare_and_infer({"padding": [1, 1]}, types)
    other = conv.prepare_and_infer({"padding": [2, 2]}, types)
    assert other[0]["padding"] == (2, 2) and other[1] == (TensorType((1, 3, 7, 7), DType.f32),)
    with pytest.raises(gawee.GaweeError):
        conv.prepare_and_infer({"padding": [1, 1]}, [types[0], TensorType((3, 4, 3, 3), DType.f32), None, None])
    assert len(base._NODE_CACHE) == 2  # the failure was not kept


def test_the_copy_keeps_order_names_uses_constants_and_outputs():
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,3]")
    w = b.const(torch.randn(2, 3), "w")
    y = b.add(x, w)
    z = b.mul(y, w)
    g = b.output(z, y, w)  # a constant among the outputs, and a value read twice
    c = g.clone()
    verify(c)
    assert str(c) == str(g) and [n.name for n in c] == [n.name for n in g]
    assert [n._order for n in c] == [0.0, 1.0]
    (cw,) = {id(v): v for n in c for v in n.inputs if v.data is not None}.values()
    assert cw is c.outputs[2] and cw.data is w.data and len(cw.uses) == 2 and cw is not w
    assert c.unique_name("add") == "add_1" and g.unique_name("add") == "add_1"  # names taken in both, apart
    c.create_node("relu", [c.outputs[0]])
    assert len(c) == 3 and len(g) == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_small_tensors_finiteness_is_exact_when_its_sum_is_not(dtype):
    big = torch.finfo(dtype).max
    t = torch.full((SMALL,), big, dtype=dtype)  # finite, its sum overflows float64 for float64
    assert all_finite(t)
    t[3] = math.inf
    assert not all_finite(t)
    t[3] = math.nan
    assert not all_finite(t)
    assert not all_finite(torch.tensor([math.inf, -math.inf], dtype=dtype))  # a sum of nan


@pytest.mark.parametrize("shape", [(), (4,), (4, 1, 1, 1), (2, 3), (1, 2, 2, 2), (0,), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_small_tensors_facts_read_in_python_agree_with_torch(shape, dtype):
    gen = torch.Generator().manual_seed(len(shape))
    base_values = torch.randn(shape, generator=gen).to(dtype)
    specials = [None, 0.0, -0.0, math.inf, -math.inf, math.nan, torch.finfo(dtype).tiny / 4]
    for special in specials:
        t = base_values.clone()
        if special is not None and t.numel():
            t.view(-1)[t.numel() // 2] = special
        assert list(map(repr, elements(t))) == list(map(repr, t.reshape(-1).tolist()))  # nan and -0.0 alike
        assert all_finite(t) == bool(torch.isfinite(t).all())
        if not t.numel():
            assert abs_peak(t) == 0.0
            continue
        lo, hi = (x.item() for x in torch.aminmax(t.abs().double()))
        if math.isnan(lo) or math.isnan(hi):
            assert all(math.isnan(x) for x in abs_range(t)) and math.isnan(abs_peak(t))
        else:
            assert abs_range(t) == (lo, hi) and abs_peak(t) == hi


ROOT_CHECKED = """
rule fold_it (priority=9):
    y: _(...) where foldable(y) and result_size(y) <= 64 => fold(y)
"""


def test_a_guards_conjunct_on_the_root_is_asked_before_matching(monkeypatch):
    from gawee.dsl import library
    from gawee.rewrite import driver

    rules = gawee.load_rules_text(ROOT_CHECKED)
    (rule,) = rules.rules
    assert rule.root_checks == ("foldable",)
    asked = []
    monkeypatch.setitem(library.NODE_CHECKS, "foldable", lambda n: asked.append(n.op) or library._inputs_constant(n))
    monkeypatch.setattr(driver, "NODE_CHECKS", library.NODE_CHECKS)
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    c = b.add(b.const(torch.ones(4), "a"), b.const(torch.ones(4), "b"))
    graph = b.output(b.relu(b.mul(x, c)))
    out, report = gawee.rewrite(graph, rules)
    assert report.firings["fold_it"] == 1 and [n.op for n in out] == ["mul", "relu"]
    assert asked == ["add", "mul", "relu"]  # each node visited, asked once (the fold's user was queued already)
    # the soundness harness builds replacements without the guard: no node check there either
    asked.clear()
    copy = graph.clone()
    relu = next(n for n in copy if n.op == "relu")
    assert not driver.fire(copy, rule, relu, use_guard=True) and asked == ["relu"]
    asked.clear()
    with pytest.raises(gawee.GaweeError, match="fold"):  # built without its guard: fold() of a computed value
        driver.fire(copy, rule, relu, use_guard=False)
    assert asked == []


@pytest.mark.parametrize(
    ("guard", "checks"),
    [
        ("foldable(y) and duplicate(y)", ("foldable", "duplicate")),
        ("foldable(y) or duplicate(y)", ()),  # a disjunction: neither is necessary
        ("not foldable(y)", ()),
        ("foldable(x)", ()),  # not the root's value
    ],
)
def test_only_necessary_conjuncts_on_the_root_become_node_checks(guard, checks):
    (rule,) = gawee.load_rules_text(f"rule r: y: relu(x) where {guard} => x").rules
    assert rule.root_checks == checks


def test_a_helper_named_as_a_builtin_is_not_a_node_check():
    rules = gawee.load_rules_text("rule r: y: relu(x) where foldable(y) => x", helpers={"foldable": lambda y: True})
    (rule,) = rules.rules
    assert rule.root_checks == ()
    b = GraphBuilder("g")
    graph = b.output(b.relu(b.input("x", "f32[4]")))
    assert gawee.rewrite(graph, rules)[1].total == 1  # the helper's answer, not foldable's node check


def test_node_checks_survive_the_checked_file_cache(tmp_path):
    from gawee.dsl import check_cache

    text, file = ROOT_CHECKED, "root.rules"
    (compiled,) = gawee.load_rules_text(text, file).rules
    check_cache.store([(compiled.ast, "", [compiled])], text, file, where=tmp_path)
    (lazy,) = check_cache.load(text, file, where=tmp_path)
    assert lazy.root_checks == ("foldable",) and not lazy.compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["mul", "add", "div"])
def test_a_small_folds_check_in_python_agrees_with_the_full_check(dtype, op):
    opdef = get_op(op)
    big = torch.finfo(dtype).max
    cases = [
        [1.0, -2.0, 3.0],
        [0.0, 1.0, 2.0],  # a zero: looked at element by element (mul, div), or exact (add)
        [-0.0, 5.0],
        [torch.finfo(dtype).tiny / 4, 1.0],  # subnormal
        [big, 1.0],  # past the headroom
        [math.inf, 1.0],
        [math.nan, 1.0],
        [1.0] * SMALL,
    ]
    for values in cases:
        t = torch.tensor(values, dtype=dtype)
        data = [torch.ones_like(t), torch.ones_like(t)]
        assert context._fold_problem(opdef, data, {}, t) == context.result_problem(opdef, data, {}, t), values


def test_nodes_no_rule_is_tried_at_are_not_visited_but_dead_ones_are_erased(monkeypatch):
    rules = gawee.load_rules_text("rule rr: relu(relu(x)) => relu(x)")
    (phase,) = rules.phases
    assert phase.idle("exp") and phase.idle("neg") and not phase.idle("relu")  # known now: not asked again
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    b.exp(b.neg(x))  # dead: read by nothing
    graph = b.output(b.relu(b.relu(b.exp(x))))
    visited = []
    real = phase.candidates  # asked of every node the worklist visits (the rules to try there)
    monkeypatch.setattr(phase, "candidates", lambda op: visited.append(op) or real(op))
    out, report = gawee.rewrite(graph, rules)
    assert report.firings["rr"] == 1 and [n.op for n in out] == ["exp", "relu"]
    assert report.erased == 4  # the dead exp and the neg it alone read; the two relus the rule replaced
    assert set(visited) == {"relu"}


def test_a_worklist_mark_left_by_a_stopped_rewriter_does_not_hide_nodes_from_the_next():
    """A rewriter marks the nodes its worklist holds (no set of queued nodes); one stopped early leaves its marks
    on the nodes it had queued, and a later rewriter of the same graph still visits them."""
    from gawee.rewrite.driver import Rewriter

    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    b.output(b.neg(b.relu(b.relu(b.relu(b.relu(x))))))
    g = b.graph
    rules = gawee.load_rules_text("rule rr: relu(relu(x)) => relu(x)")
    first = Rewriter(g, rules, max_firings=1).run()
    assert first.total == 1 and any(n._queued_in for n in g)  # stopped with nodes still queued
    Rewriter(g, rules).run()
    assert [n.op for n in g] == ["relu", "neg"] and not any(n._queued_in for n in g)
    verify(g)
