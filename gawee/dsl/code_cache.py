"""Generated matcher source kept between processes, beside the parsed rule files of gawee.dsl.ast_cache.

What :func:`gawee.dsl.codegen.module_source` makes of a file's rules depends on the file's text and
name (the rules, their spans and comments), on the compiled patterns — which the compiler's code and the
op registry shape (operand names, attribute defaults, commutativity) — and on the generator's code. An
entry is named by a sha256 of all of them — the text and name, the registry as registered when the file
is loaded, the parser's, compiler's and generator's code and gawee's version — so a changed file, op or
generator is a different entry and a stale one is never read.

Trust: an entry is Python source, compiled and run when a rule is first tried, so the cache directory
must be the user's own (``$XDG_CACHE_HOME/gawee``, as for the parsed files). The source is what gawee
generated from rule text the user loaded; it is read as text and split per rule (never unpickled),
and an entry that does not split into the rules it was made for is ignored and written anew. Its
rules' code objects are kept beside it as Python keeps a module's bytecode in ``__pycache__``
(``marshal``, named by a sha256 of the source and the interpreter's bytecode magic), under the same
trust: marshal data is loaded as a ``.pyc`` is, so the directory must be the user's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import sys
import types
from functools import cache
from pathlib import Path

from gawee.dsl import ast_cache, codegen
from gawee.dsl.compiler import Rule
from gawee.ir.serialize import _atomic_write
from gawee.ops import all_ops
from gawee.resources import VERSION


@cache
def _compiler_digest() -> str:
    """The code that turns rule text into compiled patterns, besides the generator: the compiler (its patterns,
    expressions and scope) and the parsed-rules cache's digest (grammar, parser, AST)."""
    from gawee.dsl import compiler, expressions, kinds, patterns, scope

    h = hashlib.sha256(ast_cache._code_digest().encode())
    for module in (compiler, patterns, expressions, scope, kinds):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()


_registry: tuple[tuple, str] | None = None


def registry_digest() -> str:
    """What a compiled pattern takes from the op registry, for every op registered now: operand names and
    kinds, attributes and their defaults, traits (commutativity). Recomputed only when the registry holds
    other op objects than when it was last computed (an OpDef is frozen)."""
    global _registry
    ops = all_ops()
    stamp = tuple(ops.items())  # holds the ops, so an id below is never one reused by another object
    if (
        _registry is not None
        and len(_registry[0]) == len(stamp)
        and all(n == m and a is b for (n, a), (m, b) in zip(_registry[0], stamp))
    ):
        return _registry[1]
    h = hashlib.sha256()
    for name, op in sorted(ops.items()):
        operands = [(o.name, o.optional, o.variadic) for o in op.operands]
        attrs = [(a.name, a.kind, repr(a.default)) for a in op.attrs]
        h.update(repr((name, operands, attrs, sorted(op.traits))).encode())
    _registry = (stamp, h.hexdigest())
    return _registry[1]


def key(rules: list[Rule], text: str, file: str) -> str:
    """The entry's name for the generated source of ``rules``, compiled from ``text`` read from ``file``:
    a sha256 of the text and name, the registry, the compiler's and the generator's code and gawee's version."""
    parts = (VERSION, codegen.generator_digest(), _compiler_digest(), registry_digest(), str(len(rules)), file)
    h = hashlib.sha256("\n".join(parts).encode() + b"\0" + text.encode())
    return h.hexdigest()[:32]


def attach_cached(rules: list[Rule], text: str, file: str, where: Path | None = None) -> None:
    """``codegen.attach`` with the source of ``rules`` kept in ``where`` (default: gawee.dsl.ast_cache's
    directory): read when a valid entry is there, else generated and kept."""
    where = where or ast_cache.directory()
    path = where / f"{key(rules, text, file)}.py"
    try:
        source = path.read_text(encoding="utf-8")
        codegen.attach(rules, source)
    except (OSError, ValueError):  # absent, unreadable or not made for these rules: generate again and replace it
        source = codegen.module_source(rules)
        codegen.attach(rules, source)
        with contextlib.suppress(OSError):
            _atomic_write(path, source.encode())
    _attach_code_objects(rules, source, where)


def _attach_code_objects(rules: list[Rule], source: str, where: Path) -> None:
    """Give each rule with generated code its code object, as Python keeps a module's in ``__pycache__``: read
    from an entry named by a sha256 of ``source`` and this interpreter's bytecode magic, else compiled (all of
    them, once) and kept. An entry that does not hold one code object of the right name per rule is ignored."""
    names = [codegen.code_name(r) if r.code else None for r in rules]
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER + b"\0" + source.encode()).hexdigest()[:32]
    path = where / f"{digest}.{sys.implementation.cache_tag}.code"
    try:
        objects = marshal.loads(path.read_bytes())
        if not isinstance(objects, list) or len(objects) != len(rules):
            raise ValueError("not this source's code")
        for o, name in zip(objects, names):
            if not (o is None if name is None else isinstance(o, types.CodeType) and o.co_filename == name):
                raise ValueError("not this source's code")
    except (OSError, EOFError, ValueError, TypeError):
        objects = [None if name is None else compile(r.code, name, "exec") for r, name in zip(rules, names)]
        with contextlib.suppress(OSError, ValueError):
            _atomic_write(path, marshal.dumps(objects))
    for r, o in zip(rules, objects):
        r.code_object = o
