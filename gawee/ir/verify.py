"""The structural verifier: every IR invariant, checked, with a message naming the culprit."""

from __future__ import annotations

from collections import Counter

from gawee.errors import GaweeError, IRError
from gawee.ir.core import Graph, Use, Value
from gawee.ir.registry import OPAQUE, get_op


def verify(graph: Graph, *, check_types: bool = True) -> None:
    """Raise IRError on the first broken invariant of ``graph``.

    Checks: the node list is consistent; every op is registered, with a valid arity
    and attributes; every operand is defined before use (graph input, constant, or an
    earlier node's output); use lists match operands exactly on both sides; graph
    outputs are defined; names are unique; and (``check_types``) each node's output
    types are what the registry infers from its operand types.
    """
    defined: set[int] = {id(v) for v in graph.inputs}
    names: Counter[str] = Counter(v.name for v in graph.inputs)
    expected_uses: dict[int, list[Use]] = {}
    values: dict[int, Value] = {}
    count = 0
    prev = None
    for node in graph:
        count += 1
        where = f"node {node.name} ({node.op})"
        if node.graph is not graph:
            raise IRError(
                f"{where} is linked into {graph.name} but claims graph {node.graph.name if node.graph else None}"
            )
        if node._prev is not prev:
            raise IRError(f"{where}: broken node list (prev pointer)")
        prev = node
        opdef = get_op(node.op)
        n_in = len(node.inputs)
        if n_in < opdef.min_arity or n_in > opdef.max_arity or (not opdef.variadic and n_in != len(opdef.operands)):
            raise IRError(
                f"{where} has {n_in} operands; {node.op} takes {opdef.min_arity}"
                f"{'+' if opdef.variadic else '..' + str(opdef.max_arity)}"
            )
        try:
            completed = opdef.complete_attrs(dict(node.attrs), where)
        except GaweeError as e:
            raise IRError(f"{where}: {e.message}") from None
        if completed != node.attrs:
            raise IRError(f"{where}: attributes {node.attrs} are incomplete (expected keys {list(completed)})")
        for i, v in enumerate(node.inputs):
            if v is None:
                spec = opdef.operands[min(i, len(opdef.operands) - 1)]
                if not spec.optional:
                    raise IRError(f"{where}: operand {i} ({spec.name}) is required but absent")
                continue
            if v.data is None and id(v) not in defined:
                raise IRError(
                    f"{where} reads %{v.name} before it is defined (or from another graph)",
                    hint="nodes must be in topological order",
                )
            if v.data is not None and v.producer is not None:
                raise IRError(f"{where}: %{v.name} has both constant data and a producer")
            expected_uses.setdefault(id(v), []).append(Use(node, i))
            values[id(v)] = v
        for k, v in enumerate(node.outputs):
            if v.producer is not node or v.output_index != k:
                raise IRError(f"{where}: output {k} (%{v.name}) does not point back to its producer")
            defined.add(id(v))
            values[id(v)] = v
            names[v.name] += 1
        if check_types and node.op != OPAQUE:
            in_types = [None if v is None else v.type for v in node.inputs]
            try:
                inferred = opdef.infer_types(in_types, node.attrs)
            except GaweeError as e:
                raise IRError(f"{where}: {e.message}") from None
            got = [v.type for v in node.outputs]
            if len(inferred) != len(got) or any(not a.same_shape_dtype(b) for a, b in zip(inferred, got)):
                raise IRError(
                    f"{where} is typed {[str(t) for t in got]} but its operands give {[str(t) for t in inferred]}"
                )
    if count != len(graph):
        raise IRError(f"graph {graph.name} counts {len(graph)} nodes but links {count}")
    for v in graph.constants():
        names[v.name] += 1
    dupes = [n for n, c in names.items() if c > 1]
    if dupes:
        raise IRError(f"value names used more than once: {', '.join(sorted(dupes)[:5])}")
    out_refs: Counter[int] = Counter(id(v) for v in graph.outputs)
    for v in graph.outputs:
        values[id(v)] = v
        if v.data is None and id(v) not in defined:
            raise IRError(f"graph output %{v.name} is not defined in {graph.name}")
    for vid, v in values.items():
        want = Counter((id(u.node), u.index) for u in expected_uses.get(vid, []))
        have = Counter((id(u.node), u.index) for u in v._uses)
        if want != have:
            raise IRError(f"use list of %{v.name} is out of sync with the operands that read it")
        if v._output_refs != out_refs.get(vid, 0):
            raise IRError(f"%{v.name} is a graph output {out_refs.get(vid, 0)} times but counts {v._output_refs}")
