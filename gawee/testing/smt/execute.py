"""Symbolic execution of a graph, element by element, into hash-consed terms (see ``terms``).

Each node becomes element terms by the first of these that applies:
  * every operand concrete (constants, and what is computed from them only): the op's own reference
    evaluation, exactly what the interpreter runs;
  * data movement (``MOVES``: reshape, permute, slice, cat, pad, ...): the op's reference evaluation on
    tensors of element ids says where each output element comes from — the op's own semantics, so no
    op needs a second description of its indexing;
  * elementwise: one term per output element over the broadcast operands, an exact ``op`` term where
    ``encode.exact`` allows it, else an uninterpreted ``uf`` term keyed by its kernel context (the op,
    its attributes, the operands' shapes and strides, the element's position): torch's scalar and vector
    loops may round a transcendental differently, so two applications are the same term only where
    the same loop computes them;
  * a fused epilogue (``conv2d``'s residual and activation, ``linear``'s activation): the unfused op,
    then the add and the activation as the reference applies them;
  * anything else: one ``opaque`` term per output element, keyed by the op, its attributes and every
    operand element term (the same computation on the same terms is the same value; any other is
    unknown).

The kernel contexts (strides) are read from a concrete run of the graph (``observe``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType
from gawee.ops import get_op
from gawee.testing.smt.encode import NEEDS_CHOICE, exact
from gawee.testing.smt.terms import Interner, SymTensor, Term

MOVES: dict[str, tuple[int, ...] | None] = {
    "reshape": (0,),
    "flatten": (0,),
    "permute": (0,),
    "transpose": (0,),
    "expand": (0,),
    "unsqueeze": (0,),
    "squeeze": (0,),
    "select": (0,),
    "slice": (0,),
    "alias": (0,),
    "to_layout": (0,),
    "clone": (0,),
    "roll": (0,),
    "flip": (0,),
    "repeat": (0,),
    "split": (0,),
    "unbind": (0,),
    "pad": (0,),
    "tril": (0,),
    "triu": (0,),
    "index_select": (0,),
    "gather": (0,),
    "index": (0,),
    "slice_scatter": (0, 1),
    "select_scatter": (0, 1),
    "cat": None,
    "stack": None,
}
"""Ops whose every output element is one operand element (or a fill value), by their reference
semantics: op -> the operands that are moved (None: all); the others must be concrete (indices)."""

_PAD_SENTINEL = -1.0
"""The id of a `pad` fill element; id 0 is a zero that tril/triu write."""


def attrs_key(attrs: Mapping[str, Any]) -> tuple:
    """Attributes as a hashable key."""

    def freeze(v):
        if isinstance(v, (list, tuple)):
            return tuple(freeze(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, freeze(x)) for k, x in v.items()))
        return v

    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))


class Unsupported(Exception):
    """A node the executor cannot describe (its reason names the op)."""


class Executor:
    """Executes graphs over one Interner, so that the two sides of a rewrite share their terms."""

    def __init__(self, interner: Interner):
        self.interner = interner
        self._fresh = 0
        self._contexts: dict[Any, int] = {}
        """Opaque contexts (operand terms, shapes, strides) by number: hashed once per node, not per element."""

    def run(self, graph: Graph, observed: Mapping[Value, torch.Tensor]) -> dict[Value, SymTensor]:
        """Element terms of every value of ``graph``. ``observed``: a concrete run's tensor of every
        input and node output (for the kernel contexts); inputs become ``var`` terms by position."""
        env: dict[Value, SymTensor] = {}
        for k, v in enumerate(graph.inputs):
            n = v.type.numel
            env[v] = SymTensor(tuple(v.shape), v.dtype, [self.interner.var(v.dtype, k, i) for i in range(n)])
        for node in graph:
            ins = []
            for v in node.inputs:
                if v is not None and v not in env:
                    env[v] = SymTensor.of_data(self.interner, v.data)
                ins.append(None if v is None else env[v])
            concrete = [None if v is None else (v.data if v.data is not None else observed[v]) for v in node.inputs]
            outs = self.node(node, ins, concrete, [observed.get(v) for v in node.outputs])
            for v, t in zip(node.outputs, outs):
                env[v] = t
        for v in graph.outputs:
            if v not in env:
                env[v] = SymTensor.of_data(self.interner, v.data)
        return env

    # -- one node ------------------------------------------------------------------------------
    def node(self, node: Node, ins: list[SymTensor | None], concrete: list, observed_outs: list) -> list[SymTensor]:
        opdef = get_op(node.op)
        attrs = dict(node.attrs)
        if opdef.has_trait("pure") and all(t is None or t.concrete for t in ins):
            outs = opdef.run([None if t is None else t.data for t in ins], attrs)
            return [SymTensor.of_data(self.interner, o) for o in outs]
        if node.op == "dropout" and (not attrs["train"] or attrs["p"] == 0):
            return [ins[0]]  # F.dropout returns its input unchanged then
        if node.op == "cast" and ins[0].dtype is node.output.dtype:
            return [ins[0]]  # a copy
        if node.op in MOVES:
            return self.move(node, ins, attrs, MOVES[node.op])
        out_types = [v.type for v in node.outputs]
        if opdef.has_trait("elementwise") and len(out_types) == 1:
            return [self.elementwise(node.op, attrs, ins, concrete, out_types[0].shape, out_types[0].dtype)]
        if node.op in ("conv2d", "linear") and (attrs.get("act") is not None or (len(ins) > 3 and ins[3] is not None)):
            return [self.fused(node, ins, concrete, attrs)]
        return self.opaque(node.op, attrs, ins, concrete, observed_outs, pure=opdef.has_trait("pure"))

    def move(self, node: Node, ins: list[SymTensor | None], attrs: dict, moved: tuple[int, ...] | None) -> list:
        pool: list[Term] = []
        args = []
        for k, t in enumerate(ins):
            if t is None:
                args.append(None)
            elif moved is None or k in moved:
                ids = torch.arange(len(pool) + 1, len(pool) + len(t.terms) + 1, dtype=torch.float64)
                args.append(ids.reshape(t.shape))
                pool += t.terms
            elif t.concrete:
                args.append(t.data)
            else:
                raise Unsupported(f"{node.op} with a computed {get_op(node.op).operands[k].name}")
        if node.op == "pad":
            attrs = {**attrs, "value": _PAD_SENTINEL if attrs["mode"] == "constant" else None}
        outs = get_op(node.op).run(args, attrs)
        result = []
        for v, ids in zip(node.outputs, outs):
            dtype = v.dtype
            terms = []
            for i in ids.reshape(-1).tolist():
                if i >= 1:
                    terms.append(pool[int(i) - 1])
                elif i == 0:
                    terms.append(self.interner.const(dtype, 0))
                else:
                    terms.append(self.interner.const(dtype, node.attrs["value"] or 0.0))
            result.append(SymTensor(tuple(v.shape), dtype, terms))
        return result

    def elementwise(
        self,
        op: str,
        attrs: dict,
        ins: list[SymTensor | None],
        concrete: list,
        shape: tuple[int, ...],
        dtype: DType,
    ) -> SymTensor:
        present = [(t, c) for t, c in zip(ins, concrete) if t is not None]
        maps = []
        for t, _ in present:
            ids = torch.arange(len(t.terms), dtype=torch.int64).reshape(t.shape)
            maps.append(torch.broadcast_to(ids, shape).reshape(-1).tolist())
        dtypes = [t.dtype for t, _ in present]
        key = attrs_key(attrs)
        n = 1
        for s in shape:
            n *= s
        if exact(op, attrs, dtypes, dtype):
            terms = []
            for p in range(n):
                args = tuple(t.terms[m[p]] for (t, _), m in zip(present, maps))
                if op in NEEDS_CHOICE:  # maximum's zero: which operand; cast's out-of-range result: a value
                    args += (self.interner.choice(DType.bool if op != "cast" else dtype),)
                terms.append(self.interner.make("op", dtype, (op, key), args))
            return SymTensor(tuple(shape), dtype, terms)
        # the loop torch runs depends on the operands' shapes and strides: part of the function's identity
        context = tuple((tuple(c.shape), tuple(c.stride()), str(c.dtype)) for _, c in present)
        terms = [
            self.interner.make(
                "uf", dtype, (op, key, (context, p)), tuple(t.terms[m[p]] for (t, _), m in zip(present, maps))
            )
            for p in range(n)
        ]
        return SymTensor(tuple(shape), dtype, terms)

    def fused(self, node: Node, ins: list[SymTensor | None], concrete: list, attrs: dict) -> SymTensor:
        """conv2d / linear with a fused residual and activation: the reference's own three steps."""
        from gawee.ops.nn import act_as_op

        opdef = get_op(node.op)
        act, params = attrs.get("act"), tuple(attrs.get("act_params", ()))
        core_attrs = {**attrs, "act": None, "act_params": ()}
        core_ins, core_concrete = list(ins), list(concrete)
        residual, residual_c = None, None
        if node.op == "conv2d" and len(ins) > 3:
            residual, residual_c = ins[3], concrete[3]
            core_ins[3], core_concrete[3] = None, None
        with torch.no_grad():
            y_c = opdef.run(core_concrete, core_attrs)[0]
        (y,) = self.opaque(node.op, core_attrs, core_ins, core_concrete, [y_c], pure=True)
        if residual is not None:
            y = self.elementwise("add", {}, [y, residual], [y_c, residual_c], tuple(y_c.shape), y.dtype)
            with torch.no_grad():
                y_c = y_c + residual_c
        if act is None:
            return y
        op, act_attrs = act_as_op(act, params)
        act_attrs = {**get_op(op).complete_attrs(act_attrs)}
        # the activation's result type is the node's: tanh of an integer convolution is float
        return self.elementwise(op, act_attrs, [y], [y_c], tuple(y_c.shape), node.outputs[0].type.dtype)

    def opaque(self, op: str, attrs: dict, ins: list, concrete: list, observed_outs: list, pure: bool) -> list:
        if all(t is None or t.concrete for t in ins) and pure:
            outs = get_op(op).run([None if t is None else t.data for t in ins], attrs)
            return [SymTensor.of_data(self.interner, o) for o in outs]
        context = tuple(
            None if c is None else (tuple(c.shape), tuple(c.stride()), str(c.dtype), tuple(id(x) for x in t.terms))
            for t, c in zip(ins, concrete)
        )
        if not pure:  # a random op: never the same value twice
            self._fresh += 1
            context = (context, "fresh", self._fresh)
        context = self._contexts.setdefault(context, len(self._contexts))
        key = attrs_key(attrs)
        result = []
        for k, o in enumerate(observed_outs):
            if o is None:
                raise Unsupported(f"{op}: output {k} was not observed")
            dtype = DType.from_torch(o.dtype)
            terms = [self.interner.make("opaque", dtype, (op, key, context, k, p)) for p in range(o.numel())]
            result.append(SymTensor(tuple(o.shape), dtype, terms))
        return result
