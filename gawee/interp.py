"""The reference interpreter: executes a Graph node by node with each op's torch semantics."""

from __future__ import annotations

from collections.abc import Collection

import torch

from gawee.errors import EvaluationError, GaweeError
from gawee.ir.core import Graph, Value
from gawee.ir.symbolic import bind, subs
from gawee.ops import get_op


def run(graph: Graph, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Execute ``graph`` on ``inputs`` and return its outputs, in order.

    Inputs must match the graph inputs in number, shape and dtype (a symbolic dimension takes any
    size in its range; ``ShapeOutOfRange`` names the one that does not). Intermediate
    tensors are released after their last use. Raises EvaluationError naming the
    node that failed.
    """
    return run_observed(graph, inputs, ())[0]


def run_observed(
    graph: Graph, inputs: Collection[torch.Tensor], observe: Collection[Value]
) -> tuple[tuple[torch.Tensor, ...], dict[Value, torch.Tensor]]:
    """``run``, also returning the tensors of the ``observe`` values (inputs, constants or any node output)."""
    if len(inputs) != len(graph.inputs):
        raise EvaluationError(
            f"graph {graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}",
            hint="inputs: " + ", ".join(repr(v) for v in graph.inputs),
        )
    env: dict[Value, torch.Tensor] = {}
    symbolic = any(v.type.symbolic for v in graph.inputs)
    for value, x in zip(graph.inputs, inputs):
        if not isinstance(x, torch.Tensor):
            raise EvaluationError(f"input %{value.name} must be a tensor, got {type(x).__name__}")
        if (not symbolic and tuple(x.shape) != value.shape) or x.dtype != value.dtype.torch:
            raise EvaluationError(
                f"input %{value.name} expects {value.type}, got {str(x.dtype).replace('torch.', '')}{list(x.shape)}"
            )
        env[value] = x
    sizes = bind([(v.name, v.shape) for v in graph.inputs], [x.shape for x in inputs]) if symbolic else {}
    last_use = _last_uses(graph)
    keep = set(graph.outputs) | set(observe)
    with torch.no_grad():
        for i, node in enumerate(graph):
            args = [None if v is None else (v.data if v.data is not None else env[v]) for v in node.inputs]
            try:
                attrs = {k: subs(v, sizes) for k, v in node.attrs.items()} if sizes else node.attrs
                outs = get_op(node.op).run(args, attrs)
            except GaweeError:
                raise
            except Exception as e:  # torch raises many types; report the node that failed
                raise EvaluationError(
                    f"node {node.name} ({node.op}) failed: {type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                    where=node.source or None,
                ) from e
            for v, t in zip(node.outputs, outs):
                env[v] = t
            for v in last_use.get(i, ()):
                if v not in keep:
                    env.pop(v, None)
    value_of = lambda v: v.data if v.data is not None else env[v]
    return tuple(value_of(v) for v in graph.outputs), {v: value_of(v) for v in observe}


def _last_uses(graph: Graph) -> dict[int, list[Value]]:
    """Node index → the values whose last reader is that node (to free them early)."""
    last: dict[Value, int] = {}
    for i, node in enumerate(graph):
        for v in node.inputs:
            if v is not None and v.data is None:
                last[v] = i
    by_index: dict[int, list[Value]] = {}
    for v, i in last.items():
        by_index.setdefault(i, []).append(v)
    return by_index
