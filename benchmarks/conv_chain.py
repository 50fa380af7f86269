"""What a convolution costs inside a graph, runtime by runtime: a chain of equal convolutions, per convolution.

    python benchmarks/conv_chain.py                       # the chains below, batch 1
    python benchmarks/conv_chain.py --chains 64x56:dw --convs 20

Each chain is ``--convs`` 3x3 convolutions of one shape (C channels, HxW, padding 1), each followed by a ReLU:
dense (``dense``), depthwise (``dw``) or alternating (``alt``). It is timed in one process through eager PyTorch,
gawee's torch lowering with NCHW and with channels-last activations, oneDNN Graph's compiled partitions
(``gawee.backend.onednn_graph``), oneDNN's primitives in each activation layout (``gawee.backend.dnnl``) and
ONNX Runtime with all optimizations, each the median of ``--calls`` calls
divided by the chain's length. ORT runs last: its spin-waiting pool cannot slow the runtimes before it, and
whatever torch's OpenMP threads leave behind can only slow ORT, so its lead is not overstated. On a tiny
shape the figure is the fixed cost of a convolution in that runtime; on a large one, its kernel. Used for
issue 12's analysis (benchmarks/README.md, "## Runtime" notes).
"""

from __future__ import annotations

import argparse
import math

import torch

import gawee
from gawee.backend.torch_backend import TorchOptions
from gawee.profile import time_call

CHAINS = ["8x4:alt", "32x28:dw", "32x28:dense", "64x56:dw", "16x112:dw", "128x14:dense"]
"""CHANNELSxSIZE:KIND: a tiny one (fixed costs), then mobilenet's and resnet's shapes."""


def chain(channels: int, kind: str, convs: int) -> torch.nn.Module:
    layers = []
    for i in range(convs):
        depthwise = kind == "dw" or (kind == "alt" and i % 2)
        layers += [torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels if depthwise else 1)]
        layers += [torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def runtimes(model: torch.nn.Module, x: torch.Tensor) -> dict:
    """Each runtime as a call of no arguments, where it is available."""
    graph, _ = gawee.rewrite(gawee.capture(model, (x,)))
    found = {"eager": lambda: model(x)}
    for name, channels_last in (("torch lowering NCHW", False), ("torch lowering NHWC", True)):
        module = gawee.to_torch(graph, TorchOptions(channels_last=channels_last))
        found[name] = lambda module=module: module(x)
    from gawee.backend import dnnl, onednn_graph, ort

    if onednn_graph.supports(graph) is None:
        module = onednn_graph.OneDNNGraphModule(graph, [x])
        found["oneDNN Graph"] = lambda: module(x)
    if dnnl.supports(graph) is None:
        for layout in dnnl.LAYOUTS:
            primitives = dnnl.DnnlModule(graph, layout=layout)
            found[f"oneDNN primitives {layout}"] = lambda primitives=primitives: primitives(x)
    if ort.unavailable() is None:
        session = ort.OrtModule(graph)
        found["ORT all"] = lambda: session(x)
    return found


def per_conv_us(fn, convs: int, calls: int) -> float:
    timing = time_call(fn, warmup=max(3, calls // 20), repeats=calls, budget_s=math.inf)
    return timing.median / convs * 1e6


def measure(spec: str, convs: int, calls: int) -> dict[str, float]:
    shape, _, kind = spec.partition(":")
    channels, size = (int(v) for v in shape.split("x"))
    x = torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0))
    found = runtimes(chain(channels, kind or "dense", convs), x)
    return {name: per_conv_us(fn, convs, calls) for name, fn in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", default=",".join(CHAINS), help="CHANNELSxSIZE:KIND (dense, dw, alt), comma-sep.")
    parser.add_argument("--convs", type=int, default=40, help="convolutions per chain")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per runtime")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    print(f"µs per convolution (median of {args.calls} calls / {args.convs}), batch 1, {threads} threads")
    for spec in args.chains.split(","):
        figures = measure(spec, args.convs, args.calls)
        print(f"{spec}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
