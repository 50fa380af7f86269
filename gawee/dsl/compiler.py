"""Compile rule ASTs into Rules: matchers, guard closures and replacement builders.

Everything a rule says is checked here, against the op registry and the builtin
library, before any graph is seen: unknown ops and attributes, arity, unbound
names, unknown functions, and the kinds of guard and replacement expressions.
Each problem is a RuleError at the exact source span.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gawee.dsl import ast as A
from gawee.dsl import kinds as K
from gawee.dsl.const_fold import ConstCompiler, constant_vars
from gawee.dsl.expressions import _ExprCompiler
from gawee.dsl.library import ASSUMPTIONS, BUILTINS, Assumption, Builtin
from gawee.dsl.matcher import (
    OpM,
)
from gawee.dsl.patterns import _PatternCompiler
from gawee.dsl.scope import _UNSET, Fn, _a, _Scope
from gawee.errors import RuleError, RuleWarning, SourceSpan


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
    root_checks: tuple[str, ...] = ()
    """Builtins with a node check (``Builtin.node_check``) that the guard's conjunction applies to the root's
    value: the rewriter asks their checks of a node before matching there (false: the guard would be false)."""
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

    def names_op(self, op: str) -> bool:
        """Whether one of the rule's patterns matches a node of ``op`` (its root or one inside)."""
        return any(_names_op(m, op) for m in (self.matcher, *self.extra_roots))

    @property
    def root_output(self) -> int | None:
        """For a root that is one output of a multi-output op (`split(x, ...)[1]`), its index (negative counts
        from the end): only that output's uses are replaced. None for an op root."""
        return self.matcher.output

    @functools.cached_property
    def location(self) -> str:
        """``file:line`` of the rule (kept: a rule's name and span do not change once it is compiled)."""
        return f"{self.span.file}:{self.span.line}"

    @property
    def label(self) -> str:
        """The name, with the alternative when the rule has several: `layer_norm_written (2/3)`."""
        return self.name if self.variant[1] == 1 else f"{self.name} ({self.variant[0]}/{self.variant[1]})"

    @functools.cached_property
    def tag(self) -> str:
        """Provenance written on the nodes this rule makes (kept: every node a firing makes reads it)."""
        return f"{self.name} ({self.location})"


def _names_op(matcher, op: str) -> bool:
    if getattr(matcher, "op", None) == op:
        return True
    return any(_names_op(m, op) for m in getattr(matcher, "operands", ()) if m is not None)


@dataclass(frozen=True)
class Assumed:
    """One stated assumption of a rule: ``fact`` holds for every element of the value bound to ``var``."""

    fact: Assumption
    var: str
    text: str
    """As written, e.g. `finite(x)`."""


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
    root_checks: tuple[str, ...] = ()
    if rule.guard is not None:
        ec = _ExprCompiler(scope, "guard")
        guard, kind = ec.compile(rule.guard)
        if kind.base not in (K.Base.BOOL, K.Base.ANY):
            raise RuleError(f"a guard must be a boolean, this is {kind}", span=rule.guard.span)
        guard_parts = [(part.text, ec.compile(part)[0]) for part in A.chain_terms(rule.guard, "and")]
        root_checks = _root_checks(rule.guard, matcher, scope)
    assumptions = [_assumption(e, scope) for e in rule.assumes]

    constants = ConstCompiler(scope, constant_vars(rule.guard, scope), [b.value for b in rule.withs])
    ec = _ExprCompiler(scope, "replace", constants=constants)
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
        ctx.with_tensors = [_UNSET] * n_withs
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
        root_checks=root_checks,
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


def _root_checks(guard: A.Expr, matcher: OpM, scope) -> tuple[str, ...]:
    """The builtins with a node check that ``guard``'s top-level conjunction applies to the root's own value
    (`y: _(...) where foldable(y) and ...`), in order: each false at a node makes the guard false there."""
    if matcher.bind is None or matcher.output is not None:
        return ()
    found = []
    for part in A.chain_terms(guard, "and"):
        if (
            isinstance(part, A.ECall)
            and part.func not in scope.helpers  # a helper of that name stands for its own code
            and part.func in BUILTINS
            and BUILTINS[part.func].node_check is not None
            and len(part.args) == 1
            and not (part.args[0].keyword or part.args[0].rest)
            and isinstance(part.args[0].value, A.EName)
            and part.args[0].value.name == matcher.bind
        ):
            found.append(part.func)
    return tuple(found)


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
