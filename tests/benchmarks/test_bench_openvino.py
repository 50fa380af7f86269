"""benchmarks/bench_runtime.py's OpenVINO column: measured in a process of its own, or a row that says why not."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_runtime

META = {
    "reps": 3,
    "warmup": 1,
    "passes": 1,
    "max_foreign": 0.15,
    "machine": {"cpu": "cpu", "cores": 2, "torch_threads": 2, "torch": "t", "onnxruntime": "o", "openvino": "v"},
}


def _row(method, ms=None, error="", ok=True):
    return bench_runtime.Result("m", 1, method, latency_ms=ms, compile_s=1.0 if ms else None, ok=ok, error=error)


def test_the_table_has_an_openvino_column_and_says_when_it_is_not_installed():
    missing = f"{bench_runtime.NOT_INSTALLED}: No module named 'openvino' (pip install openvino)"
    rows = [_row("eager", 10.0), _row("openvino", 5.0), _row("gawee", 4.0)]
    text = bench_runtime.markdown(rows, META)
    header = text.splitlines()[2]
    assert header.index(bench_runtime.METHODS["openvino"]) < header.index("gawee.compile")
    assert "| 5.0 ms (2.00×)<br>compile 1.0 s |" in text and ", openvino v." in text
    for r, load in zip(rows, (0.9, 0.0, 0.9)):
        r.foreign_load = load  # OpenVINO's process timed it while the machine was quieter: its cell says so
    text = bench_runtime.markdown(rows, META)
    assert "| 5.0 ms (2.00×)<br>compile 1.0 s<br>timed with 0.00 cores busy elsewhere |" in text
    assert text.count("busy elsewhere |") == 2 and text.rstrip().endswith("| 0.90 cores |")  # header, row
    text = bench_runtime.markdown([_row("eager", 10.0), _row("openvino", error=missing, ok=False)], META)
    assert "| not installed |" in text and f"- ⚠ m b1 {bench_runtime.METHODS['openvino']}: {missing}" in text
    text = bench_runtime.markdown([_row("eager", 10.0), _row("openvino", error="its process: killed", ok=False)], META)
    assert "| failed |" in text


@pytest.fixture
def no_waiting(monkeypatch):
    monkeypatch.setattr(bench_runtime, "wait_for_quiet", lambda *args: 0.0)


def test_a_missing_package_is_a_row_without_a_process(monkeypatch, no_waiting):
    monkeypatch.setattr(bench_runtime.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(bench_runtime, "run_worker", lambda *a, **k: pytest.fail("no process for a missing package"))
    row = bench_runtime.in_own_process("m", 1, "openvino", 3, 1, 1, bench_runtime.Quiet())
    assert row.error.startswith(bench_runtime.NOT_INSTALLED) and "pip install" in row.error and row.latency_ms is None
    assert bench_runtime.fastest_compiles("m", 1, ["eager", "openvino"], runs=2) == ({}, {})  # not tried either


def test_the_process_gets_the_row_and_torch_threads_and_its_failure_is_the_row(monkeypatch, no_waiting):
    monkeypatch.setattr(bench_runtime.importlib.util, "find_spec", lambda name: object())
    calls = []

    def worker(script, args, *, timeout, threads):
        calls.append((args, threads))
        row = bench_runtime.Result("m", 8, "openvino", latency_ms=2.0, latencies_ms=[2.0], max_error=1e-7, ok=True)
        return (bench_runtime.asdict(row), "", 1.0) if len(calls) == 1 else (None, "exit status 1: boom", 1.0)

    monkeypatch.setattr(bench_runtime, "run_worker", worker)
    quiet = bench_runtime.Quiet(max_foreign=0.5)
    row = bench_runtime.in_own_process("m", 8, "openvino", 7, 2, 3, quiet)
    assert row.ok and row.latency_ms == 2.0 and row.batch == 8
    args, threads = calls[0]
    assert args[:6] == ["--own-process", "openvino", "--models", "m", "--batches", "8"]
    assert args[args.index("--reps") + 1] == "7" and args[args.index("--max-foreign-load") + 1] == "0.5"
    assert threads == torch.get_num_threads()
    row = bench_runtime.in_own_process("m", 8, "openvino", 7, 2, 3, quiet)
    assert row.error == "its process: exit status 1: boom" and not row.ok


def test_the_openvino_worker_builds_checks_and_times_a_tiny_model(monkeypatch):
    pytest.importorskip("openvino", reason="the bench extra: pip install 'gawee[bench]'")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4)
    ).eval()
    monkeypatch.setattr(bench_runtime, "make_model", lambda name, batch: (net, (torch.randn(batch, 3, 8, 8),)))
    monkeypatch.setattr(bench_runtime, "warm_up_toolchains", lambda methods: 0.0)
    quiet = bench_runtime.Quiet(max_foreign=float("inf"), attempts=1)
    row = bench_runtime.own_process_row("openvino", "tiny", 2, reps=3, warmup=1, passes=1, quiet=quiet)
    assert row.ok, row.error
    assert row.max_error <= bench_runtime.RELATIVE_TOLERANCE and row.compile_s > 0
    assert len(row.latencies_ms) == 3 and row.latency_ms == sorted(row.latencies_ms)[1]
