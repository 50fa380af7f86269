"""Rule guards over symbolic shapes decide soundly: true only when the claim holds for every size in
range; a claim that holds for some sizes only is false, and `explain` says why."""

import torch

import gawee
from gawee.ir.builder import GraphBuilder
from gawee.ir.symbolic import Sym
from gawee.ir.types import DType, TensorType
from gawee.rewrite.explain import explain

S = Sym("s0", 1, 16, 4)


def _graph(shape):
    b = GraphBuilder("g")
    x = b.input("x", TensorType(shape, DType.f32))
    b.output(b.relu(x))
    return b.graph


def _fires(rule: str, shape) -> tuple[bool, str]:
    rules = gawee.load_rules_text(rule)
    g = _graph(shape)
    _, report = gawee.rewrite(g, rules)
    (why,) = explain(g, next(iter(g)), rules)
    return report.total == 1, why.reason


def test_equal_sizes_hold_for_every_value():
    fired, _ = _fires("rule r: y: relu(x) where y.shape == x.shape => x", (S, 3))
    assert fired


def test_a_size_equal_to_a_number_only_at_the_example_does_not_hold():
    fired, why = _fires("rule r: relu(x) where x.shape[0] == 4 => x", (S, 3))
    assert not fired
    assert "not provable for every size: s0 in 1..16" in why


def test_negation_keeps_the_doubt():
    # `not (s0 == 4)` is true for most sizes but not all: still false, never unsound
    fired, why = _fires("rule r: relu(x) where not (x.shape[0] == 4) => x", (S, 3))
    assert not fired and "not provable" in why
    assert _fires("rule r: relu(x) where x.shape[0] != 0 => x", (S, 3))[0]  # s0 >= 1 always


def test_orderings_use_the_range():
    assert _fires("rule r: relu(x) where x.shape[0] <= 16 => x", (S, 3))[0]
    assert not _fires("rule r: relu(x) where x.shape[0] < 16 => x", (S, 3))[0]
    assert _fires("rule r: relu(x) where numel(x) >= 3 or x.rank == 7 => x", (S, 3))[0]
    assert not _fires("rule r: relu(x) where x.shape[0] > 1 and x.rank == 2 => x", (S, 3))[0]


def test_symbolic_slice_of_a_constant_is_not_folded():
    b = GraphBuilder("g")
    x = b.input("x", TensorType((S,), DType.f32))
    table = b.graph.constant(torch.arange(32.0), "table")
    part = b.slice(table, dim=0, start=0, end=S)
    b.output(b.add(x, part))
    g = b.graph
    opt, _ = gawee.rewrite(g)
    assert any(n.op == "slice" for n in opt)
    for n in (1, 5, 16):
        xs = torch.randn(n)
        assert torch.equal(gawee.run(opt, xs)[0], xs + torch.arange(float(n)))
