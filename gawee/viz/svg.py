"""A GraphView drawn as inline SVG with gawee's own layered layout: no Graphviz, no JavaScript.

Boxes are sized from their text in a monospace font (so the estimate of each line's
width is exact enough), laid out by :mod:`gawee.viz.layout`, and written with
presentation attributes only, so the SVG looks the same embedded in a page or alone.
"""

from __future__ import annotations

import itertools
from html import escape

from gawee.ir.core import Graph
from gawee.viz.layout import Layout, Point, layered_layout
from gawee.viz.view import (
    CONST_COLOR,
    EDGE_COLOR,
    NO_PROVENANCE,
    STYLES,
    Box,
    GraphView,
    Provenance,
    build_view,
    style_class,
)

FONT = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
TITLE_PX, TEXT_PX = 12.0, 10.5
CHAR_EM = 0.61
"""Advance width of a monospace character, in em (DejaVu Sans Mono: 0.602)."""
LINE_H, PAD_X, PAD_Y = 13.0, 8.0, 5.0


def graph_svg(graph: Graph, prov: Provenance = NO_PROVENANCE, *, original: bool = False, prefix: str = "g") -> str:
    """``graph`` as an ``<svg>`` element; ``prefix`` keeps element ids unique when a page holds several."""
    return view_svg(build_view(graph, prov, original=original), prefix=prefix)


def view_svg(view: GraphView, *, prefix: str = "g") -> str:
    """A GraphView as an ``<svg>`` element (deterministic: the same view gives the same text)."""
    sizes = {b.id: _box_size(b) for b in view.boxes}
    layout = layered_layout(
        sizes, [(e.src, e.dst) for e in view.edges], pinned_top=[b.id for b in view.boxes if b.kind == "input"]
    )
    w, h = _num(layout.width), _num(layout.height)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" id="{prefix}" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="{FONT}" role="img" aria-label="{escape(view.name)}">',
        f'<defs><marker id="{prefix}-arrow" viewBox="0 0 8 8" refX="7.5" refY="4" markerWidth="7" '
        f'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{EDGE_COLOR}"/></marker></defs>',
        '<g class="edges">',
    ]
    out += _edges(view, layout, prefix)
    out.append('</g><g class="boxes">')
    out += [_box(b, layout, prefix) for b in view.boxes]
    out.append("</g></svg>")
    return "\n".join(out)


def _box_size(box: Box) -> tuple[float, float]:
    lines = box.lines()
    chars = max((len(t) * (TITLE_PX if k == "title" else TEXT_PX) for k, t in lines), default=0.0)
    width = max(chars * CHAR_EM + 2 * PAD_X, 64.0)
    height = 2 * PAD_Y + 2 + LINE_H * len(lines) + (2 if box.consts else 0)
    return round(width, 1), round(height, 1)


def _edges(view: GraphView, layout: Layout, prefix: str) -> list[str]:
    out = []
    drawn: set[tuple[Point, Point]] = set()  # the edges of one value share its lane: draw each piece once
    for edge, pts in zip(view.edges, layout.edges):
        d = _curve(pts, drawn)
        if d:
            out.append(
                f'<path d="{d}" fill="none" stroke="{EDGE_COLOR}" stroke-width="1.2" '
                f'marker-end="url(#{prefix}-arrow)"/>'
            )
        if edge.label:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            x, y = x1 + (x2 - x1) * 0.75, y1 + (y2 - y1) * 0.75
            out.append(
                f'<text x="{_num(x + 3)}" y="{_num(y)}" font-size="9" fill="{EDGE_COLOR}">{escape(edge.label)}</text>'
            )
    return out


def _curve(pts: tuple[Point, ...], drawn: set[tuple[Point, Point]]) -> str:
    """A path through ``pts``, leaving out the pieces already in ``drawn`` (and adding the rest):
    vertical runs stay straight, other steps are S-curves (as dot draws them)."""
    d: list[str] = []
    at = None
    for a, b in itertools.pairwise(pts):
        if (a, b) in drawn:
            continue
        drawn.add((a, b))
        if at != a:
            d.append(f"M{_num(a[0])},{_num(a[1])}")
        (x1, y1), (x2, y2) = a, b
        if x1 == x2:
            d.append(f"L{_num(x2)},{_num(y2)}")
        else:
            ym = (y1 + y2) / 2
            d.append(f"C{_num(x1)},{_num(ym)} {_num(x2)},{_num(ym)} {_num(x2)},{_num(y2)}")
        at = b
    return " ".join(d)


def _box(box: Box, layout: Layout, prefix: str) -> str:
    p = layout.boxes[box.id]
    cls = style_class(box)
    st = STYLES[cls]
    rx = p.height / 2 if box.kind in ("input", "output") else 5
    dash = ' stroke-dasharray="5 3"' if st.dashed else ""
    out = [
        f'<g id="{prefix}-{box.id}" class="box {cls}"><title>{escape(box.tooltip)}</title>',
        f'<rect x="{_num(p.left)}" y="{_num(p.y)}" width="{_num(p.width)}" height="{_num(p.height)}" '
        f'rx="{_num(min(rx, 12))}" fill="{st.fill}" stroke="{st.stroke}" '
        f'stroke-width="{2 if st.thick else 1}"{dash}/>',
    ]
    y = p.y + PAD_Y
    for kind, text in box.lines():
        if kind == "const":  # constants sit behind a dashed rule: they are weights, not dataflow
            y += 2
            out.append(
                f'<line x1="{_num(p.left + 4)}" x2="{_num(p.left + p.width - 4)}" y1="{_num(y)}" '
                f'y2="{_num(y)}" stroke="{CONST_COLOR}" stroke-width="0.8" stroke-dasharray="3 2"/>'
            )
        y += LINE_H
        font = {
            "title": f'font-size="{TITLE_PX}" font-weight="bold" fill="#212529"',
            "attr": f'font-size="{TEXT_PX}" fill="#343a40"',
            "const": f'font-size="{TEXT_PX}" font-style="italic" fill="{CONST_COLOR}"',
            "value": f'font-size="{TEXT_PX}" fill="#495057"',
            "note": f'font-size="{TEXT_PX}" fill="{st.note}"',
        }[kind]
        out.append(f'<text x="{_num(p.x)}" y="{_num(y - 2.5)}" text-anchor="middle" {font}>{escape(text)}</text>')
    out.append("</g>")
    return "".join(out)


def _num(v: float) -> str:
    """Fixed, short number formatting: byte-identical output across runs."""
    text = f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text
