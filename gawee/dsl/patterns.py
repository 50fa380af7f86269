"""Patterns (the left-hand side of a rule) compiled into matchers (:mod:`gawee.dsl.matcher`), checked against the
op registry: unknown ops and attributes, arity, names bound twice or of two kinds."""

from __future__ import annotations

from typing import Any

from gawee.dsl import ast as A
from gawee.dsl import kinds as K
from gawee.dsl.library import BUILTINS
from gawee.dsl.matcher import (
    AnyM,
    AttrAny,
    AttrList,
    AttrLit,
    AttrMatcher,
    AttrVar,
    LitM,
    OpM,
    ValueMatcher,
    VarM,
)
from gawee.dsl.scope import DTYPE_NAMES, _lookup_op, _multi_output_ops, _Scope, _Var
from gawee.errors import RuleError, SourceSpan
from gawee.ops import ACTIVATIONS, REQUIRED, get_op


class _PatternCompiler:
    def __init__(self, scope: _Scope):
        self.scope = scope

    def declare(
        self, name: str, kind: K.Kind, span: SourceSpan, op: str | None = None, names_node: bool = False
    ) -> None:
        """Bind ``name``; ``names_node``: it names what a pattern already matched (`y: op(...)`, `...rest`),
        so leaving it unused loosens nothing (no warning)."""
        if name in DTYPE_NAMES or name in BUILTINS:
            raise RuleError(
                f"`{name}` names a {'dtype' if name in DTYPE_NAMES else 'builtin'}; pick another variable name",
                span=span,
            )
        prev = self.scope.vars.get(name)
        if prev is None:
            self.scope.vars[name] = _Var(kind, op, span, uses=1 if names_node else 0)
            return
        prev.uses += 1
        if prev.kind.is_tensor != kind.is_tensor or (prev.kind.base is K.Base.REST) != (kind.base is K.Base.REST):
            raise RuleError(
                f"`{name}` is used as a {kind} here but as a {prev.kind} at {prev.span}",
                span=span,
                hint="a variable binds either an operand or an attribute value",
            )

    def compile_root(self, p: A.POp | A.POutput, bind: str | None, whole_node: str | None) -> OpM:
        m = self.value(p)
        assert isinstance(m, OpM)
        if bind is not None:
            self.declare(bind, K.TENSOR, p.span, names_node=True)
            m.bind = bind
        m.any_outputs = whole_node is not None
        return m

    def value(self, p: A.Pattern, single: bool = False) -> ValueMatcher:
        if isinstance(p, A.PSingleUse):
            return self.value(p.pattern, single=True)
        if isinstance(p, A.PVar):
            self.declare(p.name, K.TENSOR, p.span)
            return VarM(p.name, single_use=single)
        if isinstance(p, A.PAny):
            return AnyM(single_use=single)
        if isinstance(p, A.PLit):
            if isinstance(p.value, str):
                raise RuleError("a string cannot be an operand", span=p.span)
            return LitM(p.value, single_use=single)
        if isinstance(p, A.PList):
            raise RuleError("a list cannot be an operand; lists match list attributes (dims=[d])", span=p.span)
        if isinstance(p, A.PBind):
            inner = self.value(p.pattern)
            if not isinstance(inner, OpM):
                raise RuleError("`name:` binds the output of an op pattern", span=p.span)
            self.declare(p.name, K.TENSOR, p.span, names_node=True)
            inner.bind = p.name
            inner.single_use = inner.single_use or single
            return inner
        if isinstance(p, A.POp):
            m = self.op(p)
            m.single_use = single
            return m
        if isinstance(p, A.POutput):
            if p.pattern.op is not None and not get_op(p.pattern.op).has_trait("multi_output"):
                raise RuleError(
                    f"{p.pattern.op} has one output: `[{p.index}]` picks an output of a node with several",
                    span=p.span,
                    hint="ops with several outputs: " + ", ".join(_multi_output_ops()),
                )
            m = self.op(p.pattern)
            m.output = p.index
            m.single_use = single
            return m
        raise RuleError("unsupported pattern", span=p.span)

    def op(self, p: A.POp) -> OpM:
        if p.op is None:
            return self._any_op(p)
        opdef = _lookup_op(p.op, p.op_span)
        names = [o.name for o in opdef.operands]
        variadic_from = len(opdef.operands) - 1 if opdef.variadic else None
        slots: list[ValueMatcher | None] = []
        attrs: dict[str, AttrMatcher] = {}
        rest: bool | str = False
        positional_done = False
        for arg in p.args:
            if arg.rest:
                if rest is not False:
                    raise RuleError("only one `...` per op pattern", span=arg.span)
                rest = arg.keyword if arg.keyword else True
                if arg.keyword:
                    self.declare(arg.keyword, K.REST, arg.span, op=p.op, names_node=True)
                continue
            if rest is not False:
                raise RuleError("`...` must come last", span=arg.span)
            if arg.keyword is None:
                if positional_done:
                    raise RuleError("positional operand after a keyword", span=arg.span)
                if variadic_from is None and len(slots) >= len(names):
                    raise RuleError(f"{p.op} takes at most {len(names)} operands ({', '.join(names)})", span=arg.span)
                slots.append(self.value(arg.pattern))
                continue
            positional_done = True
            if arg.keyword in names and names.index(arg.keyword) != variadic_from:
                i = names.index(arg.keyword)
                while len(slots) <= i:
                    slots.append(None)
                if slots[i] is not None:
                    raise RuleError(f"operand {arg.keyword} is given twice", span=arg.span)
                slots[i] = self.value(arg.pattern)
            elif opdef.attr(arg.keyword) is not None:
                if arg.keyword in attrs:
                    raise RuleError(f"attribute {arg.keyword} is given twice", span=arg.span)
                attrs[arg.keyword] = self.attr(arg.pattern, K.of_attr(opdef.attr(arg.keyword).kind), arg.keyword, p.op)
            else:
                raise RuleError(
                    f"{p.op} has no operand or attribute {arg.keyword!r}",
                    span=arg.span,
                    hint=f"operands: {', '.join(names) or 'none'}; attributes: "
                    f"{', '.join(a.name for a in opdef.attrs) or 'none'}",
                )
        if rest is False:
            n_positional = sum(1 for m in slots if m is not None)
            required = opdef.min_arity
            if n_positional < required and (len(slots) < required or any(s is None for s in slots[:required])):
                raise RuleError(
                    f"{p.op} takes at least {required} operands ({', '.join(names[:required])}), "
                    f"the pattern gives {n_positional}",
                    span=p.span,
                    hint="add the missing operands, or `...` to leave them free",
                )
        defaults: dict[str, Any] = {}
        if rest is False:
            for a in opdef.attrs:
                if a.name in attrs:
                    continue
                if a.default is REQUIRED:
                    raise RuleError(
                        f"the pattern leaves {p.op}'s required attribute {a.name!r} unmatched",
                        span=p.span,
                        hint=f"add {a.name}=_ (any value), or `...`",
                    )
                defaults[a.name] = a.default
        return OpM(
            p.op,
            slots,
            names,
            attrs,
            defaults,
            rest,
            commutative=opdef.has_trait("commutative"),
            variadic_from=variadic_from,
            span=p.span,
        )

    def _any_op(self, p: A.POp) -> OpM:
        rest: bool | str = False
        slots: list[ValueMatcher | None] = []
        for arg in p.args:
            if arg.rest:
                rest = arg.keyword or True
                if arg.keyword:
                    self.declare(arg.keyword, K.REST, arg.span, op=None, names_node=True)
            elif arg.keyword is not None:
                raise RuleError("`_(...)` matches any op: it takes no keyword arguments", span=arg.span)
            else:
                slots.append(self.value(arg.pattern))
        if rest is False:
            raise RuleError("`_(...)` needs `...` (its operands are unknown)", span=p.span)
        return OpM(None, slots, [f"operand{i}" for i in range(len(slots))], {}, {}, rest, variadic_from=0, span=p.span)

    def attr(self, p: A.Pattern, kind: K.Kind, name: str, op: str) -> AttrMatcher:
        if isinstance(p, A.PVar) and p.name in DTYPE_NAMES:  # `cast(x, dtype=i64)`: a dtype literal
            if not K.accepts(kind, K.DTYPE):
                raise RuleError(f"{op}.{name} is {kind}; the dtype {p.name} can never match", span=p.span)
            return AttrLit(p.name)
        if isinstance(p, A.PVar):
            self.declare(p.name, kind, p.span)
            return AttrVar(p.name)
        if isinstance(p, A.PAny):
            return AttrAny()
        if isinstance(p, A.PLit):
            if not K.accepts(kind, K.of_value(p.value)):
                raise RuleError(f"{op}.{name} is {kind}; {p.value!r} can never match", span=p.span)
            if name == "act" and p.value is not None and p.value not in ACTIVATIONS:
                raise RuleError(
                    f"unknown activation {p.value!r}",
                    span=p.span,
                    hint="fusable activations: " + ", ".join(ACTIVATIONS),
                )
            return AttrLit(p.value)
        if isinstance(p, A.PList):
            if kind.base not in (K.Base.LIST, K.Base.ANY):
                raise RuleError(f"{op}.{name} is {kind}, not a list", span=p.span)
            item = _ITEM_KINDS.get(get_op(op).attr(name).kind.rstrip("?"), K.ANY) if kind.base is K.Base.LIST else K.ANY
            return AttrList([self.attr(x, item, f"{name} item", op) for x in p.items])
        raise RuleError(f"attribute {name} takes a name, `_` or a literal, not a pattern", span=p.span)


_ITEM_KINDS = {"ints": K.INT, "floats": K.FLOAT}
"""The kind of each item of a list attribute (`permute(x, dims=[0, 2, 1])`): a float where ints go never matches."""
