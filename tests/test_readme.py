"""The README's command examples are real: each documented `gawee-rewrite` run prints what the README shows.

Every fenced block of README.md that starts with ``$ gawee-rewrite ...`` (and the
``make demo`` block, which runs ``gawee-rewrite optimize resnet18``) is run through the
CLI from the repository root; the block's lines must appear in the output, in order.
``...`` in a block stands for lines left out; timings and runs of spaces are normalized.
"""

import re
import shlex
from pathlib import Path

import pytest

from gawee.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO_INTRO = "`make demo` runs `gawee-rewrite optimize resnet18` and prints:"


def documented_runs() -> list[tuple[str, list[str]]]:
    """(command, expected lines) for each command block of the README."""
    text = (ROOT / "README.md").read_text()
    runs = []
    for m in re.finditer(r"(?P<before>[^\n]*)\n\n```\n(?P<body>.*?)```", text, re.S):
        lines = m["body"].rstrip("\n").split("\n")
        if lines[0].startswith("$ gawee-rewrite "):
            runs.append((lines[0][2:], lines[1:]))
        elif m["before"] == DEMO_INTRO:
            runs.append(("gawee-rewrite optimize resnet18", lines))
    return runs


def normalize(line: str) -> str:
    line = re.sub(r"\d+(\.\d+)? (ms|s)\b", "<time>", line)  # timings vary by machine
    return " ".join(line.split())


RUNS = documented_runs()


def test_the_readme_documents_commands():
    commands = [c for c, _ in RUNS]
    assert "gawee-rewrite optimize resnet18" in commands
    assert any(c.startswith("gawee-rewrite check") for c in commands)
    assert any("--trace" in c for c in commands)


@pytest.mark.parametrize("command, expected", RUNS, ids=[c for c, _ in RUNS])
def test_documented_output_matches(command, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(shlex.split(command)[1:])
    out = capsys.readouterr().out
    assert code == (1 if "UNSOUND" in "\n".join(expected) else 0), out
    got = [normalize(line) for line in out.splitlines()]
    at = 0
    for line in (normalize(e) for e in expected if e.strip() != "..."):
        try:
            at = got.index(line, at) + 1
        except ValueError:
            pytest.fail(f"README line not printed (in order) by `{command}`:\n  {line}\n\noutput:\n{out}")
