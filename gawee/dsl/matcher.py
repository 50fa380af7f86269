"""Pattern matchers: compiled left-hand sides that match Values, with backtracking and failure reasons.

A matcher's ``match(value, env, ctx)`` is a generator: each time it yields, ``env``
holds one consistent set of bindings (variables to Values or attribute data). The
caller resumes it to ask for the next alternative (commutative operand orders); on
resumption the matcher undoes its own bindings. When ``ctx.explain`` is set, every
failure is reported to ``ctx.fail`` with its depth, so the deepest one can be shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gawee.errors import SourceSpan
from gawee.ir.core import Node, Value

Env = dict[str, Any]


class MatchContext:
    """Per-attempt state: the nodes matched so far, and (explaining) the deepest failure."""

    def __init__(self, explain: bool = False):
        self.explain = explain
        self.nodes: list[Node] = []
        self.best_depth = -1
        self.best_reason = ""

    def fail(self, depth: int, reason: Callable[[], str]) -> None:
        if self.explain and depth >= self.best_depth:
            self.best_depth = depth
            self.best_reason = reason()


def data_equal(a: Any, b: Any) -> bool:
    """Equality of attribute data, lists and tuples alike."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(data_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return False
    if isinstance(a, bool) != isinstance(b, bool) and a is not None and b is not None:
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # a `nan` literal matches a nan attribute
    return a == b


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _ref(v: Value | None) -> str:
    return "an absent operand" if v is None else f"%{v.name}"


def _bind(env: Env, name: str, value: Any, same: Callable[[Any, Any], bool]) -> bool | None:
    """Bind name; True if newly bound, False if already bound to an equal value, None on conflict."""
    if name in env:
        return False if same(env[name], value) else None
    env[name] = value
    return True


# -- value matchers (operand positions) ---------------------------------------------------
class ValueMatcher:
    single_use: bool = False
    """Set on the left side of `|>`: the value must have exactly one use."""

    def match(self, v: Value | None, env: Env, ctx: MatchContext, depth: int) -> Iterator[None]:
        if self.single_use and (v is None or v.num_uses != 1):
            ctx.fail(depth, lambda: f"{_ref(v)} has {0 if v is None else v.num_uses} uses; `|>` needs exactly one")
            return
        yield from self._match(v, env, ctx, depth)

    def _match(self, v, env, ctx, depth) -> Iterator[None]:
        raise NotImplementedError


@dataclass
class VarM(ValueMatcher):
    name: str
    single_use: bool = False

    def _match(self, v, env, ctx, depth):
        new = _bind(env, self.name, v, lambda a, b: a is b)
        if new is None:
            ctx.fail(
                depth,
                lambda: (
                    f"`{self.name}` is already %{env[self.name].name if env[self.name] else '_'}, "
                    f"here it would be {_ref(v)}"
                ),
            )
            return
        yield
        if new:
            del env[self.name]


@dataclass
class AnyM(ValueMatcher):
    single_use: bool = False

    def _match(self, v, env, ctx, depth):
        yield


@dataclass
class LitM(ValueMatcher):
    """A constant operand whose elements all equal ``value`` (``none``: an absent operand)."""

    value: Any
    single_use: bool = False

    def _match(self, v, env, ctx, depth):
        if self.value is None:
            if v is None:
                yield
            else:
                ctx.fail(depth, lambda: f"expected an absent operand, found {_ref(v)}")
            return
        if v is None or not v.has_known_data:
            ctx.fail(depth, lambda: f"expected the constant {self.value!r}, found {_ref(v)} (not a known constant)")
            return
        if not literal_matches(v, self.value):
            ctx.fail(depth, lambda: f"expected the constant {self.value!r}, found %{v.name} with other values")
            return
        yield


def literal_matches(v: Value | None, value: Any) -> bool:
    """Whether ``v`` is a known constant, not empty, whose elements all equal the number ``value``
    (a ``nan`` literal matches nans)."""
    if v is None or not v.has_known_data:
        return False
    data = v.data
    same = torch.isnan(data) if _is_nan(value) and data.is_floating_point() else data == value
    return data.numel() != 0 and bool(same.all())


@dataclass
class RestRecord:
    """What `...name` bound: the operands and attributes the pattern did not mention."""

    op: str
    operands: dict[str, Value | None]
    attrs: dict[str, Any]
    variadic: tuple[Value | None, ...] = ()

    def __init__(self, op: str, operands: dict, attrs: dict, variadic: tuple = ()):
        # written out as the dataclass would generate it: a match binding `...attrs` makes one, and this runs
        # compiled with this module (gawee.accel), a generated one does not
        self.op = op
        self.operands = operands
        self.attrs = attrs
        self.variadic = variadic

    def get(self, key: str) -> Any:
        if key in self.operands:
            return self.operands[key]
        return self.attrs[key]


@dataclass
class OpM(ValueMatcher):
    """``op(operands, attr=pattern, ...)``. ``rest``: False = exact, True = `...`, str = `...name`."""

    op: str | None
    operands: list[ValueMatcher | None]
    """Per operand slot (variadic ops: one per matched variadic element); None = free slot."""
    operand_names: list[str]
    attrs: dict[str, AttrMatcher]
    defaults: dict[str, Any]
    """Attributes that must hold their default (unmentioned, no rest)."""
    rest: bool | str = False
    bind: str | None = None
    single_use: bool = False
    commutative: bool = False
    variadic_from: int | None = None
    """Index of the variadic operand in the op signature, or None."""
    any_outputs: bool = False
    """Allow multi-output producers (whole-node rules)."""
    output: int | None = None
    """`split(...)[i]`: the value must be output ``i`` of its node (negative counts from the end)."""
    span: SourceSpan | None = field(default=None, repr=False, compare=False)
    """Where the pattern is written (comments of the generated matcher)."""

    def _match(self, v, env, ctx, depth):
        if v is None:
            ctx.fail(depth, lambda: f"expected {self.op or 'a node'}(...), found an absent operand")
            return
        node = v.producer
        if node is None:
            kind = "a constant" if v.data is not None else "a graph input"
            ctx.fail(depth, lambda: f"expected {self.op or 'a node'}(...), found %{v.name} ({kind})")
            return
        if self.op is not None and node.op != self.op:
            ctx.fail(depth, lambda: f"expected {self.op}(...), found %{v.name} = {node.op}(...)")
            return
        if self.output is not None:
            n = len(node.outputs)
            if not -n <= self.output < n or node.outputs[self.output] is not v:
                ctx.fail(depth, lambda: f"%{v.name} is not output {self.output} of %{node.name} = {node.op}(...)")
                return
        elif len(node.outputs) != 1 and not self.any_outputs:
            ctx.fail(depth, lambda: f"%{v.name} comes from {node.op}, which has {len(node.outputs)} outputs")
            return
        for k, want in self.defaults.items():
            if not data_equal(node.attrs.get(k), want):
                ctx.fail(
                    depth,
                    lambda k=k, want=want: (
                        f"%{v.name} = {node.op}(...) has {k}={node.attrs.get(k)!r}, the pattern needs the default "
                        f"{want!r} (add `...` to allow any)"
                    ),
                )
                return
        inputs = node.inputs
        n_fixed = self.variadic_from if self.variadic_from is not None else len(inputs)
        if self.variadic_from is not None and self.rest is False and len(inputs) != len(self.operands):
            ctx.fail(
                depth,
                lambda: f"%{v.name} = {node.op}(...) has {len(inputs)} operands, the pattern {len(self.operands)}",
            )
            return
        if len(inputs) < len(self.operands):
            ctx.fail(depth, lambda: f"%{v.name} = {node.op}(...) has only {len(inputs)} operands")
            return
        if self.rest is False:
            for i in range(len(self.operands), n_fixed):
                if inputs[i] is not None:
                    ctx.fail(
                        depth,
                        lambda i=i: (
                            f"%{v.name} = {node.op}(...) has operand {self.operand_names[i]} "
                            f"(%{inputs[i].name}) the pattern does not mention (add `...`)"
                        ),
                    )
                    return
            for i in range(n_fixed):
                if i < len(self.operands) and self.operands[i] is None and inputs[i] is not None:
                    ctx.fail(
                        depth,
                        lambda i=i: (
                            f"%{v.name} = {node.op}(...) has operand {self.operand_names[i]} "
                            f"the pattern does not mention (add `...`)"
                        ),
                    )
                    return
        orders = [list(range(len(self.operands)))]
        if self.commutative and len(self.operands) >= 2:
            swapped = list(orders[0])
            swapped[0], swapped[1] = 1, 0
            orders.append(swapped)
        ctx.nodes.append(node)
        for order in orders:
            steps: list[Callable[[], Iterator[None]]] = []
            for slot, m in enumerate(self.operands):
                if m is not None:
                    src = order[slot]
                    steps.append(lambda m=m, src=src: m.match(inputs[src], env, ctx, depth + 1))
            for name, am in self.attrs.items():
                steps.append(lambda am=am, name=name: am.match(node.attrs.get(name), env, ctx, depth + 1, name, node))
            for _ in _chain(steps, 0):
                newly: list[str] = []
                ok = True
                if isinstance(self.rest, str):
                    rec = self._rest_record(node)
                    r = _bind(env, self.rest, rec, lambda a, b: a == b)
                    ok = r is not None
                    if r:
                        newly.append(self.rest)
                if ok and self.bind is not None:
                    r = _bind(env, self.bind, v, lambda a, b: a is b)
                    ok = r is not None
                    if r:
                        newly.append(self.bind)
                    elif r is None:
                        ctx.fail(depth, lambda: f"`{self.bind}` is bound twice to different values")
                if ok:
                    yield
                for name in newly:
                    del env[name]
        ctx.nodes.pop()

    def _rest_record(self, node: Node) -> RestRecord:
        free = tuple(i for i, m in enumerate(self.operands) if m is None)
        names = tuple(self.operand_names)
        return rest_record(node, names, len(self.operands), free, tuple(self.attrs), self.variadic_from)


def rest_record(
    node: Node,
    operand_names: tuple[str, ...],
    n_operands: int,
    free: tuple[int, ...],
    mentioned: tuple[str, ...],
    variadic_from: int | None,
) -> RestRecord:
    """What `...name` binds at ``node``: the operands in slots the pattern left free (``free``, or past its
    ``n_operands``), the variadic tail, and the attributes it did not mention."""
    n_fixed = variadic_from if variadic_from is not None else len(node.inputs)
    operands = {operand_names[i]: node.inputs[i] for i in range(n_fixed) if i >= n_operands or i in free}
    variadic = tuple(node.inputs[n_operands:]) if variadic_from is not None else ()
    attrs = {k: v for k, v in node.attrs.items() if k not in mentioned}
    return RestRecord(node.op, operands, attrs, variadic)


def _chain(steps: list[Callable[[], Iterator[None]]], i: int) -> Iterator[None]:
    if i == len(steps):
        yield
        return
    for _ in steps[i]():
        yield from _chain(steps, i + 1)


# -- attribute matchers --------------------------------------------------------------------
class AttrMatcher:
    def match(self, value: Any, env: Env, ctx: MatchContext, depth: int, name: str, node: Node) -> Iterator[None]:
        raise NotImplementedError


@dataclass
class AttrVar(AttrMatcher):
    var: str

    def match(self, value, env, ctx, depth, name, node):
        new = _bind(env, self.var, value, data_equal)
        if new is None:
            ctx.fail(depth, lambda: f"{node.name}.{name} is {value!r} but `{self.var}` is already {env[self.var]!r}")
            return
        yield
        if new:
            del env[self.var]


@dataclass
class AttrAny(AttrMatcher):
    def match(self, value, env, ctx, depth, name, node):
        yield


def _int_data(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (
        isinstance(x, (list, tuple)) and bool(x) and all(_int_data(v) for v in x)
    )


def canonical_equal(literal: Any, value: Any, name: str, node: Node) -> bool:
    """Whether a literal written in a pattern (``dim=-1``, ``dims=[-1]``, ``stride=[2]``) is the node's
    canonical ``value`` once the op canonicalizes it for this node's operands (nodes store dims
    non-negative, pairs expanded): ``transpose(x, dim0=-2, dim1=-1)`` matches a rank-3 transpose(1, 2)."""
    if not _int_data(literal):
        return False
    from gawee.errors import GaweeError
    from gawee.ops import get_op

    try:
        opdef = get_op(node.op)
        if opdef.canonicalize is None:
            return False
        attrs = {**node.attrs, name: tuple(literal) if isinstance(literal, list) else literal}
        canon = opdef.prepare_attrs(attrs, [None if v is None else v.type for v in node.inputs])
    except GaweeError:
        return False
    return data_equal(canon.get(name), value)


@dataclass
class AttrLit(AttrMatcher):
    value: Any

    def match(self, value, env, ctx, depth, name, node):
        if data_equal(value, self.value) or canonical_equal(self.value, value, name, node):
            yield
        else:
            ctx.fail(
                depth, lambda: f"%{node.name} = {node.op}(...) has {name}={value!r}, the pattern needs {self.value!r}"
            )


@dataclass
class AttrList(AttrMatcher):
    items: list[AttrMatcher]

    def match(self, value, env, ctx, depth, name, node):
        literal = [m.value for m in self.items if isinstance(m, AttrLit)]
        if len(literal) == len(self.items) and not data_equal(value, literal):
            if canonical_equal(literal, value, name, node):  # dims=[-1] against a node's dims=(2,)
                yield
            else:
                ctx.fail(depth, lambda: f"%{node.name}.{name} is {value!r}, the pattern needs {literal!r}")
            return
        if not isinstance(value, tuple) or len(value) != len(self.items):
            ctx.fail(depth, lambda: f"%{node.name}.{name} is {value!r}, the pattern needs a list of {len(self.items)}")
            return
        steps = [lambda m=m, x=x: m.match(x, env, ctx, depth, name, node) for m, x in zip(self.items, value)]
        yield from _chain(steps, 0)
