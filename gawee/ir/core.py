"""Value, Node, Graph — and the one mutation API that keeps use lists right on both sides."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import sympy
import torch

try:
    import cython
except ImportError:  # Cython is optional (the accel extra): the declarations below then do nothing
    from gawee import cython_shim as cython

from gawee.errors import IRError
from gawee.ir.registry import get_op
from gawee.ir.symbolic import dim
from gawee.ir.types import TensorType


class Use(NamedTuple):
    """One operand slot that reads a Value: ``node.inputs[index] is value``."""

    node: Node
    index: int


_new_use = functools.partial(tuple.__new__, Use)
"""``_new_use((node, index))`` is ``Use(node, index)`` without the Python-level ``__new__`` that ``NamedTuple``
generates: the IR makes one per operand of every node it creates or copies."""


class Value:
    """A tensor in the graph: produced by one node, or a graph input, or a constant.

    Use lists are maintained by :class:`Graph` only; read them through ``uses``.
    """

    __slots__ = ("_output_refs", "_uses", "data", "name", "output_index", "producer", "type")

    def __init__(self, type: TensorType, name: str = "", data: torch.Tensor | None = None):
        self.name = name
        self.type = type
        """Shape, dtype and layout."""
        self.producer: Node | None = None
        """The node that computes this value; None for graph inputs and constants."""
        self.output_index = 0
        """Which output of ``producer`` this is."""
        self.data = data
        """Constant contents (a torch tensor, possibly on the meta device), or None."""
        self._uses: list[Use] = []
        self._output_refs = 0

    @property
    def uses(self) -> tuple[Use, ...]:
        """Every operand slot that reads this value, in insertion order."""
        return tuple(self._uses)

    @property
    def num_uses(self) -> int:
        """Operand uses plus graph-output uses (a graph output counts as a use)."""
        return len(self._uses) + self._output_refs

    @property
    def is_graph_output(self) -> bool:
        return self._output_refs > 0

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def has_known_data(self) -> bool:
        """A constant whose element values are known (not a meta-device placeholder)."""
        return self.data is not None and not self.data.is_meta

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    @cython.locals(seen=dict)
    def users(self) -> list[Node]:
        """The distinct nodes reading this value, in use order."""
        seen: dict[int, Node] = {}
        for use in self._uses:
            seen.setdefault(id(use.node), use.node)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One operation: ``op`` names an OpDef in the registry; ``inputs`` are read-only."""

    __slots__ = (
        "_inputs",
        "_next",
        "_order",
        "_prev",
        "_queued_in",
        "attrs",
        "graph",
        "name",
        "op",
        "outputs",
        "source",
    )

    @cython.locals(v=Value)
    def __init__(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Mapping[str, Any],
        output_types: Sequence[TensorType],
        name: str,
        source: str = "",
    ):
        self.op = op
        self._inputs: tuple[Value | None, ...] = tuple(inputs)
        self.attrs: dict[str, Any] = dict(attrs)
        """Plain JSON-able data, frozen (lists stored as tuples) by Graph.create_node / OpDef.prepare_attrs."""
        self.source = source
        """Provenance: the ATen target or the rule (file:line) that made this node."""
        self.name = name
        self.graph: Graph | None = None
        self._queued_in = 0
        """The token of the rewriter whose worklist holds this node now, else 0 (gawee.rewrite.driver): a mark
        on the node instead of a set of queued nodes, which every push and pop would hash into."""
        self.outputs: tuple[Value, ...] = tuple(
            Value(t, name if len(output_types) == 1 else f"{name}.{i}") for i, t in enumerate(output_types)
        )
        for i, v in enumerate(self.outputs):
            v.producer = self
            v.output_index = i
        self._prev: Node | None = None
        self._next: Node | None = None
        self._order = 0.0

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        """Operands in order; None marks an absent optional operand."""
        return self._inputs

    @property
    def output(self) -> Value:
        """The single output (an error for multi-output nodes)."""
        if len(self.outputs) != 1:
            raise IRError(
                f"node {self.name} ({self.op}) has {len(self.outputs)} outputs",
                hint="index node.outputs instead of node.output",
            )
        return self.outputs[0]

    def set_input(self, index: int, value: Value | None) -> None:
        """Replace operand ``index``, updating the use lists of both values."""
        if self.graph is None:
            inputs = list(self._inputs)
            inputs[index] = value
            self._inputs = tuple(inputs)
            return
        self.graph._set_input(self, index, value)

    def __repr__(self) -> str:
        return f"<Node {self.name} = {self.op}>"


_Scalar = (int, float, bool, str, type(None))


def freeze_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes canonicalized: lists become tuples; anything not plain data is refused."""
    return {k: _freeze(v, k) for k, v in attrs.items()}


_PLAIN = frozenset(_Scalar)


def _freeze(v: Any, key: str) -> Any:
    t = type(v)
    if t in _PLAIN:
        return v
    if t is tuple or t is list:
        if all(type(x) in _PLAIN for x in v):  # the common case: a flat list of numbers
            return v if t is tuple else tuple(v)
        return tuple(_freeze(x, key) for x in v)
    if isinstance(v, _Scalar):  # subclasses (IntEnum, numpy scalars registered as int...)
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x, key) for x in v)
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _freeze(x, key)) for k, x in v.items()))
    if isinstance(v, sympy.Expr):  # a symbolic size (a dynamic dimension's expression)
        return dim(v)
    raise IRError(
        f"attribute {key!r} has non-plain value {v!r} ({type(v).__name__})",
        hint="attributes hold ints, floats, bools, strings, None, symbolic sizes and lists of them",
    )


_CPU = torch.device("cpu")


class Graph:
    """A dataflow graph: inputs, nodes in a valid topological order, outputs.

    All edits go through this class so that ``Value.uses`` and ``Node.inputs`` always
    agree. Nodes are kept in a doubly linked list: insert and erase are O(1).
    """

    __slots__ = (
        "__weakref__",
        "_head",
        "_len",
        "_name_counters",
        "_names",
        "_order_valid",
        "_outputs",
        "_tail",
        "inputs",
        "meta",
        "name",
    )

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self._outputs: list[Value] = []
        self._head: Node | None = None
        self._tail: Node | None = None
        self._len = 0
        self._names: set[str] = set()
        self._name_counters: dict[str, int] = {}
        self._order_valid = True
        self.meta: dict[str, Any] = {}
        """Free-form, JSON-able information (e.g. where the graph was captured from)."""

    # -- names ---------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """``base`` if unused in this graph, else ``base_N`` for the first free N."""
        base = base or "v"
        if base not in self._names:
            self._names.add(base)
            return base
        n = self._name_counters.get(base, 0)
        while True:
            n += 1
            cand = f"{base}_{n}"
            if cand not in self._names:
                self._name_counters[base] = n
                self._names.add(cand)
                return cand

    def peek_name(self, base: str) -> str:
        """The name ``unique_name(base)`` would return now, without reserving it."""
        base = base or "v"
        if base not in self._names:
            return base
        n = self._name_counters.get(base, 0) + 1
        while f"{base}_{n}" in self._names:
            n += 1
        self._name_counters[base] = n - 1  # every index below n is taken: later scans start here
        return f"{base}_{n}"

    # -- values --------------------------------------------------------------------
    def add_input(self, type: TensorType, name: str = "input") -> Value:
        v = Value(type, self.unique_name(name))
        self.inputs.append(v)
        return v

    def constant(self, data: torch.Tensor, name: str = "const") -> Value:
        """A new constant Value holding ``data`` (not copied: treat it as immutable)."""
        if not isinstance(data, torch.Tensor):
            raise IRError(f"constant {name!r} needs a torch.Tensor, got {type(data).__name__}")
        return Value(TensorType.of(data), self.unique_name(name), data=data)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return tuple(self._outputs)

    def set_outputs(self, values: Iterable[Value]) -> None:
        for v in self._outputs:
            v._output_refs -= 1
        self._outputs = list(values)
        for v in self._outputs:
            v._output_refs += 1

    # -- nodes ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @cython.locals(node=Node)
    def __iter__(self) -> Iterator[Node]:
        """Nodes in order. Erasing nodes while iterating is safe: an erased node keeps its
        forward link, so the walk resumes after it and skips nodes no longer in the graph."""
        node = self._head
        while node is not None:
            if node.graph is self:
                yield node
            node = node._next

    @property
    def nodes(self) -> list[Node]:
        return list(self)

    @cython.locals(node=Node)
    def create_node(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Mapping[str, Any] | None = None,
        *,
        types: Sequence[TensorType] | None = None,
        name: str | None = None,
        source: str = "",
        before: Node | None = None,
        prepared: bool = False,
    ) -> Node:
        """Create a node and insert it at the end (or before ``before``).

        Without ``types`` the output types are inferred through the op registry.
        ``prepared``: ``attrs`` are already what ``OpDef.prepare_attrs`` made of them for these
        inputs (complete, checked, canonical), so they are not prepared again.
        Raises UnknownOpError for an op not in the registry, InferenceError when the
        op rejects the operand types.
        """
        opdef = get_op(op)
        if not opdef.variadic and len(inputs) < len(opdef.operands):  # absent trailing optionals
            inputs = [*inputs, *([None] * (len(opdef.operands) - len(inputs)))]
        if not prepared or types is None:  # the rewriter gives both, from one cache (OpDef.prepare_and_infer)
            in_types = [v.type if v is not None else None for v in inputs]
            if not prepared:
                attrs = opdef.prepare_attrs(attrs or {}, in_types, where=name or op)
            if types is None:
                types = opdef.infer_types(in_types, attrs)
        node = Node(op, inputs, attrs, types, self.unique_name(name or op), source)
        if len(node.outputs) > 1:
            self._names.update(v.name for v in node.outputs)
        self.insert(node, before=before)
        return node

    @cython.locals(node=Node, before=Node, prev=Node, v=Value)
    def insert(self, node: Node, before: Node | None = None) -> None:
        """Link ``node`` into the order (at the end, or before ``before``) and register its uses."""
        if node.graph is not None:
            raise IRError(f"node {node.name} is already in graph {node.graph.name}")
        node.graph = self
        if before is None:
            node._prev, node._next = self._tail, None
            if self._tail is not None:
                self._tail._next = node
                node._order = self._tail._order + 1.0
            else:
                self._head = node
                node._order = 0.0
            self._tail = node
        else:
            if before.graph is not self:
                raise IRError(f"cannot insert before {before.name}: it is not in graph {self.name}")
            prev = before._prev
            node._prev, node._next = prev, before
            if prev is not None:
                prev._next = node
                node._order = (prev._order + before._order) / 2
                if not prev._order < node._order < before._order:  # no float left between them
                    self._order_valid = False
            else:
                self._head = node
                node._order = before._order - 1.0
            before._prev = node
        self._len += 1
        for i, v in enumerate(node.outputs):  # an erased node inserted again produces its outputs again
            v.producer, v.output_index = node, i
        for i, v in enumerate(node._inputs):
            if v is not None:
                v._uses.append(_new_use((node, i)))

    @cython.locals(node=Node, v=Value)
    def erase_node(self, node: Node) -> None:
        """Remove a node whose outputs are unused; its operands lose those uses.

        Raises IRError naming the users if any output is still read.
        """
        if node.graph is not self:
            raise IRError(f"node {node.name} is not in graph {self.name}")
        for v in node.outputs:
            if v._uses or v._output_refs:  # num_uses, read directly: the rewriter erases a node per firing
                users = [u.node.name for u in v._uses] + (["<graph output>"] if v.is_graph_output else [])
                raise IRError(
                    f"cannot erase {node.name}: its output %{v.name} is still used by {', '.join(users)}",
                    hint="replace_all_uses_with() first, or erase the users",
                )
        for i, v in enumerate(node._inputs):
            if v is not None:
                _remove_use(v, node, i)
        if node._prev is not None:
            node._prev._next = node._next
        else:
            self._head = node._next
        if node._next is not None:
            node._next._prev = node._prev
        else:
            self._tail = node._prev
        node._prev = None  # _next stays: iterators standing on this node resume from it
        node.graph = None
        for v in node.outputs:  # unused and out of the graph: no cycle left for the garbage collector
            v.producer = None
        self._len -= 1

    @cython.locals(node=Node, old=Value, value=Value)
    def _set_input(self, node: Node, index: int, value: Value | None) -> None:
        old = node._inputs[index]
        if old is value:
            return
        if old is not None:
            _remove_use(old, node, index)
        inputs = list(node._inputs)
        inputs[index] = value
        node._inputs = tuple(inputs)
        if value is not None:
            value._uses.append(_new_use((node, index)))

    @cython.locals(old=Value, new=Value)
    def replace_all_uses_with(self, old: Value, new: Value) -> list[Node]:
        """Make every reader of ``old`` (graph outputs included) read ``new``.

        Returns the nodes whose operands changed. Types must agree in shape and dtype.
        """
        if old is new:
            return []
        if not old.type.same_shape_dtype(new.type):
            raise IRError(
                f"cannot replace %{old.name}: {old.type} with %{new.name}: {new.type}",
                hint="a replacement must keep the exact shape and dtype",
            )
        changed: list[Node] = []
        for use in list(old._uses):  # snapshot: _set_input edits the list
            self._set_input(use.node, use.index, new)
            if not changed or changed[-1] is not use.node:
                changed.append(use.node)
        if old._output_refs:
            self.set_outputs([new if v is old else v for v in self._outputs])
        return changed

    # -- order ---------------------------------------------------------------------
    @cython.locals(node=Node, n=Node)
    def position(self, node: Node) -> float:
        """A number that orders nodes as the graph does (amortized O(1): inserts take midpoints)."""
        if not self._order_valid:
            for i, n in enumerate(self):
                n._order = float(i)
            self._order_valid = True
        return node._order

    # -- whole-graph ---------------------------------------------------------------
    @cython.locals(node=Node, v=Value, seen=dict)
    def constants(self) -> list[Value]:
        """Constant values read by nodes or outputs, in first-use order."""
        seen: dict[int, Value] = {}
        for node in self:
            for v in node._inputs:
                if v is not None and v.data is not None:
                    seen.setdefault(id(v), v)
        for v in self._outputs:
            if v.data is not None:
                seen.setdefault(id(v), v)
        return list(seen.values())

    @property
    @cython.locals(node=Node, v=Value)
    def device(self) -> torch.device:
        """Where the graph's data lives, and so where it runs: the device of its first constant that is not on
        the CPU (a model captured on an accelerator, or on the meta device), else the CPU. Literal scalars
        (0-d constants) may stay on the CPU in any graph, as torch allows beside tensors of any device."""
        for node in self:  # constants() in its order, stopping at the first one off the CPU
            for v in node._inputs:
                if v is not None and v.data is not None and not v.data.is_cpu:
                    return v.data.device
        for v in self._outputs:
            if v.data is not None and not v.data.is_cpu:
                return v.data.device
        return _CPU

    def to(self, device: torch.device | str) -> Graph:
        """A copy of the graph with every constant on ``device`` (a graph captured on the CPU run on an
        accelerator; ``"meta"`` keeps the structure and drops the values)."""
        g = self.clone()
        for v in g.constants():
            v.data = v.data.to(device)
        return g

    @cython.locals(
        v=Value, nv=Value, got=Value, ov=Value, node=Node, n=Node, prev=Node, vmap=dict, names=set, inputs=list
    )
    def clone(self) -> Graph:
        """A structurally identical, independent graph (constant tensors are shared). Nodes are copied slot by
        slot and linked at the end in order (what ``insert`` at the end would do): the rewriter copies every graph
        it is given, so the copy is on its hot path."""
        g = Graph(self.name)
        g.meta = dict(self.meta)
        names = g._names
        vmap: dict[int, Value] = {}
        for v in self.inputs:
            nv = Value(v.type, v.name)
            names.add(v.name)
            g.inputs.append(nv)
            vmap[id(v)] = nv
        prev: Node | None = None
        count = 0
        new_node = Node.__new__
        for node in self:
            n = new_node(Node)
            inputs = []
            for v in node._inputs:
                if v is not None:
                    got = vmap.get(id(v))
                    if got is None:  # a constant (inputs and node outputs are mapped as they appear)
                        got = vmap[id(v)] = Value(v.type, v.name, data=v.data)
                        names.add(v.name)
                    v = got
                inputs.append(v)
            n.op, n._inputs, n.attrs, n.source, n.name, n.graph = (
                node.op,
                tuple(inputs),
                dict(node.attrs),
                node.source,
                node.name,
                g,
            )
            outputs = []
            for i, ov in enumerate(node.outputs):
                nv = Value(ov.type, ov.name)
                nv.producer, nv.output_index = n, i
                names.add(ov.name)
                vmap[id(ov)] = nv
                outputs.append(nv)
            n.outputs = tuple(outputs)
            names.add(node.name)
            for i, v in enumerate(n._inputs):
                if v is not None:
                    v._uses.append(_new_use((n, i)))
            n._prev, n._next, n._order, n._queued_in = prev, None, float(count), 0
            if prev is None:
                g._head = n
            else:
                prev._next = n
            prev = n
            count += 1
        g._tail, g._len = prev, count
        outputs = []
        for v in self._outputs:
            got = vmap.get(id(v))
            if got is None:  # a constant output
                got = vmap[id(v)] = Value(v.type, v.name, data=v.data)
                names.add(v.name)
            outputs.append(got)
        g.set_outputs(outputs)
        g._name_counters = dict(self._name_counters)
        return g

    def save(self, path):
        """Write this graph as JSON (+ .npz of tensor data) atomically; see gawee.ir.serialize."""
        from gawee.ir.serialize import save

        return save(self, path)

    def __str__(self) -> str:
        from gawee.ir.printer import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {self._len} nodes>"


@cython.locals(value=Value, node=Node, uses=list)
def _remove_use(value: Value, node: Node, index: int) -> None:
    uses = value._uses
    for k in range(len(uses) - 1, -1, -1):  # recent uses are the likeliest to go
        u = uses[k]
        if u.node is node and u.index == index:
            del uses[k]
            return
    raise IRError(f"use list of %{value.name} lacks {node.name}[{index}] (corrupted graph)")
