"""Graphs as Graphviz DOT text, and DOT rendered to SVG by Graphviz's ``dot`` when it is installed.

The same picture as :mod:`gawee.viz.mermaid`: a box per input, node and output,
constants folded into their reader's label, nodes made by rules painted orange with
their rules, and with the original graph too, two clusters ``before`` and ``after``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from html import escape

from gawee.errors import GaweeError
from gawee.ir.core import Graph
from gawee.viz.view import CONST_COLOR, EDGE_COLOR, STYLES, Box, Section, sections, style_class

FONT = "DejaVu Sans Mono"
INSTALL_HINT = (
    "install Graphviz (Debian/Ubuntu: apt-get install graphviz, macOS: brew install graphviz), "
    "or write .dot and render it elsewhere; the HTML report (--html) needs no Graphviz"
)


class RenderError(GaweeError):
    """A picture that could not be rendered (Graphviz missing or failing)."""

    kind = "render error"


def to_dot(graph: Graph, *, trace: Iterable = (), before: Graph | None = None) -> str:
    """``graph`` as a DOT ``digraph``, top to bottom.

    ``trace`` (``RewriteReport.trace``) gives each made node its whole chain of rules
    (without it, the rule in ``node.source``); ``before`` adds the original graph as a
    cluster beside it, its replaced nodes dashed. Deterministic: same graphs, same text.
    """
    return render(sections(graph, trace, before), graph.name)


def render(parts: list[Section], name: str) -> str:
    """The DOT text of already built sections."""
    out = [
        f"// made by gawee-rewrite; render with: dot -Tsvg {_ident(name)}.dot -o {_ident(name)}.svg",
        f"digraph {_quote(name)} {{",
        f'  graph [rankdir=TB, fontname="{FONT}", fontsize=12, nodesep=0.25, ranksep=0.3];',
        f'  node [shape=box, style="rounded,filled", fontname="{FONT}", fontsize=10, margin="0.12,0.04"];',
        f'  edge [color="{EDGE_COLOR}", arrowsize=0.6, fontname="{FONT}", fontsize=8, fontcolor="{EDGE_COLOR}"];',
    ]
    for part in parts:
        indent = "  "
        if len(parts) > 1:
            out += [
                f"  subgraph cluster_{part.prefix} {{",
                f'    label={_quote(part.caption)}; labeljust=l; color="#dee2e6"; style=rounded;',
            ]
            indent = "    "
        for box in part.view.boxes:
            out.append(f"{indent}{part.prefix}_{box.id} {_node_attrs(box)};")
        for e in part.view.edges:
            label = f" [label={_quote(e.label)}]" if e.label else ""
            out.append(f"{indent}{part.prefix}_{e.src} -> {part.prefix}_{e.dst}{label};")
        if len(parts) > 1:
            out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def to_svg(dot_text: str, *, timeout: float = 120.0) -> str:
    """Render DOT text to SVG with Graphviz's ``dot``.

    Raises RenderError when ``dot`` is not installed, fails, or takes longer than ``timeout`` seconds.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise RenderError(
            "Graphviz's `dot` is not installed, so the picture cannot be rendered to SVG", hint=INSTALL_HINT
        )
    try:
        done = subprocess.run(
            [exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise RenderError(
            f"`dot -Tsvg` did not finish in {timeout:.0f} s",
            hint="the graph may be too large for Graphviz; use --html, which lays out in Python",
        ) from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise RenderError(
            f"`dot -Tsvg` failed (exit {done.returncode}): {why[0] if why else 'no message'}",
            hint="check the DOT text (write it with a .dot extension to see it)",
        )
    return done.stdout.decode()


def _node_attrs(box: Box) -> str:
    st = STYLES[style_class(box)]
    style = "rounded,filled" + (",dashed" if st.dashed else "")
    parts = []
    for kind, text in box.lines():
        text = escape(text, quote=False)
        parts.append(
            {
                "title": f"<B>{text}</B>",
                "const": f'<I><FONT COLOR="{CONST_COLOR}">{text}</FONT></I>',
                "note": f'<FONT COLOR="{st.note}">{text}</FONT>',
            }.get(kind, text)
        )
    label = "<BR/>".join(parts)
    return (
        f'[label=<{label}>, style="{style}", fillcolor="{st.fill}", color="{st.stroke}", '
        f"penwidth={2 if st.thick else 1}, tooltip={_quote(box.tooltip)}]"
    )


def _quote(s: str) -> str:
    """A DOT double-quoted string (newlines as ``\\n``)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _ident(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s) or "graph"
