"""CPU time of loading the bundled rules in a fresh process, with the on-disk caches warm (issue 40).

    python benchmarks/rules_load.py --runs 9
    python benchmarks/rules_load.py --runs 9 --graph /tmp/graphs/resnet18.json    # and the first rewrite
    python benchmarks/rules_load.py --src /tmp/old-checkout --src .                 # two trees, alternated

Each run is a fresh ``python -c`` in a source tree (so ``gawee`` is imported from it) that imports gawee,
then times ``gawee.default_rules()`` — and with ``--graph``, the first ``gawee.rewrite`` of that saved graph
(e.g. one ``trace_identity.py --graphs`` captured) — in CPU time of the process (``time.process_time``; the
machine may be shared, wall time is printed beside it), with one torch thread. Every tree gets one untimed
run first to fill the cache directory (``XDG_CACHE_HOME`` of the children: ``--cache``, default a fresh
temporary one); ``--empty`` gives every run an empty one instead (the first load after a change). Trees
given with several ``--src`` run alternately. Prints each tree's medians and ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
w0, c0 = time.perf_counter(), time.process_time()
import gawee
import torch
torch.set_num_threads(1)
w1, c1 = time.perf_counter(), time.process_time()
rules = gawee.default_rules()
w2, c2 = time.perf_counter(), time.process_time()
row = {"import_cpu": c1 - c0, "load_cpu": c2 - c1, "load_wall": w2 - w1, "rules": len(rules)}
if sys.argv[1]:
    graph = gawee.load(sys.argv[1])
    w3, c3 = time.perf_counter(), time.process_time()
    out, report = gawee.rewrite(graph, rules)
    w4, c4 = time.perf_counter(), time.process_time()
    row.update(rewrite_cpu=c4 - c3, rewrite_wall=w4 - w3, firings=sum(report.firings.values()))
row["compiled"] = sum(1 for r in rules.rules if getattr(r, "compiled", True))
print("ROW " + json.dumps(row))
"""


def run(src: Path, graph: str, cache: str) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, graph], cwd=src, env=env, capture_output=True, text=True, check=True
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("ROW "))
    return json.loads(line[4:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="fresh processes per tree (default 9)")
    ap.add_argument("--src", action="append", type=Path, help="a source tree to import gawee from (default: this one)")
    ap.add_argument("--graph", default="", help="a saved graph to rewrite once after loading (gawee.load)")
    ap.add_argument("--cache", help="XDG_CACHE_HOME of the children (default: a fresh temporary directory)")
    ap.add_argument("--empty", action="store_true", help="every run with an empty cache directory of its own")
    args = ap.parse_args()
    srcs = [s.resolve() for s in (args.src or [HERE.parent])]
    cache = args.cache or tempfile.mkdtemp(prefix="gawee-rules-load-")
    if not args.empty:
        for s in srcs:
            run(s, args.graph, cache)  # fills the caches
    rows: dict[Path, list[dict]] = {s: [] for s in srcs}
    for _ in range(args.runs):
        for s in srcs:
            rows[s].append(run(s, args.graph, tempfile.mkdtemp(dir=cache) if args.empty else cache))
    for s in srcs:
        state = "each with an empty cache" if args.empty else "caches warm"
        print(f"{s}: {rows[s][0]['rules']} rules, {args.runs} fresh processes, {state}")
        for k in ("import_cpu", "load_cpu", "load_wall", "rewrite_cpu", "rewrite_wall"):
            xs = [r[k] for r in rows[s] if k in r]
            if xs:
                med, lo, hi = statistics.median(xs) * 1e3, min(xs) * 1e3, max(xs) * 1e3
                print(f"  {k:13s} median {med:8.1f} ms   ({lo:.1f}-{hi:.1f})")
        last = rows[s][-1]
        extra = f", {last['firings']} firings" if "firings" in last else ""
        print(f"  rules compiled by the end: {last['compiled']} of {last['rules']}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
