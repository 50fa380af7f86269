"""The modules oneDNN's runtime builds, and what gawee.compile spends choosing one (issue 38).

    python benchmarks/onednn_modules.py efficientnet_b0 densenet121 mobilenet_v3_large
    python benchmarks/onednn_modules.py resnet18 --compile

For each torchvision model (random weights, batch 1, 224²): the graph gawee.compile hands the runtime (captured,
rewritten by the bundled rules, then the runtime's target phase and the layout's variant phase where this gawee has
them) built as ``DnnlModule(layout)``; printed: the phases' milliseconds and firings (and the time to load the target
phase's rules), the module's step count, how many steps each gawee kernel took, the activations moved into the
depthwise kernel, and the median milliseconds of 60 calls after 10 warm ones. Run it with ``PYTHONPATH`` set to another
checkout to compare two commits (a checkout before the target phase builds from the rewritten graph).
``--compile``: ``gawee.compile(model, (x,))`` with the default options (``--batch``: x's batch size, 1 by default),
after one warm compile of a small model; printed: the report's seconds per stage, the compiled module's median
milliseconds (60 calls after 10 warm ones), and the runtime choice with where choosing took its time. Each model runs
in this process: run one invocation per model to keep them apart.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
import torchvision

import gawee
from gawee.backend import dnnl


def module_figures(name: str, layout: str) -> str:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    graph, _ = gawee.rewrite(gawee.capture(model, (x,)))
    phase = ""
    if hasattr(dnnl.RUNTIME, "lower"):
        t0 = time.perf_counter()
        _ = dnnl.RUNTIME.rules  # loaded once per process (from the compiled-rule cache when it holds them)
        t1 = time.perf_counter()
        graph, report = dnnl.RUNTIME.lower(graph)
        graph, layout_report = dnnl.RUNTIME.lower(graph, layout)  # the layout's phase, as gawee.compile runs it
        t2 = time.perf_counter()
        firings = report.total + (layout_report.total if layout_report is not None else 0)
        phase = (
            f"target phase {(t2 - t1) * 1e3:.1f} ms ({firings} firings; its rules loaded in {(t1 - t0) * 1e3:.0f} ms); "
        )
    module = dnnl.DnnlModule(graph, layout=layout)
    median_ms = _median_ms(module, x)
    gawee_kernels = dict(sorted(Counter(k for k in module.kernels if k.startswith("gawee:")).items()))
    return (
        f"{name} {layout}: {phase}{len(module.kernels)} steps, gawee kernels {gawee_kernels}, "
        f"{len(module.moved_acts)} activations moved; median {median_ms:.2f} ms"
    )


def _median_ms(module, x: torch.Tensor) -> float:
    """The median milliseconds of 60 calls of ``module`` on ``x`` after 10 warm ones."""
    with torch.no_grad():
        for _ in range(10):
            module(x)
        times = []
        for _ in range(60):
            t0 = time.perf_counter()
            module(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def compile_figures(name: str, batch: int = 1) -> str:
    torch.manual_seed(0)
    gawee.compile(torchvision.models.resnet18(weights=None).eval(), (torch.randn(1, 3, 64, 64),))  # imports warm
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    t0 = time.perf_counter()
    module = gawee.compile(model, (x,))
    total = time.perf_counter() - t0
    report = module.gawee_report
    stages = ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items())
    called = _median_ms(module, x)
    return f"{name}: compile {total:.2f} s ({stages}); the module: median {called:.2f} ms; runtime: {report.backend}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="torchvision model names")
    parser.add_argument("--layout", default="blocked", choices=dnnl.LAYOUTS)
    parser.add_argument("--compile", action="store_true", help="time gawee.compile instead")
    parser.add_argument("--batch", type=int, default=1, help="the batch size --compile compiles for")
    args = parser.parse_args()
    if dnnl.unavailable() is not None:
        raise SystemExit(f"oneDNN's primitives are not available here: {dnnl.unavailable()}")
    for name in args.models:
        print(compile_figures(name, args.batch) if args.compile else module_figures(name, args.layout), flush=True)


if __name__ == "__main__":
    main()
