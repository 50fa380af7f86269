"""Fuzz gawee-rewrite's input handling: mutated rule files through `check`, mutated saved graphs through `show`.

    python benchmarks/fuzz_cli.py --cases 2000            # half rule files, half graphs
    python benchmarks/fuzz_cli.py --cases 500 --seed 3 --kinds json --keep /tmp/fuzz

Every case must end as README's exit-code table says — 0 ok, 1 a finding, 2 a usage or input error — with at
most MAX_ERROR_LINES lines on stderr (one screen), no traceback, and no exception escaping the CLI's ``main``.
Rule files are the bundled rules and docs/examples, one rule per seed, mutated by truncation, random bytes
(invalid UTF-8 included), inserted grammar tokens, deep nesting, huge or tiny numbers, unknown names and
duplicated text; graphs are a small saved graph (conv, batch norm, relu, a split), mutated by truncation,
random bytes, deep nesting, huge numbers, unknown fields, wrong types, deleted fields and a truncated .npz.
Cases run in this process through ``gawee.cli.main`` (no Python started per case) and are deterministic for
a seed. A rule file that loads is checked by the soundness harness with two examples (counterexamples are
shrunk for at most a second: the fuzzer judges how input is handled, not the rules). The test suite runs a
small fixed budget of this (tests/test_fuzz_cli.py). Exit code 1 if any case broke the contract; ``--keep``
writes those cases' files to a folder to replay them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_ERROR_LINES = 25
"""The most lines a failing command may print on stderr: one screen."""

CHECK_TIMEOUT = 20
"""Seconds the soundness harness may spend on one rule of a mutant (`check --timeout`; past it: `crashed`)."""

EXIT_CODES = {0, 1, 2}
"""README: 0 ok, 1 a finding, 2 a usage or input error."""

ROOT = Path(__file__).resolve().parents[1]

TOKENS = [
    *("rule", "where", "with", "assume", "=>", "|>", "|", "...", "...attrs", "(", ")", "[", "]", "{", "}", ","),
    *(":", "=", "==", "!=", "<", "and", "or", "not", "in", "_", "x", "y", "relu", "conv2d", "add", "split", "[1]"),
    *("const", "fold", "default", "1", "-2.5", "0", '"relu"', "none", "true", "inf", "nan", "f32", "i64"),
    *("#", "\n", "(priority=1)", "dim=-1", "shape", "y.shape", "x.dtype", "x.rank", "cast", "dtype=i64"),
]
"""Grammar tokens and names that rule files are made of, inserted at random."""

NUMBERS = ["99999999999999999999999999999999999999", "9" * 5000, "1e400", "-1e400", "1e-400", "2147483648", "-0.0"]
JSON_VALUES = [
    None,
    True,
    0,
    -1,
    2**70,
    10**400,
    1e308,
    "x",
    "",
    "f33",
    "s0",
    "2*s9",
    [],
    [1, 2],
    [[]],
    {},
    {"dim": "s0"},
    {"unknown": 1},
    [-1, -1],
    [10**12, 10**12],
]
"""Values of every JSON type put where another was expected (and numbers no field can hold)."""


@dataclass
class Case:
    command: str
    """`check` (a rule file) or `show` (a saved graph)."""
    mutation: str
    name: str
    data: bytes
    npz: bytes | None = None
    """For `show`: the .npz beside the graph (the seed's, or a mutated one)."""


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    escaped: str = ""
    """The traceback of an exception that escaped ``main`` (a bug), else empty."""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


# -- seeds ----------------------------------------------------------------------------------------------
def rule_seeds() -> list[str]:
    """Each rule of the bundled rules and docs/examples with its comment, as its own file's text."""
    texts = [p.read_text() for p in sorted((ROOT / "rules").glob("*.rules"))]
    texts += [p.read_text() for p in sorted((ROOT / "docs" / "examples").glob("*.rules"))]
    seeds = []
    for text in texts:
        for chunk in re.split(r"\n(?=(?:#[^\n]*\n)*rule )", text):
            if "rule " in chunk and len(chunk) < 2000:
                seeds.append(chunk.strip() + "\n")
    return seeds


def graph_seed(folder: Path) -> tuple[str, bytes]:
    """A small saved graph (conv, per-channel scale and shift, relu, residual add, split, mul, permute): its JSON
    text and .npz bytes. No batch norm: the first inference of one costs seconds in a fresh process."""
    import torch

    from gawee.ir.builder import GraphBuilder

    torch.manual_seed(0)
    b = GraphBuilder("fuzz")
    x = b.input("x", "f32[1,4,6,6]")
    w = b.const(torch.randn(4, 4, 3, 3), "w")
    y = b.conv2d(x, w, b.const(torch.randn(4), "bias"), padding=[1, 1])
    y = b.add(b.mul(y, b.const(torch.rand(4, 1, 1), "scale")), b.const(torch.randn(4, 1, 1), "shift"))
    y = b.relu(b.add(y, x))
    lo, hi = b.split(y, split_sizes=[1, 3], dim=1)
    graph = b.output(b.mul(lo, 2.0), b.permute(hi, dims=[0, 2, 3, 1]))
    path = folder / "seed.json"
    graph.save(path)
    return path.read_text(), path.with_suffix(".npz").read_bytes()


# -- mutations ------------------------------------------------------------------------------------------
def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.choice([rng.randrange(256), rng.choice(b'\xff\xfe\xc0\x80\x00\n"{[(')]) for _ in range(n))


def _bytes_mutation(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    how = rng.choice(["truncate", "random bytes", "flip bytes"])
    if how == "truncate":
        return data[: rng.randrange(len(data) + 1)], how
    i = rng.randrange(len(data) + 1)
    if how == "random bytes":
        return data[:i] + _random_bytes(rng, rng.randint(1, 8)) + data[i:], how
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out:
            out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out), how


def mutate_rules(text: str, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of a rule file's text, and the name of the mutation."""
    how = rng.choice(["bytes", "tokens", "deep", "number", "name", "duplicate", "delete"])
    if how == "bytes":
        return _bytes_mutation(text.encode(), rng)
    i = rng.randrange(len(text) + 1)
    j = min(len(text), i + rng.randint(0, 30))
    if how == "tokens":
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(len(text) + 1)
            text = text[:k] + " " + rng.choice(TOKENS) + " " + text[k:]
        return text.encode(), how
    if how == "deep":
        n = rng.choice([50, 150, 3000])
        op = rng.choice(["relu(", "(", "[", "-", "not ", "neg("])
        close = {"relu(": ")", "(": ")", "[": "]", "neg(": ")"}.get(op, "")
        if rng.random() < 0.5:  # a whole pattern or replacement nested n deep
            side = f"{op * n}x{close * n}"
            text = f"rule deep: relu(x) => {side}\n" if rng.random() < 0.5 else f"rule deep: {side} => x\n"
        else:
            text = text[:i] + op * n + text[i:j] + close * n + text[j:]
        return text.encode(), how
    if how == "number":
        numbers = list(re.finditer(r"\b\d+(\.\d+)?\b", text))
        if numbers:
            m = rng.choice(numbers)
            return (text[: m.start()] + rng.choice(NUMBERS) + text[m.end() :]).encode(), how
        return (text[:i] + rng.choice(NUMBERS) + text[i:]).encode(), how
    if how == "name":
        names = list(re.finditer(r"\b[a-z_][a-z0-9_]*\b", text))
        if names:
            m = rng.choice(names)
            new = rng.choice(["zzz", "conv3d", "f32", "i64", "rule", "_", "x" * 300, "fold", "nan"])
            return (text[: m.start()] + new + text[m.end() :]).encode(), how
    if how == "duplicate":
        return (text[:j] + text[i:j] * rng.randint(2, 50) + text[j:]).encode(), how
    return (text[:i] + text[j:]).encode(), "delete"


def _paths(doc, prefix=()) -> Iterator[tuple]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for k, v in enumerate(doc):
            yield from _paths(v, (*prefix, k))


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def mutate_graph(text: str, npz: bytes, rng: random.Random) -> tuple[bytes, bytes, str]:
    """One mutant of a saved graph: (JSON bytes, .npz bytes, the name of the mutation)."""
    how = rng.choice(["bytes", "deep", "number", "unknown field", "wrong type", "delete field", "npz"])
    if how == "bytes":
        data, how = _bytes_mutation(text.encode(), rng)
        return data, npz, how
    if how == "npz":
        return text.encode(), _bytes_mutation(npz, rng)[0], how
    doc = json.loads(text)
    paths = list(_paths(doc))[1:]
    path = rng.choice(paths)
    parent, key = _at(doc, path[:-1]), path[-1]
    if how == "deep":
        n = rng.choice([60, 900, 100_000])
        nested = "[" * n + "1" + "]" * n
        marker = "__deep__"
        parent[key] = marker
        return json.dumps(doc).replace(f'"{marker}"', nested, 1).encode(), npz, how
    if how == "number":
        parent[key] = rng.choice([2**70, 10**400, -(2**63), 1e308, -1, 2**31, 0])
        text = json.dumps(doc)
        if rng.random() < 0.3:  # numbers JSON has no standard spelling for
            text = text.replace("1e+308", rng.choice(["1e400", "NaN", "Infinity", "-Infinity"]), 1)
        return text.encode(), npz, how
    if how == "unknown field":
        target = _at(doc, path) if isinstance(_at(doc, path), dict) else doc
        target[rng.choice(["zzz", "op", "inputs", "attrs", "__proto__", "format"])] = rng.choice(JSON_VALUES)
        return json.dumps(doc).encode(), npz, how
    if how == "wrong type":
        parent[key] = rng.choice(JSON_VALUES)
        return json.dumps(doc).encode(), npz, how
    if isinstance(parent, dict):
        del parent[key]
    else:
        parent.pop(key)
    return json.dumps(doc).encode(), npz, "delete field"


def cases(n: int, seed: int, kinds: tuple[str, ...], folder: Path) -> list[Case]:
    """``n`` cases, alternating between the kinds asked for (``rules``, ``json``), deterministic for ``seed``."""
    rng = random.Random(seed)
    seeds = rule_seeds()
    graph_text, npz = graph_seed(folder)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "rules":
            data, how = mutate_rules(rng.choice(seeds), rng)
            out.append(Case("check", how, f"case{i}.rules", data))
        else:
            data, npz_data, how = mutate_graph(graph_text, npz, rng)
            out.append(Case("show", how, f"case{i}.json", data, npz_data))
    return out


# -- running and judging --------------------------------------------------------------------------------
def run_case(case: Case, folder: Path, check_timeout: float = CHECK_TIMEOUT) -> Outcome:
    """Write the case's files into ``folder`` and run its command through ``gawee.cli.main``, judged; a rule
    file that loads gets ``check_timeout`` seconds of the harness per rule."""
    from gawee.cli import main

    path = folder / case.name
    path.write_bytes(case.data)
    if case.npz is not None:
        path.with_suffix(".npz").write_bytes(case.npz)
        (folder / "seed.npz").write_bytes(case.npz)  # the JSON names the seed's .npz
    argv = ["show", str(path)]
    if case.command == "check":
        argv = ["check", str(path), "--examples", "2", "--jobs", "1", "--timeout", str(check_timeout)]
    out, err = io.StringIO(), io.StringIO()
    escaped, code = "", None
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
        except Exception:
            escaped = traceback.format_exc()
    outcome = Outcome(code, out.getvalue(), err.getvalue(), escaped, time.perf_counter() - t0)
    outcome.problems = judge(outcome)
    return outcome


def judge(o: Outcome) -> list[str]:
    """What the outcome breaks of the contract (empty: nothing)."""
    problems = []
    if o.escaped:
        problems.append("an exception escaped main: " + o.escaped.strip().splitlines()[-1])
    elif o.code not in EXIT_CODES:
        problems.append(f"exit code {o.code}")
    if "Traceback (most recent call last)" in o.out + o.err:
        problems.append("a traceback was printed")
    lines = len(o.err.strip().splitlines())
    if lines > MAX_ERROR_LINES:
        problems.append(f"{lines} lines on stderr (more than one screen)")
    return problems


@contextlib.contextmanager
def quick_shrinking(seconds: float = 1.0):
    """The soundness harness shrinks counterexamples for at most ``seconds`` meanwhile."""
    from gawee.testing import harness

    before = harness.SHRINK_SECONDS
    harness.SHRINK_SECONDS = seconds
    try:
        yield
    finally:
        harness.SHRINK_SECONDS = before


def fuzz(
    n: int, seed: int, kinds: tuple[str, ...], keep: Path | None = None, check_timeout: float = CHECK_TIMEOUT
) -> list[tuple[Case, Outcome]]:
    """Run ``n`` cases; returns every (case, outcome)."""
    folder = Path(tempfile.mkdtemp(prefix="gawee-fuzz-"))
    try:
        results = []
        with quick_shrinking():
            for case in cases(n, seed, kinds, folder):
                outcome = run_case(case, folder, check_timeout)
                results.append((case, outcome))
                if outcome.problems and keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    (keep / case.name).write_bytes(case.data)
                    if case.npz is not None:
                        (keep / "seed.npz").write_bytes(case.npz)
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases to run (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--kinds", default="rules,json", help="rules, json or both (default rules,json)")
    parser.add_argument("--keep", type=Path, default=None, help="write the failing cases' files here")
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=CHECK_TIMEOUT,
        help=f"harness seconds per rule of a mutant that loads (default {CHECK_TIMEOUT})",
    )
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not set(kinds) <= {"rules", "json"} or not kinds:
        parser.error("--kinds takes rules, json or both")

    import logging

    logging.disable(logging.WARNING)  # rule warnings of mutants: not what is judged here
    t0 = time.perf_counter()
    results = fuzz(args.cases, args.seed, kinds, args.keep, args.check_timeout)
    by = Counter((c.command, c.mutation, o.code) for c, o in results)
    print(f"{len(results)} cases in {time.perf_counter() - t0:.1f} s (seed {args.seed})")
    for (command, mutation, code), count in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        print(f"  {command:5} {mutation:14} exit {code}: {count}")
    slow = sorted(results, key=lambda r: -r[1].seconds)[:3]
    print("slowest: " + ", ".join(f"{c.name} ({c.mutation}) {o.seconds:.1f} s" for c, o in slow))
    hung = [c.name for c, o in results if "crashed the harness" in o.out]
    if hung:
        print(f"checks that crashed or outlived --timeout {args.check_timeout}: {', '.join(hung)}")
    bad = [(c, o) for c, o in results if o.problems]
    for c, o in bad:
        print(f"\n{c.name} ({c.command}, {c.mutation}): {'; '.join(o.problems)}")
        print(o.escaped or o.err[-2000:])
    print(f"\n{len(bad)} of {len(results)} cases broke the contract")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
