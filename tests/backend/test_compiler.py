"""gawee.compile and the torch.compile backend: one call from a model to an equivalent module."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import gawee
from gawee.backend import TorchOptions, compiler, dnnl
from gawee.backend.compiler import CompileReport
from gawee.errors import EquivalenceError


class Block(nn.Module):
    """conv-bn-relu with a residual and two outputs in a dict: exercises fusion and output structure."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return {"features": y, "logits": self.head(y.mean((2, 3)))}


def block() -> nn.Module:
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so folding is really tested
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    return model


def test_compile_returns_an_equivalent_module_with_the_models_output_structure():
    model, x = block(), torch.randn(2, 4, 8, 8)
    module = gawee.compile(model, (x,))
    report = module.gawee_report
    assert isinstance(report, CompileReport) and report.equivalence.ok
    assert not any(n.op == "batch_norm" for n in report.optimized)
    assert set(report.seconds) == {"capture", "rewrite", "verify", "lower"}
    with torch.no_grad():
        expected, got = model(x), module(x)
    assert set(got) == {"features", "logits"}
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4)


def test_what_a_selections_builds_shared_is_let_go_of_before_the_timing(monkeypatch):
    """The dicts a runtime's variants share while they are built (oneDNN's kernel times, the scratch memory its
    races run on) are emptied once the candidates are built: the modules do not need them, and the memory would
    be held through the timing."""
    shared, builds = [], compiler._builds

    def building(rt, graph, xs, structure, variant, given, work):
        shared.append(work)
        return builds(rt, graph, xs, structure, variant, given, work)

    monkeypatch.setattr(compiler, "_builds", building)
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_MIN_BUDGET_S", 1e9)  # measured, however long a call takes
    model, x = block(), torch.randn(1, 4, 8, 8)
    module = gawee.compile(model, (x,))
    if dnnl.unavailable() is None:  # oneDNN's variants were built (sharing one dict) and timed
        assert any(name.startswith("onednn:") for name in module.gawee_report.backend.seconds)
    assert shared and all(not work for work in shared)


@pytest.mark.parametrize("whole_graph", ["measure", False])
def test_compile_refuses_a_module_that_disagrees_with_the_model(monkeypatch, whole_graph):
    # both ways the torch lowering is built: alone (to_torch), and in each layout for the whole-graph choice
    from gawee.backend import torch_backend

    lowering = torch_backend._lowering

    def wrong_lowering(graph, options, output_structure):
        options, build = lowering(graph, options, output_structure)

        def wrong_build(g):
            module = build(g)
            return lambda x: {k: v + 1 for k, v in module(x).items()}

        return options, wrong_build

    monkeypatch.setattr(torch_backend, "_lowering", wrong_lowering)  # what every torch module is built with
    with pytest.raises(EquivalenceError, match="differs from the model"):
        gawee.compile(block(), (torch.randn(1, 4, 8, 8),), options=TorchOptions(whole_graph=whole_graph))


def test_torch_compile_backend_gawee():
    torch._dynamo.reset()
    model, x = block(), torch.randn(1, 4, 8, 8)
    compiled = torch.compile(model, backend="gawee")
    with torch.no_grad():
        got, expected = compiled(x), model(x)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4)


def test_torch_compile_backend_leaves_autograd_alone():
    torch._dynamo.reset()
    model, x = block(), torch.randn(1, 4, 8, 8)
    compiled = torch.compile(model, backend="gawee")
    out = compiled(x)  # grad mode on and parameters require grad: run as traced, gradients flow
    out["logits"].sum().backward()
    assert model.head.weight.grad is not None


def test_torch_compile_backend_runs_dynamic_shapes_as_traced(caplog):
    torch._dynamo.reset()
    model = block()
    compiled = torch.compile(model, backend="gawee", dynamic=True)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="gawee.backend.dynamo"):
        for size in (8, 10):
            x = torch.randn(1, 4, size, size)
            torch.testing.assert_close(compiled(x)["logits"], model(x)["logits"])
    assert "dynamic shapes" in caplog.text


def test_compile_blames_an_unsound_rewrite_rather_than_the_lowering(tmp_path):
    """The end-to-end check fails; interpreting both graphs then says the rewrite is at fault."""
    bad = tmp_path / "bad.rules"
    bad.write_text("# relu(x) -> x (unsound)\nrule drop_relu: relu(x) => x\n")
    with pytest.raises(EquivalenceError, match=r"rewritten graph of .* differs from the captured one"):
        gawee.compile(block(), (torch.randn(1, 4, 8, 8),), gawee.load_rules(str(bad)))


def test_an_approximate_output_of_another_runtime_is_held_to_twice_the_lowerings_error():
    """Another runtime of a graph with approximate outputs: each such output may be APPROXIMATE_SLACK times as far
    from the model's as the torch lowering's (its own roundings fall otherwise), and no farther; the others keep the
    float tolerance."""
    torch.manual_seed(0)
    want, exact = torch.randn(4, 8), torch.randn(3)
    lowering = compiler._check_backend("m", [want, exact], [want + 0.5, exact], approximate=frozenset({0}))
    bounds = compiler._approximate_bounds(lowering, frozenset({0}))
    assert bounds == {0: compiler.APPROXIMATE_SLACK * lowering[0].max_error}
    checks = compiler._check_backend("m", [want, exact], [want - 0.9, exact], bounds=bounds)
    assert checks[0].approximate and not checks[1].approximate
    with pytest.raises(EquivalenceError, match=r"output 0 .* by 1\.1, more than 2 times the torch lowering's 0\.5"):
        compiler._check_backend("m", [want, exact], [want + 1.1, exact], bounds=bounds)
    with pytest.raises(EquivalenceError, match=r"output 1 .*tolerance"):
        compiler._check_backend("m", [want, exact], [want, exact + 0.1], bounds=bounds)


def test_a_bf16_compile_measures_onednns_bf16_modules_and_reports_the_returned_modules_accuracy(monkeypatch):
    """With the bf16 precision phase the whole-graph choice still measures oneDNN's primitives (they run bf16), each
    held to twice the lowering's error; the report's accuracy is the returned module's, whichever runtime won."""
    if dnnl.unavailable() is not None:
        pytest.skip(dnnl.unavailable())
    monkeypatch.setattr(compiler, "no_bf16", lambda device: None)  # a CPU with bf16 arithmetic, whichever runs this
    model, x = block(), torch.randn(2, 4, 8, 8)
    module = gawee.compile(model, (x,), precision="bf16", options=TorchOptions(precision="always"))
    report = module.gawee_report
    assert report.precision == "bf16" and report.rewrite.firings["conv2d_bf16_residual"] == 1
    measured = [name for name in report.backend.seconds if name.startswith("onednn:")]
    assert measured and "onednn" not in report.backend.not_candidates, report.backend
    with torch.no_grad():
        want, got = model(x), module(x)
    flat = lambda out: [out["features"], out["logits"]]
    assert report.accuracy == gawee.accuracy.compare_outputs(flat(want), flat(got))
    assert report.accuracy.max_abs_error > 0 and report.accuracy.cosine > 0.99


def test_a_long_call_after_a_short_compile_is_still_measured(monkeypatch):
    """resnet18 and resnet50 at batch 8: their torch lowerings built in a second or two, and their first calls took
    about a tenth and a sixth of a second, so measuring cost more than the compile so far; the whole-graph runtimes,
    which run them much faster, are measured all the same (``WHOLE_GRAPH_MIN_BUDGET_S``). One whose measuring would
    cost more than that and than the compile so far is not."""
    measured = []

    def choice(*args, **kwargs):
        measured.append(args[1])
        return args[1], None, None

    monkeypatch.setattr(compiler, "whole_graph_choice", choice)
    for first_call_s, compile_s in ((0.09, 0.9), (0.17, 2.6)):
        measured.clear()
        assert compiler._whole_graph(None, "lowering", None, [], [], first_call_s, compile_s)[0] == "lowering"
        assert measured, (first_call_s, compile_s)
    measured.clear()
    module, why, _ = compiler._whole_graph(None, "lowering", None, [], [], 0.3, 2.6)
    assert module == "lowering" and not measured
    assert all("over the budget of 3.5 s" in w for w in why.not_candidates.values())
