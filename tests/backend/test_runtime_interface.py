"""The runtime interface: every registered runtime implements it, and adding a runtime is one record.

The fake runtime below is registered by the test alone, without a line of ``gawee/backend/compiler.py`` changing,
and ``gawee.compile`` selects it by name and by ``backend="auto"``: that is what "adding a runtime is its module
plus one record" means. It is unregistered afterwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import gawee
from gawee.backend import compiler, measure, runtime
from gawee.backend.host import InputSignature, arrange, as_structure
from gawee.backend.runtime import Runtime
from gawee.errors import GaweeError
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.ruleset import RuleSet, load_rules_text


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return {"logits": self.head(y.mean((2, 3))), "features": y}


def _block():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(2, 3, 8, 8)


def _small_graph():
    b = GraphBuilder("small")
    return b.output(b.relu(b.input("x", "f32[2,3]")))


def test_every_registered_runtime_implements_the_interface():
    assert runtime.names() == ("torch", "onednn", "onednn_graph", "onnxruntime", "iree")
    graph = _small_graph()
    for name in runtime.names():
        rt = runtime.get(name)
        assert isinstance(rt, Runtime) and rt.name == name and rt.title, name
        assert not type(rt).__abstractmethods__, name
        why = rt.unavailable()
        assert why is None or (isinstance(why, str) and why), (name, why)
        if why is None:
            for answer in (rt.cannot_run(graph), rt.unpromising(graph)):
                assert answer is None or (isinstance(answer, str) and answer), (name, answer)
        assert isinstance(rt.cpu_only, bool) and isinstance(rt.isolated, bool), name
        assert isinstance(rt.auto, bool) and isinstance(rt.whole_graph, bool), name
        assert all(isinstance(v, str) and v and ":" not in v for v in rt.variants), name
        assert all(isinstance(k, str) for k in rt.options) and isinstance(rt.mismatch_hint, str), name
        assert rt.rules is None or isinstance(rt.rules, RuleSet), name
    assert runtime.baseline() is runtime.get("torch")
    assert runtime.baseline().unavailable() is None and not runtime.baseline().cpu_only
    assert runtime.get("onednn").variants == ("per_conv", "blocked", "channels_last")


def test_the_compiler_names_no_runtime_and_imports_none_of_their_modules():
    """Selection goes through the registry: ``compiler.py`` holds no runtime's name as a value to compare (the
    default of ``backend=`` aside), and takes nothing from a runtime's module but the torch lowering's options
    (``gawee.compile``'s own argument)."""
    tree = ast.parse(Path(compiler.__file__).read_text(encoding="utf-8"))
    defaults = {id(d) for f in ast.walk(tree) if isinstance(f, ast.arguments) for d in (*f.defaults, *f.kw_defaults)}
    literals = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in defaults
    }
    assert not literals & set(runtime.names())
    modules = {module for _, module in runtime.BUILTIN}
    taken = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in modules
        for alias in node.names
    }
    assert taken == {("gawee.backend.torch_backend", "TorchOptions")}


class Interpreted:
    """The fake runtime's module: the graph run by gawee's reference interpreter, taking and returning what every
    runtime's module does."""

    def __init__(self, graph, output_structure):
        self.graph = graph
        self.signature = InputSignature.of(graph)
        self.output_structure = None if output_structure is None else as_structure(output_structure)

    def __call__(self, *args, **kwargs):
        return arrange(list(gawee.run(self.graph, *self.signature.inputs(args, kwargs))), self.output_structure)


class Fake(Runtime):
    """A runtime that a test registers: its module interprets the graph; ``why`` makes it unavailable."""

    name = "fake"
    title = "the fake runtime"
    variants = ()

    def __init__(self, why: str | None = None, variants: tuple[str, ...] = ()):
        self.why = why
        self.variants = variants
        self.built: list[tuple[str, str]] = []

    def unavailable(self) -> str | None:
        return self.why

    def cannot_run(self, graph) -> str | None:
        return "symbolic shapes" if any(v.type.symbolic for v in graph.inputs) else None

    def build(self, graph, example_inputs, *, output_structure=None, variant: str = ""):
        self.built.append((graph.name, variant))
        return Interpreted(graph, output_structure)


@pytest.fixture
def fake():
    """A Fake registered after the built-in runtimes for one test, then unregistered."""
    registered = []

    def register(**kwargs) -> Fake:
        rt = Fake(**kwargs)
        runtime.register(rt)
        registered.append(rt.name)
        return rt

    yield register
    for name in registered:
        runtime.unregister(name)
    assert "fake" not in runtime.names()


def _assert_runs_like(module, model, x):
    with torch.no_grad():
        got, want = module(x), model(x)
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_a_registered_runtime_is_selected_by_name(fake):
    rt = fake()
    assert runtime.names()[-1] == "fake" and runtime.get("fake") is rt
    model, x = _block()
    module = gawee.compile(model, (x,), backend="fake")
    assert isinstance(module, Interpreted) and rt.built == [("Block", "")]
    assert module.gawee_report.backend is None and module.gawee_report.backend_error < 1e-5
    _assert_runs_like(module, model, x)
    with pytest.raises(GaweeError, match="a runtime named 'fake' is registered already"):
        runtime.register(Fake())


def test_a_registered_runtime_with_variants_is_measured_or_fixed_by_name(fake, monkeypatch):
    rt = fake(variants=("slow", "quick"))
    given = []

    def fastest(candidates, inputs, **kwargs):
        given.append(list(candidates))
        return measure.Timings({name: 0.001 for name in candidates}, "fake:quick")

    monkeypatch.setattr(measure, "fastest", fastest)
    model, x = _block()
    module = gawee.compile(model, (x,), backend="fake")
    assert given == [["fake:slow", "fake:quick"]] and module.gawee_report.backend.chosen == "fake:quick"
    assert gawee.compile(model, (x,), backend="fake:slow").gawee_report.backend.chosen == "fake:slow"
    assert [variant for _, variant in rt.built] == ["slow", "quick", "slow"]
    with pytest.raises(GaweeError, match="unknown backend 'fake:other'") as caught:
        gawee.compile(model, (x,), backend="fake:other")
    assert "'fake:quick'" in caught.value.hint


class Phased(Fake):
    """A Fake with a target phase and a phase for its variant ``v``, each firing a rule named ``step`` once."""

    name = "phased"

    @property
    def rules(self) -> RuleSet:
        text = 'rule step:\n    conv2d(x, w, b, act="relu", ...attrs) => relu(conv2d(x, w, b, act=none, ...attrs))\n'
        return load_rules_text(text, "target.rules")

    def variant_rules(self, variant: str) -> RuleSet | None:
        text = (
            'rule step:\n    conv2d(x, w, b, act=none, ...attrs) |> relu() => conv2d(x, w, b, act="relu", ...attrs)\n'
        )
        return load_rules_text(text, "v.rules") if variant == "v" else None


def test_a_variant_is_built_from_its_phase_after_the_target_phase_and_the_report_counts_both():
    rt = Phased(variants=("v", "plain"))
    runtime.register(rt)
    try:
        model, x = _block()
        module = gawee.compile(model, (x,), backend="phased:v")
        assert module.gawee_report.backend.target_rules == {"step": 2}  # once in each phase, summed
        assert [n.op for n in module.graph].count("relu") == 0  # the variant's phase undid the target phase's
        module = gawee.compile(model, (x,), backend="phased:plain")  # a variant without a phase of its own
        assert module.gawee_report.backend.target_rules == {"step": 1}
        assert [n.op for n in module.graph].count("relu") == 1
        _assert_runs_like(module, model, x)
    finally:
        runtime.unregister("phased")


def test_a_registered_runtime_is_a_candidate_of_auto(fake, monkeypatch):
    rt = fake()
    for other in runtime.runtimes():  # only the baseline and the fake are measured: the test stays short
        if other.name not in ("torch", "fake"):
            monkeypatch.setattr(other, "auto", False)
    given = []

    def fastest(candidates, inputs, **kwargs):
        given.append(list(candidates))
        return measure.Timings({"torch": 0.002, "fake": 0.001}, "fake")

    monkeypatch.setattr(measure, "fastest", fastest)
    model, x = _block()
    module = gawee.compile(model, (x,), backend="auto")
    assert given == [["torch", "fake"]] and rt.built == [("Block", "")]
    assert isinstance(module, Interpreted) and module.gawee_report.backend.chosen == "fake"
    assert "runtime: fake (torch 2.00 ms, fake 1.00 ms per call)" in str(module.gawee_report)
    _assert_runs_like(module, model, x)


def test_an_unavailable_runtime_is_refused_by_name_and_left_out_of_auto_with_its_reason(fake, monkeypatch):
    rt = fake(why="the fake library is not installed")
    model, x = _block()
    with pytest.raises(GaweeError, match="the fake runtime cannot run on this machine: the fake library"):
        gawee.compile(model, (x,), backend="fake")
    for other in runtime.runtimes():
        if other.name not in ("torch", "fake"):
            monkeypatch.setattr(other, "auto", False)
    choice = gawee.compile(model, (x,), backend="auto").gawee_report.backend
    assert choice.chosen == "torch" and choice.not_candidates == {"fake": "the fake library is not installed"}
    assert rt.built == []


def test_what_a_registered_runtime_cannot_run_is_said_by_name(fake):
    fake()
    model, x = _block()
    batch = torch.export.Dim("batch", min=1, max=8)
    with pytest.raises(GaweeError, match="Block cannot run on the fake runtime: symbolic shapes"):
        gawee.compile(model, (x,), backend="fake", dynamic_shapes={"x": {0: batch}})
