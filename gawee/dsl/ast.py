"""The typed AST of the rule language; every node keeps its source span."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from gawee.errors import SourceSpan


@functools.lru_cache(maxsize=8)
def _lines(text: str) -> tuple[str, ...]:
    """A source text's lines, split once per text (every node of a file quotes the same text)."""
    return tuple(text.splitlines())


@dataclass
class Node:
    span: SourceSpan = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The source text this node was parsed from."""
        s = self.span
        if s.text is None or s.end_line is None:
            return ""
        lines = list(_lines(s.text)[s.line - 1 : s.end_line])
        if not lines:
            return ""
        if len(lines) == 1:
            return lines[0][s.col - 1 : s.end_col - 1]
        lines[0] = lines[0][s.col - 1 :]
        lines[-1] = lines[-1][: s.end_col - 1]
        return " ".join(x.strip() for x in lines)


# -- patterns (left-hand sides) -----------------------------------------------------
class Pattern(Node):
    pass


@dataclass
class PVar(Pattern):
    """A variable: binds the operand (or attribute) it meets; the same name twice = the same thing."""

    name: str


@dataclass
class PAny(Pattern):
    """`_`: matches anything, binds nothing."""


@dataclass
class PLit(Pattern):
    """A literal: a constant whose elements all equal it (operand), or an equal attribute value."""

    value: Any


@dataclass
class PList(Pattern):
    """A list pattern for list attributes, e.g. ``dims=[d]``."""

    items: list[Pattern]


@dataclass
class PArg(Node):
    """One argument of an op pattern: ``keyword`` is None for positional ones."""

    pattern: Pattern | None
    keyword: str | None = None
    rest: bool = False
    """`...` or `...name`: the remaining operands and attributes are free (and bound to keyword)."""


@dataclass
class POp(Pattern):
    """``op(args)``; ``op`` None is `_(...)`, any op."""

    op: str | None
    args: list[PArg]
    op_span: SourceSpan = field(repr=False, compare=False, default=None)  # type: ignore[assignment]


@dataclass
class PBind(Pattern):
    """``name: pattern`` binds the matched node's output to name."""

    name: str
    pattern: Pattern


@dataclass
class POutput(Pattern):
    """``split(x, ...)[i]``: output ``index`` of a node with several outputs."""

    pattern: POp
    index: int


@dataclass
class PAlt(Pattern):
    """``a | b``: either spelling; the rule is compiled once per combination of alternatives."""

    options: list[Pattern]


@dataclass
class PSingleUse(Pattern):
    """The left side of `|>` after desugaring: ``pattern`` whose value has exactly one use."""

    pattern: Pattern


@dataclass
class PPipe(Pattern):
    """``lhs |> call`` is ``call`` with lhs as its first operand, and lhs must have one use."""

    lhs: Pattern
    call: POp


# -- expressions (guards, replacements, `with` bindings) ------------------------------
class Expr(Node):
    pass


@dataclass
class EName(Expr):
    name: str


@dataclass
class ELit(Expr):
    value: Any
    """int, float, str, bool or None."""


@dataclass
class EList(Expr):
    items: list[Expr]


@dataclass
class ESet(Expr):
    items: list[Expr]


@dataclass
class EArg(Node):
    value: Expr | None
    keyword: str | None = None
    rest: str | None = None
    """`...name`: splice a bound rest-record (operands and attributes)."""


@dataclass
class ECall(Expr):
    func: str
    args: list[EArg]
    func_span: SourceSpan = field(repr=False, compare=False, default=None)  # type: ignore[assignment]


@dataclass
class EAttr(Expr):
    obj: Expr
    name: str


@dataclass
class EIndex(Expr):
    obj: Expr
    index: Expr


@dataclass
class EBin(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass
class ENeg(Expr):
    operand: Expr


@dataclass
class ENot(Expr):
    operand: Expr


@dataclass
class EBool(Expr):
    """`and` / `or` of two operands."""

    op: str
    left: Expr
    right: Expr


def chain_terms(e: Expr, op: str) -> list[Expr]:
    """The terms of a chain of ``op`` (`and` or `or`) rooted at ``e``, however nested, left to right (a guard's
    conjuncts: ``chain_terms(guard, "and")``)."""
    if isinstance(e, EBool) and e.op == op:
        return chain_terms(e.left, op) + chain_terms(e.right, op)
    return [e]


@dataclass
class ECompare(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass
class EIn(Expr):
    item: Expr
    choices: ESet
    negate: bool = False


# -- rules ---------------------------------------------------------------------------
@dataclass
class Binding(Node):
    name: str
    value: Expr


@dataclass
class RuleAST(Node):
    name: str
    options: dict[str, int]
    pattern: Pattern
    guard: Expr | None
    replacement: Expr
    withs: list[Binding]
    assumes: list[Expr] = field(default_factory=list)
    extra_roots: list[Pattern] = field(default_factory=list)
    """Roots after the first (`a: linear(x, ...), b: linear(x, ...)`): matched together, sharing variables."""
    extra_results: list[Expr] = field(default_factory=list)
    """What replaces each extra root, in order (`=> r0, r1`)."""
    """`assume finite(x), ...`: numeric facts about runtime values the rule relies on (not checked
    by the rewriter; stated, reported, and honoured by the soundness harness)."""
    name_span: SourceSpan = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    bound: Expr | None = None
    """`within expr`: the rule is approximate, and ``expr`` is its declared absolute error per element of
    each result (None: the rule is exact)."""
