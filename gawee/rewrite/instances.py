"""One firing on its own: the nodes a rule matched and the nodes it built, cut out as one small graph.

Verification (``gawee.equivalence.verify_rewrite``) runs these instances on operands drawn over the ranges where
rewrites differ: the values that reach a node inside a model may never leave the range where an unsound rule
happens to agree (a layer norm before the GELU that a tanh approximation replaced keeps its input small).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gawee.ir.core import Graph, Node, Value
from gawee.ir.symbolic import at_example
from gawee.ops import get_op


@dataclass(frozen=True)
class Instance:
    """The nodes one firing matched and the nodes it built, side by side in ``graph``.

    Inputs are the values the matched and built nodes read from outside them (constants stay constants); outputs
    are the values the firing replaced, then, in the same order, the values that replaced them.
    """

    graph: Graph
    replaced: int
    """How many of the outputs are replaced values (the rest are their replacements)."""
    assumed: tuple[tuple[int, object], ...] = ()
    """(input index, ``gawee.dsl.library.Assumption``): what the rule's ``assume`` clauses state of an input."""


def instance_key(rule: str, nodes: Sequence[Node]) -> tuple[tuple, int]:
    """Firings with one key are checked once: the rule, and the dtype and rank of each value its nodes read from
    outside them (a value's range, not its shape, is what a rewrite gets wrong). Also returns what running the
    nodes costs (FLOPs, or output elements for an op with no formula): the cheapest firing of a key is kept."""
    inside = {id(n) for n in nodes}
    reads = [
        v for n in nodes for v in n.inputs if v is not None and (v.producer is None or id(v.producer) not in inside)
    ]
    return (rule, tuple((v.type.dtype.value, v.type.rank) for v in reads)), sum(_cost(n) for n in nodes)


def _cost(node: Node) -> int:
    outs = [v.type for v in node.outputs]
    flops = get_op(node.op).flops
    n = flops([None if v is None else v.type for v in node.inputs], outs, node.attrs) if flops is not None else None
    return int(at_example(n if n is not None else sum(t.numel for t in outs)))


def extract(
    name: str,
    matched: Sequence[Node],
    created: Sequence[Node],
    replaced: Sequence[Value],
    results: Sequence[Value],
    assumed: Sequence[tuple[Value, object]] = (),
) -> Instance:
    """The instance of a firing, copied out of its graph (which is left as it is) before the replaced values'
    uses move to the results. ``assumed``: (value, assumption) pairs the rule states."""
    nodes = sorted({id(n): n for n in [*matched, *created]}.values(), key=lambda n: n.graph.position(n))
    g = Graph(name)
    copies: dict[int, Value] = {}

    def copy(v: Value | None) -> Value | None:
        if v is None:
            return None
        got = copies.get(id(v))
        if got is None:
            if v.data is not None:
                got = g.constant(v.data, v.name or "const")
            else:  # read from outside the instance (a computed value or a graph input)
                got = g.add_input(v.type, v.name or "x")
            copies[id(v)] = got
        return got

    for n in nodes:
        node = g.create_node(n.op, [copy(v) for v in n.inputs], n.attrs, types=[v.type for v in n.outputs], name=n.name)
        copies.update((id(old), new) for old, new in zip(n.outputs, node.outputs))
    g.set_outputs([copy(v) for v in [*replaced, *results]])
    position = {id(v): i for i, v in enumerate(g.inputs)}
    facts = tuple(
        (position[id(copies[id(v)])], a) for v, a in assumed if id(v) in copies and id(copies[id(v)]) in position
    )
    return Instance(g, len(replaced), facts)
