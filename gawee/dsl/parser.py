"""Parse `.rules` text (grammar/rules.lark) into the AST, with file:line:col caret diagnostics."""

from __future__ import annotations

import functools
import math

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from gawee.dsl import ast as A
from gawee.errors import GaweeError, RuleError, RuleSyntaxError, SourceSpan
from gawee.resources import bundled_dir, missing_hint

GRAMMAR_PATH = bundled_dir("grammar") / "rules.lark"

MAX_NESTING = 100
"""How deeply one rule may nest calls, brackets and operators (``relu(relu(x))`` is 2 levels, a chain of 100 ``+``
is 100). Every later stage (the AST, the compiler, the matcher, the harness) walks a rule recursively; a bound
checked once, right after parsing, turns a file nested thousands deep into one located error instead of a
RecursionError. Hand-written rules nest about ten deep."""

_NOT_A_LEVEL = frozenset(
    {"start", "rule_def", "roots", "results", "options", "option", "guard", "assumes", "withs", "binding"}
    | {"error_bound"}
    | {"pos_pat", "kw_pat", "rest_pat", "pos_arg", "kw_arg", "rest_arg", "op_name", "any_op"}
    | {"var", "wildcard", "name", "number", "negnum", "string", "true", "false", "none"}
)
"""Parse-tree nodes that wrap a construct without nesting it (a rule's parts, an argument, an op's name) or hold
nothing nested (a name, a literal)."""

INT_LITERAL_MAX = 2**63 - 1
"""The largest integer a rule may write: i64's, the widest integer dtype. A literal beyond it could become a
constant of no dtype; it is refused where it is written. Float literals that round to inf or to 0 (``1e400``,
``1e-400``) are refused likewise: ``inf`` is spelled ``inf``."""

KEYWORDS = {
    "rule",
    "where",
    "assume",
    "with",
    "within",
    "and",
    "or",
    "not",
    "in",
    "true",
    "false",
    "none",
    "inf",
    "nan",
}


@functools.cache
def _parser() -> Lark:
    if not GRAMMAR_PATH.exists():
        raise GaweeError(f"the rule grammar is missing: {GRAMMAR_PATH}", hint=missing_hint())
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", propagate_positions=True, maybe_placeholders=False)


def parse_rules(text: str, file: str = "<string>") -> list[A.RuleAST]:
    """Parse a whole `.rules` text. Raises RuleSyntaxError at the offending character."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, file) from None
    _check_nesting(tree, text, file)
    try:
        return _ToAST(text, file).transform(tree)
    except VisitError as e:  # lark wraps errors raised inside the transformer
        if isinstance(e.orig_exc, GaweeError):
            raise e.orig_exc from None
        raise


def _check_nesting(tree: Tree, text: str, file: str) -> None:
    """Raise RuleSyntaxError at the first construct (in source order) nested deeper than MAX_NESTING. The walk
    keeps its own stack: the parser (LALR) builds any depth of tree without recursing, this walk neither."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if node.data not in _NOT_A_LEVEL:
            depth += 1
        if depth > MAX_NESTING:
            meta = node.meta
            span = SourceSpan(file, meta.line, meta.column, meta.line, meta.column + 1, text)
            raise RuleSyntaxError(
                f"nesting deeper than {MAX_NESTING} levels (calls, brackets and operators each count one)",
                span=span,
                hint="a rule this deep is not read: nest less, or name parts of a replacement with `with`",
            )
        stack.extend((c, depth) for c in reversed(node.children) if isinstance(c, Tree))


def _syntax_error(e: UnexpectedInput, text: str, file: str) -> RuleSyntaxError:
    line, col = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        lines = text.rstrip().splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        msg = "unexpected end of file"
    elif isinstance(e, UnexpectedCharacters):
        msg = f"unexpected character {text[e.pos_in_stream]!r}" if e.pos_in_stream < len(text) else "unexpected input"
    elif isinstance(e, UnexpectedToken):
        msg = f"unexpected {_describe_token(e.token)}"
    else:
        msg = "syntax error"
    expected = sorted({_describe_terminal(t) for t in (getattr(e, "expected", None) or ())} - {None})
    hint = None
    if expected:
        hint = "expected " + (", ".join(expected[:-1]) + " or " + expected[-1] if len(expected) > 1 else expected[0])
    if isinstance(e, UnexpectedToken) and e.token.type in ("RULE", "WHERE", "WITH") and "=>" in (hint or ""):
        hint = "a rule needs `=> replacement` after its pattern (and guard)"
    elif isinstance(e, UnexpectedToken) and e.token.type == "WITH" and expected == ["`rule`"]:
        hint = "the clauses go in this order: `=> replacement`, `with` bindings, `within` error bound"
    span = SourceSpan(file, line, col, line, col + max(1, len(str(getattr(e, "token", "") or "x"))), text)
    return RuleSyntaxError(msg, span=span, hint=hint)


_TERMINAL_TEXT = {
    "NAME": "a name",
    "INT": "a number",
    "FLOAT": "a number",
    "SIGNED_INT": "a number",
    "STRING": "a string",
    "INF": "`inf`",
    "NAN": "`nan`",
    "COMP_OP": "a comparison",
    "ADD_OP": "`+` or `-`",
    "MUL_OP": "`*`, `/`, `//` or `%`",
}


def _describe_terminal(name: str) -> str | None:
    if name in _TERMINAL_TEXT:
        return _TERMINAL_TEXT[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return None
    return f"`{pattern.value}`" if pattern.type == "str" else None


def _describe_token(tok: Token) -> str:
    if tok.type == "NAME":
        return f"name {tok.value!r}"
    return f"`{tok.value}`"


@v_args(meta=True)
class _ToAST(Transformer):
    """lark tree → AST, attaching a SourceSpan to every node."""

    def __init__(self, text: str, file: str):
        super().__init__()
        self.source = text
        self.file = file

    def _span(self, meta) -> SourceSpan:
        if getattr(meta, "empty", True):
            return SourceSpan(self.file, 1, 1, 1, 2, self.source)
        return SourceSpan(self.file, meta.line, meta.column, meta.end_line, meta.end_column, self.source)

    def _tok_span(self, tok: Token) -> SourceSpan:
        return SourceSpan(self.file, tok.line, tok.column, tok.end_line, tok.end_column, self.source)

    # -- rules ---------------------------------------------------------------------
    def start(self, meta, children):
        return list(children)

    def rule_def(self, meta, children):
        name_tok = children[0]
        rest = list(children[1:])
        options = rest.pop(0) if rest and isinstance(rest[0], dict) else {}
        _, roots = rest.pop(0)
        guard = rest.pop(0)[1] if rest and isinstance(rest[0], tuple) and rest[0][0] == "guard" else None
        assumes = rest.pop(0)[1] if rest and isinstance(rest[0], tuple) and rest[0][0] == "assume" else []
        _, results = rest.pop(0)
        withs = rest.pop(0) if rest and isinstance(rest[0], list) else []
        bound = rest.pop(0)[1] if rest else None
        return A.RuleAST(
            self._span(meta),
            str(name_tok),
            options,
            roots[0],
            guard,
            results[0],
            withs,
            assumes,
            extra_roots=roots[1:],
            extra_results=results[1:],
            name_span=self._tok_span(name_tok),
            bound=bound,
        )

    def roots(self, meta, children):
        return ("roots", [_as_pattern(c) for c in children])

    def results(self, meta, children):
        return ("results", list(children))

    def options(self, meta, children):
        return dict(children)

    def option(self, meta, children):
        return (str(children[0]), _int(str(children[1]), self._tok_span(children[1])))

    def guard(self, meta, children):
        return ("guard", children[0])

    def assumes(self, meta, children):
        return ("assume", list(children))

    def withs(self, meta, children):
        return list(children)

    def error_bound(self, meta, children):
        return ("within", children[0])

    def binding(self, meta, children):
        return A.Binding(self._span(meta), str(children[0]), children[1])

    # -- patterns ------------------------------------------------------------------
    def pipe(self, meta, children):
        return A.PPipe(self._span(meta), _as_pattern(children[0]), children[1])

    def alt(self, meta, children):
        left, right = _as_pattern(children[0]), _as_pattern(children[1])
        options = [*left.options] if isinstance(left, A.PAlt) else [left]
        return A.PAlt(self._span(meta), [*options, right])

    def pat_output(self, meta, children):
        return A.POutput(self._span(meta), children[0], _int(str(children[1]), self._tok_span(children[1])))

    def bound(self, meta, children):
        return A.PBind(self._span(meta), str(children[0]), _as_pattern(children[1]))

    def var(self, meta, children):
        return A.PVar(self._span(meta), str(children[0]))

    def wildcard(self, meta, children):
        return A.PAny(self._span(meta))

    def negnum(self, meta, children):
        return A.PLit(self._span(meta), -children[0].value)

    def pat_list(self, meta, children):
        return A.PList(self._span(meta), [_as_pattern(c) for c in children])

    def pat_call(self, meta, children):
        (op, op_span), *args = children
        return A.POp(self._span(meta), op, list(args), op_span=op_span)

    def op_name(self, meta, children):
        tok = children[0]
        return (str(tok), self._tok_span(tok))

    def any_op(self, meta, children):
        return (None, self._span(meta))

    def pos_pat(self, meta, children):
        return A.PArg(self._span(meta), _as_pattern(children[0]))

    def kw_pat(self, meta, children):
        return A.PArg(self._span(meta), _as_pattern(children[1]), keyword=str(children[0]))

    def rest_pat(self, meta, children):
        return A.PArg(self._span(meta), None, keyword=str(children[0]) if children else None, rest=True)

    def pos_arg(self, meta, children):
        return A.EArg(self._span(meta), children[0])

    def kw_arg(self, meta, children):
        return A.EArg(self._span(meta), children[1], keyword=str(children[0]))

    def rest_arg(self, meta, children):
        return A.EArg(self._span(meta), None, rest=str(children[0]))

    # -- expressions ---------------------------------------------------------------
    def or_(self, meta, children):
        return A.EBool(self._span(meta), "or", children[0], children[1])

    def and_(self, meta, children):
        return A.EBool(self._span(meta), "and", children[0], children[1])

    def not_(self, meta, children):
        return A.ENot(self._span(meta), children[0])

    def compare(self, meta, children):
        return A.ECompare(self._span(meta), str(children[1]), children[0], children[2])

    def in_(self, meta, children):
        return A.EIn(self._span(meta), children[0], children[1])

    def not_in(self, meta, children):
        return A.EIn(self._span(meta), children[0], children[1], negate=True)

    def binop(self, meta, children):
        return A.EBin(self._span(meta), str(children[1]), children[0], children[2])

    def neg(self, meta, children):
        x = children[0]
        if isinstance(x, A.ELit) and isinstance(x.value, (int, float)) and not isinstance(x.value, bool):
            return A.ELit(self._span(meta), -x.value)
        return A.ENeg(self._span(meta), x)

    def attr(self, meta, children):
        return A.EAttr(self._span(meta), children[0], str(children[1]))

    def index(self, meta, children):
        return A.EIndex(self._span(meta), children[0], children[1])

    def name(self, meta, children):
        return A.EName(self._span(meta), str(children[0]))

    def call(self, meta, children):
        func, *args = children
        return A.ECall(self._span(meta), str(func), list(args), func_span=self._tok_span(func))

    def list_lit(self, meta, children):
        return A.EList(self._span(meta), list(children))

    def set_lit(self, meta, children):
        return A.ESet(self._span(meta), list(children))

    # -- literals ------------------------------------------------------------------
    def number(self, meta, children):
        tok = children[0]
        text = str(tok)
        span = self._span(meta)
        is_float = any(c in text for c in ".eE") or "inf" in text or "nan" in text
        value = float(text) if is_float else _int(text, span)
        if text not in ("inf", "nan") and (
            math.isinf(value) or (value == 0 and any(c in "123456789" for c in text.lower().split("e")[0]))
        ):
            what = "overflows to inf" if math.isinf(value) else "underflows to 0"
            raise RuleError(
                f"the number {_clip(text)} {what} in every dtype (f64 included)",
                span=span,
                hint="write `inf` or `-inf`" if math.isinf(value) else "write 0 or 0.0",
            )
        return A.ELit(span, value)

    def string(self, meta, children):
        return A.ELit(self._span(meta), str(children[0])[1:-1])

    def true(self, meta, children):
        return A.ELit(self._span(meta), True)

    def false(self, meta, children):
        return A.ELit(self._span(meta), False)

    def none(self, meta, children):
        return A.ELit(self._span(meta), None)


def _int(text: str, span: SourceSpan) -> int:
    """An integer literal's value; RuleError beyond INT_LITERAL_MAX in magnitude (checked on the digits first:
    Python refuses to convert more than a few thousand of them)."""
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(INT_LITERAL_MAX)) or abs(int(text)) > INT_LITERAL_MAX:
        raise RuleError(
            f"the integer {_clip(text)} is beyond every integer dtype (i64 holds at most {INT_LITERAL_MAX})",
            span=span,
            hint="write a number that fits, or a float (1e30) if a float is meant",
        )
    return int(text)


def _clip(text: str, most: int = 40) -> str:
    """A literal's text as a message quotes it: its start and end when it is long."""
    return text if len(text) <= most else f"{text[:18]}...{text[-18:]}"


def _as_pattern(value):
    """A literal parsed as an expression, where a pattern is expected, becomes a pattern literal."""
    if isinstance(value, A.ELit):
        return A.PLit(value.span, value.value)
    return value
