"""Cost model: FLOPs and bytes per node, totals, peak activation memory, ops it cannot count.

Conventions (stated once, used everywhere):

* FLOPs of conv / linear / matmul / bmm / attention are 2 x multiply-accumulates, the
  convention of ``torch.utils.flop_counter`` (bias adds are not counted, as there).
* Elementwise ops count one FLOP per output element; a fused activation or residual
  add on a conv counts one per output element each.
* Normalizations: batch norm (inference) 2 per element; layer/group norm 5; softmax 5.
  Pooling counts one per window element; reductions one per input element. Data
  movement (cat, pad, copy, views) counts 0.
* Bytes: a node reads each distinct operand once (weights included) and writes its
  outputs; views read and write nothing.
* An op with no formula (the opaque ``aten`` op) is listed in ``uncounted``, never 0.
* Symbolic sizes: every figure is a formula in the size symbols (sympy, ``2*s0 + 3``);
  ``CostReport.at()`` evaluates them at the example sizes (or any others), ``formulas()``
  gives their text.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from gawee.analysis.liveness import peak_memory
from gawee.ir.core import Graph, Node
from gawee.ir.symbolic import dim, example_values, subs, symbols_of, text
from gawee.ops import OPAQUE, get_op


@dataclass(frozen=True)
class NodeCost:
    name: str
    op: str
    flops: int | None
    """None when the op has no FLOPs formula."""
    bytes_read: int
    bytes_written: int


@dataclass
class CostReport:
    nodes: list[NodeCost]
    flops: int
    bytes_read: int
    bytes_written: int
    peak_memory: int
    """Peak bytes of live activations (inputs, intermediates, outputs; not weights)."""
    peak_at: str
    param_bytes: int
    """Bytes of constant data (weights, buffers, folded constants)."""
    params: int
    """Elements of constant data."""
    op_counts: dict[str, int]
    uncounted: dict[str, int] = field(default_factory=dict)
    """Op (or opaque ATen target) → how many nodes had no FLOPs formula."""

    @property
    def symbols(self) -> list:
        """The size symbols the figures depend on (none for a static graph), by name."""
        figures = (self.flops, self.bytes_read, self.bytes_written, self.peak_memory)
        return sorted(symbols_of(list(figures)), key=lambda s: s.name)

    def at(self, values: dict | None = None) -> CostReport:
        """The report with every formula evaluated at ``values`` (``Sym -> int``; missing symbols at their
        example): plain numbers, as for a static graph."""
        if not self.symbols:
            return self
        vals = {**example_values(self.symbols), **(values or {})}
        num = lambda x: None if x is None else subs(x, vals)
        nodes = [NodeCost(n.name, n.op, num(n.flops), num(n.bytes_read), num(n.bytes_written)) for n in self.nodes]
        return dataclasses.replace(
            self,
            nodes=nodes,
            flops=num(self.flops),
            bytes_read=num(self.bytes_read),
            bytes_written=num(self.bytes_written),
            peak_memory=num(self.peak_memory),
        )

    def formulas(self) -> dict[str, str]:
        """FLOPs, bytes and peak memory as formulas in the size symbols (text), for a dynamic graph."""
        return {k: text(getattr(self, k)) for k in ("flops", "bytes_read", "bytes_written", "peak_memory")}

    def as_dict(self) -> dict:
        if self.symbols:
            return {**self.at().as_dict(), "formulas": self.formulas()}
        return {
            "nodes": len(self.nodes),
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "peak_memory": self.peak_memory,
            "peak_at": self.peak_at,
            "param_bytes": self.param_bytes,
            "params": self.params,
            "op_counts": self.op_counts,
            "uncounted": self.uncounted,
        }


def node_cost(node: Node) -> NodeCost:
    opdef = get_op(node.op)
    ins = [None if v is None else v.type for v in node.inputs]
    outs = [v.type for v in node.outputs]
    flops = None if opdef.flops is None else opdef.flops(ins, outs, node.attrs)
    if opdef.bytes_accessed is not None:
        read, written = opdef.bytes_accessed(ins, outs, node.attrs)
    else:
        distinct = {id(v): v for v in node.inputs if v is not None}
        read = sum(v.type.nbytes for v in distinct.values())
        written = sum(t.nbytes for t in outs)
    return NodeCost(node.name, node.op, flops, read, written)


def cost(graph: Graph) -> CostReport:
    """The cost report of ``graph`` (see the module docstring for the conventions)."""
    per_node = [node_cost(n) for n in graph]
    uncounted: Counter[str] = Counter()
    for node, c in zip(graph, per_node):
        if c.flops is None:
            uncounted[node.attrs["target"] if node.op == OPAQUE else node.op] += 1
    consts = graph.constants()
    peak, at = peak_memory(graph)
    return CostReport(
        nodes=per_node,
        flops=dim(sum(c.flops or 0 for c in per_node)),
        bytes_read=dim(sum(c.bytes_read for c in per_node)),
        bytes_written=dim(sum(c.bytes_written for c in per_node)),
        peak_memory=peak,
        peak_at=at,
        param_bytes=sum(v.type.nbytes for v in consts),
        params=sum(v.type.numel for v in consts),
        op_counts=dict(sorted(Counter(n.op for n in graph).items(), key=lambda kv: (-kv[1], kv[0]))),
        uncounted=dict(sorted(uncounted.items())),
    )
