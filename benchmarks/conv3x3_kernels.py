"""Candidate kernels for 3x3 stride-1 convolutions, side by side in one process: oneDNN against NNPACK.

    python benchmarks/conv3x3_kernels.py                  # resnet's 3x3 shapes at batch 1 and 8
    python benchmarks/conv3x3_kernels.py --batches 1 --shapes 64x56

torch ships NNPACK (``torch._nnpack_spatial_convolution``), whose Winograd and FFT algorithms do fewer
multiplications than a direct convolution: a candidate, beside oneDNN, for a per-shape kernel choice like the
one ``gawee.backend.kernels`` makes for linears and 1x1 convolutions, where oneDNN's AVX2 convolutions trail
ONNX Runtime's (benchmarks/README.md, "## Runtime" notes). Per shape (C -> C channels, HxW, padding 1, fused
ReLU): each kernel's fastest call of ``--calls`` (interleaved rounds), its ratio to oneDNN's (above 1: faster
than oneDNN), and each one's largest error against float64 relative to the output's largest magnitude.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from gawee.backend import onednn

RESNET_SHAPES = ["64x56", "128x28", "256x14", "512x7"]
"""resnet18/34's 3x3 stride-1 convolutions: channels x spatial size."""


def candidates(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict:
    """Each kernel as a call of no arguments computing ``relu(conv2d(x, w, b, padding=1))``."""
    geometry = {"padding": (1, 1), "stride": (1, 1), "dilation": (1, 1), "groups": 1}
    packed = onednn.pack_conv_weight(w, **geometry, input_shape=tuple(x.shape), channels_last=False)
    found = {
        "onednn": lambda: torch.ops.mkldnn._convolution_pointwise(
            x, packed, b, [1, 1], [1, 1], [1, 1], 1, "relu", [], ""
        )
    }
    if torch.backends.nnpack.is_available():
        found["nnpack"] = lambda: torch._nnpack_spatial_convolution(x, w, b, [1, 1], [1, 1]).relu_()
    return found


def measure(batch: int, channels: int, size: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, channels, size, size, generator=g)
    w = torch.randn(channels, channels, 3, 3, generator=g) / (3 * channels**0.5)
    b = torch.randn(channels, generator=g)
    reference = F.conv2d(x.double(), w.double(), b.double(), padding=1).relu()
    scale = reference.abs().max().item()
    row = {"batch": batch, "channels": channels, "size": size, "ms": {}, "error": {}}
    with torch.no_grad():
        kernels = candidates(x, w, b)
        best = dict.fromkeys(kernels, float("inf"))
        for name, fn in kernels.items():
            row["error"][name] = (fn().double() - reference).abs().max().item() / scale
            fn()
        for _ in range(calls):  # not kernels.best_calls: it stops timing a clear loser, whose figure is printed here
            for name, fn in kernels.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    row["ms"] = {name: s * 1e3 for name, s in best.items()}
    return row


def line(row: dict) -> str:
    ms, err = row["ms"], row["error"]
    cells = [f"{k} {v:.3f} ms ({ms['onednn'] / v:.2f}x oneDNN's speed, error {err[k]:.1e})" for k, v in ms.items()]
    return f"b{row['batch']} {row['channels']}x{row['size']}x{row['size']}: " + "; ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--shapes", default=",".join(RESNET_SHAPES), help="CHANNELSxSIZE, comma-separated")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per kernel and shape")
    args = parser.parse_args(argv)
    nnpack = torch.backends.nnpack.is_available()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, NNPACK available: {nnpack}")
    for batch in (int(b) for b in args.batches.split(",")):
        for shape in args.shapes.split(","):
            channels, size = (int(v) for v in shape.split("x"))
            print(line(measure(batch, channels, size, args.calls)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
