"""Graph traversal: a topological order computed from the dataflow alone."""

from __future__ import annotations

import heapq

from gawee.errors import IRError
from gawee.ir.core import Graph, Node


def topological_order(graph: Graph) -> list[Node]:
    """Nodes ordered so that producers come before users (Kahn's algorithm).

    Ties are broken by the current order, so an already valid graph keeps its order.
    Raises IRError if the dataflow has a cycle.
    """
    nodes = graph.nodes
    position = {id(n): i for i, n in enumerate(nodes)}
    indegree = {}
    for n in nodes:
        producers = {id(v.producer) for v in n.inputs if v is not None and v.producer is not None}
        indegree[id(n)] = len(producers)
    ready = [position[id(n)] for n in nodes if indegree[id(n)] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for user in {id(u.node): u.node for v in n.outputs for u in v.uses}.values():
            indegree[id(user)] -= 1
            if indegree[id(user)] == 0:
                heapq.heappush(ready, position[id(user)])
    if len(order) != len(nodes):
        stuck = [n.name for n in nodes if indegree[id(n)] > 0][:5]
        raise IRError(f"graph {graph.name} has a dataflow cycle through {', '.join(stuck)}")
    return order
