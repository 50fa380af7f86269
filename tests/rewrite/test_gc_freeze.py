"""rewrite() keeps the cyclic collector off while it runs, leaves no cyclic garbage, and leaves gc as it found it;
the graphs a caller drops are collected."""

import gc
from pathlib import Path

from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import load_rules_text


def _graph():
    b = GraphBuilder("g")
    return b.output(b.relu(b.relu(b.input("x", "f32[4]"))))


def test_the_collector_is_off_during_a_rewrite_and_on_after():
    seen = []
    rules = load_rules_text(
        "rule rr: relu(relu(x)) where probe(x) => relu(x)",
        helpers={"probe": lambda x: seen.append(gc.isenabled()) or True},
    )
    _, report = rewrite(_graph(), rules)
    assert report.total == 1 and seen == [False]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_what_a_rewrite_made_joins_the_oldest_generation():
    """The copy and its rewritten nodes are moved to the oldest generation unscanned: the caller's next young
    collection does not walk them (gc.get_objects lists a generation's objects)."""
    gc.collect()
    out, _ = rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
    value = out.inputs[0]
    assert any(o is value for o in gc.get_objects(generation=2))
    assert not any(o is value for o in gc.get_objects(generation=0))


def test_a_rewrite_leaves_the_collector_off_when_it_was_off():
    gc.disable()
    try:
        rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_callers_own_freeze_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few frozen objects may have been freed)
    finally:
        gc.unfreeze()


def test_the_collector_is_paused_while_the_copy_is_made():
    """Copying makes no garbage: the collector is off while the copy grows (its full collections walked the
    copy again and again), and on again after."""
    seen = []

    class Watched:  # the compiled Graph's methods cannot be patched: what rewrite copies, observed
        def __init__(self, graph):
            self.graph = graph

        def clone(self):
            seen.append(gc.isenabled())
            return self.graph.clone()

    rewrite(Watched(_graph()), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
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


def test_graphs_a_caller_drops_are_collected(monkeypatch):
    """What a rewrite made joins the oldest generation uncounted by CPython's trigger for a full collection; the
    driver counts it, so the result graphs a loop drops (cyclic: nodes and values point at each other) are collected
    instead of piling up. Without that count no collection runs at all in such a loop (each rewrite restarts the
    young generation's count)."""
    import sys
    import weakref

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import engine_speed

    from gawee.rewrite import driver

    monkeypatch.setattr(driver, "FULL_COLLECTION_UNKNOWN", 20_000)  # a rewrite of this graph moves about 4.6k
    monkeypatch.setattr(driver._Oldest, "survivors", None)
    graph, rules = engine_speed.gawee_graph(300), load_rules_text("rule rr: relu(relu(x)) => relu(x)")
    gc.collect()
    dropped = []
    for _ in range(8):
        out, _ = rewrite(graph, rules)
        dropped.append(weakref.ref(out))
        del out
    assert dropped[0]() is None and dropped[-1]() is not None  # collected by the fifth rewrite, the last one not yet


def test_the_oldest_generation_is_collected_once_what_moved_outnumbers_what_its_last_collection_left(monkeypatch):
    from gawee.rewrite import driver

    collections = []
    monkeypatch.setattr(driver.gc, "collect", lambda *a: collections.append(a) or 0)
    for name, value in (("full_collections", gc.get_stats()[-1]["collections"]), ("moved", 0), ("survivors", 500_000)):
        monkeypatch.setattr(driver._Oldest, name, value)
    driver._moved_to_oldest(400_000)
    assert collections == [] and driver._Oldest.moved == 400_000
    driver._moved_to_oldest(200_000)
    assert collections == [()] and driver._Oldest.moved == 0 and driver._Oldest.survivors > 0  # counted anew
    monkeypatch.setattr(driver._Oldest, "survivors", 10)
    driver._moved_to_oldest(driver.FULL_COLLECTION_FLOOR - 1)  # more than survived, fewer than the floor
    assert len(collections) == 1
    monkeypatch.setattr(driver._Oldest, "full_collections", -1)  # a full collection of someone else's since
    driver._moved_to_oldest(driver.FULL_COLLECTION_FLOOR)
    assert len(collections) == 1 and driver._Oldest.survivors is None  # what it left is not known
