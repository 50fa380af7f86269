"""What one convolution call costs: oneDNN as torch reaches it against ONNX Runtime, each in a process of its own.

    python benchmarks/conv_overhead.py            # mobilenet_v3_large's convolution shapes, and a 1x1 on 8 channels
    python benchmarks/conv_overhead.py --llga mobilenet_v3_large resnet18

Per shape (batch 1, fused ReLU): the median of 2000 calls of ``mkldnn._convolution_pointwise`` with the weight
prepacked for the input size (gawee's torch lowering), NCHW and channels-last, and of an ONNX Runtime session
(all optimizations) holding that one convolution. The smallest shape shows the fixed cost of a call. ``--llga``
times whole torchvision models through TorchScript's oneDNN Graph fuser (``torch.jit.enable_onednn_fusion``),
which compiles fused partitions once, against ONNX Runtime. Used for issue 12's analysis (benchmarks/README.md,
"## Runtime" notes).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
import warnings

SHAPES = [  # (c_in, c_out, kernel, stride, groups, size)
    (8, 8, 1, 1, 1, 1),
    (16, 64, 1, 1, 1, 112),
    (72, 72, 5, 2, 72, 56),
    (240, 240, 3, 1, 240, 28),
    (120, 480, 1, 1, 1, 14),
    (960, 160, 1, 1, 1, 7),
]


def median_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def torch_side() -> dict:
    import torch

    torch.manual_seed(0)
    out = {}
    with torch.no_grad():
        for cin, cout, k, s, g, hw in SHAPES:
            x, conv = torch.randn(1, cin, hw, hw), torch.nn.Conv2d(cin, cout, k, s, k // 2, groups=g).eval()
            for channels_last in (False, True):
                fmt = torch.channels_last if channels_last else torch.contiguous_format
                xx, w = x.contiguous(memory_format=fmt), conv.weight.detach().contiguous(memory_format=fmt)
                packed = torch.ops.mkldnn._reorder_convolution_weight(
                    w, [k // 2] * 2, [s] * 2, [1, 1], g, list(x.shape)
                )
                bias, pad, stride = conv.bias.detach(), [k // 2] * 2, [s] * 2
                out[f"{(cin, cout, k, s, g, hw)} {'nhwc' if channels_last else 'nchw'}"] = median_us(
                    lambda: torch.ops.mkldnn._convolution_pointwise(
                        xx, packed, bias, pad, stride, [1, 1], g, "relu", [], ""
                    )
                )
    return out


def ort_side() -> dict:
    import onnxruntime as ort
    import torch

    torch.manual_seed(0)
    out = {}
    for cin, cout, k, s, g, hw in SHAPES:
        x, conv = torch.randn(1, cin, hw, hw), torch.nn.Conv2d(cin, cout, k, s, k // 2, groups=g).eval()
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(torch.nn.Sequential(conv, torch.nn.ReLU()), (x,), buf, dynamo=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x.numpy()}
        out[str((cin, cout, k, s, g, hw))] = median_us(lambda: session.run(None, feed))
    return out


def llga_side(name: str) -> dict:
    import torch
    import torchvision

    torch.manual_seed(0)
    model, x = getattr(torchvision.models, name)(weights=None).eval(), torch.randn(1, 3, 224, 224)
    torch.jit.enable_onednn_fusion(True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = model(x)
        t = time.perf_counter()
        traced = torch.jit.freeze(torch.jit.trace(model, x))
        for _ in range(3):  # the profiling runs, after which the fused partitions are compiled
            traced(x)
        build = time.perf_counter() - t
        error = ((traced(x) - ref).abs().max() / ref.abs().max()).item()
        ms = median_us(lambda: traced(x), 200) / 1e3
    return {"ms": ms, "build_s": build, "relative_error": error}


def ort_model_side(name: str) -> dict:
    import onnxruntime as ort
    import torch
    import torchvision

    torch.manual_seed(0)
    model, x = getattr(torchvision.models, name)(weights=None).eval(), torch.randn(1, 3, 224, 224)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.numpy()}
    return {"ms": median_us(lambda: session.run(None, feed), 200) / 1e3}


def _in_process(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llga", nargs="*", metavar="MODEL", help="time whole torchvision models through oneDNN Graph")
    p.add_argument("--side", help=argparse.SUPPRESS)  # the per-process worker
    args = p.parse_args(argv)
    if args.side:
        side, _, model = args.side.partition(":")
        fn = {"torch": torch_side, "ort": ort_side, "llga": llga_side, "ortmodel": ort_model_side}[side]
        print(json.dumps(fn(model) if model else fn()))
        return 0
    from gawee.profile import cpu_name

    if args.llga:
        print(f"whole models, batch 1, median ms, {cpu_name()}")
        print(f"{'model':24} {'oneDNN Graph':>13} {'ORT all':>9} {'build s':>8} {'error':>9}")
        for name in args.llga:
            llga, ort_ = _in_process("--side", f"llga:{name}"), _in_process("--side", f"ortmodel:{name}")
            print(
                f"{name:24} {llga['ms']:13.2f} {ort_['ms']:9.2f} {llga['build_s']:8.1f} {llga['relative_error']:9.1e}"
            )
        return 0
    torch_us, ort_us = _in_process("--side", "torch"), _in_process("--side", "ort")
    print(f"one convolution + ReLU, batch 1, median µs per call, {cpu_name()}")
    print(f"{'(c_in, c_out, k, stride, groups, size)':40} {'oneDNN nchw':>12} {'oneDNN nhwc':>12} {'ORT all':>9}")
    for shape in SHAPES:
        key = str(shape)
        print(f"{key:40} {torch_us[key + ' nchw']:12.1f} {torch_us[key + ' nhwc']:12.1f} {ort_us[key]:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
