"""rewrite() keeps the cyclic collector off the objects older than the rewrite, and leaves gc as it found it."""

import gc

from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import load_rules_text


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


def test_a_callers_own_freeze_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        rewrite(_graph(), load_rules_text("rule rr: relu(relu(x)) => relu(x)"))
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few frozen objects may have been freed)
    finally:
        gc.unfreeze()
