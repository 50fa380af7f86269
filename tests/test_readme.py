"""The README's command examples are real: each documented `gawee-rewrite` run prints what the README shows.

Every fenced block of README.md that starts with ``$ gawee-rewrite ...`` (and the
``make demo`` block, which runs ``gawee-rewrite optimize resnet18 --bench``) is run through the
CLI from the repository root; the block's lines must appear in the output, in order.
``...`` in a block stands for lines left out; timings, computed floating-point values (their last digits
depend on the CPU) and runs of spaces are normalized.
"""

import re
import shlex
from pathlib import Path

import pytest

from gawee.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO_INTRO = "`make demo` runs `gawee-rewrite optimize resnet18 --bench` and prints:"


def documented_runs() -> list[tuple[str, list[str]]]:
    """(command, expected lines) for each command block of the README."""
    text = (ROOT / "README.md").read_text()
    runs = []
    for m in re.finditer(r"(?P<before>[^\n]*)\n\n```\n(?P<body>.*?)```", text, re.S):
        lines = m["body"].rstrip("\n").split("\n")
        if lines[0].startswith("$ gawee-rewrite "):
            runs.append((lines[0][2:], lines[1:]))
        elif m["before"] == DEMO_INTRO:
            runs.append(("gawee-rewrite optimize resnet18 --bench", lines))
    return runs


# Digits that depend on the CPU (its kernels' summation order, its libm): computed floating-point values, which
# the CLI prints in exponent form (``max error 2.4e-06``) or at full precision (counterexample values,
# ``1.5409960746765137``). Shape-derived figures (``3.64 G``, ``80.14 MiB``, ``-65.2%``) have at most 2 decimals
# and are the same everywhere, so they are still compared.
COMPUTED_FLOAT = re.compile(r"-?\d+(\.\d+)?e[-+]?\d+|-?\d+\.\d{6,}|\b(nan|inf)\b")


def normalize(line: str) -> str:
    line = re.sub(r"\d+(\.\d+)? (ms|s)\b", "<time>", line)  # timings vary by machine
    line = COMPUTED_FLOAT.sub("<float>", line)
    line = re.sub("━+", "━", line)  # table rules are as wide as the widest cell (a timing, on this machine)
    return " ".join(line.split())


RUNS = documented_runs()


def test_the_readme_documents_commands():
    commands = [c for c, _ in RUNS]
    assert "gawee-rewrite optimize resnet18 --bench" in commands
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


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("verification │ │ ok, max error 2.4e-06 │", "verification │ │ ok, max error 1.2e-06 │", True),
        ("verification │ │ ok, max error 2.4e-06 │", "verification │ │ FAILED, max error 2.4e-06 │", False),
        ("%x: f32[2,1,1,1] = [[[[1.5409960746765137]]]]", "%x: f32[2,1,1,1] = [[[[1.5409960746765140]]]]", True),
        ("rewrite time │ │ 64.6 ms │", "rewrite time │ │ 12 s │", True),
        ("FLOPs │ 3.64 G │ 3.63 G │ -0.1%", "FLOPs │ 3.64 G │ 3.62 G │ -0.1%", False),
        ("bytes read │ 80.14 MiB │", "bytes read │ 80.15 MiB │", False),
        ("1 rules, 52 examples, 1 unsound", "1 rules, 53 examples, 1 unsound", False),
    ],
)
def test_normalize_hides_cpu_dependent_digits_only(a, b, same):
    assert (normalize(a) == normalize(b)) is same
