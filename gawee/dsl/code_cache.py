"""Generated matcher source kept between processes, beside the parsed rule files of gawee.dsl.ast_cache.

What :func:`gawee.dsl.codegen.module_source` makes of a file's rules depends on the file's text and
name (the rules, their spans and comments), on the compiled patterns (which the op registry shapes:
operand names, attribute defaults, commutativity) and on the generator's code. An entry is named by a
sha256 of all of them — the text and name, ``repr`` of every compiled pattern, the generator's digest
and gawee's version — so a changed file, op or generator is a different entry and a stale one is never
read.

Trust: an entry is Python source, compiled and run when a rule is first tried, so the cache directory
must be the user's own (``$XDG_CACHE_HOME/gawee``, as for the parsed files). The source is what gawee
generated from rule text the user loaded; it is read as text and split per rule (never unpickled),
and an entry that does not split into the rules it was made for is ignored and written anew.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from gawee.dsl import ast_cache, codegen
from gawee.dsl.compiler import Rule
from gawee.resources import VERSION


def key(rules: list[Rule], text: str, file: str) -> str:
    """The entry's name for the generated source of ``rules``, compiled from ``text`` read from ``file``."""
    h = hashlib.sha256(f"{VERSION}\n{codegen.generator_digest()}\n{file}\0{text}\0".encode())
    for r in rules:
        h.update(repr((r.label, r.location, r.comment, r.matcher, r.extra_roots)).encode())
    return h.hexdigest()[:32]


def attach_cached(rules: list[Rule], text: str, file: str, where: Path | None = None) -> None:
    """``codegen.attach`` with the source of ``rules`` kept in ``where`` (default: gawee.dsl.ast_cache's
    directory): read when a valid entry is there, else generated and kept."""
    path = (where or ast_cache.directory()) / f"{key(rules, text, file)}.py"
    try:
        codegen.attach(rules, path.read_text(encoding="utf-8"))
        return
    except (OSError, ValueError):
        pass  # absent, unreadable or not made for these rules: generate again and replace it
    source = codegen.module_source(rules)
    codegen.attach(rules, source)
    from gawee.ir.serialize import _atomic_write

    with contextlib.suppress(OSError):
        _atomic_write(path, source.encode())
