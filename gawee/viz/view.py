"""What a graph picture shows, independent of the drawing format: boxes, edges, labels, provenance.

Every renderer (Mermaid, DOT, the HTML report's SVG) draws the same :class:`GraphView`,
so the pictures agree. A view has one box per graph input, node and output; constants
(weights, folded scalars) are not boxes but a line in their reader's label, which keeps
ResNet- or MobileNet-sized graphs readable. A node made by a rule carries the rules that
made it: read from the rewrite trace when there is one (the whole chain, e.g.
``fold_conv_bn → fuse_conv_residual → fuse_conv_relu``), else from ``node.source``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gawee.ir.core import Graph, Node, Value

MAX_LINE = 44
"""Label lines longer than this are cut with "…" (the full text is in the box's tooltip)."""

_RULE_SOURCE = re.compile(r"^(?P<rule>[A-Za-z_][\w.]*) \((?P<location>[^()]+:\d+)\)$")


@dataclass(frozen=True)
class Box:
    """One drawn box: a graph input, a node, or a graph output."""

    id: str
    """Unique within the view, stable for the same graph (``n0``, ``n1``, ... in drawing order)."""
    kind: str
    """``input``, ``output``, ``op``, or ``opaque`` (an ATen call gawee has no OpDef for)."""
    title: str
    """The op name, or ``input`` / ``output``."""
    attrs: tuple[str, ...] = ()
    """Key attributes (those not at their default), a few ``key=value`` per line."""
    consts: str = ""
    """The constant operands in one line (``weight f32[64,3,7,7], bias f32[64]``), or ""."""
    values: tuple[str, ...] = ()
    """What the box produces (``%conv2d: f32[1,64,112,112]``), or, for an output, what it returns."""
    rules: tuple[str, ...] = ()
    """The rules that made this node, oldest first; empty for a captured node."""
    replaced_by: str = ""
    """For a node of the original graph that a rule replaced: that rule's name."""
    tooltip: str = ""
    """Everything about the box, untruncated (name, source, all attributes)."""

    def lines(self) -> list[tuple[str, str]]:
        """Every line of the label, top to bottom, as (kind, text); kind is ``title``, ``attr``,
        ``const``, ``value`` or ``note`` and picks the font and colour."""
        lines = [("title", self.title)]
        lines += [("attr", s) for s in self.attrs]
        if self.consts:
            lines.append(("const", self.consts))
        lines += [("value", s) for s in self.values]
        lines += [("note", s) for s in self.notes]
        return lines

    @property
    def notes(self) -> tuple[str, ...]:
        """Provenance lines: ``by fold_conv_bn → fuse_conv_relu`` or ``replaced by fold_conv_bn``."""
        if self.rules:
            lines = [f"by {self.rules[0]}"]
            for rule in self.rules[1:]:
                if len(lines[-1]) + 3 + len(rule) <= MAX_LINE:
                    lines[-1] += f" → {rule}"
                else:
                    lines.append(f"→ {rule}")
            return tuple(_cut(s) for s in lines)
        if self.replaced_by:
            return (_cut(f"replaced by {self.replaced_by}"),)
        return ()


@dataclass(frozen=True)
class Style:
    """How a box is painted; every renderer uses the same palette."""

    fill: str
    stroke: str
    note: str
    """Colour of the provenance lines."""
    dashed: bool = False
    thick: bool = False


STYLES = {
    "io": Style("#e7f5ff", "#1c7ed6", "#1c7ed6"),
    "op": Style("#f8f9fa", "#868e96", "#868e96"),
    "rule": Style("#fff4e6", "#e8590c", "#d9480f", thick=True),
    "replaced": Style("#f8f9fa", "#adb5bd", "#868e96", dashed=True),
    "opaque": Style("#fff5f5", "#e03131", "#e03131", dashed=True),
}
"""Palette by box class: graph inputs/outputs, captured ops, ops made by rules, original ops
that rules replaced, opaque ATen calls."""

EDGE_COLOR = "#868e96"
CONST_COLOR = "#868e96"


def style_class(box: Box) -> str:
    """The key of ``box``'s style in STYLES."""
    if box.kind in ("input", "output"):
        return "io"
    if box.kind == "opaque":
        return "opaque"
    if box.rules:
        return "rule"
    return "replaced" if box.replaced_by else "op"


@dataclass(frozen=True)
class Edge:
    """A value flowing from one box to another."""

    src: str
    dst: str
    label: str = ""
    """The operand's name when it is not the reader's first operand (``residual``), and the
    value's name when its producer has several outputs (``%split.1``); else ""."""


@dataclass(frozen=True)
class GraphView:
    """A graph ready to draw."""

    name: str
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]

    @property
    def num_nodes(self) -> int:
        return sum(b.kind in ("op", "opaque") for b in self.boxes)


@dataclass(frozen=True)
class Provenance:
    """What a rewrite trace says about node names: the rules behind each made node, and
    which rule replaced each original node. Built by :func:`provenance`."""

    rules_of: dict[str, tuple[str, ...]]
    replaced_by: dict[str, str]


NO_PROVENANCE = Provenance({}, {})


def provenance(trace: Iterable) -> Provenance:
    """Read a rewrite trace (``RewriteReport.trace``: Firing records, in firing order) into a Provenance.

    Node names are unique over a whole rewrite (the graph never reuses a name), so the
    names in the trace identify nodes of both the input and the rewritten graph.
    """
    rules_of: dict[str, tuple[str, ...]] = {}
    replaced_by: dict[str, str] = {}
    for firing in trace:
        matched = [_ref_name(ref) for ref in firing.matched]
        chain: dict[str, None] = {}  # an ordered set: the rules behind what this firing consumed, then its own
        for name in matched:
            chain.update(dict.fromkeys(rules_of.get(name, ())))
            replaced_by.setdefault(name, firing.rule)
        chain[firing.rule] = None
        for ref in firing.created:
            rules_of.setdefault(_ref_name(ref), tuple(chain))
    return Provenance(rules_of, replaced_by)


def _ref_name(ref: str) -> str:
    """A trace names a node ``name:op`` (op names have no colon)."""
    return ref.rsplit(":", 1)[0]


def rule_of_source(source: str) -> tuple[str, str] | None:
    """``"fuse_conv_relu (rules/3-fuse.rules:11)"`` → ``("fuse_conv_relu", "rules/3-fuse.rules:11")``;
    None for a captured node's source such as ``"aten.conv2d.default"``."""
    m = _RULE_SOURCE.match(source)
    return (m["rule"], m["location"]) if m else None


def build_view(graph: Graph, prov: Provenance = NO_PROVENANCE, *, original: bool = False) -> GraphView:
    """The boxes and edges of ``graph``.

    ``prov`` supplies rule chains (and, with ``original=True``, marks the nodes of the
    input graph that rules replaced). Raises nothing for a well-formed graph.
    """
    boxes: list[Box] = []
    edges: list[Edge] = []
    box_of: dict[int, str] = {}  # id(Value) → id of the box that produces it

    def new_id() -> str:
        return f"n{len(boxes)}"

    for v in graph.inputs:
        bid = new_id()
        boxes.append(Box(bid, "input", "input", values=(_value_line(v),), tooltip=f"graph input %{v.name}: {v.type}"))
        box_of[id(v)] = bid
    for node in graph:
        bid = new_id()
        boxes.append(_node_box(bid, node, prov, original))
        for index, v in enumerate(node.inputs):
            if v is None or v.is_const or id(v) not in box_of:
                continue
            edges.append(Edge(box_of[id(v)], bid, _edge_label(node, index, v)))
        for v in node.outputs:
            box_of[id(v)] = bid
    for i, v in enumerate(graph.outputs):
        bid = new_id()
        title = "output" if len(graph.outputs) == 1 else f"output {i}"
        if v.is_const or id(v) not in box_of:
            boxes.append(
                Box(
                    bid,
                    "output",
                    title,
                    consts=f"const {v.type}",
                    values=(f"%{v.name}",),
                    tooltip=f"graph output {i}: constant %{v.name}: {v.type}",
                )
            )
            continue
        boxes.append(
            Box(bid, "output", title, values=(f"%{v.name}",), tooltip=f"graph output {i}: %{v.name}: {v.type}")
        )
        edges.append(Edge(box_of[id(v)], bid, _edge_label(None, 0, v)))
    return GraphView(graph.name, tuple(boxes), tuple(edges))


def _node_box(bid: str, node: Node, prov: Provenance, original: bool) -> Box:
    from gawee.ops import get_op
    from gawee.ops.opaque import OPAQUE

    opdef = get_op(node.op)
    attrs = {k: v for k, v in node.attrs.items() if not _is_default(opdef, k, v)}  # defaults say nothing
    opaque = node.op == OPAQUE
    if opaque:  # the target says what it is; the argument template (in the tooltip) is for the interpreter
        lines = [str(attrs.get("target", "?"))]
    else:
        lines = _wrap([f"{k}={_attr_text(v)}" for k, v in attrs.items()])
    rules = prov.rules_of.get(node.name, ())
    if not rules and (made := rule_of_source(node.source)):
        rules = (made[0],)
    replaced_by = prov.replaced_by.get(node.name, "") if original else ""
    tip = [f"%{node.name} = {node.op}"]
    tip += [f"  {_operand_name(opdef, i)}: {_value_ref(v)}" for i, v in enumerate(node.inputs) if v is not None]
    tip += [f"  {k} = {_attr_text(v)}" for k, v in node.attrs.items()]
    tip += [f"  -> {_value_line(v)}" for v in node.outputs]
    if node.source:
        tip.append(f"source: {node.source}")
    if rules:
        tip.append("rules: " + " → ".join(rules))
    if replaced_by:
        tip.append(f"replaced by {replaced_by}")
    return Box(
        bid,
        "opaque" if opaque else "op",
        node.op,
        tuple(_cut(s) for s in lines),
        _cut(_const_text(node, opdef)),
        tuple(_cut(_value_line(v)) for v in node.outputs),
        tuple(rules),
        replaced_by,
        "\n".join(tip),
    )


def _is_default(opdef, key: str, value) -> bool:
    attr = opdef.attr(key)
    return attr is not None and attr.default == value


def _edge_label(node: Node | None, index: int, v: Value) -> str:
    parts = []
    if node is not None and index > 0:
        from gawee.ops import get_op

        parts.append(_operand_name(get_op(node.op), index))
    if v.producer is not None and len(v.producer.outputs) > 1:
        parts.append(f"%{v.name}")
    return " ".join(parts)


def _operand_name(opdef, index: int) -> str:
    if index < len(opdef.operands):
        return opdef.operands[index].name
    return f"{opdef.operands[-1].name}[{index - len(opdef.operands) + 1}]" if opdef.variadic else f"arg{index}"


def _const_text(node: Node, opdef) -> str:
    """The constant operands in one line: scalars by value, tensors by operand name and type;
    grouped by type (``4× f32[64]``) when listing them would not fit."""
    items: list[tuple[str, str]] = []
    for index, v in enumerate(node.inputs):
        if v is None or not v.is_const:
            continue
        name = _operand_name(opdef, index)
        if v.type.rank == 0 and v.has_known_data:
            items.append((name, f"={_attr_text(v.data.item())}"))
        else:
            items.append((name, f" {v.type}"))
    if not items:
        return ""
    text = ", ".join(f"{n}{t}" for n, t in items)
    if len(text) <= MAX_LINE:
        return text
    groups: dict[str, int] = {}
    for _, t in items:
        groups[t.strip()] = groups.get(t.strip(), 0) + 1
    return "const " + ", ".join(f"{n}× {t}" if n > 1 else t for t, n in groups.items())


def _value_line(v: Value) -> str:
    return f"%{v.name}: {v.type}"


def _value_ref(v: Value) -> str:
    if v.is_const:
        return f"const %{v.name}: {v.type}"
    return f"%{v.name}"


def _attr_text(value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):  # short, but a float still reads as one: 2.0, 1e-05, 0.333333
        return r if len(r := repr(value)) <= 8 else f"{value:.6g}"
    return str(value)


def _wrap(parts: Sequence[str]) -> list[str]:
    """Join ``k=v`` items into lines of at most MAX_LINE characters."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 1 + len(part) <= MAX_LINE:
            lines[-1] += " " + part
        else:
            lines.append(part)
    return lines


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


@dataclass(frozen=True)
class Section:
    """One graph of a picture: a view with a caption and the id prefix that keeps its boxes apart."""

    caption: str
    view: GraphView
    prefix: str


def sections(graph: Graph, trace: Iterable = (), before: Graph | None = None) -> list[Section]:
    """``graph`` alone, or with ``before``: the original graph (its replaced nodes marked from
    ``trace``) then ``graph`` as the rewritten one. The picture modules draw these."""
    prov = provenance(trace)
    after_view = build_view(graph, prov)
    if before is None:
        return [Section(f"{graph.name}: {after_view.num_nodes} nodes", after_view, "g")]
    kept = {n.name for n in graph}  # a matched node that is still there (it had other users) was not replaced
    prov = Provenance(prov.rules_of, {k: r for k, r in prov.replaced_by.items() if k not in kept})
    before_view = build_view(before, prov, original=True)
    return [
        Section(f"before: {before.name}, {before_view.num_nodes} nodes", before_view, "b"),
        Section(f"after: {graph.name}, {after_view.num_nodes} nodes", after_view, "a"),
    ]
