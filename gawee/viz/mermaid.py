"""Graphs as Mermaid flowcharts: paste into Markdown on GitHub or GitLab, or into mermaid.live.

A box per input, node and output; constants are a line of their reader's label; nodes
made by rules are painted orange with the rules that made them; with the original graph
too, the two graphs are side by side as subgraphs ``before`` and ``after``.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from gawee.ir.core import Graph
from gawee.viz.view import STYLES, Box, Section, sections, style_class


def to_mermaid(graph: Graph, *, trace: Iterable = (), before: Graph | None = None) -> str:
    """``graph`` as a Mermaid ``flowchart TB``.

    ``trace`` (``RewriteReport.trace``) gives each made node its whole chain of rules
    (without it, the rule in ``node.source``); ``before`` adds the original graph as a
    second subgraph, its replaced nodes dashed. Deterministic: same graphs, same text.
    """
    return render(sections(graph, trace, before))


def render(parts: list[Section]) -> str:
    """The flowchart text of already built sections."""
    out = [
        "%% made by gawee-rewrite; render with Mermaid: mermaid.live, or a mermaid code block in Markdown",
        "flowchart TB",
    ]
    classes: dict[str, list[str]] = {}
    for part in parts:
        indent = "  "
        if len(parts) > 1:
            out.append(f'  subgraph {part.prefix}["{_text(part.caption)}"]')
            out.append("    direction TB")
            indent = "    "
        for box in part.view.boxes:
            nid = f"{part.prefix}_{box.id}"
            out.append(f"{indent}{nid}{_shape(box)}")
            classes.setdefault(style_class(box), []).append(nid)
        for e in part.view.edges:
            label = f"|{_text(e.label)}|" if e.label else ""
            out.append(f"{indent}{part.prefix}_{e.src} -->{label} {part.prefix}_{e.dst}")
        if len(parts) > 1:
            out.append("  end")
    for name, st in STYLES.items():
        dash = ",stroke-dasharray:5 3" if st.dashed else ""
        out.append(f"  classDef {name} fill:{st.fill},stroke:{st.stroke},stroke-width:{2 if st.thick else 1}px{dash}")
    for name in STYLES:
        if classes.get(name):
            out.append(f"  class {','.join(classes[name])} {name}")
    return "\n".join(out) + "\n"


def _shape(box: Box) -> str:
    parts = []
    for kind, text in box.lines():
        text = _text(text)
        parts.append({"title": f"<b>{text}</b>", "const": f"<i>{text}</i>"}.get(kind, text))
    label = "<br/>".join(parts)
    return f'(["{label}"])' if box.kind in ("input", "output") else f'["{label}"]'


def _text(s: str) -> str:
    """Escaped for a quoted Mermaid label or an edge label, with named HTML entities only:
    Mermaid's own ``#code;`` escapes are not decoded in every kind of label."""
    return escape(s, quote=False).replace('"', "&quot;").replace("#", "&num;").replace("|", "&vert;")
