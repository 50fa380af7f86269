"""Guards, replacements, assumptions and error bounds compiled into closures over a match, each expression's
kind checked at load time; comparisons over symbolic sizes use three-valued (Kleene) logic."""

from __future__ import annotations

import difflib
import operator
from typing import Any

import sympy

from gawee.dsl import ast as A
from gawee.dsl import kinds as K
from gawee.dsl.const_fold import (
    NO_LITERAL,
    TENSOR_ARITH,
    ConstCompiler,
    NotConstant,
    literal_value,
    prepared_once,
)
from gawee.dsl.library import BUILTINS, Builtin, GuardFailed
from gawee.dsl.matcher import (
    RestRecord,
)
from gawee.dsl.scope import _UNSET, DTYPE_NAMES, Fn, _a, _lookup_op, _Scope, _Var
from gawee.errors import RuleError, SourceSpan
from gawee.ir.symbolic import has_symbols, prove
from gawee.ops import ACTIVATIONS, REQUIRED, OpDef, all_ops, get_op, has_op

_ARITH = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
}


def decide_equal(a: Any, b: Any) -> bool | None:
    """Equality of guard values, three-valued over symbolic sizes: True when it holds for every value of
    the symbols in range, False when for none, None (unknown) when it depends on them."""
    from gawee.dsl.matcher import data_equal

    if not (has_symbols(a) or has_symbols(b)):
        return data_equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return False
        result: bool | None = True
        for x, y in zip(a, b):
            result = kleene_and(result, decide_equal(x, y))
        return result
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return False
    if isinstance(a, (int, sympy.Basic)) and isinstance(b, (int, sympy.Basic)) and not isinstance(a, bool):
        return prove(a, "==", b)
    return data_equal(a, b)


def kleene_not(v: bool | None, negate: bool = True) -> bool | None:
    """Negation in three-valued logic: unknown stays unknown, so ``not`` never turns a doubt into True."""
    if not negate or v is None:
        return v
    return not v


def kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False or (a is not None and not a) or (b is not None and not b):
        return False
    return None if a is None or b is None else True


def kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if (a is not None and a) or (b is not None and b):
        return True
    return None if a is None or b is None else False


def _call(b: Builtin, args: list[tuple[Fn, bool]], names: list[str | None] | None = None) -> Fn:
    """The call of builtin ``b`` on its compiled arguments (each: its function, and whether a number there is
    made a 0-d tensor): one or two arguments without a loop, a fallback's second only where the first is absent.
    ``names``: per argument, the pattern variable it is (read from the match directly), or None."""
    impl = b.impl
    if names and not b.fallback and all(n is not None for n in names):
        if len(names) == 1:
            (n0,) = names
            return lambda ctx: impl(ctx, ctx.env[n0])
        if len(names) == 2:
            n0, n1 = names
            return lambda ctx: impl(ctx, ctx.env[n0], ctx.env[n1])
        return lambda ctx: impl(ctx, *[ctx.env[n] for n in names])
    fns = [(lambda ctx, fn=fn: ctx.tensor(fn(ctx))) if implicit else fn for fn, implicit in args]
    if b.fallback:
        first, second = fns
        return lambda ctx: v if (v := first(ctx)) is not None else second(ctx)
    if len(fns) == 1:
        (f0,) = fns
        return lambda ctx: impl(ctx, f0(ctx))
    if len(fns) == 2:
        f0, f1 = fns
        return lambda ctx: impl(ctx, f0(ctx), f1(ctx))
    return lambda ctx: impl(ctx, *[fn(ctx) for fn in fns])


def kleene_any(items) -> bool | None:
    result: bool | None = False
    for v in items:
        result = kleene_or(result, v)
        if result is True:
            return True
    return result


_COMPARE = {"==": None, "!=": None, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_TENSOR_FIELDS = {"shape": K.LIST, "dtype": K.DTYPE, "rank": K.INT, "numel": K.INT, "layout": K.STR}


def _constant_first(folded: Fn, general: Fn) -> Fn:
    """A replacement's subexpression evaluated by its compiled constant closure where that applies (on a graph on
    the CPU: one new constant), else by its general closure."""

    def fn(ctx):
        if ctx.on_host:
            try:
                t = folded(ctx)
            except NotConstant:
                return general(ctx)
            return ctx.constant(t)
        return general(ctx)

    return fn


class _ExprCompiler:
    """Compiles expressions to closures ``fn(ctx)``; ``mode`` is "guard", "replace" or "bound" (an error bound:
    built like a replacement, from the same names and `with` bindings, but never part of the graph)."""

    def __init__(
        self, scope: _Scope, mode: str, with_fns: list[Fn] | None = None, constants: ConstCompiler | None = None
    ):
        self.scope = scope
        self.mode = mode
        self.with_fns: list[Fn] = [] if with_fns is None else with_fns
        self.constants = constants
        """Compiles the replacement's constant subexpressions to closures over tensors (gawee.dsl.const_fold),
        tried before the general closure of each; None: not tried (guards, bounds)."""

    @property
    def builds(self) -> bool:
        """Whether op calls and tensor arithmetic are allowed (the replacement and the bound)."""
        return self.mode in ("replace", "bound")

    def compile(self, e: A.Expr) -> tuple[Fn, K.Kind]:
        method = getattr(self, "_" + type(e).__name__)
        fn, kind = method(e)
        if self.constants is not None and kind.is_tensor and isinstance(e, (A.EBin, A.ENeg, A.ECall)):
            folded = self.constants.compile(e)
            if folded is not None:
                fn = _constant_first(folded, fn)
        return fn, kind

    # -- atoms -------------------------------------------------------------------------
    def _ELit(self, e: A.ELit):
        v = e.value
        return (lambda ctx: v), K.of_value(v)

    def _EName(self, e: A.EName):
        name = e.name
        var = self.scope.vars.get(name)
        if var is not None:
            var.uses += 1
            return (lambda ctx: ctx.env[name]), var.kind
        if name in self.scope.withs:
            if not self.builds:
                raise RuleError(f"`{name}` is a `with` binding: it exists only in the replacement", span=e.span)
            i, kind = self.scope.withs[name]

            def get_with(ctx, i=i):
                if ctx.with_cache[i] is _UNSET:
                    ctx.with_cache[i] = ctx.with_fns[i](ctx)
                return ctx.with_cache[i]

            return get_with, kind
        if name in DTYPE_NAMES:
            return (lambda ctx: name), K.DTYPE
        if name in BUILTINS or name in self.scope.helpers or has_op(name):
            raise RuleError(f"`{name}` is a function: call it, e.g. {name}(x)", span=e.span)
        bound = sorted(self.scope.vars) + sorted(self.scope.withs)
        close = difflib.get_close_matches(name, bound, n=2)
        raise RuleError(
            f"`{name}` is never bound",
            span=e.span,
            hint=(f"did you mean {' or '.join(close)}? " if close else "")
            + f"bound names: {', '.join(bound) or 'none'}",
        )

    def _EList(self, e: A.EList):
        items = [self.compile(x) for x in e.items]
        for (_, kind), x in zip(items, e.items):
            if not kind.is_data:
                raise RuleError(f"list elements must be plain values, this is a {kind}", span=x.span)
        fns = [f for f, _ in items]
        return (lambda ctx: tuple(f(ctx) for f in fns)), K.LIST

    def _ESet(self, e: A.ESet):
        raise RuleError("a set `{...}` only appears after `in`", span=e.span)

    # -- operators ---------------------------------------------------------------------
    def _EAttr(self, e: A.EAttr):
        obj, kind = self.compile(e.obj)
        field_name = e.name
        if kind.is_tensor:
            if field_name not in _TENSOR_FIELDS:
                raise RuleError(
                    f"a tensor has no field {field_name!r}",
                    span=e.span,
                    hint="tensor fields: " + ", ".join(_TENSOR_FIELDS),
                )
            getter = {
                "shape": lambda v: v.shape,
                "dtype": lambda v: v.dtype.value,
                "rank": lambda v: v.type.rank,
                "numel": lambda v: v.type.numel,
                "layout": lambda v: v.type.layout.value,
            }[field_name]

            def get_field(ctx):
                v = obj(ctx)
                if v is None:
                    raise GuardFailed(f"`{e.obj.text}` is absent")
                return getter(v)

            return get_field, _TENSOR_FIELDS[field_name]
        if kind.base is K.Base.REST:
            var = self.scope.vars[e.obj.name] if isinstance(e.obj, A.EName) else None
            field_kind = K.ANY
            if var is not None and var.op is not None:
                opdef = get_op(var.op)
                a = opdef.attr(field_name)
                if a is not None:
                    field_kind = K.of_attr(a.kind)
                elif field_name in [o.name for o in opdef.operands]:
                    field_kind = K.TENSOR
                else:
                    raise RuleError(f"{var.op} has no operand or attribute {field_name!r}", span=e.span)

            def get_rest(ctx):
                rec: RestRecord = obj(ctx)
                try:
                    return rec.get(field_name)
                except KeyError:
                    raise GuardFailed(f"{field_name} was matched explicitly, not by `...`") from None

            return get_rest, field_kind
        raise RuleError(f"a {kind} has no fields", span=e.span)

    def _EIndex(self, e: A.EIndex):
        obj, kind = self.compile(e.obj)
        idx, ikind = self.compile(e.index)
        if kind.base is K.Base.TENSORS:
            if ikind.base not in (K.Base.INT, K.Base.ANY):
                raise RuleError(f"an output index must be an int, this is a {ikind}", span=e.index.span)

            def output(ctx):
                outs, i = obj(ctx), idx(ctx)
                if not -len(outs) <= i < len(outs):
                    raise ctx.error(f"`{e.text}`: the node has {len(outs)} outputs, there is no output {i}")
                return outs[i]

            return output, K.TENSOR
        if kind.base not in (K.Base.LIST, K.Base.ANY):
            raise RuleError(
                f"only lists and the outputs of a multi-output op (split(...)[0]) can be indexed, this is {_a(kind)}",
                span=e.obj.span,
            )
        if ikind.base not in (K.Base.INT, K.Base.ANY):
            raise RuleError(f"a list index must be an int, this is a {ikind}", span=e.index.span)

        def index(ctx):
            seq, i = obj(ctx), idx(ctx)
            try:
                return seq[i]
            except (IndexError, TypeError):
                raise GuardFailed(f"index {i} out of range") from None

        return index, K.ANY

    def _ENeg(self, e: A.ENeg):
        fn, kind = self.compile(e.operand)
        if kind.is_tensor:
            self._need_replace(e, "negating a tensor")
            return (lambda ctx: ctx.emit("neg", [fn(ctx)], {})), K.TENSOR
        self._need_numeric(kind, e.operand)
        return (lambda ctx: -fn(ctx)), kind

    def _EBin(self, e: A.EBin):
        lf, lk = self.compile(e.left)
        rf, rk = self.compile(e.right)
        if lk.is_tensor or rk.is_tensor:
            self._need_replace(e, f"`{e.op}` on tensors")
            for k, side in ((lk, e.left), (rk, e.right)):
                if not (k.is_tensor or k.base in K.NUMERIC or k.base is K.Base.ANY):
                    raise RuleError(f"cannot combine a tensor with a {k}", span=side.span)
            op, attrs = TENSOR_ARITH[e.op]
            opdef = get_op(op)
            prepared = prepared_once(opdef, attrs)
            lt, rt = lk.is_tensor, rk.is_tensor

            def tensor_arith(ctx):
                a, b = lf(ctx), rf(ctx)
                if a is None or b is None:
                    raise ctx.error(f"`{e.text}` uses an absent operand (guard it, or use default(b, 0))")
                a = a if lt else ctx.tensor(a, like=b)
                b = b if rt else ctx.tensor(b, like=a)
                return ctx.emit_op(opdef, [a, b], attrs, prepared=prepared)

            return tensor_arith, K.TENSOR
        if e.op == "+" and lk.base is K.Base.LIST and rk.base is K.Base.LIST:
            return (lambda ctx: tuple(lf(ctx)) + tuple(rf(ctx))), K.LIST
        self._need_numeric(lk, e.left)
        self._need_numeric(rk, e.right)
        fn = _ARITH[e.op]

        def arith(ctx):
            try:
                return fn(lf(ctx), rf(ctx))
            except (ZeroDivisionError, TypeError) as err:
                raise GuardFailed(str(err)) from None

        kind = K.FLOAT if e.op == "/" or K.Base.FLOAT in (lk.base, rk.base) else K.INT
        return arith, kind

    def _ENot(self, e: A.ENot):
        fn, kind = self.compile(e.operand)
        self._need_bool(kind, e.operand)
        return (lambda ctx: kleene_not(fn(ctx))), K.BOOL

    def _EBool(self, e: A.EBool):
        """A chain of one operator (`a and b and c`, however nested) as one closure over its terms, in order:
        the first decisive term (false for `and`, true for `or`) decides, and the chain is unknown (None) where
        no term decides and some term is unknown — Kleene logic, evaluated as the nested pairs would be."""
        fns = []
        for term in A.chain_terms(e, e.op):
            fn, kind = self.compile(term)
            self._need_bool(kind, term)
            fns.append(fn)
        decisive = e.op == "or"  # the value that decides the chain

        def chain(ctx):
            unknown = False
            for fn in fns:
                a = fn(ctx)
                if a is None:
                    unknown = True
                elif bool(a) is decisive:
                    return decisive
            return None if unknown else not decisive

        return chain, K.BOOL

    def _ECompare(self, e: A.ECompare):
        lf, lk = self.compile(e.left)
        rf, rk = self.compile(e.right)
        if lk.is_tensor or rk.is_tensor:
            raise RuleError("tensors cannot be compared; compare .shape, .dtype, or use all_equal(x, 1)", span=e.span)
        if not K.comparable(lk, rk):
            raise RuleError(f"comparing {_a(lk)} with {_a(rk)} is always false", span=e.span)
        if e.op in ("==", "!="):
            neg = e.op == "!="
            return (lambda ctx: kleene_not(decide_equal(lf(ctx), rf(ctx)), neg)), K.BOOL
        if lk.base not in K.NUMERIC | {K.Base.ANY} or rk.base not in K.NUMERIC | {K.Base.ANY}:
            raise RuleError(f"`{e.op}` orders numbers, not {lk} and {rk}", span=e.span)
        fn = _COMPARE[e.op]

        def compare(ctx):
            a, b = lf(ctx), rf(ctx)
            if a is None or b is None:
                return False
            if has_symbols(a) or has_symbols(b):
                return prove(a, e.op, b)  # None: holds for some sizes in range only
            return fn(a, b)

        return compare, K.BOOL

    def _EIn(self, e: A.EIn):
        f, kind = self.compile(e.item)
        if kind.is_tensor:
            raise RuleError("a tensor cannot be `in` a set; use x.dtype in {f32, f16}", span=e.item.span)
        choices = []
        for c in e.choices.items:
            cf, ck = self.compile(c)
            if not K.comparable(kind, ck):
                raise RuleError(f"a {kind} is never equal to a {ck}", span=c.span)
            choices.append(cf)
        neg = e.negate
        return (lambda ctx: kleene_not(kleene_any(decide_equal(f(ctx), c(ctx)) for c in choices), neg)), K.BOOL

    # -- calls -------------------------------------------------------------------------
    def _ECall(self, e: A.ECall):
        if (
            e.func in BUILTINS
            and has_op(e.func)
            and self.builds
            and e.args
            and e.args[0].value
            and self.compile(e.args[0].value)[1].is_tensor
        ):
            return self._op_call(e)  # abs/min/max: the op on tensors, the builtin on numbers
        if e.func in BUILTINS or e.func in self.scope.helpers:
            return self._builtin(e, self.scope.helpers.get(e.func) or BUILTINS[e.func])
        if has_op(e.func):
            if not self.builds:
                raise RuleError(
                    f"ops are built in the replacement; `{e.func}(...)` cannot appear in a guard",
                    span=e.func_span,
                    hint="match it in the pattern instead",
                )
            return self._op_call(e)
        names = list(BUILTINS) + list(self.scope.helpers) + (list(all_ops()) if self.builds else [])
        close = difflib.get_close_matches(e.func, names, n=3)
        raise RuleError(
            f"unknown function {e.func!r}",
            span=e.func_span,
            hint=(f"did you mean {' or '.join(close)}? " if close else "")
            + "Python helpers must be passed to load_rules(..., helpers={...})",
        )

    def _builtin(self, e: A.ECall, b: Builtin):
        if self.mode == "bound" and b.name in ("fold", "original"):
            raise RuleError(
                f"`{b.name}` reads the graph being rewritten: an error bound is of the matched values only",
                span=e.func_span,
            )
        if b.where != "both" and b.where != ("replace" if self.builds else self.mode):
            raise RuleError(
                f"`{b.name}` can only be used in the {'guard' if b.where == 'guard' else 'replacement'}",
                span=e.func_span,
            )
        args = []
        kinds = []
        names: list[str | None] = []  # the arguments that are pattern variables, read without a closure
        for i, a in enumerate(e.args):
            if a.keyword or a.rest:
                raise RuleError(f"`{b.name}` takes positional arguments only", span=a.span)
            fn, kind = self.compile(a.value)
            kinds.append(kind)
            param = b.params[min(i, len(b.params) - 1)] if b.params else K.ANY
            if i >= len(b.params) and not b.variadic:
                raise RuleError(f"`{b.name}` takes {len(b.params)} argument(s)", span=a.span)
            implicit_tensor = param.is_tensor and kind.base in K.NUMERIC and self.builds
            if not (K.accepts(param, kind) or implicit_tensor) or (
                param.is_tensor and kind.is_data and not implicit_tensor
            ):
                raise RuleError(f"argument {i + 1} of `{b.name}` must be a {param}, this is a {kind}", span=a.span)
            args.append((fn, implicit_tensor))
            plain = isinstance(a.value, A.EName) and a.value.name in self.scope.vars and not implicit_tensor
            names.append(a.value.name if plain else None)
        if len(e.args) < len(b.params) - (1 if b.variadic else 0) or (b.params and not e.args):
            raise RuleError(
                f"`{b.name}` takes {len(b.params)}{'+' if b.variadic else ''} argument(s), got {len(e.args)}",
                span=e.span,
            )
        call = _call(b, args, names)
        if b.int_preserving and kinds and all(k.base in (K.Base.INT, K.Base.ANY) for k in kinds):
            # ints give an int; an item of a list (`x.shape[0]`) is known only at firing, where it is checked
            return call, K.INT if all(k.base is K.Base.INT for k in kinds) else K.ANY
        return call, b.returns

    def _op_call(self, e: A.ECall):
        opdef = _lookup_op(e.func, e.func_span)
        names = [o.name for o in opdef.operands]
        variadic_from = len(names) - 1 if opdef.variadic else None
        operands: list[tuple[Fn, bool] | None] = []
        attr_fns: dict[str, Fn] = {}
        literals: dict[str, Any] = {}  # the attribute arguments known when the rule is compiled
        rests: list[Fn] = []
        attr_order = [a.name for a in opdef.attrs]
        next_attr = 0
        for a in e.args:
            if a.rest:
                var = self.scope.vars.get(a.rest)
                if var is None or var.kind.base is not K.Base.REST:
                    raise RuleError(f"`...{a.rest}` must name a `...{a.rest}` bound in the pattern", span=a.span)
                self._check_rest_fits(a.rest, var, opdef, a.span)
                rests.append(self.compile(A.EName(a.span, a.rest))[0])
                continue
            fn, kind = self.compile(a.value)
            if a.keyword is None:
                fits_operand = variadic_from is not None or len(operands) < len(names)
                # a number or `none` before any attribute fills the next operand slot, as in a pattern
                takes_slot = kind.is_tensor or ((kind.base in K.NUMERIC or kind.base is K.Base.NONE) and not attr_fns)
                if takes_slot and fits_operand:
                    operands.append((fn, kind.is_tensor))
                    continue
                if not kind.is_data:
                    raise RuleError(f"{e.func} takes at most {len(names)} operands", span=a.span)
                while next_attr < len(attr_order) and attr_order[next_attr] in attr_fns:
                    next_attr += 1
                if next_attr >= len(attr_order):
                    raise RuleError(f"{e.func} has no attribute left for this argument", span=a.span)
                self._check_attr(opdef, attr_order[next_attr], kind, a)
                attr_fns[attr_order[next_attr]] = fn
                literals[attr_order[next_attr]] = literal_value(a.value)
                continue
            if a.keyword in names and names.index(a.keyword) != variadic_from:
                i = names.index(a.keyword)
                while len(operands) <= i:
                    operands.append(None)
                if not (kind.is_tensor or kind.base in K.NUMERIC or kind.base is K.Base.NONE):
                    raise RuleError(f"operand {a.keyword} must be a tensor, this is a {kind}", span=a.span)
                operands[i] = (fn, kind.is_tensor)
            elif opdef.attr(a.keyword) is not None:
                self._check_attr(opdef, a.keyword, kind, a)
                attr_fns[a.keyword] = fn
                literals[a.keyword] = literal_value(a.value)
            else:
                raise RuleError(
                    f"{e.func} has no operand or attribute {a.keyword!r}",
                    span=a.span,
                    hint=f"operands: {', '.join(names) or 'none'}; attributes: {', '.join(attr_order) or 'none'}",
                )
        if not rests:
            given = sum(1 for o in operands if o is not None)
            if given < opdef.min_arity:
                raise RuleError(
                    f"{e.func} takes at least {opdef.min_arity} operands "
                    f"({', '.join(names[: opdef.min_arity])}), got {given}",
                    span=e.span,
                )
            missing = [x.name for x in opdef.attrs if x.default is REQUIRED and x.name not in attr_fns]
            if missing:
                raise RuleError(f"{e.func} needs attribute(s) {', '.join(missing)}", span=e.span)
        multi = opdef.has_trait("multi_output")
        fixed = len(names) if variadic_from is None else variadic_from
        literal = not rests and all(v is not NO_LITERAL for v in literals.values())
        prepared = prepared_once(opdef, literals) if literal else None

        def build(ctx):
            # spliced rests first: explicit arguments then overwrite what they name
            attrs: dict[str, Any] = {}
            values: list[Any] = [None] * max(fixed, len(operands))
            extra: list[Any] = []
            for rf in rests:
                rec: RestRecord = rf(ctx)
                attrs.update(rec.attrs)  # _check_rest_fits: the target op has every one of them
                for k, v in rec.operands.items():
                    values[names.index(k)] = v
                if variadic_from is not None:
                    extra.extend(rec.variadic)
            like = None
            for i, o in enumerate(operands):
                if o is not None:
                    fn, is_tensor = o
                    v = fn(ctx)
                    values[i] = v
                    if is_tensor and v is not None:
                        like = like or v
            for i, o in enumerate(operands):
                if o is not None and not o[1]:  # a number in an operand slot: a 0-d constant
                    values[i] = ctx.tensor(values[i], like=like) if values[i] is not None else None
            if prepared is None:
                for k, fn in attr_fns.items():
                    attrs[k] = fn(ctx)
            return ctx.emit_op(opdef, values + extra, attrs, multi=multi, prepared=prepared)

        return build, K.TENSORS if multi else K.TENSOR

    def _check_attr(self, opdef: OpDef, name: str, kind: K.Kind, a: A.EArg) -> None:
        want = K.of_attr(opdef.attr(name).kind)
        if kind.is_tensor or kind.base is K.Base.REST or not K.accepts(want, kind):
            raise RuleError(f"{opdef.name}.{name} is {want}, this is a {kind}", span=a.span)
        if (
            name == "act"
            and isinstance(a.value, A.ELit)
            and a.value.value is not None
            and a.value.value not in ACTIVATIONS
        ):
            raise RuleError(
                f"unknown activation {a.value.value!r}",
                span=a.span,
                hint="fusable activations: " + ", ".join(ACTIVATIONS),
            )

    def _check_rest_fits(self, name: str, var: _Var, target: OpDef, span: SourceSpan) -> None:
        """`...attrs` may carry any operand/attribute of its source op: the target must have them all."""
        if var.op is None:
            raise RuleError("`...` bound by `_(...)` cannot be spliced into an op call", span=span)
        source = get_op(var.op)
        target_names = {o.name for o in target.operands} | {a.name for a in target.attrs}
        missing = [o.name for o in source.operands if o.name not in target_names] + [
            a.name for a in source.attrs if a.name not in target_names
        ]
        if missing:
            raise RuleError(
                f"`...{name}` from {var.op} may carry {', '.join(missing)}, which {target.name} does not have",
                span=span,
                hint="match those explicitly in the pattern (e.g. act=none) instead of `...`",
            )

    # -- checks ------------------------------------------------------------------------
    def _need_replace(self, e: A.Expr, what: str) -> None:
        if not self.builds:
            raise RuleError(f"{what} builds new nodes: only the replacement may do that", span=e.span)

    def _need_numeric(self, kind: K.Kind, e: A.Expr) -> None:
        if kind.base not in K.NUMERIC and kind.base is not K.Base.ANY:
            raise RuleError(f"expected a number, this is a {kind}", span=e.span)

    def _need_bool(self, kind: K.Kind, e: A.Expr) -> None:
        if kind.base not in (K.Base.BOOL, K.Base.ANY):
            raise RuleError(f"expected a boolean, this is a {kind}", span=e.span)
