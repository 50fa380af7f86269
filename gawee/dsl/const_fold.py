"""A replacement's constant subexpressions compiled to closures over tensors.

`w * reshape(s, [-1, 1, 1, 1])` with `s = default(gamma, 1) / sqrt(var + eps)`, where the guard makes `w`,
`gamma` and `var` constants, is folded when the rule fires. The general replacement closures
(gawee.dsl.expressions) do that one op at a time through ``RewriteContext.emit_op``: every intermediate result
becomes a detached constant Value that the next op unwraps. Compiled here, such a subexpression runs as one
closure over the tensors themselves — each op evaluated as ``emit_op`` would evaluate it (the op's ``evaluate``
on the same operands and prepared attributes, the same check of its result, :func:`RewriteContext.fold_data`)
— and only its result becomes a Value. Where a firing finds something the closure was not compiled for (an
operand that is not a constant on the CPU, an absent one, an op that raises), it stops (``NotConstant``) and
the general closure builds the subexpression instead, errors included: the result is the same either way.

What is compiled: tensor arithmetic, negation and calls of pure single-result ops whose attributes are
literals, over pattern variables the guard's conjunction makes constants (`const(w, ...)`, or
`const(g) or absent(g)`), numbers (literals and matched attributes, made 0-d tensors as the replacement makes
them), `default(v, number)` and `with` bindings of such subexpressions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gawee.dsl import ast as A
from gawee.dsl import kinds as K
from gawee.dsl.library import BUILTINS
from gawee.dsl.scope import _UNSET, _Scope
from gawee.errors import GaweeError
from gawee.ir.types import TensorType
from gawee.ops import OpDef, get_op, has_op

CFn = Callable[[Any], Any]
"""A compiled constant subexpression: ``cfn(ctx)`` gives its tensor, or raises NotConstant."""

TENSOR_ARITH = {
    "+": ("add", {}),
    "-": ("sub", {}),
    "*": ("mul", {}),
    "/": ("div", {}),
    "//": ("div", {"rounding_mode": "floor"}),
    "%": ("remainder", {}),
}
"""The op and attributes of each arithmetic operator on tensors (the replacement's closures and the compiled
constant ones build the same)."""


NO_LITERAL = object()
"""What :func:`literal_value` gives for an expression that is not made of literals."""


def literal_value(e: A.Expr) -> Any:
    """The value of an expression made of literals only (`1e-5`, `"relu"`, `[-1, 1, 1, 1]`) as its compiled
    closure would give it, known when the rule is compiled; ``NO_LITERAL`` for any other expression."""
    if isinstance(e, A.ELit):
        return e.value
    if isinstance(e, A.EList):
        items = tuple(literal_value(x) for x in e.items)
        return NO_LITERAL if any(x is NO_LITERAL for x in items) else items
    if isinstance(e, A.ENeg):
        v = literal_value(e.operand)
        return -v if type(v) in (int, float) else NO_LITERAL
    return NO_LITERAL


def prepared_once(opdef: OpDef, attrs: dict[str, Any]) -> dict[str, Any] | None:
    """``attrs`` (known when the rule is compiled) prepared for ``opdef`` once, shared by every firing — where
    the preparation reads no operand type (no canonicalization) and succeeds; else None (each firing prepares
    them, and reports a failure where it happens)."""
    if opdef.canonicalize is not None:
        return None
    try:
        return opdef.prepare_attrs(attrs, None, where=opdef.name, shared=True)
    except GaweeError:
        return None


class NotConstant(Exception):
    """A compiled constant subexpression met what it was not compiled for: the general path builds it."""


def constant_vars(guard: A.Expr | None, scope: _Scope) -> frozenset[str]:
    """The tensor variables that ``guard``'s top-level conjunction makes constants: every argument of a
    `const(...)` term, and `g` of a term `const(g) or absent(g)` (a constant where present)."""
    found: set[str] = set()
    for term in A.chain_terms(guard, "and") if guard is not None else []:
        found.update(_names_of(term, "const", scope))
        if isinstance(term, A.EBool) and term.op == "or":
            for one, other in ((term.left, term.right), (term.right, term.left)):
                const = _names_of(one, "const", scope)
                if len(const) == 1 and const == _names_of(other, "absent", scope):
                    found.update(const)
    return frozenset(found)


def _names_of(e: A.Expr, builtin: str, scope: _Scope) -> list[str]:
    """The variables ``e`` passes to ``builtin`` when it is a call of it on variables only (else none)."""
    if not isinstance(e, A.ECall) or e.func != builtin or builtin in scope.helpers:
        return []
    if not all(not (a.keyword or a.rest) and isinstance(a.value, A.EName) for a in e.args):
        return []
    return [a.value.name for a in e.args]


class ConstCompiler:
    """Compiles the constant subexpressions of one rule's replacement (its scope, the variables its guard makes
    constants, the expressions of its `with` bindings)."""

    def __init__(self, scope: _Scope, constants: frozenset[str], with_exprs: list[A.Expr]):
        self.scope = scope
        self.constants = constants
        self.with_exprs = with_exprs
        self._memo: dict[int, tuple[str, CFn] | None] = {}

    def compile(self, e: A.Expr) -> CFn | None:
        """``e`` as a closure over tensors, or None where it is not a constant subexpression this compiles."""
        got = self._compile(e)
        return got[1] if got is not None and got[0] == "tensor" else None

    def _compile(self, e: A.Expr) -> tuple[str, CFn] | None:
        """("tensor", cfn) or ("number", fn) for ``e``; None: not compiled."""
        key = id(e)
        if key not in self._memo:
            method = getattr(self, "_" + type(e).__name__, None)
            self._memo[key] = None if method is None else method(e)
        return self._memo[key]

    # -- leaves --------------------------------------------------------------------------
    def _ELit(self, e: A.ELit):
        v = e.value
        if type(v) not in (int, float, bool):
            return None
        return "number", lambda ctx: v

    def _EName(self, e: A.EName):
        name = e.name
        var = self.scope.vars.get(name)
        if var is not None:
            if var.kind.is_tensor:
                return ("tensor", _leaf(name)) if name in self.constants else None
            if var.kind.base in K.NUMERIC:
                return "number", lambda ctx: _number(ctx.env[name])
            return None
        if name in self.scope.withs:
            i, kind = self.scope.withs[name]
            if not kind.is_tensor or i >= len(self.with_exprs):
                return None
            inner = self.compile(self.with_exprs[i])
            if inner is None:
                return None

            def with_value(ctx):
                cache = ctx.with_tensors
                t = cache[i]
                if t is _UNSET:
                    t = cache[i] = inner(ctx)
                return t

            return "tensor", with_value
        return None

    # -- operators -----------------------------------------------------------------------
    def _ENeg(self, e: A.ENeg):
        inner = self._compile(e.operand)
        if inner is None or inner[0] != "tensor":
            return None
        fn, opdef, attrs = inner[1], get_op("neg"), prepared_once(get_op("neg"), {})
        if attrs is None:
            return None
        return "tensor", lambda ctx: ctx.fold_data(opdef, attrs, [fn(ctx)])

    def _EBin(self, e: A.EBin):
        left, right = self._compile(e.left), self._compile(e.right)
        if left is None or right is None or "tensor" not in (left[0], right[0]) or e.op not in TENSOR_ARITH:
            return None
        op, raw = TENSOR_ARITH[e.op]
        opdef = get_op(op)
        attrs = prepared_once(opdef, raw)
        if attrs is None:
            return None
        (lk, lf), (rk, rf) = left, right
        lt, rt = lk == "tensor", rk == "tensor"

        def arith(ctx):
            a, b = lf(ctx), rf(ctx)
            a = a if lt else ctx.scalar_data(a, b)
            b = b if rt else ctx.scalar_data(b, a)
            return ctx.fold_data(opdef, attrs, [a, b])

        return "tensor", arith

    def _ECall(self, e: A.ECall):
        if e.func == "default" and e.func not in self.scope.helpers:
            return self._default(e)
        if e.func in self.scope.helpers or not has_op(e.func):
            return None
        if e.func in BUILTINS:  # abs, min, max: the op on a tensor (as the replacement reads them), else numbers
            first = self._compile(e.args[0].value) if e.args and e.args[0].value is not None else None
            if first is None or first[0] != "tensor":
                return None
        return self._op(e, get_op(e.func))

    def _default(self, e: A.ECall):
        """`default(v, fallback)`: v where present (a constant), else the fallback (a number made a 0-d tensor
        as the replacement makes it, or a constant subexpression)."""
        if len(e.args) != 2 or any(a.keyword or a.rest for a in e.args):
            return None
        first, second = e.args[0].value, self._compile(e.args[1].value)
        if not isinstance(first, A.EName) or first.name not in self.constants or second is None:
            return None
        name, (kind, fn) = first.name, second

        def default(ctx):
            v = ctx.env[name]
            if v is not None:
                return _data(v)
            x = fn(ctx)
            return x if kind == "tensor" else ctx.scalar_data(x, None)

        return "tensor", default

    def _op(self, e: A.ECall, opdef: OpDef):
        """A call of a pure op of one result, its operands given in order, its attributes literals."""
        if "pure" not in opdef.traits or opdef.has_trait("multi_output") or opdef.variadic:
            return None
        names = [o.name for o in opdef.operands]
        operands: list[tuple[str, CFn, str | None]] = []  # kind, closure, the variable a leaf is
        attrs: dict[str, Any] = {}
        for a in e.args:
            if a.rest or (a.keyword is not None and a.keyword not in [x.name for x in opdef.attrs]):
                return None  # a spliced rest, or an operand given by name
            value = literal_value(a.value)
            if a.keyword is None and not attrs and len(operands) < len(names) and not _plain_data(value):
                # the next operand, as the replacement reads it: a tensor, or a number made a 0-d tensor
                got = self._compile(a.value)
                if got is None:
                    return None  # an operand that is not a constant subexpression, or `none`
                leaf = a.value.name if isinstance(a.value, A.EName) and a.value.name in self.scope.vars else None
                operands.append((got[0], got[1], leaf))
                continue
            if value is NO_LITERAL:
                return None  # an attribute computed from the match
            name = a.keyword
            if name is None:
                remaining = [x.name for x in opdef.attrs if x.name not in attrs]
                if not remaining:
                    return None
                name = remaining[0]
            attrs[name] = value
        if len(operands) < opdef.min_arity or not any(k == "tensor" for k, _, _ in operands):
            return None
        fixed = prepared_once(opdef, attrs)
        if fixed is None and opdef.canonicalize is None:
            return None  # attributes the op refuses: the general path reports it
        slots = len(names)

        def call(ctx):
            data: list[Any] = [None] * slots
            like = None
            for i, (kind, fn, _) in enumerate(operands):
                if kind == "tensor":
                    data[i] = t = fn(ctx)
                    like = like if like is not None else t
            for i, (kind, fn, _) in enumerate(operands):
                if kind != "tensor":
                    data[i] = ctx.scalar_data(fn(ctx), like)
            if fixed is not None:
                return ctx.fold_data(opdef, fixed, data)
            types = [None] * slots
            for i, t in enumerate(data):  # a variable's own type, as the general path reads it
                leaf = operands[i][2] if i < len(operands) else None
                types[i] = None if t is None else ctx.env[leaf].type if leaf is not None else TensorType.of(t)
            try:
                prepared = opdef.prepare_attrs(attrs, types, where=opdef.name, shared=True)
            except GaweeError:
                raise NotConstant from None  # the general path reports it
            return ctx.fold_data(opdef, prepared, data)

        return "tensor", call


def _plain_data(v: Any) -> bool:
    """A literal that is not a number or `none` (a list, a string): an attribute wherever it is written."""
    return v is not NO_LITERAL and not (type(v) in (int, float, bool) or v is None)


def _number(x: Any) -> Any:
    if type(x) not in (int, float, bool):
        raise NotConstant  # an absent attribute, or one that is not a number: the general path decides
    return x


def _data(v: Any) -> Any:
    """The tensor of a constant Value on the CPU, else NotConstant."""
    if v is None:
        raise NotConstant
    d = v.data
    if d is None or not d.is_cpu:
        raise NotConstant
    return d


def _leaf(name: str) -> CFn:
    return lambda ctx: _data(ctx.env[name])
