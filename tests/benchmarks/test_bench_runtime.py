"""benchmarks/bench_runtime.py: each method's compile time measured in a process of its own."""

import gc
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
    torch.testing.assert_close(run(x), net(x), rtol=1e-4, atol=1e-4)
    assert len(run.optimized_graph()) == 16
    del run
    gc.collect()
    assert list(tmp_path.iterdir()) == []  # the exported model went with the session's callable


def _reshape_model(path, allowzero: int | None, width: int = 4) -> None:
    """x [1, width, 2, 2] -> Conv 1x1 -> Reshape to [1, -1]: a model ORT's optimizer keeps two nodes of."""
    import numpy
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = numpy.random.default_rng(width + (allowzero or 0))
    w = numpy_helper.from_array(rng.standard_normal((width, width, 1, 1)).astype(numpy.float32), "w")
    shape = numpy_helper.from_array(numpy.array([1, -1], dtype=numpy.int64), "shape")
    extra = {} if allowzero is None else {"allowzero": allowzero}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"], **extra)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width, 2, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4 * width])],
        [w, shape],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_the_optimized_graph_digest_names_what_ort_runs_not_names_or_weights(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    digests = {}
    for name, allowzero, width in [("a", None, 4), ("b", 1, 4), ("c", None, 8)]:
        (tmp_path / name).mkdir()
        path = tmp_path / name / "model.onnx"
        _reshape_model(path, allowzero, width)
        digests[name] = bench_runtime.optimized_graph(ort, path, level)
    assert digests["a"] == digests["b"]  # other weights; allowzero on a shape without a zero means nothing
    assert digests["a"] != digests["c"]  # other shapes


def test_ort_export_rows_are_met_where_measured_or_where_ort_runs_the_same_graph():
    def row(model, method, ms, graph):
        return bench_runtime.Result(model, 1, method, latency_ms=ms, ok=True, ort_graph=graph)

    same = [row("a", "ort_all", 10.0, "d1"), row("a", "ort_all_gawee", 10.3, "d1")]
    ahead = [row("b", "ort_all", 10.0, "d2"), row("b", "ort_all_gawee", 9.0, "d3")]
    behind = [row("c", "ort_all", 10.0, "d4"), row("c", "ort_all_gawee", 11.0, "d5")]
    text = bench_runtime.ort_export_targets(same + ahead)
    assert "measured on 1 of 2 rows" in text and "same graph of both on 1 of 2 rows" in text and "**met**" in text
    text = bench_runtime.ort_export_targets(same + ahead + behind)
    assert "**not met** (behind on c b1 (0.909×))" in text


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
