"""What trying the crash-prone runtimes in child processes costs a default gawee.compile, one process per model.

    python benchmarks/isolation_cost.py                       # resnet18 (batch 1), a small BERT, VOLO's class block
    python benchmarks/isolation_cost.py resnet18 --repeat 3

``gawee.compile`` builds oneDNN Graph's runtime, oneDNN's primitives and the torch lowering's attention partitions in
forked children first (gawee.backend.isolation); while they run the compile waits. Per model, in a fresh process:
the whole compile's wall and CPU time, the part spent waiting on trial children (what isolation adds, beside the
second build of each runtime that survives, which is inside the rest), the children's CPU time, and each child's.
benchmarks/README.md, "Crash isolation", has figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

MODELS = ("resnet18", "bert", "volo")


def _model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18().eval(), (torch.randn(1, 3, 224, 224),)
    if name == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256)
        inputs = {"input_ids": torch.randint(0, 1000, (1, 64)), "attention_mask": torch.ones(1, 64, dtype=torch.long)}
        return BertModel(config).eval(), inputs
    from timm.models.volo import ClassBlock

    return ClassBlock(dim=384, num_heads=12).eval(), (torch.randn(1, 197, 384),)


def measure(name: str) -> str:
    """One compile of ``name`` in this process: its figures as a line."""
    import gawee
    from gawee.backend import isolation

    trials = []
    tried = isolation.tried

    def timed(work, **kwargs):
        t0 = time.perf_counter()
        result = tried(work, **kwargs)
        trials.append((result, time.perf_counter() - t0))
        return result

    isolation.tried = timed
    model, inputs = _model(name)
    before, t0 = os.times(), time.perf_counter()
    module = gawee.compile(model, inputs)
    total, after = time.perf_counter() - t0, os.times()
    waited = sum(s for _, s in trials)
    children = after.children_user + after.children_system - before.children_user - before.children_system
    own = after.user + after.system - before.user - before.system
    each = ", ".join(
        f"{name} {t.seconds:.1f} s{' (died)' if t.died else ''}" for result, _ in trials for name, t in result.items()
    )
    return (
        f"{name}: compile {total:.1f} s ({own:.1f} s of CPU), waiting on trial children {waited:.1f} s "
        f"({100 * waited / total:.0f}%), their CPU {children:.1f} s; each child: {each}; "
        f"runtime: {module.gawee_report.backend}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS), help=f"any of {', '.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure this model
    args = parser.parse_args()
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown model {', '.join(sorted(unknown))}: pick from {', '.join(MODELS)}")
    if args.one:
        print(measure(args.one), flush=True)
        return
    for _ in range(args.repeat):
        for name in args.models:
            subprocess.run([sys.executable, __file__, "--one", name], check=True)


if __name__ == "__main__":
    main()
