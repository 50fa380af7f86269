"""What keeping freed memory in the process (``TorchOptions.keep_freed_memory``) does to a compiled module's calls.

Each (model, batch, backend) is compiled and timed in fresh processes, with the setting off and on, alternately
over ``--runs`` rounds: the setting is process-wide and cannot be undone, so one process cannot time both.
Each process prints the median call and the minor page faults per call (``gawee.profile.time_call``).

    python benchmarks/bench_allocator.py --models densenet121,resnet50 --batches 1,8 --backends torch,onednn_graph
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def measure(name: str, batch: int, backend: str, keep: bool) -> dict:
    """One process's figures: compile ``name`` at ``batch`` (``bench_runtime.make_model``: a torchvision classifier
    or one of its transformer specs, e.g. bert) for ``backend`` with the setting ``keep``, time the module."""
    import torch
    from bench_runtime import make_model

    import gawee
    from gawee.profile import time_call

    model, xs = make_model(name, batch)
    module = gawee.compile(model, xs, backend=backend, options=gawee.TorchOptions(keep_freed_memory=keep))
    with torch.no_grad():
        timing = time_call(lambda: module(*xs), warmup=5, repeats=40 if batch == 1 else 15, budget_s=20.0)
    return {"median_ms": timing.median * 1e3, "page_faults": timing.page_faults}


def in_process_of_its_own(name: str, batch: int, backend: str, keep: bool) -> dict:
    argv = [sys.executable, __file__, "--worker", json.dumps([name, batch, backend, keep])]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name} b{batch} {backend} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows(models: list[str], batches: list[int], backends: list[str], runs: int) -> list[str]:
    """One Markdown row per (model, batch, backend), printed as it is measured: each run's median call and page
    faults without and with the setting, and the ratio of the fastest runs' medians."""
    lines = [
        "| model | batch | backend | freed memory given back: ms (page faults per call) | kept | given back / kept |",
        "|---|---:|---|---|---|---:|",
    ]
    print("\n".join(lines), flush=True)
    for name in models:
        for batch in batches:
            for backend in backends:
                plain, kept = [], []
                for _ in range(runs):
                    plain.append(in_process_of_its_own(name, batch, backend, False))
                    kept.append(in_process_of_its_own(name, batch, backend, True))

                def cell(results: list[dict]) -> str:
                    return ", ".join(f"{r['median_ms']:.2f} ({r['page_faults']:.0f})" for r in results)

                ratio = min(r["median_ms"] for r in plain) / min(r["median_ms"] for r in kept)
                lines.append(f"| {name} | {batch} | {backend} | {cell(plain)} | {cell(kept)} | {ratio:.3f}× |")
                print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="densenet121,resnet50,mobilenet_v3_large")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--backends", default="torch,onednn_graph")
    parser.add_argument("--runs", type=int, default=2, help="processes per setting and row")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(*json.loads(args.worker))))
        return 0
    rows(args.models.split(","), [int(b) for b in args.batches.split(",")], args.backends.split(","), args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
