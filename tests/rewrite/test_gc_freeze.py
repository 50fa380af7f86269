"""rewrite() keeps the cyclic collector off the objects older than the rewrite, and leaves gc as it found it."""

import gc

from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import RuleSet, load_rules_text


def _graph():
    b = GraphBuilder("g")
    return b.output(b.relu(b.relu(b.input("x", "f32[4]"))))


def test_old_objects_are_frozen_during_a_rewrite_and_released_after():
    seen = []
    rules = load_rules_text(
        "rule rr: relu(relu(x)) where probe(x) => relu(x)",
        helpers={"probe": lambda x: seen.append(gc.get_freeze_count()) or True},
    )
    before = gc.get_freeze_count()
    _, report = rewrite(_graph(), rules)
    assert report.total == 1 and seen and seen[0] > 0  # the graph and the caller's heap were frozen
    assert gc.get_freeze_count() == before == 0


def test_the_copy_being_rewritten_is_frozen_too():
    """The copy is made inside the rewrite: frozen once made, a full collection does not walk it again and
    again (gc.get_objects lists the collected generations only, not the frozen one)."""
    seen = []

    def probe(x):
        seen.append(any(o is x for o in gc.get_objects()))
        return True

    graph = _graph()
    _, report = rewrite(
        graph, load_rules_text("rule rr: relu(relu(x)) where probe(x) => relu(x)", helpers={"probe": probe})
    )
    assert report.total == 1 and seen == [False]  # x: the copy's input, made by the rewrite
    assert any(o is graph.inputs[0] for o in gc.get_objects())  # released after


def test_what_a_phase_made_is_frozen_before_the_next():
    """The relu the first phase made is not walked by the second phase's full collections."""
    seen = []

    def probe(y):
        seen.append(any(o is y for o in gc.get_objects()))
        return True

    first = load_rules_text("rule a: relu(relu(x)) => relu(x)")
    second = load_rules_text("rule b: y: relu(x) where probe(y) => neg(neg(relu(x)))", helpers={"probe": probe})
    b = GraphBuilder("g")
    graph = b.output(b.relu(b.relu(b.exp(b.input("x", "f32[4]")))))
    _, report = rewrite(graph, RuleSet([*first.phases, *second.phases]), max_firings=2)
    assert report.firings == {"a": 1, "b": 1} and seen == [False]


def test_a_callers_own_freeze_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few frozen objects may have been freed)
    finally:
        gc.unfreeze()


def test_the_collector_is_paused_while_the_copy_is_made(monkeypatch):
    """Copying makes no garbage: the collector is off while the copy grows (its full collections walked the
    copy again and again), and on again after."""
    from gawee.ir.core import Graph

    seen, clone = [], Graph.clone
    monkeypatch.setattr(Graph, "clone", lambda self: (seen.append(gc.isenabled()), clone(self))[1])
    rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
    assert seen == [False] and gc.isenabled()


def test_a_rewrite_leaves_no_cyclic_garbage():
    """Matching (one root and several), folding, building and erasing free what they drop by reference counting:
    nothing is left for the cyclic collector. A closure that called itself per match attempt and erased nodes
    that kept their outputs (each pointing back) were cycles; at 100k nodes the collector's passes over them were
    a tenth of the rewrite and grew faster than the graph (benchmarks/README.md, engine speed)."""
    import torch

    rules = load_rules_text(
        """
rule both: a: relu(x), b: neg(x) => sigmoid(x), tanh(x)
rule fold: mul(x, c) where const(c) => mul(x, c * 1.0 + 0.0)
rule rr: relu(relu(x)) => relu(x)
"""
    )
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    c = b.const(torch.tensor([2.0, 3.0, 4.0, 5.0]), "c")
    graph = b.output(b.add(b.relu(x), b.neg(x)), b.relu(b.relu(b.exp(x))), b.mul(x, c))
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _, report = rewrite(graph, rules)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert report.firings["both"] == 1 and report.firings["rr"] == 1, report.firings
    assert left == []


def test_an_erased_node_inserted_again_produces_its_outputs_again():
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    graph = b.output(b.neg(x))
    node = graph.create_node("relu", [x])
    graph.erase_node(node)
    assert node.outputs[0].producer is None  # out of the graph: no cycle with its outputs
    graph.insert(node)
    assert node.outputs[0].producer is node and node.outputs[0].output_index == 0
