"""Where a CNN's time goes per kernel class: ONNX Runtime (all optimizations) against gawee.compile.

    python benchmarks/kernel_classes.py mobilenet_v3_large --batch 1

ORT's own profiler (``enable_profiling``) on torch.onnx's export, and :func:`gawee.profile` on
gawee.compile's module, each in a separate process (a runtime's threads slow the other's calls for
a while). Convolutions are grouped as 1×1, depthwise k×k and other k×k; every other kernel under its
op name. Milliseconds per call, summed over the kernels of a class (medians over the calls). Used for
issue 12's analysis of what ORT's MLAS kernels win (benchmarks/README.md, "## Runtime" notes).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path


def conv_class(kernel: int, depthwise: bool) -> str:
    if depthwise:
        return f"depthwise {kernel}x{kernel}"
    return "1x1" if kernel == 1 else f"{kernel}x{kernel}"


def model_and_input(name: str, batch: int):
    import torch
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)().eval(), torch.randn(batch, 3, 224, 224)


def ort_classes(name: str, batch: int, calls: int) -> dict[str, float]:
    import onnxruntime as ort
    import torch

    model, x = model_and_input(name, batch)
    folder = Path(tempfile.mkdtemp(prefix="gawee-kernels-"))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(folder / "model.onnx"), verbose=False)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "profile")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.numpy()}
    for _ in range(calls):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = sum(1 for e in events if e.get("name") == "model_run")
    ms: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        args = e["args"]
        cls = args["op_name"]
        if cls == "Conv":  # NCHWc weights are [O, I/groups (or blocked), kh, kw, ...]: depthwise has I == 1
            weight = next(iter(args["input_type_shape"][1].values()))
            cls = conv_class(weight[2], weight[1] == 1 and weight[2] > 1)
        ms[cls] += e["dur"] / 1e3 / runs
    return dict(ms)


def gawee_classes(name: str, batch: int, calls: int) -> dict[str, float]:
    import gawee
    from gawee.profile import profile

    model, x = model_and_input(name, batch)
    module = gawee.compile(model, (x,))
    graph = module.gawee_report.optimized
    nodes = {n.name: n for n in graph}
    best = min((profile(module, graph, [x], repeats=calls) for _ in range(3)), key=lambda p: p.node_sum)
    ms: dict[str, float] = collections.defaultdict(float)
    for t in best.nodes:
        node = nodes[t.node]
        cls = node.op
        if node.op == "conv2d":
            cin, weight = node.inputs[0].type.shape[1], node.inputs[1].type.shape
            cls = conv_class(weight[2], node.attrs["groups"] == cin > 1)
        ms[cls] += t.seconds * 1e3
    return dict(ms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a torchvision classifier, e.g. mobilenet_v3_large")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--side", choices=["ort", "gawee"], help=argparse.SUPPRESS)  # the per-process worker
    args = p.parse_args(argv)
    if args.side:
        fn = ort_classes if args.side == "ort" else gawee_classes
        print(json.dumps(fn(args.model, args.batch, args.calls)))
        return 0
    sides = {}
    for side in ("ort", "gawee"):
        cmd = [sys.executable, __file__, args.model, "--batch", str(args.batch), "--calls", str(args.calls)]
        out = subprocess.run([*cmd, "--side", side], capture_output=True, text=True, check=True).stdout
        sides[side] = json.loads(out.strip().splitlines()[-1])
    from gawee.profile import cpu_name

    print(f"{args.model} batch {args.batch}, ms per call by kernel class, {cpu_name()}")
    print(f"{'class':24} {'ORT all':>9} {'gawee':>9}")
    classes = sorted(set(sides["ort"]) | set(sides["gawee"]), key=lambda c: -max(s.get(c, 0) for s in sides.values()))
    for c in classes:
        print(f"{c:24} {sides['ort'].get(c, 0):9.3f} {sides['gawee'].get(c, 0):9.3f}")
    print(f"{'total':24} {sum(sides['ort'].values()):9.3f} {sum(sides['gawee'].values()):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
