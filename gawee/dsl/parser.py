"""Parse `.rules` text (grammar/rules.lark) into the AST, with file:line:col caret diagnostics."""

from __future__ import annotations

import functools

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from gawee.dsl import ast as A
from gawee.errors import GaweeError, RuleSyntaxError, SourceSpan
from gawee.resources import bundled_dir, missing_hint

GRAMMAR_PATH = bundled_dir("grammar") / "rules.lark"

KEYWORDS = {"rule", "where", "assume", "with", "and", "or", "not", "in", "true", "false", "none", "inf", "nan"}


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
    try:
        return _ToAST(text, file).transform(tree)
    except VisitError as e:  # lark wraps errors raised inside the transformer
        if isinstance(e.orig_exc, GaweeError):
            raise e.orig_exc from None
        raise


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
        withs = rest.pop(0) if rest else []
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
        )

    def roots(self, meta, children):
        return ("roots", [_as_pattern(c) for c in children])

    def results(self, meta, children):
        return ("results", list(children))

    def options(self, meta, children):
        return dict(children)

    def option(self, meta, children):
        return (str(children[0]), int(children[1]))

    def guard(self, meta, children):
        return ("guard", children[0])

    def assumes(self, meta, children):
        return ("assume", list(children))

    def withs(self, meta, children):
        return list(children)

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
        return A.POutput(self._span(meta), children[0], int(children[1]))

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
        value = float(text) if any(c in text for c in ".eE") or "inf" in text or "nan" in text else int(text)
        return A.ELit(self._span(meta), value)

    def string(self, meta, children):
        return A.ELit(self._span(meta), str(children[0])[1:-1])

    def true(self, meta, children):
        return A.ELit(self._span(meta), True)

    def false(self, meta, children):
        return A.ELit(self._span(meta), False)

    def none(self, meta, children):
        return A.ELit(self._span(meta), None)


def _as_pattern(value):
    """A literal parsed as an expression, where a pattern is expected, becomes a pattern literal."""
    if isinstance(value, A.ELit):
        return A.PLit(value.span, value.value)
    return value
