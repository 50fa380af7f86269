"""Static int8 benchmark: gawee.compile(precision="int8", calibration=...) against OpenVINO's int8 model from NNCF
post-training quantization with the same calibration data.

Columns, each built, checked and timed in a process of its own (bench_int8's workers), all with the same thread
count, on resnet50 and mobilenet_v3_large at batch 1 (seeded random weights, bench_runtime.make_model): eager
float32 PyTorch (the reference); OpenVINO's CPU plugin in float32; ``nncf.quantize`` of OpenVINO's converted
model on the calibration batches, run by the same plugin; gawee.compile in float32 and with the int8 precision
phase calibrated on the same batches (rules/precision/int8.rules: convolutions quantized statically, linears
dynamically). The calibration data: CALIBRATION_BATCHES seeded random images (no dataset is available offline).
Each column's output is compared with eager float32's on the example input (max and mean absolute error, cosine),
and the top-1 agreement with eager float32 over the calibration images is in the row's note.

    python benchmarks/bench_int8_static.py                      # resnet50 and mobilenet_v3_large
    python benchmarks/bench_int8_static.py --tiny --reps 3 --warmup 1 --passes 1   # a smoke run
    python benchmarks/bench_int8_static.py --readme             # its section of benchmarks/README.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from bench_int8 import Row, against, arguments, markdown, meta_of, publish, rounds_said, run
from bench_runtime import _timed, build_eager, build_gawee, build_openvino

import gawee

HEADING = "## Static int8: gawee against OpenVINO with NNCF"
MODELS = {"resnet50": "resnet50", "mobilenet_v3_large": "mobilenet_v3_large"}
TINY = {"resnet50": "resnet18", "mobilenet_v3_large": "mobilenet_v3_small"}
"""``--tiny``: smaller models of the same families (smoke runs)."""
METHODS = {
    "eager": "eager PyTorch f32",
    "openvino": "OpenVINO f32",
    "openvino_int8": "OpenVINO int8 (NNCF post-training quantization)",
    "gawee": "gawee.compile f32",
    "gawee_int8": 'gawee.compile(precision="int8", calibration=...)',
}
CALIBRATION_BATCHES = 16


def calibration(xs) -> list[tuple[torch.Tensor, ...]]:
    """The calibration batches: seeded random inputs of the example's shapes (the same for every column)."""
    generator = torch.Generator().manual_seed(1234)
    return [tuple(torch.randn(x.shape, generator=generator) for x in xs) for _ in range(CALIBRATION_BATCHES)]


def _agreement(model, fn, batches) -> str:
    """Top-1 agreement of ``fn`` with eager float32 over the calibration batches, as a note."""
    agree = total = 0
    with torch.no_grad():
        for batch in batches:
            a, b = model(*batch).argmax(-1), fn(*batch).argmax(-1)
            agree, total = agree + int((a == b).sum()), total + a.numel()
    return f"top-1 agreement with eager f32 on the {len(batches)} calibration images: {agree}/{total}"


def build_openvino_int8(model, xs):
    """``nncf.quantize`` (defaults: the mixed preset, symmetric int8 weights per channel) of OpenVINO's converted
    model on the calibration batches, compiled by the CPU plugin as the float32 column is."""
    import nncf
    import openvino as ov

    batches = calibration(xs)

    def make():
        with torch.no_grad():
            converted = ov.convert_model(model, example_input=tuple(xs))
        dataset = nncf.Dataset(batches, lambda batch: tuple(t.numpy() for t in batch))
        quantized = nncf.quantize(converted, dataset, subset_size=len(batches))
        compiled = ov.Core().compile_model(
            quantized, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": torch.get_num_threads()}
        )
        request = compiled.create_infer_request()
        return lambda *args: torch.from_numpy(request.infer([a.numpy() for a in args], share_inputs=True)[0].copy())

    fn, seconds = _timed(make)
    fn.note = _agreement(model, fn, batches)  # the row's note (a lambda takes attributes)
    return fn, seconds


def build_gawee_int8(model, xs):
    """gawee.compile with the int8 precision phase, calibrated on the calibration batches (float32 where that
    measured faster, which the note says)."""
    batches = calibration(xs)
    module, seconds = _timed(lambda: gawee.compile(model, xs, precision="int8", calibration=batches))
    report = module.gawee_report
    convs = sum(v for k, v in report.rewrite.firings.items() if k.startswith("conv2d_int8"))
    ran = report.precision_skipped or f"{convs} convolutions in int8"  # float32 where it measured faster
    module.note = f"{ran}; {_agreement(model, module, batches)}"
    return module, seconds


BUILDERS: dict[str, Callable] = {
    "eager": build_eager,
    "openvino": build_openvino,
    "openvino_int8": build_openvino_int8,
    "gawee": build_gawee,
    "gawee_int8": build_gawee_int8,
}


def verdicts(rows: list[Row]) -> str:
    """Per model: gawee int8 against OpenVINO int8 — at least as fast — with the errors side by side."""
    index = {(r.model, r.method): r for r in rows}
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        ours, theirs = index.get((model, "gawee_int8")), index.get((model, "openvino_int8"))
        if not ours or not theirs or ours.latency_ms is None or theirs.latency_ms is None:
            lines.append(f"- {model}: gawee int8 or OpenVINO int8 gave no latency — not compared.")
            continue
        lines.append(against(model, ours, "gawee int8", theirs, "OpenVINO int8") + ".")
    return "\n".join(lines) + "\n"


def readme_section(table: str, checks: str, command: str, meta: dict) -> str:
    return (
        f"Produced by `make bench-int8-static`, i.e.\n\n```sh\n{command}\n```\n\n"
        f"Run {meta['date']} · {meta['gawee']}. Machine: {meta['machine']}; {meta['threads']} threads for every "
        f"column; torch {meta['torch']}, openvino {meta['openvino']}, nncf {meta['nncf']}.\n\n"
        "Random weights (seeded, `bench_runtime.make_model`), batch 1, a 224×224 image; the output compared is the "
        f"logits. Calibration: {CALIBRATION_BATCHES} seeded random images, the same for both int8 columns. Each "
        "column is built, checked and timed in a process of its own (`benchmarks/worker.py`), with the same thread "
        "count: **OpenVINO f32**: `openvino.convert_model` on the CPU plugin, latency hint, f32 inference "
        "precision; **OpenVINO int8**: `nncf.quantize` of that converted model on the calibration data (defaults), "
        'same plugin; **gawee.compile f32**: `gawee.compile(model, xs)`; **gawee.compile(precision="int8", '
        "calibration=...)**: the int8 precision phase with each convolution's input and residual and the "
        "classifier's input ranges measured on the calibration data (`gawee.rewrite.calibration`), the runtime "
        "gawee.compile measures fastest (oneDNN's int8 convolutions, results handed over as u8 codes). Latency: "
        "median of the timed calls "
        f"({meta['reps']} calls in {meta['passes']} passes after {meta['warmup']} warm-up calls{rounds_said(meta)}), "
        "speedup over "
        "eager in brackets; compile: wall time from the model to a callable (NNCF's quantization included). Errors "
        "and cosine similarity: against eager float32 on the example input; top-1 agreement over the calibration "
        f"images in the notes.\n\n{table}\n### gawee int8 against OpenVINO int8 (computed from the table)\n\n{checks}"
    )


def main(argv: list[str] | None = None) -> int:
    suite = {"models": MODELS, "tiny": TINY, "methods": METHODS, "builders": BUILDERS}
    args, rows = run(arguments(__doc__, MODELS, METHODS, HEADING), argv, suite, Path(__file__))
    if rows is None:
        return 0
    table, checks = markdown(rows, METHODS), verdicts(rows)
    command = "python benchmarks/bench_int8_static.py " + " ".join(argv if argv is not None else sys.argv[1:])
    versions = {}
    for name in ("openvino", "nncf"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "not installed"
    return publish(args, rows, meta_of(args, command, **versions), table, checks, HEADING, readme_section)


if __name__ == "__main__":
    sys.exit(main())
