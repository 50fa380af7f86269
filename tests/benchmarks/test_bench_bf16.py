"""benchmarks/bench_bf16.py: its verdicts on fixed rows, and its gawee bf16 worker on a small CNN."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_bf16
from bench_int8 import Row, measure
from bench_runtime import Quiet

from gawee.machine import no_bf16

ROWS = [
    Row("resnet50", "eager", latency_ms=60.0),
    Row("resnet50", "inductor_bf16", latency_ms=25.0, compile_s=20.0, max_abs_error=0.07, cosine=0.99998),
    Row("resnet50", "openvino_bf16", latency_ms=20.0, compile_s=1.2, max_abs_error=0.06, cosine=0.99999),
    Row("resnet50", "gawee_bf16", latency_ms=22.0, compile_s=1.5, max_abs_error=0.08, cosine=0.99998),
]


def test_verdicts_hold_gawee_bf16_against_each_peer():
    text = bench_bf16.verdicts(ROWS)
    assert "gawee bf16 22.00 ms vs OpenVINO bf16 20.00 ms (0.909×) — at least as fast: **no**" in text
    assert "gawee bf16 22.00 ms vs Inductor, bf16 autocast 25.00 ms (1.136×) — at least as fast: **yes**" in text
    assert "cosine 0.999980 vs 0.999990, max abs error 0.08 vs 0.06" in text
    assert "OpenVINO bf16 gave no latency — not compared" in bench_bf16.verdicts(ROWS[:2] + ROWS[3:])
    assert "gawee bf16 gave no latency" in bench_bf16.verdicts(ROWS[:3])


def test_a_cpu_without_bf16_is_said_under_the_table_and_in_the_verdicts():
    skipped = Row("resnet50", "gawee_bf16", latency_ms=30.0, note="bf16 not applied: no bf16 here")
    rows = [*ROWS[:3], skipped]
    assert '- resnet50 gawee.compile(precision="bf16"): bf16 not applied: no bf16 here' in bench_bf16.markdown(
        rows, bench_bf16.METHODS
    )
    assert "gawee bf16 not applied: no bf16 here (its row is float32)" in bench_bf16.verdicts(rows)


def test_the_gawee_bf16_worker_builds_compares_and_times_a_small_cnn():
    quiet = Quiet(max_foreign=float("inf"), timeout_s=0.0, attempts=1)  # a smoke run: measure whatever the load
    spec = bench_bf16.TINY["resnet50"]
    row = measure("gawee_bf16", "resnet50", spec, reps=2, warmup=1, passes=1, quiet=quiet, builders=bench_bf16.BUILDERS)
    assert not row.error, row.error
    assert row.latency_ms > 0 and len(row.latencies_ms) == 2 and row.compile_s > 0
    assert row.cosine > 0.999 and row.max_abs_error < 1.0
    assert (row.note == "") == (no_bf16() is None)  # float32 where the CPU has no bf16, and the row says so
