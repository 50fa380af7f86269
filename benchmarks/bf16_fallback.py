"""bf16 against float32 on this CPU: why ``gawee.compile(precision="bf16")`` stays in float32 without bf16 arithmetic.

    python benchmarks/bf16_fallback.py [MODEL ...]   # torchvision names; default resnet18

For each model (random weights, batch 1, 224²): ``gawee.compile`` in float32, and with the bf16 precision phase
forced on (what compile applies only where :func:`gawee.machine.no_bf16` finds bf16 arithmetic), each timed by
``machine.time_call`` in alternation (the best of three medians); printed: what ``no_bf16`` says of this CPU, both
latencies, their ratio and the bf16 module's max error against eager float32.
"""

from __future__ import annotations

import argparse

import torch
import torchvision

import gawee
from gawee.backend import compiler
from gawee.machine import cpu_name, no_bf16, time_call


def figures(name: str) -> str:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    f32 = gawee.compile(model, (x,))
    checked, compiler.no_bf16 = compiler.no_bf16, lambda device: None  # the phase applied whatever the CPU
    try:
        bf16 = gawee.compile(model, (x,), precision="bf16")
    finally:
        compiler.no_bf16 = checked
    medians: dict[str, list[float]] = {"f32": [], "bf16": []}
    for _ in range(3):
        for key, module in (("f32", f32), ("bf16", bf16)):
            medians[key].append(time_call(lambda module=module: module(x)).median)
    a, b = min(medians["f32"]), min(medians["bf16"])
    with torch.no_grad():
        error = (bf16(x) - model(x)).abs().max().item()
    times = f"float32 {a * 1e3:.2f} ms, bf16 {b * 1e3:.2f} ms ({b / a:.2f}x the float32 time)"
    return f"{name}: {times}; bf16 max error {error:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["resnet18"], help="torchvision model names")
    args = parser.parse_args()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads: {no_bf16() or 'bf16 arithmetic present'}")
    for name in args.models:
        print(figures(name), flush=True)


if __name__ == "__main__":
    main()
