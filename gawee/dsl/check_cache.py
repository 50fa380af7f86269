"""Checked rule files kept between processes: a file that passed its checks is not checked again, and each
of its rules is compiled the first time the rewriter needs more of it than its root.

Loading a `.rules` file parses it and compiles every rule (gawee/dsl/compiler.py): the checks (ops,
attributes, arity, names, kinds) and the building of the matcher tree, guard and replacement closures run
together, and both are functions of the file's text and name, gawee's version, the code of the grammar, the
parser, the checker and its builtin library, the bundled ops, and the op registry as registered when the file
is loaded. When a file passes, :func:`store` keeps an entry in ``$XDG_CACHE_HOME/gawee/rules/`` named by a
sha256 of all of those: per rule its name and span, its parsed form (still encoded, as gawee.dsl.ast_cache
encodes it), the comment above it, and per variant (`a | b` alternatives) what the rewriter reads before the
rule first matches — root op, priority, whole-node replacement, root output, error bound text, the node checks
it asks before matching — and its load-time warnings.

:func:`load` with the same key gives :class:`LazyRule` objects carrying those, and nothing else is done at
load: the first access to anything more (the matcher tree, guard, replacement, assumptions, bound, AST)
decodes the rule's AST and compiles it, once for all its variants. A file that fails its checks leaves no
entry, so it is checked, and rejected, on every load; any change to what the checks depend on is another
key, so a stale entry is never read. Files loaded with helpers are never kept: a helper is Python whose
kinds the key cannot name.

Trust: an entry is JSON, decoded into plain values and the AST's own dataclasses (gawee.dsl.ast_cache's
decoder); nothing in it is executed. An entry that cannot be read or decoded is ignored: the file is
checked again and the entry written anew; a directory that cannot be written is no error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from gawee.dsl import ast as A
from gawee.dsl import ast_cache, code_cache
from gawee.dsl.compiler import Rule, compile_rule
from gawee.dsl.library import BUILTINS
from gawee.errors import RuleWarning, SourceSpan
from gawee.ops import ACTIVATIONS
from gawee.resources import VERSION

FORMAT = 2
"""The layout of an entry; part of the key."""

_HERE = Path(__file__).resolve().parent


@cache
def _code_digest() -> str:
    """The code the checks run: the parsed-rules cache's digest (grammar, parser, AST), every module of
    gawee/dsl/ (checker, kinds, builtin library, matcher), the bundled ops, errors and IR types."""
    h = hashlib.sha256(f"{FORMAT}\n{VERSION}\n{ast_cache._code_digest()}\n".encode())
    root = _HERE.parent
    files = [
        *sorted(_HERE.glob("*.py")),
        *sorted((root / "ops").glob("*.py")),
        root / "errors.py",
        root / "ir" / "types.py",
        root / "ir" / "symbolic.py",
    ]
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def registry_digest() -> str:
    """What the checks read from the op registry, for every op registered now: operand names, attributes and
    their defaults, traits (gawee.dsl.code_cache's digest), and the fusable activations."""
    h = hashlib.sha256(code_cache.registry_digest().encode())
    h.update(repr(sorted(ACTIVATIONS.items())).encode())
    return h.hexdigest()


def directory() -> Path:
    """Where entries are kept: beside the parsed rule files (gawee.dsl.ast_cache)."""
    return ast_cache.directory()


def key(text: str, file: str) -> str:
    """The entry's name for ``text`` read from ``file``, checked by this code against the registry now."""
    h = hashlib.sha256(f"checked\n{_code_digest()}\n{registry_digest()}\n{file}".encode())
    h.update(b"\0" + text.encode())
    return h.hexdigest()[:32]


# -- rules compiled on first use ---------------------------------------------------------------
_DEFERRED = ("matcher", "guard", "guard_parts", "build", "extra_roots", "extra_builds", "assumptions", "bound", "ast")
"""The fields of a Rule a LazyRule compiles on first access; the others are read from the entry."""


class _Source:
    """One rule of a checked file as the entry keeps it: its encoded AST and the LazyRules of its variants."""

    __slots__ = ("comment", "encoded", "rules", "text")

    def __init__(self, encoded: str, text: str, comment: str):
        self.encoded = encoded
        self.text = text
        self.comment = comment
        self.rules: list[LazyRule] = []

    def compile(self) -> None:
        """Decode the AST and compile it, giving every variant the fields it has not been given yet."""
        (ast,) = ast_cache.from_json({"format": ast_cache.FORMAT, "rules": [json.loads(self.encoded)]}, self.text)
        compiled = compile_rule(ast, {}, comment=self.comment)
        if len(compiled) != len(self.rules):  # the key names everything compiling depends on: not expected
            raise RuntimeError(f"{ast.span}: {ast.name!r} compiled to {len(compiled)} variants, kept {len(self.rules)}")
        for lazy, rule in zip(self.rules, compiled):
            for name in _DEFERRED:
                lazy.__dict__.setdefault(name, getattr(rule, name))
            lazy.__class__ = _CompiledLazyRule  # its fields now plain attributes: no property call per read


def _deferred(name: str) -> property:
    def get(self: LazyRule) -> Any:
        d = self.__dict__
        if name not in d:
            self._source.compile()
        return d[name]

    def put(self: LazyRule, value: Any) -> None:
        self.__dict__[name] = value

    return property(get, put, doc=f"The rule's {name}, compiled on first access.")


class LazyRule(Rule):
    """A Rule of a checked file read from its entry: name, span, root op, priority, variant, warnings, comment
    and the root's output are there from the start; the matcher tree, guard, replacement, assumptions, bound and
    AST are compiled the first time any of them is read (the rewriter reads them once a rule's generated matcher
    has matched). Behaves as the Rule the file's compilation gives in every other respect."""

    matcher = _deferred("matcher")
    guard = _deferred("guard")
    guard_parts = _deferred("guard_parts")
    build = _deferred("build")
    extra_roots = _deferred("extra_roots")
    extra_builds = _deferred("extra_builds")
    assumptions = _deferred("assumptions")
    bound = _deferred("bound")
    ast = _deferred("ast")

    @property
    def approximate(self) -> bool:
        return self._approximate

    @property
    def root_output(self) -> int | None:
        return self._root_output

    @property
    def compiled(self) -> bool:
        """Whether the deferred fields have been compiled."""
        return "matcher" in self.__dict__

    def names_op(self, op: str) -> bool:
        """:meth:`Rule.names_op`, without compiling a rule whose kept AST does not even spell ``op``."""
        if not self.compiled and f'"{op}"' not in self._source.encoded:
            return False
        return super().names_op(op)


class _CompiledLazyRule(LazyRule):
    """A LazyRule once compiled: the deferred fields are read from the instance (the rewriter reads them on every
    match), as a class attribute each name only stands for the instance's own value."""

    matcher = guard = guard_parts = build = extra_roots = extra_builds = assumptions = bound = ast = None


# -- entries -------------------------------------------------------------------------------------
def _span(s: SourceSpan | None) -> list | None:
    return None if s is None else [s.file, s.line, s.col, s.end_line, s.end_col]


def store(groups: list[tuple[A.RuleAST, str, list[Rule]]], text: str, file: str, where: Path | None = None) -> None:
    """Keep the entry of a file whose every rule compiled: per rule its AST, the comment above it and its variants
    (in order), as compiled from ``text`` read from ``file``."""
    rules = []
    for ast, comment, variants in groups:
        kept = [
            [
                r.root_op,
                r.whole_node,
                r.priority,
                r.root_output,
                r.approximate,
                r.bound_text,
                list(r.variant),
                [[w.message, _span(w.span), w.hint, w.where] for w in r.warnings],
                list(r.root_checks),
            ]
            for r in variants
        ]
        encoded = json.dumps(ast_cache.to_json([ast])["rules"][0], allow_nan=True)
        rules.append([ast.name, _span(ast.span), encoded, comment, kept])
    doc = {"format": FORMAT, "file": file, "rules": rules}
    from gawee.ir.serialize import _atomic_write

    with contextlib.suppress(OSError, TypeError, ValueError):
        _atomic_write((where or directory()) / f"{key(text, file)}.checked.json", json.dumps(doc).encode())


def load(text: str, file: str, where: Path | None = None) -> list[LazyRule] | None:
    """The rules of ``text`` read from ``file`` as its entry keeps them (every variant in file order), or None
    when there is no valid entry (the file is then to be loaded, checked and stored)."""
    path = (where or directory()) / f"{key(text, file)}.checked.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT or doc.get("file") != file:
            return None
        return [r for item in doc["rules"] for r in _rules(item, text)]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None  # absent, unreadable or invalid: check the file again


def _rules(item: list, text: str) -> list[LazyRule]:
    name, span, encoded, comment, variants = item
    if not (isinstance(name, str) and isinstance(encoded, str) and isinstance(comment, str) and variants):
        raise TypeError("not a rule")
    span = SourceSpan(*span, text)
    source = _Source(encoded, text, comment)
    for root_op, whole_node, priority, root_output, approximate, bound_text, variant, warnings, checks in variants:
        if not all(isinstance(c, str) and c in BUILTINS and BUILTINS[c].node_check for c in checks):
            raise TypeError("not a node check")
        r = object.__new__(LazyRule)
        r.__dict__.update(
            name=name,
            span=span,  # shared by the variants, as compiled ones share their AST's
            root_op=root_op,
            whole_node=whole_node,
            priority=int(priority),
            comment=comment,
            index=0,
            phase="",
            variant=(int(variant[0]), int(variant[1])),
            warnings=[
                RuleWarning(m, span=None if s is None else SourceSpan(*s, text), hint=h, where=w)
                for m, s, h, w in warnings
            ],
            match_fns=None,
            code=None,
            bound_text=bound_text,
            root_checks=tuple(checks),
            _approximate=bool(approximate),
            _root_output=root_output,
            _source=source,
        )
        source.rules.append(r)
    return source.rules
