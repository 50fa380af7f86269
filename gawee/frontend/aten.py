"""ATen → gawee: bind one exported fx node to an OpDef through its AtenBinding, or make it opaque."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx

from gawee.errors import CaptureError, GaweeError
from gawee.ir.core import Graph, Value
from gawee.ir.symbolic import dim
from gawee.ir.types import DType, TensorType
from gawee.ops import OPAQUE, AtenBinding, OpDef, all_ops
from gawee.ops.opaque import encode_arg

_Refused = None


def binding_table() -> dict[str, list[tuple[OpDef, AtenBinding]]]:
    """ATen target string (``aten.add.Tensor``) → candidate (OpDef, binding) pairs, in registry order."""
    table: dict[str, list[tuple[OpDef, AtenBinding]]] = {}
    for op in all_ops().values():
        for b in op.aten:
            table.setdefault(b.target, []).append((op, b))
    return table


def recorded_types(fx_node: torch.fx.Node, symbols: dict | None = None) -> list[TensorType | None]:
    """The output types torch.export recorded for a node (None where a result is not a tensor);
    ``symbols`` renames torch's size symbols to gawee ``Sym``s."""
    val = fx_node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [TensorType.of(v, symbols) if isinstance(v, torch.Tensor) else None for v in vals]


def symbolic_scalar(fx_node: torch.fx.Node, symbols: dict | None) -> Any:
    """The sympy expression of a node that computes a size (``aten.sym_size.int``, ``operator.mul`` of
    sizes...), over gawee ``Sym``s; None if the node computes something else (a data-dependent value)."""
    val = fx_node.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        expr = val.node.expr
        if not expr.free_symbols <= set(symbols or {}):  # data-dependent (unbacked): not a size of the inputs
            return None
        return expr.xreplace(symbols) if symbols else expr
    return None


def written_operands(target) -> list[int]:
    """The positions of the arguments an ATen overload writes (``relu_``: ``[0]``; a functional op: ``[]``)."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    return [i for i, a in enumerate(target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def is_check(target) -> bool:
    """An ATen op that returns nothing and writes nothing: a runtime check export emits
    (``_assert_tensor_metadata`` next to every ``.to(dtype)``, ``_assert_scalar``,
    ``sym_constrain_range_for_size``, ``_assert_async``...). Found by schema, not by name.
    The shapes and dtypes it asserts are already static in the captured graph."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not target._schema.returns and not written_operands(target)


class NodeConverter:
    """Converts fx call_function nodes into gawee nodes on one graph.

    ``env`` maps an fx node to its Value (single result) or list of Values (tuple
    results); ``scalar`` makes (and shares) 0-d constants for Scalar operands.
    """

    def __init__(
        self,
        graph: Graph,
        env: dict[torch.fx.Node, Any],
        warnings: list[str],
        dropped: dict[str, int] | None = None,
        symbols: dict | None = None,
        device: torch.device | None = None,
    ):
        self.graph = graph
        self.device = device
        """Where Scalar operands' 0-d constants are made: the model's accelerator, or None for the CPU (a
        meta-device model's Scalars stay on the CPU, their values known)."""
        self.symbols = symbols or {}
        """torch.export's size symbols -> gawee Syms (empty for a static capture)."""
        self.env = env
        self.warnings = warnings
        self.dropped = dropped if dropped is not None else {}
        """ATen target → how many no-result checks (``_assert_tensor_metadata``...) were dropped."""
        self.table = binding_table()
        self._scalars: dict[tuple, Value] = {}

    # -- entry -------------------------------------------------------------------------
    def convert(self, fx_node: torch.fx.Node) -> None:
        target = fx_node.target
        if target is operator.getitem:
            src, idx = fx_node.args
            self.env[fx_node] = self.env[src][idx]
            return
        key = target_name(target)
        if is_check(target):
            self.dropped[key] = self.dropped.get(key, 0) + 1
            return
        expr = symbolic_scalar(fx_node, self.symbols)
        if expr is not None:  # a size computation: its value lives on as an expression in attributes
            self.env[fx_node] = dim(expr) if isinstance(expr, sympy.Expr) else expr
            return
        for opdef, binding in self.table.get(key, ()):
            if self._try_bind(fx_node, opdef, binding, key):
                return
        self._opaque(fx_node, key)

    # -- binding -----------------------------------------------------------------------
    def _try_bind(self, fx_node, opdef: OpDef, binding: AtenBinding, key: str) -> bool:
        schema = fx_node.target._schema
        args = {k: self._sizes(v) for k, v in _normalize_args(schema, fx_node.args, fx_node.kwargs).items()}
        defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        types = {k: self._type_of(v) for k, v in args.items() if isinstance(v, torch.fx.Node)}
        if binding.convert is not None:
            args = binding.convert(dict(args), types)
            if args is _Refused:
                return False
        for k, v in binding.fixed.items():
            if args.pop(k, v) != v:
                return False
        for k in binding.drop:
            args.pop(k, None)
        args = {binding.rename.get(k, k): v for k, v in args.items()}

        recorded = recorded_types(fx_node, self.symbols)
        mapped = binding.outputs if binding.outputs is not None else tuple(range(len(recorded)))
        if not self._unmapped_results_unused(fx_node, mapped):
            return False

        primary = next(
            (
                self._value(v)
                for v in args.values()
                if isinstance(v, torch.fx.Node) and isinstance(self._value(v), Value)
            ),
            None,
        )
        inputs: list[Value | None] = []
        for operand in opdef.operands:
            v = args.pop(operand.name, None)
            if operand.variadic:
                items = list(v) if isinstance(v, (list, tuple)) else ([] if v is None else [v])
                converted = [self._operand(x, primary) for x in items]
                if any(c is False for c in converted) or (not operand.optional and None in converted):
                    return False
                inputs.extend(converted)
                continue
            c = self._operand(v, primary)
            if c is False or (c is None and not operand.optional):
                return False
            inputs.append(c)
        attrs = {}
        for attr in opdef.attrs:
            if attr.name in args:
                val = _plain(args.pop(attr.name))
                if val is _NOT_PLAIN:
                    return False
                attrs[attr.name] = val
        for k, v in args.items():  # left-over ATen arguments must be inert
            if not (k in defaults and _same(v, defaults[k])) and v is not None:
                return False
        try:
            node = self.graph.create_node(opdef.name, inputs, attrs, source=key)
        except GaweeError as e:
            self.warnings.append(f"{fx_node.name} ({key}): kept opaque, {opdef.name} refused it: {e.message}")
            return False
        got = [v.type for v in node.outputs[: len(mapped)]]  # an op may have results the ATen call lacks
        want = [recorded[i] for i in mapped]
        if len(got) != len(want) or any(w is not None and not g.same_shape_dtype(w) for g, w in zip(got, want)):
            self.warnings.append(f"{fx_node.name} ({key}): inferred {got} but export recorded {want}; kept opaque")
            self.graph.erase_node(node)
            return False
        if len(recorded) == 1 and not isinstance(fx_node.meta.get("val"), (list, tuple)):
            self.env[fx_node] = node.outputs[0]
        else:
            results: list[Value | None] = [None] * len(recorded)
            for out, i in zip(node.outputs, mapped):
                results[i] = out
            self.env[fx_node] = results
        return True

    def _sizes(self, v):
        """An argument with the size nodes in it replaced by their expressions."""
        if isinstance(v, torch.fx.Node) and isinstance(self.env.get(v), sympy.Basic):
            return self.env[v]
        if isinstance(v, (list, tuple)):
            return type(v)(self._sizes(x) for x in v)
        return v

    def _unmapped_results_unused(self, fx_node, mapped) -> bool:
        for user in fx_node.users:
            if user.target is operator.getitem and user.args[1] not in mapped and user.users:
                return False
        return True

    def _operand(self, v, primary: Value | None):
        """A Value for an ATen argument: fx node, None, or Scalar (→ 0-d constant); False if none fits."""
        if v is None:
            return None
        if isinstance(v, torch.fx.Node):
            value = self._value(v)
            return value if isinstance(value, Value) else False
        if isinstance(v, (bool, int, float)):
            return self.scalar(v, primary)
        return False

    def scalar(self, v: bool | int | float, primary: Value | None) -> Value:
        """A shared 0-d constant holding a Scalar, typed as torch would promote it against ``primary``."""
        if primary is not None:
            probe = torch.empty((1,) * min(primary.type.rank, 1), dtype=primary.dtype.torch, device="meta")
            dtype = torch.result_type(probe, v)
        else:
            dtype = torch.tensor(v).dtype if not isinstance(v, float) else torch.get_default_dtype()
        key = (type(v), v, dtype)
        got = self._scalars.get(key)
        if got is None:
            got = self.graph.constant(torch.tensor(v, dtype=dtype, device=self.device), "scalar")
            self._scalars[key] = got
        return got

    def _value(self, fx_node) -> Value | list:
        return self.env[fx_node]

    def _type_of(self, fx_node) -> TensorType | None:
        v = self.env.get(fx_node)
        return v.type if isinstance(v, Value) else None

    # -- the fallback ------------------------------------------------------------------
    def _opaque(self, fx_node, key: str) -> None:
        operands: list[Value] = []
        index: dict[int, int] = {}

        def collect(a):
            if isinstance(a, torch.fx.Node):
                v = self.env[a]
                if isinstance(v, Value):
                    index.setdefault(id(a), len(operands))
                    if index[id(a)] == len(operands):
                        operands.append(v)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    collect(x)

        collect(fx_node.args)
        collect(list(fx_node.kwargs.values()))
        try:
            attrs = {
                "target": key,
                "args": encode_arg(tuple(self._sizes(fx_node.args)), index),
                "kwargs": tuple((k, encode_arg(self._sizes(v), index)) for k, v in fx_node.kwargs.items()),
            }
        except TypeError as e:
            raise CaptureError(
                f"cannot record {key} at {fx_node.name}: {e}",
                hint="this ATen call takes an argument gawee cannot serialize",
            ) from None
        recorded = recorded_types(fx_node, self.symbols)
        if any(t is None for t in recorded):
            raise CaptureError(
                f"{key} at {fx_node.name} returns a non-tensor result ({_describe(fx_node.meta.get('val'))})",
                where=_user_location(fx_node),
                hint="gawee graphs carry tensors only: a symbolic size or scalar result comes from data-dependent "
                "shapes, which are not supported; make the shape static or return the value as a tensor",
            )
        node = self.graph.create_node(OPAQUE, operands, attrs, types=recorded, name=fx_node.name, source=key)
        if isinstance(fx_node.meta.get("val"), (list, tuple)):
            self.env[fx_node] = list(node.outputs)
        else:
            self.env[fx_node] = node.outputs[0]


_NOT_PLAIN = object()


def _plain(v: Any) -> Any:
    """An ATen argument as attribute data (dtypes become their short names)."""
    if isinstance(v, torch.dtype):
        return DType.from_torch(v).value
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, sympy.Expr) and v.is_integer:
        return dim(v)
    if isinstance(v, (list, tuple, torch.Size)):
        items = [_plain(x) for x in v]
        return _NOT_PLAIN if any(x is _NOT_PLAIN for x in items) else tuple(items)
    return _NOT_PLAIN


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (RuntimeError, TypeError):
        return False


def _normalize_args(schema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Positional + keyword ATen arguments as one dict keyed by schema name (defaults not added)."""
    out: dict[str, Any] = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for a, v in zip(positional, args):
        out[a.name] = v
    out.update(kwargs)
    return out


def target_name(target: Callable) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _describe(val: Any) -> str:
    vals = val if isinstance(val, (list, tuple)) else [val]
    return ", ".join(type(v).__name__ for v in vals)


def _user_location(fx_node: torch.fx.Node) -> str | None:
    """``file:line`` of the user's code that emitted this node (the innermost non-torch frame export recorded)."""
    trace = fx_node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    frames = [f for f in frames if "site-packages/torch/" not in f[0]] or frames
    if not frames:
        return None
    path, line, func = frames[-1]
    return f"{path}:{line} in {func}"
