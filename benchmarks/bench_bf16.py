"""bf16 benchmark: gawee.compile(precision="bf16") against OpenVINO in bf16 and Inductor with bf16 autocast.

Columns, each built, checked and timed in a process of its own (bench_int8's workers), all with the same thread
count, on resnet50 and vit_b_16 at batch 1 (seeded random weights, bench_runtime.make_model): eager float32
PyTorch (the reference); eager PyTorch under ``torch.autocast("cpu", torch.bfloat16)``; Inductor
(``torch.compile`` with freezing) under the same autocast; OpenVINO's CPU plugin in float32 and with
``INFERENCE_PRECISION_HINT=bf16``; gawee.compile in float32 and with the bf16 precision phase
(rules/precision/bf16.rules). Each column's output is compared with eager float32's (max and mean absolute error,
cosine similarity). On a CPU without bf16 instructions gawee keeps float32 and its row says so.

    python benchmarks/bench_bf16.py                      # resnet50 and vit_b_16
    python benchmarks/bench_bf16.py --tiny --models resnet50 --reps 3 --warmup 1 --passes 1   # a smoke run
    python benchmarks/bench_bf16.py --readme             # the ## bf16 section of benchmarks/README.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from bench_int8 import Row, against, arguments, markdown, meta_of, publish, rounds_said, run
from bench_runtime import _timed, build_eager, build_gawee, build_inductor, build_openvino

import gawee

HEADING = "## bf16: gawee against OpenVINO and Inductor"
MODELS = {"resnet50": "resnet50", "vit_b_16": "vit_b_16"}
TINY = {"resnet50": "resnet18", "vit_b_16": "vit_b_32"}
"""``--tiny``: smaller models of the same families (smoke runs and the test)."""
METHODS = {
    "eager": "eager PyTorch f32",
    "eager_bf16": "eager PyTorch, bf16 autocast",
    "inductor_bf16": "Inductor, bf16 autocast",
    "openvino": "OpenVINO f32",
    "openvino_bf16": "OpenVINO bf16",
    "gawee": "gawee.compile f32",
    "gawee_bf16": 'gawee.compile(precision="bf16")',
}
PEERS = ("openvino_bf16", "inductor_bf16")
"""The bf16 columns gawee's bf16 column is held against."""


def _autocast(fn: Callable) -> Callable:
    """``fn`` called under bf16 autocast, its output in float32 (as the float model's)."""

    def call(*args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(*args)
        return out.float()

    return call


def build_eager_bf16(model, xs):
    return _autocast(model), 0.0


def build_inductor_bf16(model, xs):
    """Inductor with freezing, compiled (on the first call) and run under bf16 autocast: the recipe of PyTorch's
    CPU inference docs for bf16."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled, seconds = build_inductor(model, xs)
    return _autocast(compiled), seconds


def build_openvino_bf16(model, xs):
    return build_openvino(model, xs, precision="bf16")


def build_gawee_bf16(model, xs):
    """gawee.compile with the bf16 precision phase; on a CPU without bf16 arithmetic it keeps float32 and the
    row's note says why (``CompileReport.precision_skipped``)."""
    module, seconds = _timed(lambda: gawee.compile(model, xs, precision="bf16"))
    module.note = module.gawee_report.precision_skipped
    return module, seconds


BUILDERS: dict[str, Callable] = {
    "eager": build_eager,
    "eager_bf16": build_eager_bf16,
    "inductor_bf16": build_inductor_bf16,
    "openvino": build_openvino,
    "openvino_bf16": build_openvino_bf16,
    "gawee": build_gawee,
    "gawee_bf16": build_gawee_bf16,
}


def verdicts(rows: list[Row]) -> str:
    """Per model: gawee bf16 against each peer's bf16 column — at least as fast — with the errors side by side."""
    index = {(r.model, r.method): r for r in rows}
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        ours = index.get((model, "gawee_bf16"))
        if ours is None or ours.latency_ms is None:
            lines.append(f"- {model}: gawee bf16 gave no latency — not compared.")
            continue
        if ours.note:
            lines.append(f"- {model}: gawee {ours.note} (its row is float32).")
        for peer in PEERS:
            theirs = index.get((model, peer))
            if theirs is None or theirs.latency_ms is None:
                lines.append(f"- {model}: {METHODS[peer]} gave no latency — not compared.")
                continue
            lines.append(against(model, ours, "gawee bf16", theirs, METHODS[peer]) + ".")
    return "\n".join(lines) + "\n"


def readme_section(table: str, checks: str, command: str, meta: dict) -> str:
    return (
        f"Produced by `make bench-bf16`, i.e.\n\n```sh\n{command}\n```\n\n"
        f"Run {meta['date']} · {meta['gawee']}. Machine: {meta['machine']}; {meta['threads']} threads for every "
        f"column; torch {meta['torch']}, openvino {meta['openvino']}.\n\n"
        "Random weights (seeded, `bench_runtime.make_model`), batch 1, a 224×224 image; the output compared is the "
        "logits. Each column is built, checked and timed in a process of its own (`benchmarks/worker.py`), with "
        "the same thread count: **eager PyTorch f32**: `model(x)` under `torch.no_grad()`; **eager PyTorch, bf16 "
        'autocast**: the same under `torch.autocast("cpu", dtype=torch.bfloat16)`; **Inductor, bf16 autocast**: '
        "`torch.compile(model)` with `freezing=True`, compiled and run under that autocast; **OpenVINO f32 / "
        "bf16**: `openvino.convert_model` on the CPU plugin with `PERFORMANCE_HINT=LATENCY` and "
        "`INFERENCE_PRECISION_HINT` f32 or bf16; **gawee.compile f32**: `gawee.compile(model, xs)`; "
        '**gawee.compile(precision="bf16")**: the bf16 precision phase (`rules/precision/bf16.rules`: '
        "convolutions, linears and matmuls on bf16 operands with float32 accumulation, each within its declared "
        "bound, and the exact moves of casts that keep a bf16 result in bf16 to the next such op), oneDNN's bf16 "
        "convolutions where the CPU has bf16 instructions. Latency: median of the timed calls "
        f"({meta['reps']} calls in {meta['passes']} passes after {meta['warmup']} warm-up calls{rounds_said(meta)}), "
        "speedup over "
        "eager in brackets; compile: wall time from the model to a callable (Inductor's first call included). "
        "Errors and cosine similarity: the column's output against eager float32's on the same input "
        "(`gawee.accuracy.compare_outputs`). *busy elsewhere*: CPU cores other processes used while the column "
        f"was timed.\n\n{table}\n### gawee bf16 against OpenVINO bf16 and Inductor bf16 (computed from the table)"
        f"\n\n{checks}"
    )


def main(argv: list[str] | None = None) -> int:
    suite = {"models": MODELS, "tiny": TINY, "methods": METHODS, "builders": BUILDERS}
    args, rows = run(arguments(__doc__, MODELS, METHODS, HEADING), argv, suite, Path(__file__))
    if rows is None:
        return 0
    table, checks = markdown(rows, METHODS), verdicts(rows)
    command = "python benchmarks/bench_bf16.py " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        import openvino

        version = openvino.__version__
    except ImportError:
        version = "not installed"
    return publish(args, rows, meta_of(args, command, openvino=version), table, checks, HEADING, readme_section)


if __name__ == "__main__":
    sys.exit(main())
