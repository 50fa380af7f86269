"""oneDNN Graph as a runtime: the rewritten graph traced, frozen and compiled into fused partitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.backend import dnnl, onednn_graph
from gawee.backend.onednn_graph import OneDNNGraphModule
from gawee.errors import GaweeError
from gawee.ir.builder import GraphBuilder
from tests.backend.test_attention_kernels import measuring_wins
from tests.backend.test_ort import _net, assert_runs_like_the_net

needs_fuser = pytest.mark.skipif(onednn_graph.unavailable() is not None, reason="no working oneDNN Graph fuser here")

PRIMITIVES = [f"onednn:{v}" for v in dnnl.RUNTIME.variants] if dnnl.unavailable() is None else []
"""The default compile's other whole-graph candidates: oneDNN's primitives in each layout (gawee.backend.dnnl)."""

TORCH = ["torch", "torch:channels_last"]
"""The torch lowering among them: without and with its layout phase (the net's convolutions: gawee.backend.layout)."""


@needs_fuser
def test_backend_compiles_fused_partitions_equal_to_the_model_and_restores_the_fuser_flag():
    net, x = _net()
    before = torch.jit.onednn_fusion_enabled()
    module = gawee.compile(net, (x,), backend="onednn_graph")
    assert torch.jit.onednn_fusion_enabled() == before
    assert isinstance(module, OneDNNGraphModule) and module.partitions > 0
    assert_runs_like_the_net(module, net)


@needs_fuser
def test_static_float32_graphs_only():
    b = GraphBuilder("half")
    half = b.output(b.relu(b.input("x", "f16[2,3]")))
    assert "float32" in onednn_graph.supports(half)
    with pytest.raises(GaweeError, match="float32 graphs only"):
        OneDNNGraphModule(half, [torch.randn(2, 3).half()])
    net, x = _net()
    graph = gawee.capture(net, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=8)}})
    assert "static shapes" in onednn_graph.supports(graph)


@needs_fuser
def test_auto_names_a_runtime_it_could_not_build(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise RuntimeError("tracer: something torch.jit cannot record")

    monkeypatch.setattr(OneDNNGraphModule, "__init__", refuse)
    net, x = _net()
    choice = gawee.compile(net, (x,), backend="auto").gawee_report.backend
    assert "torch.jit cannot record" in choice.not_candidates["onednn_graph"]
    assert "onednn_graph" not in choice.seconds


def _wins(monkeypatch, winner: str) -> list:
    """``measure.fastest`` with ``winner`` chosen (the torch lowering where it is no candidate): the candidates it
    was given are recorded."""
    from gawee.backend import measure

    given = []

    def fastest(candidates, inputs, **kwargs):
        given.append(list(candidates))
        return measure.Timings({name: 0.001 for name in candidates}, winner if winner in candidates else "torch")

    monkeypatch.setattr(measure, "fastest", fastest)
    return given


@needs_fuser
@pytest.mark.parametrize("winner", ["torch", "onednn_graph"])
def test_the_default_compile_keeps_the_runtime_that_measured_faster(monkeypatch, winner):
    given = _wins(monkeypatch, winner)
    net, x = _net()
    module = gawee.compile(net, (x,))
    assert given == [[*TORCH, *PRIMITIVES, "onednn_graph"]]
    report = module.gawee_report
    assert report.backend.chosen == winner and f"runtime: {winner}" in str(report)
    assert isinstance(module, OneDNNGraphModule) == (winner == "onednn_graph")
    assert isinstance(module, torch.fx.GraphModule) == (winner == "torch")
    assert report.backend_error < 1e-4
    x2 = torch.randn(2, 3, 16, 16)
    got, want = module(x2), net(x2)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)


@needs_fuser
def test_the_default_compile_measures_the_whole_graph_runtime_only_where_that_costs_less_than_the_compile(monkeypatch):
    from gawee.backend import compiler

    given = _wins(monkeypatch, "onednn_graph")
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_MIN_BUDGET_S", 0.0)
    # a thousand times the compile so far: a warm compile of this tiny net takes a few of its calls' time, so
    # whether 16 calls fit in one compile's time was the machine's to say
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_SHARE", 1e3)
    net, x = _net()
    module = gawee.compile(net, (x,))  # a call of a millisecond: 16 of them cost less than that budget
    assert given == [[*TORCH, *PRIMITIVES, "onednn_graph"]] and module.gawee_report.backend.chosen == "onednn_graph"
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_CALLS", 1e9)  # now they would cost more
    module = gawee.compile(net, (x,))
    assert len(given) == 1 and isinstance(module, torch.fx.GraphModule)
    why = module.gawee_report.backend.not_candidates["onednn_graph"]
    assert "measuring would cost about" in why and "over the budget" in why


@needs_fuser
def test_whole_graph_false_keeps_the_lowering_without_measuring(monkeypatch):
    given = _wins(monkeypatch, "onednn_graph")
    net, x = _net()
    module = gawee.compile(net, (x,), options=gawee.TorchOptions(whole_graph=False))
    assert given == [] and module.gawee_report.backend is None and isinstance(module, torch.fx.GraphModule)
    with pytest.raises(GaweeError, match="whole_graph"):
        gawee.compile(net, (x,), options=gawee.TorchOptions(whole_graph=True))


@needs_fuser
def test_a_whole_graph_runtime_that_computes_something_else_is_not_chosen(monkeypatch):
    given = _wins(monkeypatch, "onednn_graph")
    forward = OneDNNGraphModule.forward

    def off(self, *inputs):
        out = forward(self, *inputs)
        return {k: v + 1.0 for k, v in out.items()}

    monkeypatch.setattr(OneDNNGraphModule, "forward", off)
    net, x = _net()
    module = gawee.compile(net, (x,))
    assert given == ([[*TORCH, *PRIMITIVES]] if PRIMITIVES else []) and isinstance(module, torch.fx.GraphModule)
    assert "differ" in module.gawee_report.backend.not_candidates["onednn_graph"]


def test_without_the_fuser_the_default_compile_keeps_the_lowering(monkeypatch):
    monkeypatch.setattr(onednn_graph, "unavailable", lambda part="partitions": "planted: no fuser, trial run failed")
    given = _wins(monkeypatch, "onednn_graph")
    net, x = _net()
    module = gawee.compile(net, (x,))
    assert given == ([[*TORCH, *PRIMITIVES]] if PRIMITIVES else []) and isinstance(module, torch.fx.GraphModule)
    assert "trial run" in module.gawee_report.backend.not_candidates["onednn_graph"]


def test_a_fuser_that_crashes_its_trial_is_no_candidate(monkeypatch):
    """The trial runs in a child process: a fuser that aborts there leaves this process running, unavailable."""
    monkeypatch.setattr(onednn_graph, "TRIAL", "import os; os.abort()")
    onednn_graph._trial.cache_clear()
    try:
        assert "failed its trial run" in onednn_graph.unavailable()
        b = GraphBuilder("relu")
        assert "failed its trial run" in onednn_graph.supports(b.output(b.relu(b.input("x", "f32[2]"))))
    finally:
        monkeypatch.undo()
        onednn_graph._trial.cache_clear()


class _Excite(torch.nn.Module):
    """Squeeze-and-excitation gates in the spellings models use: adaptive pool + hardsigmoid, spatial mean +
    sigmoid; adaptive pools to a size that divides the input's (a plain pool) and to one that does not (left)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = y * F.hardsigmoid(self.fc(F.adaptive_avg_pool2d(y, 1)))
        y = y * torch.sigmoid(self.fc(y.mean((2, 3), keepdim=True)))
        pools = F.adaptive_avg_pool2d(y, 3).sum() + F.adaptive_avg_pool2d(y, 5).sum()
        return y + pools


@needs_fuser
def test_ops_the_fuser_lacks_are_spelled_in_ops_it_maps(monkeypatch):
    net, x = _Excite().eval(), torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        expected = net(x)
    module = gawee.compile(net, (x,), backend="onednn_graph")
    torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-5)
    lacking = {"aten::hardsigmoid", "aten::mean"}
    assert not lacking & set(module.unfused)
    assert module.unfused["aten::adaptive_avg_pool2d"] == 1  # to 5 x 5; to 3 x 3 is a 4 x 4 pool, spelled
    unspelled = {f: s for f, s in onednn_graph.SPELLINGS.items() if f not in (F.hardsigmoid, torch.mean)}
    monkeypatch.setattr(onednn_graph, "SPELLINGS", unspelled)
    assert lacking <= set(gawee.compile(net, (x,), backend="onednn_graph").unfused)


class _Scalars(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return y * (y.sum() + y.amax())


@needs_fuser
def test_binary_ops_on_0d_tensors_stay_out_of_partitions_the_fuser_cannot_compile(monkeypatch):
    """Without the 0-d spellings the fuser fails on the builds measured (AMD EPYC Zen 5): the module is traced
    again with the required spellings only, and with none at all the failure is a GaweeError. A CPU whose build
    compiles it shows the first step only."""
    net, x = _Scalars(), torch.randn(2, 3, 4, 4)
    module = gawee.compile(net, (x,), backend="onednn_graph")
    assert module.spelled
    torch.testing.assert_close(module(x), net(x))
    optional = {f: s for f, s in onednn_graph.SPELLINGS.items() if f not in onednn_graph.REQUIRED}
    monkeypatch.setattr(onednn_graph, "SPELLINGS", optional)
    fallback = gawee.compile(net, (x,), backend="onednn_graph")
    torch.testing.assert_close(fallback(x), net(x))
    monkeypatch.setattr(onednn_graph, "REQUIRED", {})
    try:
        gawee.compile(net, (x,), backend="onednn_graph")
    except GaweeError as e:
        assert not fallback.spelled
        assert "could not compile _Scalars: RuntimeError: partition compile failed" in e.message
        assert 'backend="torch"' in e.hint
    else:
        assert fallback.spelled


class _Attend(torch.nn.Module):
    """Attention without a mask, with a finite constant mask, with a constant mask that shuts a row (-inf), with a
    constant bool mask (where to attend: a 0 / -inf term), with a mask given at run time, and causal."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.randn(5, 5))
        shut = torch.zeros(5, 5)
        shut[2] = float("-inf")
        self.register_buffer("shut", shut)
        self.register_buffer("where", torch.rand(5, 5) > 0.3)

    def forward(self, q, k, v, mask):
        a = F.scaled_dot_product_attention(q, k, v)
        b = F.scaled_dot_product_attention(a, k, v, attn_mask=self.bias)
        c = F.scaled_dot_product_attention(b, k, v, attn_mask=self.shut)
        d = F.scaled_dot_product_attention(c, k, v, attn_mask=self.where | torch.eye(5, dtype=torch.bool))
        e = F.scaled_dot_product_attention(d, k, v, attn_mask=mask, scale=0.3)
        return F.scaled_dot_product_attention(e, k, v, is_causal=True)


@needs_fuser
@pytest.mark.parametrize("winner", ["onednn_graph", "aten"])
def test_attention_is_spelled_only_where_that_is_torchs_result_and_measured_faster(monkeypatch, winner):
    measured = measuring_wins(monkeypatch, winner)
    net = _Attend().eval()
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5)
    mask[0, 0, 1] = float("-inf")  # a row shut at run time: torch's kernel gives 0 there
    module = gawee.compile(net, (q, k, v, mask), backend="onednn_graph")
    # measured per shape: no mask, the finite and the bool constants, causal (not the shut row, not at run time)
    assert measured == [["aten", "onednn_graph"]] * 4 and len(module.attention_kernels) == 4
    assert [c.nodes for c in module.attention_kernels] == [1, 1, 1, 1]
    assert module.attention == (winner == "onednn_graph")
    torch.testing.assert_close(module(q, k, v, mask), net(q, k, v, mask), rtol=1e-5, atol=1e-5)
    # spelled: all but the constant that shuts a row and the run-time mask, inside partitions (the bool constant
    # attends somewhere from every row: it is a 0 / -inf term)
    assert module.unfused["aten::scaled_dot_product_attention"] == (2 if winner == "onednn_graph" else 6)


class _Rounded(torch.nn.Module):
    def forward(self, x, y):
        rounded = torch.div(x, y, rounding_mode="floor") * torch.div(x, y, rounding_mode="trunc")
        return F.gelu(x, approximate="tanh") + rounded


@needs_fuser
def test_arguments_the_fuser_drops_are_kept_by_spelling_the_op(monkeypatch):
    """The fuser maps gelu and div without their approximate and rounding_mode: tanh GELU ran as erf GELU."""
    net, x, y = _Rounded(), torch.randn(4, 16) * 3, torch.rand(4, 16) + 0.5
    graph, _ = gawee.rewrite(gawee.capture(net, (x, y)))
    module = OneDNNGraphModule(graph, [x, y])
    torch.testing.assert_close(module(x, y)[0], net(x, y), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(onednn_graph, "REQUIRED", {})
    monkeypatch.setattr(onednn_graph, "SPELLINGS", {})
    assert (OneDNNGraphModule(graph, [x, y])(x, y)[0] - net(x, y)).abs().max() > 1e-4


class _ScalarGelu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0, F.gelu(x.amax(), approximate="tanh")


@needs_fuser
def test_a_0d_tanh_gelu_is_computed_outside_the_fuser():
    net, x = _ScalarGelu(), torch.randn(4, 16) * 0.1 + 1.5  # its max near 1.7, where tanh and erf GELU differ by 1e-4
    module = gawee.compile(net, (x,), backend="onednn_graph")
    for got, expected in zip(module(x), net(x)):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


class _IntDiv(torch.nn.Module):
    def forward(self, x, i, j):
        return torch.relu(x) * 2.0, torch.div(i, j, rounding_mode="trunc"), torch.div(i, 2, rounding_mode="floor")


@needs_fuser
def test_integer_rounded_division_keeps_torchs_result():
    x, i, j = torch.randn(4, 4), torch.arange(-8, 8).reshape(4, 4), torch.tensor([3, -3, 2, -2])
    net = _IntDiv()
    module = gawee.compile(net, (x, i, j), backend="onednn_graph")
    for got, expected in zip(module(x, i, j), net(x, i, j)):
        assert torch.equal(got, expected)
