"""Peak activation memory by liveness over the node order."""

from __future__ import annotations

import sympy

from gawee.ir.core import Graph, Value
from gawee.ir.symbolic import at_example, dim, has_symbols
from gawee.ops import get_op


def peak_memory(graph: Graph) -> tuple[int, str]:
    """Peak bytes of live activations while running nodes in order, and the node where it peaks.

    Activations are graph inputs and node outputs (constants are parameters, counted
    apart). An output is allocated when its node runs and freed after its last reader;
    view outputs share their base's buffer, which lives as long as any alias. Graph
    outputs live to the end. At each node its inputs and outputs are live together.
    """
    buffer_of: dict[Value, Value] = {}
    size: dict[Value, int] = {}
    last: dict[Value, int] = {}
    nodes = graph.nodes
    end = len(nodes)
    for v in graph.inputs:
        buffer_of[v] = v
        size[v] = v.type.nbytes
        last[v] = -1
    for i, node in enumerate(nodes):
        is_view = get_op(node.op).has_trait("view")
        base = node.inputs[0] if is_view and node.inputs and node.inputs[0] is not None else None
        for out in node.outputs:
            if base is not None and base in buffer_of:
                buffer_of[out] = buffer_of[base]
            elif base is not None:  # a view of a constant (or of a view of one) is a constant: no activation
                continue
            else:
                buffer_of[out] = out
                size[out] = out.type.nbytes
                last[out] = i
        for v in node.inputs:
            if v is not None and v in buffer_of:
                b = buffer_of[v]
                last[b] = max(last[b], i)
    for v in graph.outputs:
        if v in buffer_of:
            last[buffer_of[v]] = end
    frees: dict[int, list[Value]] = {}
    for b, i in last.items():
        frees.setdefault(max(i, 0) if b.producer is None else i, []).append(b)
    live = sum(size[v] for v in graph.inputs)
    symbolic = has_symbols(live) or any(has_symbols(n) for n in size.values())
    if symbolic:  # a formula: the max over the node order, the peak's place at the example sizes
        live = sympy.sympify(live)
    candidates = [live]
    peak, peak_at = at_example(live), "<inputs>"
    for i, node in enumerate(nodes):
        for out in node.outputs:
            if buffer_of.get(out) is out:
                live += size[out]
        here = at_example(live) if symbolic else live
        if symbolic:
            candidates.append(live)
        if here > peak:
            peak, peak_at = here, node.name
        for b in frees.get(i, ()):
            live -= size[b]
    if symbolic:
        return dim(sympy.Max(*set(candidates))), peak_at
    return peak, peak_at
