"""The ONNX Runtime backend and gawee.compile's measured choice of runtime (backend="auto")."""

import time

import pytest
import torch

import gawee
from gawee.backend import dnnl, measure, onednn_graph
from gawee.backend.compiler import BackendChoice
from gawee.backend.measure import fastest
from gawee.backend.onednn_graph import OneDNNGraphModule
from gawee.backend.ort import OrtModule
from gawee.errors import GaweeError
from gawee.ir.symbolic import ShapeOutOfRange
from tests.backend.test_measure import FakeClock, candidate

pytest.importorskip("onnxruntime")


class Net(torch.nn.Module):
    """conv + BN + ReLU, a residual add, pooling and a head; two outputs in a dict."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y) + y)
        feats = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return {"logits": self.head(feats), "feats": feats}


PRIMITIVES = {f"onednn:{layout}" for layout in dnnl.LAYOUTS} if dnnl.unavailable() is None else set()
RUNTIMES = {"torch", "onnxruntime"} | ({"onednn_graph"} if onednn_graph.unavailable() is None else set()) | PRIMITIVES
"""What auto measures here (oneDNN Graph where it passes its trial, oneDNN's primitives where installed)."""


def _net():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    return net, torch.randn(2, 3, 16, 16)


def assert_runs_like_the_net(module, net):
    """Equal outputs on another input, in the net's own nesting; an input of another shape is a ShapeOutOfRange."""
    x2 = torch.randn(2, 3, 16, 16)
    got, want = module(x2), net(x2)
    assert set(got) == {"logits", "feats"}
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeOutOfRange, match=r"input x dimension 0 is 1, the graph needs 2 \(static\)"):
        module(torch.randn(1, 3, 16, 16))


def test_onnxruntime_backend_runs_the_rewritten_graph_and_keeps_the_output_structure():
    net, x = _net()
    module = gawee.compile(net, (x,), backend="onnxruntime")
    assert isinstance(module, OrtModule)
    assert module.gawee_report.backend is None  # asked for, not chosen
    assert_runs_like_the_net(module, net)


def test_auto_measures_both_runtimes_and_returns_the_chosen_one():
    net, x = _net()
    module = gawee.compile(net, (x,), backend="auto")
    choice = module.gawee_report.backend
    assert isinstance(choice, BackendChoice) and set(choice.not_candidates) <= {"onednn_graph", "onednn"}
    assert set(choice.seconds) == RUNTIMES and all(s > 0 for s in choice.seconds.values())
    assert isinstance(module, OrtModule) == (choice.chosen == "onnxruntime")
    assert isinstance(module, OneDNNGraphModule) == (choice.chosen == "onednn_graph")
    if choice.chosen != "torch":  # only when another runtime measured more than 5% faster
        assert choice.seconds[choice.chosen] < 0.95 * choice.seconds["torch"]
    assert f"runtime: {choice.chosen} (" in str(module.gawee_report)
    torch.testing.assert_close(module(x)["logits"], net(x)["logits"], rtol=1e-4, atol=1e-4)


def test_auto_keeps_the_torch_lowering_for_symbolic_shapes_and_says_why():
    net, x = _net()
    batch = torch.export.Dim("batch", min=1, max=8)
    module = gawee.compile(net, (x,), backend="auto", dynamic_shapes={"x": {0: batch}})
    choice = module.gawee_report.backend
    assert choice.chosen == "torch" and not choice.seconds
    assert "symbolic input shapes" in choice.not_candidates["onnxruntime"]
    assert "static shapes only" in choice.not_candidates["onednn_graph"] or onednn_graph.unavailable() is not None
    assert "symbolic shapes" in choice.not_candidates["onednn"] or dnnl.unavailable() is not None
    assert module(torch.randn(3, 3, 16, 16))["logits"].shape == (3, 4)
    with pytest.raises(GaweeError, match="symbolic input shapes"):
        gawee.compile(net, (x,), backend="onnxruntime", dynamic_shapes={"x": {0: batch}})


def test_auto_keeps_the_torch_lowering_when_ort_disagrees_or_fails(monkeypatch):
    net, x = _net()
    monkeypatch.setattr(
        OrtModule, "forward", lambda self, *xs: {"logits": torch.zeros(2, 4), "feats": torch.zeros(2, 16)}
    )
    module = gawee.compile(net, (x,), backend="auto")
    choice = module.gawee_report.backend
    assert choice.chosen != "onnxruntime" and "differ from the model's" in choice.not_candidates["onnxruntime"]

    def broken(self, *xs):
        raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no kernel")

    monkeypatch.setattr(OrtModule, "forward", broken)
    choice = gawee.compile(net, (x,), backend="auto").gawee_report.backend
    assert "fails to run it: [ONNXRuntimeError]" in choice.not_candidates["onnxruntime"]


class Lookup(torch.nn.Module):
    """Indices into a table of 2 rows: an input drawn at random (0-3) is outside its domain."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(2, 4)

    def forward(self, ids):
        return self.table(ids) * 2


def test_auto_compares_and_times_the_runtimes_on_the_example_inputs():
    ids, model = torch.tensor([[0, 1, 1, 0, 1]]), Lookup()
    module = gawee.compile(model, (ids,), backend="auto")
    choice = module.gawee_report.backend
    assert set(choice.seconds) == RUNTIMES - PRIMITIVES  # oneDNN's primitives compute in float32 only
    assert "computes in i64 (float32 and bfloat16 only)" in choice.not_candidates.get("onednn", "") or not PRIMITIVES
    with torch.no_grad():
        torch.testing.assert_close(module(ids), model(ids))


def test_unknown_backend_names_the_choices():
    net, x = _net()
    with pytest.raises(GaweeError, match="unknown backend") as e:
        gawee.compile(net, (x,), backend="ort")
    assert "'onnxruntime'" in e.value.hint and "'auto'" in e.value.hint


def test_fastest_keeps_the_default_on_a_tie_and_takes_a_clear_winner(monkeypatch):
    calls = {"a": 0, "b": 0}

    def sleeper(name, seconds):
        def run(*_):
            calls[name] += 1
            time.sleep(seconds)

        return run

    slow, fast = sleeper("a", 0.004), sleeper("b", 0.0005)
    timed = fastest({"default": slow, "other": fast}, [])
    assert timed.chosen == "other" and timed.seconds["other"] < timed.seconds["default"]
    timed = fastest({"default": sleeper("a", 0.002), "other": sleeper("b", 0.002)}, [], margin=0.5)
    assert timed.chosen == "default"
    # different runtimes: a pause, untimed calls, then several timed calls per round (for two within FAR), counted
    # on a clock that advances by exactly what each call takes: a loaded machine's oversleep cannot put them FAR apart
    clock = FakeClock()
    monkeypatch.setattr(measure, "time", clock)
    close_a, close_b = candidate(clock, 0.004), candidate(clock, 0.0038)
    fastest({"default": close_a, "other": close_b}, [], settle_s=0.01)
    assert len(close_b.calls) >= 2 + 2 * (2 + 2)  # first calls, then two rounds of (untimed + timed)
    monkeypatch.setattr(measure, "time", time)
    # calls of 50 ms or more: one untimed call per round
    long_a, long_b = sleeper("a", 0.06), sleeper("b", 0.05)
    before = dict(calls)
    fastest({"default": long_a, "other": long_b}, [], settle_s=0.01, budget_s=0.0)
    assert calls["b"] - before["b"] == 2 + 2 * (1 + 2)
