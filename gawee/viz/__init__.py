"""Pictures of graphs: Mermaid and Graphviz DOT text, inline SVG, and the before/after HTML report.

All of them draw the same :class:`~gawee.viz.view.GraphView` (a box per input, node
and output; constants folded into labels; nodes made by rules marked with their rules).
"""

from gawee.viz.dot import RenderError, to_dot, to_svg
from gawee.viz.files import PicturePlan, plan_pictures
from gawee.viz.html import html_report
from gawee.viz.mermaid import to_mermaid
from gawee.viz.svg import graph_svg
from gawee.viz.view import GraphView, build_view, provenance

__all__ = [
    "GraphView",
    "PicturePlan",
    "RenderError",
    "build_view",
    "graph_svg",
    "html_report",
    "plan_pictures",
    "provenance",
    "to_dot",
    "to_mermaid",
    "to_svg",
]
