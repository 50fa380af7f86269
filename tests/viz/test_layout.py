"""The layered layout: boxes never overlap, edges run downwards and around boxes, output is deterministic."""

import itertools

import pytest

from gawee.viz.layout import Spacing, _place, layered_layout
from gawee.viz.svg import view_svg
from gawee.viz.view import build_view


def _residual_chain():
    """a → b → c → d → e, plus a skip edge a → e that must run beside b, c, d."""
    sizes = {k: (80.0, 30.0) for k in "abcde"}
    edges = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("a", "e")]
    return sizes, edges


def _overlap(p, q) -> bool:
    return (abs(p.x - q.x) < (p.width + q.width) / 2) and not (p.bottom <= q.y or q.bottom <= p.y)


def test_layers_top_down_and_no_box_overlaps_another():
    sizes, edges = _residual_chain()
    layout = layered_layout(sizes, edges, pinned_top=["a"])
    ys = [layout.boxes[k].y for k in "abcde"]
    assert ys == sorted(ys) and len(set(ys)) == 5
    placed = list(layout.boxes.values())
    assert not any(_overlap(p, q) for i, p in enumerate(placed) for q in placed[i + 1 :])
    assert all(p.left >= 0 and p.x + p.width / 2 <= layout.width for p in placed)
    assert all(p.bottom <= layout.height for p in placed)


def test_a_long_edge_runs_in_a_lane_beside_the_boxes_it_passes():
    sizes, edges = _residual_chain()
    layout = layered_layout(sizes, edges, pinned_top=["a"])
    skip = layout.edges[-1]
    assert skip[0][1] == layout.boxes["a"].bottom and skip[-1][1] == layout.boxes["e"].y
    for name in "bcd":  # no point of the skip edge's lane lies inside b, c or d
        box = layout.boxes[name]
        assert not any(box.left <= x <= box.left + box.width and box.y <= y <= box.bottom for x, y in skip[1:-1])
    for path in layout.edges:  # every edge goes downwards
        assert all(y1 <= y2 for (_, y1), (_, y2) in itertools.pairwise(path))


def test_the_same_input_gives_the_same_layout_and_svg(block):
    sizes, edges = _residual_chain()
    assert layered_layout(sizes, edges) == layered_layout(dict(sizes), list(edges))
    _, optimized, _ = block
    assert view_svg(build_view(optimized)) == view_svg(build_view(optimized.clone()))


def test_sources_that_are_not_inputs_sit_just_above_their_reader():
    sizes = {k: (40.0, 20.0) for k in "abcdz"}
    layout = layered_layout(sizes, [("a", "b"), ("b", "c"), ("c", "d"), ("z", "d")], pinned_top=["a"])
    rows = sorted({p.y for p in layout.boxes.values()})
    assert rows.index(layout.boxes["z"].y) == rows.index(layout.boxes["c"].y)


def test_placement_is_the_least_squares_fit_under_the_gaps():
    spacing = Spacing(box_gap=10.0)
    widths, dummy = [20.0, 20.0, 20.0], [False] * 3
    # far apart: each box where it wants to be
    assert _place([0, 1, 2], [0.0, 100.0, 200.0], widths, dummy, spacing) == [0.0, 100.0, 200.0]
    # all want 0: packed 30 apart, centred on 0
    assert _place([0, 1, 2], [0.0, 0.0, 0.0], widths, dummy, spacing) == [-30.0, 0.0, 30.0]


def test_edges_out_of_order_are_refused():
    with pytest.raises(ValueError, match="topological order"):
        layered_layout({"a": (1, 1), "b": (1, 1)}, [("b", "a")])
