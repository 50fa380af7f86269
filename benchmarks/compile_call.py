"""gawee.compile of one model with the default options, and the median call of the module it returns.

    PYTHONPATH=<checkout> python benchmarks/compile_call.py resnet18 [--batch 8] [--calls 20]

The model and its input are ``bench_runtime.make_model``'s (seeded random weights, batch ``--batch``, a 224×224
image or 128 tokens), built in this process; printed: the median milliseconds of ``--calls`` calls after 5 warm
ones, the compile's wall time and the runtime it chose. Run one process per model and tree, with ``PYTHONPATH`` set
to each checkout and the trees alternated, to compare two commits (benchmarks/README.md, "Runtime: the oneDNN
fusions as a target phase": the before/now table).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_runtime import make_model

import gawee


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a torchvision classifier or a transformer row of bench_runtime (bert, ...)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=60, help="timed calls (median printed)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, xs = make_model(args.model, args.batch)
    t0 = time.perf_counter()
    module = gawee.compile(model, xs)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        for _ in range(5):
            module(*xs)
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            module(*xs)
            times.append(time.perf_counter() - t)
    report = getattr(module, "gawee_report", None)
    chosen = getattr(getattr(report, "backend", None), "chosen", "torch")
    print(f"{args.model}: {statistics.median(times) * 1e3:.2f} ms (compile {compile_s:.1f} s, {chosen})", flush=True)


if __name__ == "__main__":
    main()
