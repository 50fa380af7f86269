"""Docstrings and comments in gawee/ describe the code, not the lab: no CPU models, timings, throughputs, dates or
commit hashes (they go stale the day the code or the machine changes). Figures worth keeping live in
benchmarks/README.md beside the command that measures them; history lives in git.

The scan reads comments (``tokenize``) and string statements (module, class, function and attribute docstrings)
of every ``gawee/**/*.py``, and the comments of every ``gawee/**/*.c``; code and messages are not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gawee"

CPU_MODELS = (
    r"Xeon|EPYC|Ryzen|Threadripper|Opteron|Athlon|Core ?i[3579]|Zen ?\d|Sapphire ?Rapids|Emerald ?Rapids|"
    r"Granite ?Rapids|Ice ?Lake|Cascade ?Lake|Cooper ?Lake|Sky ?lake|Kaby ?Lake|Coffee ?Lake|Alder ?Lake|"
    r"Raptor ?Lake|Meteor ?Lake|Haswell|Broadwell|Genoa|Milan|Rome|Bergamo|Graviton|Neoverse|Apple M\d"
)

PATTERNS = {
    "a CPU model": re.compile(rf"\b({CPU_MODELS})\b"),
    "a timing": re.compile(r"(?<![\w.])\d+(\.\d+)? ?(ms|µs|us|ns)\b"),
    "a throughput": re.compile(r"[GTM]FLOP/s|[GT]B/s\b", re.IGNORECASE),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a date": re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"),
}
"""What a docstring or comment must not hold, by name."""


def python_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and string statement of a Python file."""
    source = path.read_text(encoding="utf-8")
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found += [(node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return found


def c_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment of a C file (``/* ... */`` and ``// ...``)."""
    source = path.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(r"/\*.*?\*/|//[^\n]*", source, re.DOTALL):
        first = source.count("\n", 0, m.start()) + 1
        found += [(first + i, line) for i, line in enumerate(m.group().splitlines())]
    return found


def findings(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``file:line: what (match): text`` for each forbidden figure in the file's comments and docstrings."""
    text = python_text(path) if path.suffix == ".py" else c_text(path)
    return [
        f"{path.relative_to(root)}:{line}: {what} ({m.group()!r}): {snippet.strip()[:100]}"
        for line, snippet in text
        for what, pattern in PATTERNS.items()
        for m in [pattern.search(snippet)]
        if m
    ]


FILES = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c")])


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PACKAGE)) for p in FILES])
def test_docs_say_what_the_code_does(path):
    found = "\n".join(findings(path))
    assert not found, f"say why in words; a figure worth keeping goes to benchmarks/README.md:\n{found}"


@pytest.mark.parametrize(
    "text, what",
    [
        ("# faster on the AMD EPYC", "a CPU model"),
        ("# took 40 µs per call", "a timing"),
        ("# 1.9 TFLOP/s here", "a throughput"),
        ("# since 3c03586e", "a commit hash"),
        ("# measured 2025-06-01", "a date"),
    ],
)
def test_the_scan_finds_each_kind(tmp_path, text, what):
    file = tmp_path / "m.py"
    file.write_text(f'"""A module."""\n\nx = 1  {text}\n')
    assert [f.split(": ", 1)[1].split(" (")[0] for f in findings(file, tmp_path)] == [what]


def test_the_scan_leaves_code_and_plain_words_alone(tmp_path):
    (tmp_path / "m.c").write_text('/* one pass over the rows, 4x unrolled */\nconst char *s = "3 ms";\n')
    (tmp_path / "m.py").write_text(
        '"""Runs in 2 passes; the 1024-wide tiles."""\n\nLIMIT = "20 ms"  # a deadbeef word\n'
    )
    assert findings(tmp_path / "m.c", tmp_path) == []
    assert findings(tmp_path / "m.py", tmp_path) == []


def test_the_scan_reads_c_comments(tmp_path):
    (tmp_path / "m.c").write_text("int x; /* tiles of 8 */\n// took 1.2 ms here\n")
    assert [f.split(": ", 1)[0] for f in findings(tmp_path / "m.c", tmp_path)] == ["m.c:2"]
