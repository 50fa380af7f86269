"""benchmarks/bench_int8_static.py: its verdicts on fixed rows, its calibration data, and its gawee int8 worker on a
small CNN."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_int8_static
import torch
from bench_int8 import Row, measure
from bench_runtime import Quiet

ROWS = [
    Row("resnet50", "eager", latency_ms=60.0),
    Row("resnet50", "openvino_int8", latency_ms=10.0, compile_s=9.0, max_abs_error=0.3, cosine=0.9998),
    Row("resnet50", "gawee_int8", latency_ms=12.5, compile_s=3.0, max_abs_error=0.25, cosine=0.9999),
]


def test_verdicts_hold_gawee_int8_against_openvino_int8():
    text = bench_int8_static.verdicts(ROWS)
    assert "gawee int8 12.50 ms vs OpenVINO int8 10.00 ms (0.800×) — at least as fast: **no**" in text
    assert "cosine 0.999900 vs 0.999800, max abs error 0.25 vs 0.3" in text
    assert "not compared" in bench_int8_static.verdicts(ROWS[:2])


def test_both_int8_columns_calibrate_on_the_same_seeded_batches():
    xs = (torch.zeros(1, 3, 8, 8),)
    a, b = bench_int8_static.calibration(xs), bench_int8_static.calibration(xs)
    assert len(a) == bench_int8_static.CALIBRATION_BATCHES and all(x[0].shape == (1, 3, 8, 8) for x in a)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b)) and not torch.equal(a[0][0], a[1][0])


def test_the_gawee_int8_worker_calibrates_quantizes_and_times_a_small_cnn():
    quiet = Quiet(max_foreign=float("inf"), timeout_s=0.0, attempts=1)  # a smoke run: measure whatever the load
    spec = bench_int8_static.TINY["resnet50"]
    builders = bench_int8_static.BUILDERS
    row = measure("gawee_int8", "resnet50", spec, reps=2, warmup=1, passes=1, quiet=quiet, builders=builders)
    assert not row.error, row.error
    assert row.latency_ms > 0 and row.compile_s > 0
    assert row.cosine > 0.999 and 0 < row.max_abs_error < 1.0
    ran, agreement = row.note.split("; ")
    assert ran == "20 convolutions in int8" or ran.startswith("int8 not applied: float32 measured faster")
    assert agreement.startswith("top-1 agreement with eager f32 on the 16 calibration images: ")
