"""benchmarks/bench_runtime.py: each method's compile time measured in a process of its own."""

import sys
import tempfile
from pathlib import Path

import pytest
import torch

from gawee.backend import dnnl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_runtime


def test_a_compile_is_timed_in_a_fresh_process_and_a_failure_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seconds, choice = bench_runtime.isolated_compile("resnet18", 1, "fx_fuse")
    assert 0.0 < seconds < 60.0 and choice is None
    with pytest.raises(RuntimeError, match="compiling no_such_method in its own process failed"):
        bench_runtime.isolated_compile("resnet18", 1, "no_such_method")
    assert list(tmp_path.iterdir()) == []  # each process's fresh Inductor cache is removed after it


@pytest.mark.parametrize("method, exporter", [("ort_all", "onnxscript"), ("ort_all_gawee", "gawee")])
def test_an_ort_method_leaves_no_files_behind(tmp_path, monkeypatch, method, exporter):
    pytest.importorskip("onnxruntime")
    pytest.importorskip(exporter)  # torch.onnx.export needs onnxscript: the bench extra has it, dev does not
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    run, _ = getattr(bench_runtime, f"build_{method}")(net, (x,))
    assert list(tmp_path.iterdir()) == []  # the exported model was removed once the session had read it
    torch.testing.assert_close(run(x), net(x), rtol=1e-4, atol=1e-4)


def test_auto_chooses_in_a_process_of_its_own_and_the_row_times_that_runtime():
    seconds, choice = bench_runtime.isolated_compile("resnet18", 1, "gawee_auto")
    runtimes = ("torch", "onednn_graph", "onnxruntime", *(f"onednn:{layout}" for layout in dnnl.LAYOUTS))
    assert 0.0 < seconds < 120.0 and choice in runtimes
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    module, _ = bench_runtime.build_gawee_auto(net, (torch.randn(2, 4),), "onnxruntime")
    assert type(module).__name__ == "OrtModule"
    module, _ = bench_runtime.build_gawee(net, (torch.randn(2, 4),), "torch")  # the default's choice, not measured
    assert isinstance(module, torch.fx.GraphModule) and module.gawee_report.backend is None


def test_each_method_keeps_its_fastest_compile_of_the_rounds(monkeypatch):
    """One compile is one sample of a noisy machine: the rounds run every method again, and each keeps its fastest;
    a failing compile is left out, not fatal."""
    seconds = {
        "inductor": iter([9.0, 8.0]),
        "gawee": iter([3.0, 3.5]),
        "gawee_auto": iter([4.0, 2.0]),
        "gawee_dynamic": iter([5.0, 4.0]),
    }
    chosen = {
        "gawee": iter(["torch", "onednn_graph"]),
        "gawee_auto": iter(["torch", "onnxruntime"]),
        "gawee_dynamic": iter(["onednn_graph", None]),  # its fastest compile measured nothing: no choice
    }
    order = []

    def fake(name, batch, method):
        order.append(method)
        if method == "broken":
            raise RuntimeError("compiling broken in its own process failed")
        return next(seconds[method]), (next(chosen[method]) if method in chosen else None)

    monkeypatch.setattr(bench_runtime, "isolated_compile", fake)
    methods = ["eager", "inductor", "gawee", "gawee_auto", "gawee_dynamic", "broken"]
    compile_s, choices = bench_runtime.fastest_compiles("resnet18", 1, methods, runs=2)
    assert compile_s == {"inductor": 8.0, "gawee": 3.0, "gawee_auto": 2.0, "gawee_dynamic": 4.0}
    assert choices == {"gawee": "torch", "gawee_auto": "onnxruntime"}  # each from its fastest compile
    assert order == ["inductor", "gawee", "gawee_auto", "gawee_dynamic", "broken"] * 2  # rounds; eager never
