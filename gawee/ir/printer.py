"""A compact text form of a Graph: one node per line, like MLIR or torch.fx."""

from __future__ import annotations

from gawee.ir.core import Graph, Node, Value
from gawee.ir.registry import get_op


def format_value_ref(v: Value | None) -> str:
    if v is None:
        return "_"
    if v.data is not None and v.type.rank == 0 and v.producer is None and v.has_known_data:
        item = v.data.item()
        return f"{item!r}:{v.dtype.value}"
    return f"%{v.name}"


def format_attr(value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(format_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def format_node(node: Node, show_defaults: bool = False) -> str:
    opdef = get_op(node.op)
    outs = ", ".join(f"%{v.name}" for v in node.outputs)
    inputs = list(node.inputs)
    while inputs and inputs[-1] is None:  # trailing absent optional operands say nothing
        inputs.pop()
    args = ", ".join(format_value_ref(v) for v in inputs)
    shown = []
    for k, v in node.attrs.items():
        a = opdef.attr(k)
        if show_defaults or a is None or a.default != v:
            shown.append(f"{k}={format_attr(v)}")
    attrs = f" {{{', '.join(shown)}}}" if shown else ""
    types = ", ".join(str(v.type) for v in node.outputs)
    note = f"  # {node.source}" if node.source else ""
    return f"{outs} = {node.op}({args}){attrs} : {types}{note}"


def format_graph(graph: Graph, show_defaults: bool = False, show_sources: bool = True) -> str:
    """The whole graph as text: a header with the inputs, a line per node, the return line."""
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({ins}) {{"]
    for node in graph:
        line = format_node(node, show_defaults)
        if not show_sources and "  # " in line:
            line = line[: line.index("  # ")]
        lines.append("  " + line)
    lines.append("  return " + ", ".join(format_value_ref(v) for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
