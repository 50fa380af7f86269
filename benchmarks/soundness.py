"""The soundness harness at full size: every bundled rule, the planted unsound rules, their correct twins.

    python benchmarks/soundness.py                  # figures into benchmarks/README.md
    python benchmarks/soundness.py --examples 50 --seeds 1 --no-readme

Three rule corpora go through ``gawee.testing.check_rule`` (the harness ``gawee-rewrite
check`` runs): the bundled ``rules/`` (each must come out *sound*), ``tests/data/unsound``
(rules with a planted bug — a missing guard, a wrong constant, a dtype or broadcasting
slip — each must come out *UNSOUND* with a counterexample) and ``tests/data/twins`` (the
corrected version of each planted rule, each must come out *sound*: the harness does not
cry wolf). Every rule is checked under several seeds, so the figures say how reliably a
bug is caught, not only that one lucky seed caught it. The table gives, per corpus, the
runs that met the expectation, the examples drawn, how often the rewrite fired, and the
time; the per-rule figures of the bundled rules follow. Exit status 1 if any run misses.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections import Counter

import torch
from readme import ROOT, machine, replace_section, source_version

import gawee
from gawee.testing import check_rule
from gawee.testing.harness import RuleCheck

SECTION = "## Soundness harness"
CORPORA = (
    ("bundled rules (rules/)", ROOT / "rules", "proven or sound"),
    ("planted unsound (tests/data/unsound)", ROOT / "tests" / "data" / "unsound", "UNSOUND"),
    ("correct twins (tests/data/twins)", ROOT / "tests" / "data" / "twins", "proven or sound"),
)


def meets(verdict: str, expected: str) -> bool:
    """Whether a verdict is one of the expected ones ("proven or sound")."""
    return verdict in expected.split(" or ")


def run_corpus(path, examples: int, seeds: int) -> list[list[RuleCheck]]:
    """For each rule of the corpus, its checks under seeds 0 .. seeds-1."""
    out = []
    for rule in gawee.load_rules(path).rules:
        checks = [check_rule(rule, examples=examples, seed=s) for s in range(seeds)]
        verdicts = Counter(c.verdict for c in checks)
        print(
            f"  {rule.name:<32} {', '.join(f'{n} {v}' for v, n in sorted(verdicts.items())):<22} "
            f"fired {sum(c.fired for c in checks):>5}/{sum(c.examples for c in checks):<5} "
            f"guard {hit_rate(checks):4.0%} scope {checks[0].scope_instances:>3} largest {checks[0].extent} "
            f"{sum(c.seconds for c in checks):5.1f} s",
            flush=True,
        )
        out.append(checks)
    return out


def summary_rows(results: dict[str, list[list[RuleCheck]]]) -> list[list[str]]:
    rows = []
    for label, _, expected in CORPORA:
        checks = [c for per_rule in results[label] for c in per_rule]
        met = sum(meets(c.verdict, expected) for c in checks)
        verdicts = Counter(c.verdict for c in checks)
        rows.append(
            [
                label,
                str(len(results[label])),
                f"{met}/{len(checks)} {expected}",
                ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())),
                str(sum(c.examples for c in checks)),
                str(sum(c.fired for c in checks)),
                f"{min_hit_rate(results[label]):.0%}",
                f"{sum(c.seconds for c in checks):.1f} s",
            ]
        )
    return rows


def hit_rate(checks: list[RuleCheck]) -> float:
    """The share of a rule's draws (over its seeds) on which its guard held."""
    examples = sum(c.examples for c in checks)
    return sum(c.guard_hits for c in checks) / examples if examples else 0.0


def min_hit_rate(results: list[list[RuleCheck]]) -> float:
    """The lowest guard hit rate of a corpus's rules (only runs that went to the end: a caught rule stops early)."""
    rates = [hit_rate([c for c in per_rule if c.counterexample is None]) for per_rule in results]
    rates = [r for r, per_rule in zip(rates, results) if any(c.counterexample is None for c in per_rule)]
    return min(rates, default=0.0)


def rule_rows(results: list[list[RuleCheck]]) -> list[list[str]]:
    rows = []
    for checks in results:
        guards = Counter(c.guard_verdict for c in checks)
        rows.append(
            [
                f"`{checks[0].rule.name}`",
                ", ".join(f"{n} {v}" for v, n in sorted(Counter(c.verdict for c in checks).items())),
                str(sum(c.examples for c in checks)),
                str(sum(c.fired for c in checks)),
                f"{hit_rate(checks):.0%}",
                guards.most_common(1)[0][0],
                ", ".join(sorted(set().union(*(c.dtypes for c in checks)))),
                f"{checks[0].scope_instances}: {checks[0].scope}",
                str(checks[0].extent),
                checks[0].proof_note,
                f"{sum(c.seconds for c in checks):.1f} s",
            ]
        )
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def caught_after(results: list[list[RuleCheck]]) -> str:
    """Examples drawn before the first counterexample, over the runs of the planted rules that caught it."""
    n = [c.examples for per_rule in results for c in per_rule if c.counterexample is not None]
    return f"median {statistics.median(n):.0f}, max {max(n)}" if n else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200, help="valid draws per rule and seed (default 200)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per rule, 0 .. N-1 (default 5)")
    ap.add_argument("--no-readme", action="store_true", help="do not write benchmarks/README.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, list[list[RuleCheck]]] = {}
    t0 = time.perf_counter()
    for label, path, expected in CORPORA:
        print(f"{label}: expecting {expected} under {args.seeds} seeds", flush=True)
        results[label] = run_corpus(path, args.examples, args.seeds)
    wall = time.perf_counter() - t0
    command = "python benchmarks/soundness.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    summary = table(
        ["corpus", "rules", "runs meeting it", "verdicts", "examples", "fired", "lowest guard hit rate", "time"],
        summary_rows(results),
    )
    body = "\n\n".join(
        [
            "Every rule checked by the hypothesis harness on random graphs drawn from its own pattern (shapes, "
            "dtypes, attributes and constants chosen to satisfy or deliberately violate its guard), compared with "
            "the graph before the rewrite on inputs with awkward values. A planted unsound rule must be caught with a "
            "counterexample; its corrected twin must pass. Each rule runs under several seeds: a bug caught by one "
            "seed only would show here as a miss. The same checks (one seed) run in `make test` "
            "(tests/test_rule_soundness.py, tests/testing/test_harness.py, figures in the test summary).",
            f"```sh\n{command}\n```",
            f"Run {datetime.date.today().isoformat()} · {source_version()} · torch {torch.__version__} · {machine()} "
            f"· one torch thread · {args.examples} examples per rule and seed, seeds 0–{args.seeds - 1} · "
            f"{wall:.0f} s in all.",
            summary,
            f"A planted bug was caught after {caught_after(results[CORPORA[1][0]])} examples (the harness stops at "
            "the first counterexample and shrinks it).",
            "Per bundled rule (*guard*: *needed* = applying the rewrite where the guard is false broke equivalence "
            "on some draw, so the guard is shown to matter; *possibly vacuous* = no such draw was found):",
            table(
                [
                    "rule",
                    "verdicts",
                    "examples",
                    "fired",
                    "guard hits",
                    "guard",
                    "dtypes",
                    "scope",
                    "largest",
                    "solver",
                    "time",
                ],
                rule_rows(results[CORPORA[0][0]]),
            ),
        ]
    )
    print()
    print(summary)
    print(f"total {wall:.0f} s")
    if not args.no_readme:
        replace_section(SECTION, body)
        print(f"wrote the {SECTION!r} section of benchmarks/README.md")
    ok = all(meets(c.verdict, expected) for label, _, expected in CORPORA for rs in results[label] for c in rs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
