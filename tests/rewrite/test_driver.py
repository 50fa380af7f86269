"""The worklist rewriter: matching semantics, fixpoint, determinism, budget, trace and explain."""

import pytest
import torch

import gawee
from gawee import load_rules_text, rewrite
from gawee.errors import RewriteError
from gawee.ir.builder import GraphBuilder
from gawee.ir.verify import verify


def rules(text):
    return load_rules_text(text, "t.rules")


def ops(graph):
    return [n.op for n in graph]


def chain():
    b = GraphBuilder("c")
    x = b.input("x", "f32[2,3]")
    y = b.relu(b.relu(x))
    b.output(b.neg(b.neg(y)))
    return b.graph


def test_input_graph_is_never_modified():
    g = chain()
    before = str(g)
    out, report = rewrite(g, rules("rule rr: relu(y: relu(x)) => y\nrule nn: neg(neg(x)) => x"))
    assert str(g) == before and ops(out) == ["relu"]
    assert report.nodes_before == 4 and report.nodes_after == 1 and report.total == 2


def test_rewrites_reach_a_fixpoint_through_requeueing():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    y = x
    for _ in range(6):
        y = b.relu(y)
    b.output(y)
    out, report = rewrite(b.graph, rules("rule rr: relu(y: relu(x)) => y"))
    assert ops(out) == ["relu"] and report.firings["rr"] == 5


def test_pipe_requires_a_single_use_and_graph_outputs_count():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    n = b.neg(x)
    r = b.relu(n)
    b.output(r, n)  # n is also a graph output: two uses
    out, _ = rewrite(b.graph, rules("rule f: neg(x) |> relu() => abs(x)"))
    assert ops(out) == ["neg", "relu"]


def test_commutative_ops_match_both_operand_orders():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    c = b.const(torch.zeros(4), "zeros")
    b.output(b.add(c, b.neg(x)))
    out, _ = rewrite(b.graph, rules("rule f: add(neg(x), 0) => neg(x)"))
    assert ops(out) == ["neg"]


def test_literals_match_constants_whose_elements_all_equal():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    y1 = b.mul(x, b.const(torch.ones(4), "ones"))
    y2 = b.mul(x, b.const(torch.tensor([1.0, 1.0, 1.0, 1.0001]), "almost"))
    b.output(y1, y2)
    out, report = rewrite(b.graph, rules("rule m: y: mul(x, 1) where same_type(y, x) => x"))
    assert report.firings["m"] == 1 and ops(out) == ["mul"]


@pytest.mark.parametrize(
    ("dtype", "m2", "folds"),
    [
        ("f16", 0.5, True),
        ("f16", 1024.0, False),
        ("f32", -100.0, True),
        ("f32", 3e33, False),
        ("f32", float("nan"), False),
    ],
)
def test_reassociable_takes_constants_whose_sum_rounds_as_adding_them_in_turn(dtype, m2, folds):
    """-100 is Swin's window mask; 1024 in float16 has a last-place unit of 1."""
    b = GraphBuilder()
    x = b.input("x", f"{dtype}[4]")
    torch_dtype = {"f16": torch.float16, "f32": torch.float32}[dtype]
    m1 = b.const(torch.full((4,), 0.25, dtype=torch_dtype), "m1")
    b.output(b.add(b.add(x, m1), b.const(torch.tensor(m2, dtype=torch_dtype), "m2")))
    rule = "rule r: add(add(x, m1), m2) where const(m1, m2) and reassociable(m1, m2) => add(x, m1 + m2)"
    out, report = rewrite(b.graph, rules(rule))
    assert report.firings["r"] == folds and ops(out) == ["add"] * (2 - folds)


def test_a_variable_used_twice_binds_the_same_value():
    b = GraphBuilder()
    x, z = b.input("x", "f32[4]"), b.input("z", "f32[4]")
    b.output(b.sub(x, x), b.sub(x, z))
    out, report = rewrite(b.graph, rules("rule s: sub(x, x) => mul(x, 0)"))
    assert report.firings["s"] == 1 and ops(out) == ["mul", "sub"]


def test_unmentioned_attributes_must_be_default_unless_rest():
    b = GraphBuilder()
    x = b.input("x", "f32[1,2,8,8]")
    w = b.const(torch.randn(2, 2, 3, 3), "w")
    b.output(b.relu(b.conv2d(x, w, stride=[2, 2])))
    strict = rules('rule f: conv2d(x, w, b) |> relu() => conv2d(x, w, b, act="relu")')
    out, _ = rewrite(b.graph, strict)
    assert ops(out) == ["conv2d", "relu"]
    loose = rules('rule f: conv2d(x, w, b, act=none, ...a) |> relu() => conv2d(x, w, b, act="relu", ...a)')
    out, _ = rewrite(b.graph, loose)
    (conv,) = out.nodes
    assert conv.attrs["stride"] == (2, 2) and conv.attrs["act"] == "relu"
    gawee.assert_equivalent(b.graph, out)


def test_a_cycle_stops_with_an_error_naming_both_rules():
    g = chain()
    with pytest.raises(RewriteError) as info:
        rewrite(g, rules("rule to_abs: relu(x) => abs(x)\nrule to_relu: abs(x) => relu(x)"))
    msg = str(info.value)
    assert "to_abs (t.rules:1)" in msg and "to_relu (t.rules:2)" in msg


def test_replacement_of_another_type_is_a_rule_error():
    b = GraphBuilder()
    x = b.input("x", "f32[2,3]")
    b.output(b.relu(x))
    with pytest.raises(RewriteError, match=r"rule bad \(t.rules:1\).*f32\[3,2\] but %relu is f32\[2,3\]"):
        rewrite(b.graph, rules("rule bad: relu(x) => permute(x, dims=[1, 0])"))


def test_priority_then_file_order():
    g = chain()
    _, report = rewrite(g, rules("rule first: neg(neg(x)) => x\nrule second (priority=1): neg(x) => mul(x, -1)"))
    assert report.firings["second"] == 2 and "first" not in report.firings


def test_dead_nodes_are_erased_eagerly():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    dead = b.sigmoid(b.exp(x))
    b.output(b.relu(x))
    assert dead.num_uses == 0
    out, report = rewrite(b.graph, rules("rule nothing: tanh(x) => x"))
    assert ops(out) == ["relu"] and report.erased == 2


def test_cse_and_constant_folding_from_the_bundled_rules():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    w = b.const(torch.arange(4.0), "w")
    s = b.mul(b.add(w, 1.0), 2.0)  # constant subexpression
    y1, y2 = b.relu(x), b.relu(x)  # common subexpression
    b.output(b.add(b.add(y1, y2), s))
    out, report = rewrite(b.graph)
    assert report.firings["fold_constants"] == 2 and report.firings["cse"] == 1
    assert ops(out) == ["relu", "add", "add"]
    gawee.assert_equivalent(b.graph, out)
    verify(out)


def test_trace_records_every_firing():
    _, report = rewrite(chain(), rules("rule rr: relu(y: relu(x)) => y\nrule nn: neg(neg(x)) => x"), trace=True)
    assert [(f.rule, f.location) for f in report.trace] == [("rr", "t.rules:1"), ("nn", "t.rules:2")]
    assert report.trace[0].matched == ("relu_1:relu", "relu:relu")
    assert "rr (t.rules:1): relu_1:relu + relu:relu -> %relu" in str(report.trace[0])


def test_new_nodes_record_the_rule_that_made_them():
    b = GraphBuilder()
    x = b.input("x", "f32[4]")
    b.output(b.neg(b.relu(x)))
    out, _ = rewrite(b.graph, rules("rule f: neg(relu(x)) => mul(relu(x), -1)"))
    assert {n.source for n in out} == {"f (t.rules:1)"}


def test_explain_says_which_sub_pattern_or_guard_failed():
    b = GraphBuilder()
    x = b.input("x", "f32[2,3]")
    y = b.relu(b.sigmoid(x))
    b.output(y)
    rs = rules(
        "rule a: relu(relu(x)) => relu(x)\n"
        "rule b: relu(s: sigmoid(x)) where x.rank == 2 and s.rank == 3 => s\n"
        "rule c: relu(x) => relu(x)\n"
    )
    got = {e.rule: e for e in gawee.explain(b.graph, y.producer.name, rs)}
    assert got["a"].outcome == "pattern" and "expected relu(...), found %sigmoid = sigmoid(...)" in got["a"].reason
    assert got["b"].outcome == "guard" and "`s.rank == 3`" in got["b"].reason
    assert got["c"].outcome == "matches"


def test_rewriting_twice_gives_byte_identical_json(tmp_path):
    from tests.conftest import captured

    g, _, _ = captured("resnet18")
    a, _ = rewrite(g)
    b, _ = rewrite(g)
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "a2.json")
    assert (tmp_path / "a.json").read_text().replace("a.npz", "X") == (tmp_path / "a2.json").read_text().replace(
        "a2.npz", "X"
    )
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "a2.npz").read_bytes()


def test_python_helper_in_a_guard():
    from gawee import Helper

    calls = []

    def wide(v):
        """True for tensors with more than 2 columns."""
        calls.append(v.name)
        return v.shape[-1] > 2

    rs = load_rules_text(
        "rule f: relu(x) where wide(x) => abs(x)", "h.rules", helpers={"wide": Helper(wide, returns="bool")}
    )
    out, _ = rewrite(chain(), rs)
    assert calls and "abs" in ops(out)


def test_explain_looks_through_users_for_fusions():
    b = GraphBuilder()
    x = b.input("x", "f32[1,2,6,6]")
    conv = b.conv2d(x, b.const(torch.randn(2, 2, 3, 3), "w"))
    b.output(b.relu(conv), conv)  # the conv output is also returned: `|>` must refuse
    got = [e for e in gawee.explain(b.graph, conv.producer.name, gawee.default_rules()) if e.rule == "fuse_conv_relu"]
    assert got and got[0].outcome == "pattern"
    assert "via its user relu" in got[0].reason and "has 2 uses; `|>` needs exactly one" in got[0].reason
