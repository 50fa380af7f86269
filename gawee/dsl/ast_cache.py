"""Parsed rule files kept between processes: the AST of a `.rules` text as JSON, keyed by all it depends on.

Most of what loading a rule file costs is parsing it: building the LALR parser from
grammar/rules.lark, parsing, and turning the tree into the AST of gawee/dsl/ast.py. The AST is a
function of the file's text, the file name its spans carry, the grammar, gawee's version and the
code of the parser and the AST; :func:`parse_rules_cached` keeps it in
``$XDG_CACHE_HOME/gawee/rules/`` (``~/.cache/gawee/rules``) under a sha256 of all of those, so a
changed file, grammar or parser is a different entry and a stale one is never read. The checks of
gawee/dsl/compiler.py (ops, attributes, kinds, names) depend on the op registry and on helpers a caller
passes as well: a file that passed them is kept as such by gawee.dsl.check_cache, which is read
first; this cache serves a file checked again (another registry, helpers, a changed checker).
Reading an entry needs no parser: gawee.dsl.parser (and lark) is imported only to parse.

Trust: an entry is JSON, decoded into the AST's own dataclasses only (a class name outside
gawee.dsl.ast is an invalid entry); nothing in it is executed, so reading the cache runs no code.
It holds what gawee derived from rule text the user loaded, in a directory the user owns. An entry
that cannot be read or decoded (truncated, edited, from another layout) is ignored, parsed again and
written anew; a directory that cannot be written is no error (the AST is just not kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from gawee.dsl import ast as A
from gawee.errors import SourceSpan
from gawee.resources import VERSION, bundled_dir, cache_dir

FORMAT = 1
"""The layout of an entry; part of the key."""

_CLASSES: dict[str, type] = {
    name: cls
    for name, cls in vars(A).items()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, A.Node)
}


def directory() -> Path:
    """Where parsed rule files are kept: ``rules/`` in gawee's cache directory."""
    return cache_dir() / "rules"


@cache
def _code_digest() -> str:
    """What the AST depends on besides the text: the grammar, gawee's version and this code."""
    h = hashlib.sha256(f"{FORMAT}\n{VERSION}\n".encode())
    here = Path(__file__).resolve().parent  # the parser's module is not imported: lark is only needed to parse
    for path in (bundled_dir("grammar") / "rules.lark", here / "parser.py", Path(A.__file__), Path(__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()


def key(text: str, file: str) -> str:
    """The entry's name for ``text`` read from ``file``."""
    h = hashlib.sha256(_code_digest().encode())
    h.update(file.encode() + b"\0" + text.encode())
    return h.hexdigest()[:32]


def parse_rules_cached(text: str, file: str, where: Path | None = None) -> list[A.RuleAST]:
    """``parser.parse_rules(text, file)``, from the entry kept in ``where`` (default :func:`directory`)
    when there is a valid one, else parsed and kept. Raises what parse_rules raises."""
    path = (where or directory()) / f"{key(text, file)}.json"
    try:
        return from_json(json.loads(path.read_text(encoding="utf-8")), text)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # absent, unreadable or invalid: parse again and replace it
    from gawee.dsl import parser  # imported only to parse (it imports lark)

    asts = parser.parse_rules(text, file)
    from gawee.ir.serialize import _atomic_write

    with contextlib.suppress(OSError):
        _atomic_write(path, json.dumps(to_json(asts), allow_nan=True).encode())
    return asts


# -- encoding --------------------------------------------------------------------------
# Every JSON array is tagged by its first item: "@" a span (file, line, col, end line, end col), "[" a
# list, "(" a tuple, "{" a dict (key, value pairs), else the name of an AST class and its fields in order.
_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in dataclasses.fields(c)) for name, c in _CLASSES.items()
}


def to_json(asts: list[A.RuleAST]) -> dict:
    """An entry's document for these ASTs (their spans point into one source text, not stored)."""
    return {"format": FORMAT, "rules": [_encode(r) for r in asts]}


def from_json(doc: dict, text: str) -> list[A.RuleAST]:
    """The ASTs of an entry, their spans pointing into ``text``. Raises ValueError, KeyError or TypeError
    for a document that is not a valid entry."""
    if doc.get("format") != FORMAT:
        raise ValueError("another entry format")
    rules = [_decode(r, text) for r in doc["rules"]]
    if not all(isinstance(r, A.RuleAST) for r in rules):
        raise TypeError("not a list of rules")
    return rules


def _encode(v: Any) -> Any:
    if isinstance(v, SourceSpan):
        return ["@", v.file, v.line, v.col, v.end_line, v.end_col]
    if isinstance(v, A.Node):
        return [type(v).__name__, *(_encode(getattr(v, f)) for f in _FIELDS[type(v).__name__])]
    if isinstance(v, list):
        return ["[", *(_encode(x) for x in v)]
    if isinstance(v, tuple):
        return ["(", *(_encode(x) for x in v)]
    if isinstance(v, dict):
        return ["{", *([k, _encode(x)] for k, x in v.items())]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot keep {type(v).__name__} in a parsed-rules entry")


def _decode(v: Any, text: str) -> Any:
    if type(v) is not list:
        if isinstance(v, dict):
            raise TypeError("an object where an AST value belongs")
        return v
    tag = v[0]
    if tag == "@":
        return SourceSpan(*v[1:], text)
    if tag == "[":
        return [_decode(x, text) for x in v[1:]]
    if tag == "(":
        return tuple(_decode(x, text) for x in v[1:])
    if tag == "{":
        return {k: _decode(x, text) for k, x in v[1:]}
    names = _FIELDS[tag]
    if len(v) != len(names) + 1:
        raise ValueError(f"{tag} with {len(v) - 1} fields")
    return _CLASSES[tag](*(_decode(x, text) for x in v[1:]))
