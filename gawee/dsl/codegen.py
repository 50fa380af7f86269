"""Rules compiled to code: each rule's patterns as Python source specialized to them, compiled once.

gawee/dsl/matcher.py interprets a pattern tree on every attempt (a generator per pattern node, a
closure per step). Here the same tree (the ``OpM`` the compiler built, every load-time check done)
becomes the source of one generator function per root, in the manner of the Go compiler's rulegen
and tinygrad's compiled ``UPat``: straight-line checks on locals, a ``for`` over the two operand
orders of each commutative op, and the bindings written into ``env`` only where it yields.

Equivalence with the interpreter (``OpM.match``, which ``explain`` keeps using for its failure
reasons) holds by construction and is tested on every bundled rule and node of real models:

* every check the interpreter makes is made, and nothing else; checks are pure, so they may run in any
  order that respects what they read. They are scheduled cheapest first (operand producers' op names
  and arity, then attribute equality, then variable identity and single use, literals last), each
  as early as the commutative loops it depends on allow;
* the interpreter's backtracking is a chain of generators in which only commutative ops yield more
  than once; the generated loops nest in the same order, so matches come in the same order;
* at each yield ``env`` holds the same bindings and ``ctx.nodes`` the same nodes (pattern pre-order),
  and both are restored when the caller asks for the next match.

Every check carries a ``# file:line:col`` comment naming the pattern it comes from; the compiled code's
file name is the rule's location and its source is registered with :mod:`linecache`, so a traceback
through generated code shows the rule and the generated line.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    _int_data,
    canonical_equal,
    data_equal,
    literal_matches,
    rest_record,
)

if TYPE_CHECKING:
    from gawee.dsl.compiler import Rule

MatchFn = Callable[[Any, dict, Any], Iterator[None]]
"""A generated matcher: ``fn(value, env, ctx)`` yields once per match, as ``OpM.match(value, env, ctx, 0)``."""

# cost classes: lower runs first among the checks ready at one point
_STRUCTURE, _ARITY, _USES, _IDENTITY, _ATTR, _RECORD, _LITERAL = range(7)


@cache
def generator_digest() -> str:
    """A digest of the code that decides what source a pattern becomes (this module and the matcher)."""
    from gawee.dsl import matcher

    h = hashlib.sha256()
    for path in (Path(__file__), Path(matcher.__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class _Step:
    """One statement of the generated matcher before scheduling."""

    kind: str
    """"check" (``code`` is the failure condition), "assign" (a statement) or "loop" (a ``for`` header)."""
    code: str
    reads: frozenset[str]
    defines: frozenset[str]
    cost: int
    where: str = ""


@dataclass
class _Root:
    """The generator of one root's matcher: steps in the interpreter's order, then scheduled."""

    prebound: frozenset[str]
    """Names bound by earlier roots: read from ``env``, compared, never bound again."""
    steps: list[_Step] = field(default_factory=list)
    bound: dict[str, str] = field(default_factory=dict)
    """Pattern name -> the local holding it (names first bound by this root)."""
    binds: list[tuple[str, str]] = field(default_factory=list)
    """(name, expression) written into ``env`` at the yield, in the interpreter's binding order."""
    nodes: list[str] = field(default_factory=list)
    """Locals of the matched nodes, in pattern pre-order (``ctx.nodes``)."""
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, value: Any) -> str:
        return literal_source(value)

    def add(self, kind: str, code: str, reads, defines=(), cost: int = _STRUCTURE, where: str = "") -> None:
        self.steps.append(_Step(kind, code, frozenset(reads), frozenset(defines), cost, where))

    # -- values --------------------------------------------------------------------------
    def value(self, m: ValueMatcher, v: str, where: str) -> None:
        """Steps matching the Value in local ``v`` (defined once its token ``v`` is) against ``m``."""
        if m.single_use:
            self.add("check", f"{v} is None or {v}.num_uses != 1", [v], cost=_USES, where=where)
        if isinstance(m, VarM):
            self.name(m.name, v, [v], where, attr=False)
        elif isinstance(m, AnyM):
            pass
        elif isinstance(m, LitM):
            if m.value is None:
                self.add("check", f"{v} is not None", [v], where=where)
            else:
                self.add("check", f"not _literal({v}, {self.const(m.value)})", [v], cost=_LITERAL, where=where)
        elif isinstance(m, OpM):
            self.op(m, v)
        else:  # pragma: no cover - the compiler makes no other matcher
            raise TypeError(f"no code for {type(m).__name__}")

    def name(self, name: str, expr: str, reads: list[str], where: str, attr: bool) -> None:
        """A pattern variable meeting ``expr``: bound at its first occurrence, compared at later ones."""
        same = "_data_equal({a}, {b})" if attr else "{a} is {b}"
        if name in self.bound:
            other = self.bound[name]
            self.add("check", f"not ({same.format(a=expr, b=other)})", [*reads, other], cost=_IDENTITY, where=where)
        elif name in self.prebound:
            self.add("check", f"not ({same.format(a=expr, b=f'env[{name!r}]')})", reads, cost=_IDENTITY, where=where)
        else:
            local = expr if expr.isidentifier() else self.fresh("b")
            if local != expr:
                self.add("assign", f"{local} = {expr}", reads, [local], cost=_ATTR, where=where)
            self.bound[name] = local
            self.binds.append((name, local))

    def op(self, m: OpM, v: str) -> None:
        where = _where(m)
        n, ins = self.fresh("n"), self.fresh("i")
        ok, arity = f"ok_{n}", f"ar_{n}"
        what = f"{n} is None" if m.op is None else f"{n} is None or {n}.op != {m.op!r}"
        self.add("check", f"{v} is None", [v], [f"nn_{v}"], where=where)
        self.add("assign", f"{n} = {v}.producer", [v, f"nn_{v}"], [n], where=where)
        self.add("check", what, [n], [ok], where=where)
        if m.output is not None:
            k = m.output
            self.add(
                "check",
                f"not -len({n}.outputs) <= {k} < len({n}.outputs) or {n}.outputs[{k}] is not {v}",
                [ok, v],
                where=where,
            )
        elif not m.any_outputs:
            self.add("check", f"len({n}.outputs) != 1", [ok], where=where)
        for k, want in m.defaults.items():
            self.add("check", f"not {_attr_equal(f'{n}.attrs.get({k!r})', want, self)}", [ok], cost=_ATTR, where=where)
        self.nodes.append(n)
        self.add("assign", f"{ins} = {n}.inputs", [ok], [ins], where=where)
        count = len(m.operands)
        arity_checks = []
        if m.variadic_from is not None and m.rest is False:
            arity_checks.append(f"len({ins}) != {count}")
        arity_checks.append(f"len({ins}) < {count}")
        if m.rest is False:
            fixed = str(m.variadic_from) if m.variadic_from is not None else f"len({ins})"
            tail = f"any(x is not None for x in {ins}[{count}:{fixed}])"
            arity_checks.append(f"({tail})" if m.variadic_from is not None else f"(len({ins}) > {count} and {tail})")
            last = count if m.variadic_from is None else min(count, m.variadic_from)
            free = [i for i in range(last) if m.operands[i] is None]
            arity_checks += [f"{ins}[{i}] is not None" for i in free]
        self.add("check", " or ".join(arity_checks), [ins], [arity], cost=_ARITY, where=where)
        slots = [None] * count
        if m.commutative and count >= 2:
            a, b = self.fresh("v"), self.fresh("v")
            self.add(
                "loop",
                f"for {a}, {b} in (({ins}[0], {ins}[1]), ({ins}[1], {ins}[0])):",
                [ins, arity],
                [a, b],
                where=where + " (both operand orders)",
            )
            slots[0], slots[1] = a, b
        for i, sub in enumerate(m.operands):
            if sub is None:
                continue
            if slots[i] is None:
                slots[i] = self.fresh("v")
                self.add("assign", f"{slots[i]} = {ins}[{i}]", [ins, arity], [slots[i]], where=where)
            self.value(sub, slots[i], _where(sub) or where)
        for name, am in m.attrs.items():
            self.attr(am, f"{n}.attrs.get({name!r})", name, n, [ok], where)
        if isinstance(m.rest, str):
            free = tuple(i for i, s in enumerate(m.operands) if s is None)
            record = (
                f"_rest_record({n}, {tuple(m.operand_names)!r}, {count}, {free!r}, {tuple(m.attrs)!r}, "
                f"{m.variadic_from!r})"
            )
            self.rest(m.rest, record, [ok], where)
        if m.bind is not None:
            self.name(m.bind, v, [v], where, attr=False)

    def rest(self, name: str, expr: str, reads: list[str], where: str) -> None:
        """`...name`: the record of what the pattern did not mention, compared with ``==`` when bound twice."""
        if name in self.bound or name in self.prebound:
            other = self.bound.get(name) or f"env[{name!r}]"
            extra = [other] if name in self.bound else []
            self.add("check", f"{expr} != {other}", [*reads, *extra], cost=_RECORD, where=where)
            return
        self.bound[name] = expr  # made where the rule yields: only a match pays for it
        self.binds.append((name, expr))

    # -- attributes ----------------------------------------------------------------------
    def attr(self, am: AttrMatcher, expr: str, name: str, node: str, reads: list[str], where: str) -> None:
        if isinstance(am, AttrAny):
            return
        if isinstance(am, AttrVar):
            self.name(am.var, expr, reads, where, attr=True)
        elif isinstance(am, AttrLit):
            self.add("check", f"not {_literal_attr(expr, am.value, name, node, self)}", reads, cost=_ATTR, where=where)
        elif isinstance(am, AttrList):
            self.attr_list(am, expr, name, node, reads, where)
        else:  # pragma: no cover
            raise TypeError(f"no code for {type(am).__name__}")

    def attr_list(self, am: AttrList, expr: str, name: str, node: str, reads: list[str], where: str) -> None:
        items = am.items
        if all(isinstance(x, AttrLit) for x in items):  # AttrList.match's first branch
            literal = self.const([x.value for x in items])
            check = f"not (_data_equal({expr}, {literal}) or _canonical_equal({literal}, {expr}, {name!r}, {node}))"
            self.add("check", check, reads, cost=_ATTR, where=where)
            return
        local = self.fresh("a")
        self.add("assign", f"{local} = {expr}", reads, [local], cost=_ATTR, where=where)
        shape, token = f"not isinstance({local}, tuple) or len({local}) != {len(items)}", f"ok_{local}"
        self.add("check", shape, [local], [token], cost=_ATTR, where=where)
        for i, item in enumerate(items):
            self.attr(item, f"{local}[{i}]", name, node, [local, token], where)


def _where(m: Any) -> str:
    span = getattr(m, "span", None)
    return "" if span is None else one_line(f"{span.file}:{span.line}:{span.col}")


def one_line(text: str) -> str:
    """``text`` fit for a ``#`` comment: whatever Python would read as a line break (a file name may hold
    one) becomes a space, so nothing from a rule file or its name reaches the generated code but as a
    comment or a string literal (``repr``)."""
    return " ".join(text.splitlines()).replace("\r", " ").replace("\n", " ")


def _attr_equal(expr: str, want: Any, root: _Root) -> str:
    """``data_equal(expr, want)`` as source, specialized where a plain comparison decides it the same way."""
    if want is None:
        return f"({expr} is None)"
    if type(want) is str:
        return f"({expr} == {want!r})"
    return f"_data_equal({expr}, {root.const(want)})"


def _literal_attr(expr: str, value: Any, name: str, node: str, root: _Root) -> str:
    """``AttrLit.match``'s test: equal data, or (integer data only) the node's canonical form of the literal."""
    plain = _attr_equal(expr, value, root)
    if not _int_data(value):
        return plain  # canonical_equal is False for anything but integer data
    return f"({plain} or _canonical_equal({root.const(value)}, {expr}, {name!r}, {node}))"


# -- scheduling and emitting ------------------------------------------------------------
def _schedule(root: _Root, entry: str) -> list[tuple[int, _Step]]:
    """Steps in emission order with their loop depth: among the steps whose inputs are ready, the cheapest
    first (file order among equals); a loop only when nothing else is ready."""
    defined = {entry}
    pending = list(enumerate(root.steps))
    out: list[tuple[int, _Step]] = []
    depth = 0
    while pending:
        ready = [(i, s) for i, s in pending if s.reads <= defined]
        plain = [(s.cost, i, s) for i, s in ready if s.kind != "loop"]
        if plain:
            _, i, step = min(plain, key=lambda t: (t[0], t[1]))
        elif ready:
            i, step = ready[0]
        else:  # pragma: no cover - every read is defined by an earlier step
            raise AssertionError(f"unschedulable steps: {[s.code for _, s in pending]}")
        pending.remove((i, step))
        defined |= step.defines
        out.append((depth, step))
        if step.kind == "loop":
            depth += 1
    return out


def _emit(root: _Root, fn_name: str, header: list[str]) -> str:
    entry = "v0"
    scheduled = _schedule(root, entry)
    lines = [f"def {fn_name}(v0, env, ctx):", *(f"    # {h}" for h in header)]
    last_where: dict[int, str] = {}
    for depth, step in scheduled:
        pad = "    " * (depth + 1)
        fail = "continue" if depth else "return"
        if step.where and last_where.get(depth) != step.where:
            lines.append(f"{pad}# {step.where}")
            last_where[depth] = step.where
        if step.kind == "check":
            lines.append(f"{pad}if {step.code}:")
            lines.append(f"{pad}    {fail}")
        else:
            lines.append(pad + step.code)
            if step.kind == "loop":
                last_where[depth + 1] = step.where
    pad = "    " * (1 + sum(step.kind == "loop" for _, step in scheduled))
    lines += [f"{pad}env[{name!r}] = {expr}" for name, expr in root.binds]
    nodes = root.nodes
    lines.append(f"{pad}ctx.nodes.extend(({', '.join(nodes)},))")
    lines.append(f"{pad}yield")
    lines += [f"{pad}del env[{name!r}]" for name, _ in reversed(root.binds)]
    lines.append(f"{pad}del ctx.nodes[-{len(nodes)}:]")
    return "\n".join(lines) + "\n"


def _rule_roots(rule: Rule) -> list[OpM]:
    return [rule.matcher, *rule.extra_roots]


def rule_source(rule: Rule, prefix: str) -> list[tuple[str, str]]:
    """The source of each root's matcher of ``rule``: (function name, source). Raises NoCode for a
    pattern holding a literal that has no source form."""
    out = []
    prebound: set[str] = set()
    for k, m in enumerate(_rule_roots(rule)):
        root = _Root(frozenset(prebound))
        root.op(m, "v0")
        fn = f"{prefix}_{k}"
        header = [one_line(f"{rule.location}  rule {rule.label}") + (f", root {k + 1}" if rule.extra_roots else "")]
        if rule.comment and k == 0:
            header.append(one_line(rule.comment))
        out.append((fn, _emit(root, fn, header)))
        prebound |= {name for name, _ in root.binds}
    return out


class NoCode(Exception):
    """A pattern the generator has no code for (its rule keeps the interpreted matcher)."""


def literal_source(value: Any) -> str:
    """Source that evaluates to ``value`` (plain attribute data: None, bool, int, float, str, lists and
    tuples of them). Raises NoCode for anything else."""
    if value is None or type(value) in (bool, int, str):
        return repr(value)
    if type(value) is float:
        if math.isnan(value):
            return "_nan"
        if math.isinf(value):
            return "_inf" if value > 0 else "-_inf"
        return repr(value)
    if type(value) in (list, tuple):
        items = ", ".join(literal_source(x) for x in value)
        return f"[{items}]" if type(value) is list else f"({items}{',' if len(value) == 1 else ''})"
    raise NoCode(f"no source form for the literal {value!r}")


_GLOBALS = {
    "_data_equal": data_equal,
    "_canonical_equal": canonical_equal,
    "_literal": literal_matches,
    "_rest_record": rest_record,
    "_inf": math.inf,
    "_nan": math.nan,
}


_MARK = "# -- rule "
_FUNCTION = re.compile(r"_r\d+_\d+")


def module_source(rules: list[Rule]) -> str:
    """One module's source holding the matchers of ``rules``: after a ``# -- rule i`` line, rule i's functions
    (``_r{i}_{k}``: its root k) or, for a rule the generator has no code for, a comment saying why."""
    parts = ['"""Matchers generated by gawee.dsl.codegen from the rules named in each function."""\n']
    for i, rule in enumerate(rules):
        parts.append(f"{_MARK}{i}: {one_line(f'{rule.label} ({rule.location})')}\n")
        try:
            parts += [src for _, src in rule_source(rule, f"_r{i}")]
        except NoCode as e:
            parts.append(f"# stays interpreted: {one_line(str(e))}\n")
    return "\n\n".join(parts)


def attach(rules: list[Rule], source: str) -> None:
    """Give each of ``rules`` its part of ``source`` (what :func:`module_source` made of the same rules, e.g.
    read from the cache) as ``rule.code`` ("": no generated code); each is compiled on first use. Raises
    ValueError when ``source`` was not made for these rules."""
    chunks = source.split("\n" + _MARK)[1:]
    if len(chunks) != len(rules):
        raise ValueError(f"generated source for {len(chunks)} rules, not {len(rules)}")
    for i, (rule, chunk) in enumerate(zip(rules, chunks)):
        head, _, body = chunk.partition("\n")
        if not head.startswith(f"{i}: "):
            raise ValueError(f"generated source out of order at rule {i}")
        rule.code = body.strip() + "\n" if f"def _r{i}_0(" in body else ""
        rule.match_fns = None
        rule.code_object = None


def code_name(rule: Rule) -> str:
    """The file name a rule's generated code is compiled under (tracebacks name the rule by it)."""
    return f"{rule.location} ({rule.label}, generated)"


def match_functions(rule: Rule) -> list[MatchFn]:
    """The rule's generated matchers, one per root (``[]``: it has no generated code), compiled on first use
    (its code generated then too, for a rule no rule set attached code to)."""
    if rule.match_fns is not None:
        return rule.match_fns
    if rule.code is None:
        attach([rule], module_source([rule]))
    if not rule.code:
        rule.match_fns = []
        return rule.match_fns
    name = code_name(rule)
    code = rule.code_object if rule.code_object is not None else compile(rule.code, name, "exec")
    linecache.cache[name] = (len(rule.code), None, rule.code.splitlines(True), name)
    namespace: dict[str, Any] = {**_GLOBALS, "__name__": "gawee.rules.generated"}
    exec(code, namespace)  # gawee's own generated source (the trust model: docs/rules.md)
    fns = [v for k, v in namespace.items() if _FUNCTION.fullmatch(k)]
    rule.match_fns = fns
    return fns
