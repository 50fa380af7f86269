"""Compile rule ASTs into Rules: matchers, guard closures and replacement builders.

Everything a rule says is checked here, against the op registry and the builtin
library, before any graph is seen: unknown ops and attributes, arity, unbound
names, unknown functions, and the kinds of guard and replacement expressions.
Each problem is a RuleError at the exact source span.
"""

from __future__ import annotations

import difflib
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from gawee.dsl import ast as A
from gawee.dsl import kinds as K
from gawee.dsl.library import ASSUMPTIONS, BUILTINS, Assumption, Builtin, GuardFailed
from gawee.dsl.matcher import (
    AnyM,
    AttrAny,
    AttrList,
    AttrLit,
    AttrMatcher,
    AttrVar,
    LitM,
    OpM,
    RestRecord,
    ValueMatcher,
    VarM,
)
from gawee.errors import RuleError, RuleWarning, SourceSpan
from gawee.ir.symbolic import has_symbols, prove
from gawee.ir.types import DType
from gawee.ops import ACTIVATIONS, OPAQUE, REQUIRED, OpDef, all_ops, get_op, has_op

Fn = Callable[[Any], Any]  # fn(ctx) -> value; ctx.env holds the bindings

DTYPE_NAMES = {d.value for d in DType}


@dataclass
class Rule:
    """A compiled rule, ready for the rewriter."""

    name: str
    span: SourceSpan
    root_op: str | None
    """The op at the root of the pattern (None: any op)."""
    matcher: OpM
    guard: Fn | None
    guard_parts: list[tuple[str, Fn]]
    """The top-level `and` conjuncts of the guard, with their source text (for explain)."""
    build: Fn
    whole_node: str | None
    """"fold" or "original" when the replacement is fold(root)/original(root): every output of the
    root node is replaced (multi-output nodes included)."""
    priority: int = 0
    comment: str = ""
    """The `# lhs -> rhs` comment line just above the rule, if any."""
    index: int = 0
    """Position in its rule set (file order), for deterministic ordering."""
    phase: str = ""
    ast: A.RuleAST | None = field(default=None, repr=False)
    """The source form (the soundness harness derives its example generator from it)."""
    extra_roots: list[OpM] = field(default_factory=list)
    """Roots after the first, matched among the users of values the earlier roots bound (horizontal fusion)."""
    extra_builds: list[Fn] = field(default_factory=list)
    """Their replacements, in order; run after ``build`` (they share its `with` values)."""
    variant: tuple[int, int] = (1, 1)
    """(i, n): this is the i-th of the n spellings its pattern's alternatives (`a | b`) make."""
    assumptions: list[Assumed] = field(default_factory=list)
    """`assume ...`: facts about runtime values the rule is sound under."""
    warnings: list[RuleWarning] = field(default_factory=list)
    """Load-time warnings (e.g. a variable bound and never used)."""
    match_fns: list[Callable] | None = field(default=None, repr=False)
    """The generated matchers of the roots, in order (gawee.dsl.codegen); None until installed."""
    code: str | None = field(default=None, repr=False)
    """Their Python source ("": the generator has no code for this rule; None: not generated yet)."""
    code_object: Any = field(default=None, repr=False)
    """``code`` compiled, where it was kept on disk beside it (gawee.dsl.code_cache); None: compiled on first use."""
    bound: Fn | None = field(default=None, repr=False)
    """`within expr`, compiled: ``bound(ctx)`` is the declared absolute error of each result element, a number
    or a tensor that broadcasts to the results (None: the rule is exact). Evaluated by
    gawee.rewrite.bound, in float64, never by the rewriter."""
    bound_text: str = ""
    """The bound as written (`3 * roundoff(bf16) * linear(abs(x), abs(w))`), for reports and the trace."""

    @property
    def approximate(self) -> bool:
        """Whether the rule declares an error bound: its result may differ from what it replaces by that much."""
        return self.bound is not None

    @property
    def root_output(self) -> int | None:
        """For a root that is one output of a multi-output op (`split(x, ...)[1]`), its index (negative counts
        from the end): only that output's uses are replaced. None for an op root."""
        return self.matcher.output

    @property
    def location(self) -> str:
        return f"{self.span.file}:{self.span.line}"

    @property
    def label(self) -> str:
        """The name, with the alternative when the rule has several: `layer_norm_written (2/3)`."""
        return self.name if self.variant[1] == 1 else f"{self.name} ({self.variant[0]}/{self.variant[1]})"

    @property
    def tag(self) -> str:
        """Provenance written on the nodes this rule makes."""
        return f"{self.name} ({self.location})"


@dataclass(frozen=True)
class Assumed:
    """One stated assumption of a rule: ``fact`` holds for every element of the value bound to ``var``."""

    fact: Assumption
    var: str
    text: str
    """As written, e.g. `finite(x)`."""


@dataclass
class _Var:
    kind: K.Kind
    op: str | None = None
    """For REST variables: the op whose remaining operands/attributes it holds."""
    span: SourceSpan | None = None
    uses: int = 0
    """Mentions after the binding one (in the pattern, guard, assumptions or replacement)."""


@dataclass
class _Scope:
    vars: dict[str, _Var] = field(default_factory=dict)
    withs: dict[str, tuple[int, K.Kind]] = field(default_factory=dict)
    helpers: dict[str, Builtin] = field(default_factory=dict)


def compile_rule(rule: A.RuleAST, helpers: dict[str, Builtin] | None = None, comment: str = "") -> list[Rule]:
    """Check and compile one rule AST: one Rule per combination of its patterns' alternatives
    (`a | b`), all with the rule's name, guard and replacement. Raises RuleError at the offending span."""
    if len(rule.extra_results) != len(rule.extra_roots):
        n, m = len(rule.extra_roots) + 1, len(rule.extra_results) + 1
        raise RuleError(
            f"{n} root{'s' if n > 1 else ''} but {m} result{'s' if m > 1 else ''}",
            span=(rule.extra_results[-1] if m > n else rule.replacement).span,
            hint="a rule with several roots gives one replacement per root, in order: `=> r0, r1`",
        )
    choices = [_alternatives(_desugar(p)) for p in [rule.pattern, *rule.extra_roots]]
    rules = [_compile_variant(rule, list(ps), helpers, comment) for ps in itertools.product(*choices)]
    noop = _no_op(rule)
    for r in rules:
        r.warnings += noop
    if len(rules) > 1:
        for i, r in enumerate(rules, 1):
            r.variant = (i, len(rules))
        seen: set[tuple] = set()  # a variable unused in every variant warns once
        for r in rules:
            r.warnings = [w for w in r.warnings if (w.message, str(w.span)) not in seen]
            seen.update((w.message, str(w.span)) for w in r.warnings)
    return rules


def _alternatives(p: A.Pattern) -> list[A.Pattern]:
    """Every spelling of a pattern with alternatives: the cross product of its `a | b` choices."""
    if isinstance(p, A.PAlt):
        names = [_bound_names(o) for o in p.options]
        for o, n in zip(p.options[1:], names[1:]):
            if n != names[0]:
                raise RuleError(
                    f"this alternative binds {', '.join(sorted(n)) or 'nothing'}, the first one "
                    f"{', '.join(sorted(names[0])) or 'nothing'}",
                    span=o.span,
                    hint="every alternative must bind the same names (the guard and replacement use them)",
                )
        return [v for o in p.options for v in _alternatives(o)]
    if isinstance(p, A.POp):
        choices = [_alternatives(a.pattern) if a.pattern is not None else [None] for a in p.args]
        return [
            A.POp(
                p.span, p.op, [A.PArg(a.span, c, a.keyword, a.rest) for a, c in zip(p.args, combo)], op_span=p.op_span
            )
            for combo in itertools.product(*choices)
        ]
    if isinstance(p, A.PBind):
        return [A.PBind(p.span, p.name, v) for v in _alternatives(p.pattern)]
    if isinstance(p, A.PSingleUse):
        return [A.PSingleUse(p.span, v) for v in _alternatives(p.pattern)]
    if isinstance(p, A.POutput):
        return [A.POutput(p.span, v, p.index) for v in _alternatives(p.pattern)]
    if isinstance(p, A.PList):
        return [A.PList(p.span, list(c)) for c in itertools.product(*(_alternatives(x) for x in p.items))]
    return [p]


def _bound_names(p: A.Pattern | None) -> set[str]:
    if p is None:
        return set()
    if isinstance(p, A.PVar):
        return {p.name}
    if isinstance(p, A.PBind):
        return {p.name} | _bound_names(p.pattern)
    if isinstance(p, A.POp):
        return set().union(
            *(_bound_names(a.pattern) | ({a.keyword} if a.rest and a.keyword else set()) for a in p.args)
        )
    if isinstance(p, (A.PSingleUse, A.POutput)):
        return _bound_names(p.pattern)
    if isinstance(p, A.PAlt):
        return _bound_names(p.options[0])
    if isinstance(p, A.PList):
        return set().union(*(_bound_names(x) for x in p.items))
    return set()


def _compile_variant(rule: A.RuleAST, patterns: list[A.Pattern], helpers, comment: str) -> Rule:
    scope = _Scope(helpers=dict(helpers or {}))
    root, root_bind = _root(patterns[0])
    whole = len(patterns) == 1 and isinstance(root, A.POp)  # an output root is replaced alone, never its node
    whole_node = _is_whole_node(rule.replacement, root_bind) if whole else None
    compiler = _PatternCompiler(scope)
    matcher = compiler.compile_root(root, root_bind, whole_node)
    extra_roots = [compiler.compile_root(*_root(p), None) for p in patterns[1:]]
    for opt in rule.options:
        if opt != "priority":
            raise RuleError(f"unknown rule option {opt!r}", span=rule.span, hint="the only option is priority=N")

    guard = guard_parts = None
    if rule.guard is not None:
        ec = _ExprCompiler(scope, "guard")
        guard, kind = ec.compile(rule.guard)
        if kind.base not in (K.Base.BOOL, K.Base.ANY):
            raise RuleError(f"a guard must be a boolean, this is {kind}", span=rule.guard.span)
        guard_parts = [(part.text, ec.compile(part)[0]) for part in _conjuncts(rule.guard)]
    assumptions = [_assumption(e, scope) for e in rule.assumes]

    ec = _ExprCompiler(scope, "replace")
    for i, b in enumerate(rule.withs):
        if b.name in scope.vars or b.name in scope.withs:
            raise RuleError(f"`{b.name}` is already bound", span=b.span)
        fn, kind = ec.compile(b.value)
        scope.withs[b.name] = (i, kind)
        ec.with_fns.append(fn)
    build, *extra_builds = [_tensor_result(ec, e) for e in [rule.replacement, *rule.extra_results]]
    n_withs = len(rule.withs)
    with_fns = ec.with_fns

    def run(ctx):
        ctx.with_cache = [_UNSET] * n_withs
        ctx.with_fns = with_fns
        return build(ctx)

    bound = None
    if rule.bound is not None:
        bound_fn = _bound(_ExprCompiler(scope, "bound", ec.with_fns), rule.bound)

        def bound(ctx):
            ctx.with_cache = [_UNSET] * n_withs
            ctx.with_fns = with_fns
            return bound_fn(ctx)

    return Rule(
        rule.name,
        rule.span,
        _root_op(root),
        matcher,
        guard,
        guard_parts or [],
        run,
        whole_node,
        priority=rule.options.get("priority", 0),
        comment=comment,
        ast=rule,
        assumptions=assumptions,
        warnings=_unused(scope),
        extra_roots=extra_roots,
        extra_builds=extra_builds,
        bound=bound,
        bound_text=rule.bound.text if rule.bound is not None else "",
    )


def _bound(ec: _ExprCompiler, e: A.Expr) -> Fn:
    """`within e`: an expression of the rule's names giving a number or a tensor, the absolute error allowed
    per element of each result."""
    fn, kind = ec.compile(e)
    if not (kind.is_tensor or kind.base in (K.Base.INT, K.Base.FLOAT, K.Base.ANY)):
        raise RuleError(
            f"an error bound must be a number or a tensor, this is {_a(kind)}",
            span=e.span,
            hint="`within` takes the absolute error allowed per result element, e.g. "
            "`within 3 * roundoff(bf16) * abs(x)`",
        )
    return fn


def _tensor_result(ec: _ExprCompiler, e: A.Expr) -> Fn:
    fn, kind = ec.compile(e)
    if not kind.is_tensor and kind.base is not K.Base.ANY:
        raise RuleError(
            f"the replacement must be a tensor, this is {kind}",
            span=e.span,
            hint="pick an output with [i]"
            if kind.base is K.Base.TENSORS
            else "replace with a bound operand or an op call",
        )
    return fn


def _assumption(e: A.Expr, scope: _Scope) -> Assumed:
    """`finite(x)` in an `assume` clause: a known fact about a bound tensor variable."""
    known = ", ".join(f"{n}(x)" for n in ASSUMPTIONS)
    if not (isinstance(e, A.ECall) and e.func in ASSUMPTIONS):
        raise RuleError("`assume` takes facts about runtime values", span=e.span, hint=f"known facts: {known}")
    args = e.args
    if len(args) != 1 or args[0].keyword or args[0].rest or not isinstance(args[0].value, A.EName):
        raise RuleError(f"{e.func}(...) takes one variable of the pattern, e.g. {e.func}(x)", span=e.span)
    name = args[0].value.name
    var = scope.vars.get(name)
    if var is None or not var.kind.is_tensor:
        raise RuleError(
            f"`{name}` is not an operand bound by the pattern",
            span=args[0].span,
            hint="an assumption is about the values of a tensor the pattern binds",
        )
    var.uses += 1
    return Assumed(ASSUMPTIONS[e.func], name, e.text)


def _no_op(rule: A.RuleAST) -> list[RuleWarning]:
    """A replacement written as its pattern (`relu(x) => relu(x)`, spaces and a root's `name:` aside) changes
    nothing. The rewriter never fires a replacement that rebuilds what it matched (rewrite/driver.py), so such a
    rule is dead: worth a warning where it is written."""

    def bare(p: A.Node) -> str:
        return "".join((p.pattern if isinstance(p, A.PBind) else p).text.split())

    pairs = list(zip([rule.pattern, *rule.extra_roots], [rule.replacement, *rule.extra_results]))
    if not all(bare(p) == bare(e) and bare(p) for p, e in pairs):
        return []
    return [
        RuleWarning(
            "the replacement is the pattern itself: the rule changes nothing",
            span=rule.replacement.span,
            hint="the rewriter never fires a replacement that rebuilds the nodes it matched; "
            "change the replacement or delete the rule",
        )
    ]


def _unused(scope: _Scope) -> list[RuleWarning]:
    """A variable bound once and never mentioned again matches anything: usually a typo or a
    missing literal (`max_val=inf` before `inf` was a literal). `_name` says it is meant."""
    return [
        RuleWarning(
            f"`{name}` is bound here and never used: it matches anything",
            span=var.span,
            hint=f"write `_` to match anything, a literal to match a value, or `_{name}` to keep the name",
        )
        for name, var in scope.vars.items()
        if var.uses == 0 and not name.startswith("_")
    ]


_UNSET = object()


def _multi_output_ops() -> list[str]:
    return sorted(n for n, op in all_ops().items() if op.has_trait("multi_output"))


def _a(kind: K.Kind) -> str:
    text = str(kind)
    return ("an " if text[0] in "aeiou" else "a ") + text


def _conjuncts(e: A.Expr) -> list[A.Expr]:
    if isinstance(e, A.EBool) and e.op == "and":
        return _conjuncts(e.left) + _conjuncts(e.right)
    return [e]


def _desugar(p: A.Pattern) -> A.Pattern:
    """`a |> f(args)` becomes f(a, args) with `a` marked single-use."""
    if isinstance(p, A.PPipe):
        lhs = A.PSingleUse(p.lhs.span, _desugar(p.lhs))
        call = _desugar(p.call)
        return A.POp(p.span, call.op, [A.PArg(lhs.span, lhs), *call.args], op_span=call.op_span)
    if isinstance(p, A.POp):
        return A.POp(
            p.span,
            p.op,
            [A.PArg(a.span, _desugar(a.pattern) if a.pattern else None, a.keyword, a.rest) for a in p.args],
            op_span=p.op_span,
        )
    if isinstance(p, A.PBind):
        return A.PBind(p.span, p.name, _desugar(p.pattern))
    if isinstance(p, A.PList):
        return A.PList(p.span, [_desugar(x) for x in p.items])
    if isinstance(p, A.PAlt):
        return A.PAlt(p.span, [_desugar(x) for x in p.options])
    if isinstance(p, A.POutput):
        return A.POutput(p.span, _desugar(p.pattern), p.index)
    if isinstance(p, A.PSingleUse):
        return A.PSingleUse(p.span, _desugar(p.pattern))
    return p


def _root(p: A.Pattern) -> tuple[A.POp | A.POutput, str | None]:
    """The root pattern (an op, or one output of a multi-output op: `split(x, ...)[1]`) and its `name:`."""
    if isinstance(p, A.PBind):
        inner, _ = _root(p.pattern)
        return inner, p.name
    if isinstance(p, A.POp) or (isinstance(p, A.POutput) and isinstance(p.pattern, A.POp)):
        return p, None
    raise RuleError(
        "a rule's pattern must be an op pattern such as relu(x), or an output of one: split(x, ...)[1]", span=p.span
    )


def _root_op(p: A.POp | A.POutput) -> str | None:
    return p.pattern.op if isinstance(p, A.POutput) else p.op


def _is_whole_node(e: A.Expr, root_bind: str | None) -> str | None:
    if (
        isinstance(e, A.ECall)
        and e.func in ("fold", "original")
        and len(e.args) == 1
        and isinstance(e.args[0].value, A.EName)
        and e.args[0].value.name == root_bind
    ):
        return e.func
    return None


def _unknown_op(name: str, span: SourceSpan) -> RuleError:
    close = difflib.get_close_matches(name, list(all_ops()), n=3)
    return RuleError(
        f"unknown op {name!r}",
        span=span,
        hint=f"did you mean {' or '.join(close)}?" if close else "see docs/ops.md for the op list",
    )


def _lookup_op(name: str, span: SourceSpan) -> OpDef:
    if not has_op(name):
        raise _unknown_op(name, span)
    if name == OPAQUE:
        raise RuleError("opaque `aten` nodes cannot be matched or built by rules", span=span)
    return get_op(name)


# ---------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------
_ARITH = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
}
_TENSOR_ARITH = {
    "+": ("add", {}),
    "-": ("sub", {}),
    "*": ("mul", {}),
    "/": ("div", {}),
    "//": ("div", {"rounding_mode": "floor"}),
    "%": ("remainder", {}),
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


def kleene_any(items) -> bool | None:
    result: bool | None = False
    for v in items:
        result = kleene_or(result, v)
        if result is True:
            return True
    return result


_COMPARE = {"==": None, "!=": None, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_TENSOR_FIELDS = {"shape": K.LIST, "dtype": K.DTYPE, "rank": K.INT, "numel": K.INT, "layout": K.STR}


class _ExprCompiler:
    """Compiles expressions to closures ``fn(ctx)``; ``mode`` is "guard", "replace" or "bound" (an error bound:
    built like a replacement, from the same names and `with` bindings, but never part of the graph)."""

    def __init__(self, scope: _Scope, mode: str, with_fns: list[Fn] | None = None):
        self.scope = scope
        self.mode = mode
        self.with_fns: list[Fn] = [] if with_fns is None else with_fns

    @property
    def builds(self) -> bool:
        """Whether op calls and tensor arithmetic are allowed (the replacement and the bound)."""
        return self.mode in ("replace", "bound")

    def compile(self, e: A.Expr) -> tuple[Fn, K.Kind]:
        method = getattr(self, "_" + type(e).__name__)
        return method(e)

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
            op, attrs = _TENSOR_ARITH[e.op]
            lt, rt = lk.is_tensor, rk.is_tensor

            def tensor_arith(ctx):
                a, b = lf(ctx), rf(ctx)
                if a is None or b is None:
                    raise ctx.error(f"`{e.text}` uses an absent operand (guard it, or use default(b, 0))")
                a = a if lt else ctx.tensor(a, like=b)
                b = b if rt else ctx.tensor(b, like=a)
                return ctx.emit(op, [a, b], attrs)

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
        lf, lk = self.compile(e.left)
        rf, rk = self.compile(e.right)
        self._need_bool(lk, e.left)
        self._need_bool(rk, e.right)
        if e.op == "and":

            def both(ctx):
                a = lf(ctx)
                return False if a is not None and not a else kleene_and(a, rf(ctx))

            return both, K.BOOL

        def either(ctx):
            a = lf(ctx)
            return True if a is not None and a else kleene_or(a, rf(ctx))

        return either, K.BOOL

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
        if len(e.args) < len(b.params) - (1 if b.variadic else 0) or (b.params and not e.args):
            raise RuleError(
                f"`{b.name}` takes {len(b.params)}{'+' if b.variadic else ''} argument(s), got {len(e.args)}",
                span=e.span,
            )
        impl = b.impl

        def call(ctx):
            vals = []
            for fn, implicit in args:
                v = fn(ctx)
                vals.append(ctx.tensor(v) if implicit else v)
            return impl(ctx, *vals)

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
        op = e.func
        multi = opdef.has_trait("multi_output")
        fixed = len(names) if variadic_from is None else variadic_from

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
            for k, fn in attr_fns.items():
                attrs[k] = fn(ctx)
            return ctx.emit(op, values + extra, attrs, multi=multi)

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
