"""Precision phases: opt-in only, run by `optimize --precision`, their rules' bounds in the trace and explain."""

import json

import pytest
import torch

from gawee.cli import main
from gawee.interp import run
from gawee.ir.builder import GraphBuilder
from gawee.ir.serialize import load
from gawee.rewrite.explain import explain
from gawee.rewrite.ruleset import PRECISIONS, RULES_DIR, default_rules, load_rules, with_precision

MODEL = """
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    return model, (torch.randn(4, 32),)
"""

U = 2.0**-8


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_default_rules_are_exact():
    assert not any(r.approximate for r in default_rules().rules)
    assert not any(r.approximate for r in load_rules(RULES_DIR).rules)
    bf16 = load_rules(PRECISIONS["bf16"])
    assert bf16.rules and any(r.approximate for r in bf16.rules)
    assert bf16.rules[0].location.startswith("rules/precision/bf16.rules:")


def _within_bound(model: torch.nn.Sequential, x: torch.Tensor, got: torch.Tensor) -> None:
    """got (the bf16 model's output) is within the per-layer bounds of the bundled rules, carried through the
    second layer: |W2| @ (first layer's bound) + the second layer's bound on the perturbed hidden values."""
    l1, l2 = model[0], model[2]
    x64 = x.double()
    w1, b1, w2, b2 = (t.detach().double() for t in (l1.weight, l1.bias, l2.weight, l2.bias))
    h = torch.relu(x64 @ w1.T + b1)
    truth = h @ w2.T + b2
    e1 = 4.01 * U * (x64.abs() @ w1.abs().T + b1.abs())
    e2 = 4.01 * U * ((h + e1) @ w2.abs().T + b2.abs())
    bound = e1 @ w2.abs().T + e2
    error = (got.double() - truth).abs()
    assert bool((error <= bound).all()), (error - bound).max()
    assert error.max() > 1e-4  # bf16 was really used: float32 alone is far closer


def test_optimize_with_precision_bf16(capsys, tmp_path):
    src = tmp_path / "mlp.py"
    src.write_text(MODEL)
    out_json = tmp_path / "mlp-bf16.json"
    code, out, err = run_cli(capsys, "optimize", f"{src}:make", "--precision", "bf16", "--trace", "-o", str(out_json))
    assert code == 0, out + err
    assert "linear_bf16 x2" in out and "f32_round_trip_of_bf16 x1" in out
    assert "within (4 * u + 8 * u * u" in out  # the trace shows each approximate firing's bound
    assert "values of approximate rules past the tolerance" in out
    graph = load(out_json)
    assert sorted(n.op for n in graph) == ["cast", "cast", "linear", "linear"]
    assert {v.dtype.value for v in graph.constants()} == {"bf16"}
    namespace: dict = {}
    exec(MODEL, namespace)
    model, (x,) = namespace["make"]()
    (got,) = run(graph, x)
    _within_bound(model, x, got)


def test_without_precision_no_approximate_rule_fires(capsys, tmp_path):
    src = tmp_path / "mlp.py"
    src.write_text(MODEL)
    code, out, _ = run_cli(capsys, "optimize", f"{src}:make", "--json")
    result = json.loads(out)
    assert code == 0 and not any("bf16" in name or "int8" in name for name in result["firings"])
    assert result["accuracy"] is None  # exact rules only: nothing to report against the float model


def test_the_precision_file_also_loads_with_rules(capsys, tmp_path):
    src = tmp_path / "mlp.py"
    src.write_text(MODEL)
    code, out, _ = run_cli(capsys, "optimize", f"{src}:make", "--rules", str(PRECISIONS["bf16"]), "--json")
    # the relu between the two linears (unfused: only the bf16 rules ran) moves into bf16, and the casts cancel
    firings = {"linear_bf16": 2, "relu_in_bf16": 1, "f32_round_trip_of_bf16": 1}
    assert code == 0 and json.loads(out)["firings"] == firings


def test_an_unknown_precision_exits_2(capsys, tmp_path):
    src = tmp_path / "mlp.py"
    src.write_text(MODEL)
    code, _, err = run_cli(capsys, "optimize", f"{src}:make", "--precision", "fp7")
    assert code == 2 and "no precision phase 'fp7'" in err and "bf16" in err


def test_explain_shows_the_bound():
    b = GraphBuilder("g")
    y = b.linear(b.input("x", "f32[2,8]"), b.const(torch.randn(4, 8)), b.const(torch.randn(4)))
    graph = b.output(y)
    (node,) = list(graph)
    found = [e for e in explain(graph, node, load_rules(PRECISIONS["bf16"])) if e.rule == "linear_bf16"]
    assert found and found[0].outcome == "matches" and "approximate, within (4 * u" in found[0].reason


@pytest.mark.parametrize("name", sorted(PRECISIONS))
def test_every_precision_file_is_bundled(name):
    assert PRECISIONS[name].is_file() and PRECISIONS[name].parent.parent == RULES_DIR


def test_optimize_with_precision_int8(capsys, tmp_path):
    from tests.int8_mlp import MODEL as INT8_MODEL
    from tests.int8_mlp import assert_within_mlp_bound, make

    src = tmp_path / "mlp.py"
    src.write_text(INT8_MODEL)
    out_json = tmp_path / "mlp-int8.json"
    code, out, err = run_cli(capsys, "optimize", f"{src}:make", "--precision", "int8", "-o", str(out_json))
    assert code == 0, out + err
    assert "linear_int8 x2" in out and "values of approximate rules past the tolerance" in out
    assert "accuracy" in out and "top-1 agreement 4/4" in out
    assert "largest error" in out and "linear_int8 at" in out and "worst of 2 values" in out
    graph = load(out_json)
    assert sorted(n.op for n in graph) == ["linear_int8_dynamic", "linear_int8_dynamic"]
    assert {v.dtype.value for v in graph.constants()} == {"i8", "f32"}  # int8 weights, float32 scales and biases
    model, x = make()
    (got,) = run(graph, x)
    assert assert_within_mlp_bound(model, x, got) > 1e-4  # int8 was really used: float32 alone is far closer


def test_optimize_int8_reports_accuracy_in_json(capsys, tmp_path):
    src = tmp_path / "mlp.py"
    src.write_text(MODEL)
    code, out, _ = run_cli(capsys, "optimize", f"{src}:make", "--precision", "int8", "--json")
    assert code == 0
    result = json.loads(out)
    accuracy = result["accuracy"]
    assert result["firings"]["linear_int8"] == 2
    assert 0 < accuracy["mean_abs_error"] <= accuracy["max_abs_error"] < 0.1
    assert 0.999 < accuracy["cosine"] <= 1.0
    assert accuracy["top1_rows"] == 4 and 0 <= accuracy["top1_agree"] <= 4
    errors = result["firing_errors"]  # which rewrites the error comes from, worst relative error first
    assert [e["rule"] for e in errors] == ["linear_int8"] * 2 and all(e["bound"] for e in errors)
    assert errors[0]["max_error"] / errors[0]["scale"] >= errors[1]["max_error"] / errors[1]["scale"] > 0
    assert any(e["max_error"] == pytest.approx(accuracy["max_abs_error"], rel=1e-6) for e in errors)  # the output


CNN = """
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    ).eval()
    return model, (torch.randn(2, 3, 12, 12),)
"""


def test_optimize_int8_calibrates_convolutions_on_the_example_inputs(capsys, tmp_path):
    src = tmp_path / "cnn.py"
    src.write_text(CNN)
    out_json = tmp_path / "cnn-int8.json"
    code, out, err = run_cli(capsys, "optimize", f"{src}:make", "--precision", "int8", "-o", str(out_json))
    assert code == 0, out + err
    assert "conv2d_int8 x2" in out and "requantize_for_int8_conv x1" in out and "accuracy" in out
    assert "linear_int8_static x1" in out  # the classifier, calibrated as the convolutions are
    graph = load(out_json)
    assert [n.op for n in graph if n.op.startswith("conv")] == ["conv2d_int8_static"] * 3
    assert not any(n.op == "calibrated" for n in graph)  # read by the rules, then dropped


class _SelfAttention(torch.nn.Module):
    """torch's MultiheadAttention on a sequence-first input, batch 1: a fused projection whose result is viewed
    into three sets of heads, and an output projection reading the heads' result viewed back."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_bf16_heads_stay_bf16_between_the_projections_and_the_attention():
    import gawee

    torch.manual_seed(0)
    net, x = _SelfAttention().eval(), torch.randn(10, 1, 32)
    graph, report = gawee.rewrite(gawee.capture(net, (x,)), with_precision(default_rules(), "bf16"))
    attention = [n for n in graph if n.op == "scaled_dot_product_attention"]
    assert len(attention) == 1 and all(v.dtype.value == "bf16" for v in attention[0].inputs[:3])
    # the widening cast of the projection's result moved below the views and cancelled with the heads' casts; the
    # attention's result is cast only where the output projection's operand was: both reach bf16 without a cast
    assert report.firings["select_before_widening"] == 3 and report.firings["f32_round_trip_of_bf16"] >= 4
    casts = [n for n in graph if n.op == "cast"]
    assert [str(c.attrs["dtype"]) for c in casts] == ["bf16", "f32"]  # the model's input and its output
    with torch.no_grad():
        got, want = run(graph, x)[0], net(x)
    assert 0 < (got - want).abs().max() < 0.05 * want.abs().max()
