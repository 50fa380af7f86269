"""verify_rewrite: several input distributions, intermediate values by provenance, and the rule blamed."""

import json
from pathlib import Path

import torch

import gawee
from gawee import load_rules_text, rewrite
from gawee.cli import main
from gawee.equivalence import DISTRIBUTIONS, distribution_inputs, verify_rewrite
from gawee.frontend.models import load_graph
from gawee.ir.builder import GraphBuilder, parse_type
from gawee.rewrite.driver import provenance

BUNDLED = str(Path(__file__).resolve().parents[1] / "rules")
RELU6_IS_RELU = "rule relu6_is_relu:\n    hardtanh(x, min_val=0.0, max_val=6.0) => relu(x)\n"


def relu6_then_clip():
    """clamp(relu6(x), max=1): relu(x) in place of relu6 changes the intermediate value, never the output."""
    b = GraphBuilder("masked")
    x = b.input("x", "f32[4,16]")
    h = b.node("hardtanh", x, min_val=0.0, max_val=6.0).outputs[0]
    b.output(b.node("clamp", h, max=1.0).outputs[0])
    return b.graph


def two_phases(first: str, second: str):
    """A RuleSet of two phases (one rule text each)."""
    one, two = load_rules_text(first, "one.rules"), load_rules_text(second, "two.rules")
    return type(one)([*one.phases, *two.phases])


def test_distributions_scale_floats_and_keep_integer_inputs():
    types = [parse_type("f32[64]"), parse_type("i64[64]")]
    normal = distribution_inputs(types, "normal", 3)
    assert torch.equal(distribution_inputs(types, "x10", 3)[0], normal[0] * 10)
    awkward = distribution_inputs(types, "awkward", 3)
    assert torch.equal(awkward[1], normal[1])  # indices stay indices
    assert awkward[0].abs().max() > 500 and (awkward[0] == 0).any()


def test_provenance_chains_replacements_to_the_original_value():
    rules = two_phases(RELU6_IS_RELU, "rule relu_to_clamp: relu(x) => clamp(x, min=0.0)")
    g = relu6_then_clip()
    _, report = rewrite(g, rules, trace=True)
    first, second = report.trace
    assert first.replaces == ("hardtanh",) and second.replaces == first.results
    links = provenance(report.trace, {v.name for n in g for v in n.outputs})
    assert links[second.results[0]] == {"hardtanh": (0, 1)}
    assert links[first.results[0]] == {"hardtanh": (0,)}


def test_a_difference_masked_at_the_output_is_found_in_the_intermediate_value():
    g = relu6_then_clip()
    rules = load_rules_text(RELU6_IS_RELU, "relu6.rules")
    out, report = rewrite(g, rules, trace=True)
    assert gawee.verify_equivalent(g, out, trials=4).ok  # the outputs agree everywhere
    v = verify_rewrite(g, out, report.trace, rules=rules)
    assert not v.ok and [t.distribution for t in v.trials] == list(DISTRIBUTIONS)
    assert v.trials[0].ok  # unit normal inputs never exceed 6 here
    x10 = v.trials[1]
    assert not x10.ok and all(o.ok for o in x10.outputs)
    assert x10.first_divergence.original == "hardtanh" and x10.first_divergence.rules == ("relu6_is_relu",)
    assert v.blame.rule == "relu6_is_relu" and v.blame.method == "provenance" and v.blame.distribution == "x10"
    assert "relu6_is_relu" in v.short() and "x10" in v.short()


def test_replay_blames_the_unsound_rule_of_a_chain_whichever_comes_first():
    g = relu6_then_clip()
    unsound_first = two_phases(RELU6_IS_RELU, "rule relu_to_clamp: relu(x) => clamp(x, min=0.0)")
    unsound_second = two_phases(
        "rule relu6_to_clamp: hardtanh(x, min_val=0.0, max_val=6.0) => clamp(x, min=0.0, max=6.0)",
        "rule clamp6_is_relu: clamp(x, min=0.0, max=6.0) => relu(x)",
    )
    for rules, guilty, innocent in [
        (unsound_first, "relu6_is_relu", "relu_to_clamp"),
        (unsound_second, "clamp6_is_relu", "relu6_to_clamp"),
    ]:
        out, report = rewrite(g, rules, trace=True)
        assert report.total == 2
        v = verify_rewrite(g, out, report.trace, rules=rules)
        assert v.blame.method == "replay" and v.blame.rule == guilty, v
        assert set(v.blame.candidates) == {guilty, innocent}
        assert v.trials[1].first_divergence.original == "hardtanh"


def test_without_rules_to_replay_an_ambiguous_blame_says_so():
    g = relu6_then_clip()
    rules = two_phases(RELU6_IS_RELU, "rule relu_to_clamp: relu(x) => clamp(x, min=0.0)")
    out, report = rewrite(g, rules, trace=True)
    v = verify_rewrite(g, out, report.trace)
    assert not v.ok and v.blame.method == "ambiguous"
    assert set(v.blame.candidates) == {"relu6_is_relu", "relu_to_clamp"}


def scaled(factors):
    b = GraphBuilder("scale")
    y = b.input("x", "f32[256]")
    for f in factors:
        y = b.mul(y, f)
    b.output(y)
    return b.graph


def test_a_rewrite_that_avoids_an_overflow_of_the_original_is_not_a_difference():
    before = scaled([1e20, 1e20, 1e-30])  # overflows float32 for |x| > 0.034, then scales back
    after = scaled([1e10])  # what float64 computes
    assert not gawee.verify_equivalent(before, after).ok
    v = verify_rewrite(before, after, [])
    assert v.ok, v
    wrong = verify_rewrite(before, scaled([2e10]), [])
    assert not wrong.ok and wrong.trials[0].first_divergence.output == 0


RELU6_NET = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    block = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU6()]
    net = nn.Sequential(*block(3, 8), *block(8, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return net.eval(), (torch.randn(1, 3, 16, 16),)
"""


def test_optimize_exits_1_naming_the_unsound_rule(capsys, tmp_path):
    (tmp_path / "relu6net.py").write_text(RELU6_NET)
    (tmp_path / "relu6.rules").write_text(RELU6_IS_RELU)
    model, rules = f"{tmp_path / 'relu6net.py'}:make", str(tmp_path / "relu6.rules")
    code = main(["optimize", model, "--rules", rules, "--rules", BUNDLED, "--json"])
    out, err = capsys.readouterr()
    assert code == 1, err
    doc = json.loads(out)
    assert code == 1 and doc["firings"]["relu6_is_relu"] == 2
    ver = doc["verification"]
    assert not ver["ok"] and ver["blame"]["rule"] == "relu6_is_relu"
    assert [t["distribution"] for t in ver["trials"]] == list(DISTRIBUTIONS)
    failed = [t for t in ver["trials"] if not t["ok"]]
    assert {"x100", "awkward"} <= {t["distribution"] for t in failed}
    assert all(t["first_divergence"]["rules"][0] == "relu6_is_relu" for t in failed)
    code = main(["optimize", model, "--rules", rules, "--rules", BUNDLED])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED: relu6_is_relu" in out and "blamed: rule relu6_is_relu" in out


def test_the_bundled_rules_verify_on_resnet18(capsys):
    code = main(["optimize", "resnet18", "--json"])
    ver = json.loads(capsys.readouterr().out)["verification"]
    assert code == 0 and ver["ok"] and ver["blame"] is None
    assert [t["distribution"] for t in ver["trials"]] == list(DISTRIBUTIONS)
    assert all(t["ok"] and t["values_compared"] > 20 for t in ver["trials"])
    assert 0 < ver["firings_checked"] <= 8 and ver["failed_firing"] is None  # 46 firings, one per rule and operands


GELU_TANH = 'rule gelu_is_tanh: gelu(x) => gelu(x, approximate="tanh")\n'

NORMED_GELU = """
import torch
from torch import nn


class Block(nn.Module):
    # a layer norm whose small scale keeps the GELU's input within +-0.3 whatever the model's inputs are
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(32), nn.Linear(32, 32)
        with torch.no_grad():
            self.norm.weight.fill_(0.05)

    def forward(self, x):
        return self.fc(nn.functional.gelu(self.norm(x)))


def make():
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(2, 8, 32),)
"""


def test_a_rule_wrong_where_the_model_never_goes_is_caught_on_its_firing_alone(capsys, tmp_path):
    """x10, x100 and awkward model inputs never reach the GELU (the layer norm rescales them): the whole graph
    agrees within tolerance on every input set. The firing run alone, its operand drawn over those ranges,
    does not, and optimize names the rule."""
    (tmp_path / "normed.py").write_text(NORMED_GELU)
    (tmp_path / "gelu.rules").write_text(GELU_TANH)
    rules = load_rules_text(GELU_TANH, "gelu.rules")
    graph, _ = load_graph(f"{tmp_path / 'normed.py'}:make")
    out, report = rewrite(graph, rules, trace=True)
    v = verify_rewrite(graph, out, report.trace, rules=rules)
    assert all(t.ok for t in v.trials) and not v.ok
    assert v.failed_firing.rule == "gelu_is_tanh" and v.blame.rule == "gelu_is_tanh" and v.blame.method == "alone"
    code = main(["optimize", f"{tmp_path / 'normed.py'}:make", "--rules", str(tmp_path / "gelu.rules")])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED: gelu_is_tanh (alone on" in out and "blamed: rule gelu_is_tanh" in out


def test_a_firing_alone_honours_the_rules_assumptions():
    """abs(y) => y where the rule assumes y >= 0: true of the relu output it meets in the model; its firing
    alone draws negative operands too, which break the assumption and are set aside (nonnegative ones agree)."""
    rules = load_rules_text("rule abs_of_nonnegative: abs(y)\n    assume nonnegative(y)\n    => y\n", "abs.rules")
    b = GraphBuilder("g")
    x = b.input("x", "f32[64]")
    g = b.output(b.abs(b.relu(x)))
    out, report = rewrite(g, rules, trace=True)
    v = verify_rewrite(g, out, report.trace, rules=rules)
    assert v.ok, v
    (checked,) = v.firings
    assert checked.rule == "abs_of_nonnegative" and set(checked.skipped) == set(DISTRIBUTIONS)
    unassumed = load_rules_text("rule abs_is_identity: abs(y) => y\n", "abs.rules")
    out, report = rewrite(g, unassumed, trace=True)
    v = verify_rewrite(g, out, report.trace, rules=unassumed)
    assert not v.ok and v.blame.rule == "abs_is_identity" and v.blame.method == "alone"


def test_rounding_drift_amplified_downstream_is_not_blamed_on_an_exact_rewrite():
    # x * 0.1 -> x / 10 rounds differently in the last bit; sin of ~1e15 turns that bit into O(1), and the
    # exact rewrite of sin downstream sees it. In float64 the truth is the original itself (no own error
    # to forgive it by); recomputed from the original's input, the sin agrees.
    rules = load_rules_text(
        "rule tenth: r: mul(x, 0.1) where same_type(r, x) => div(x, 10.0)\nrule sin_odd: sin(neg(z)) => neg(sin(z))\n"
    )
    b = GraphBuilder("g")
    x = b.input("x", "f64[64]")
    g = b.output(b.sin(b.neg(b.mul(b.mul(x, 0.1), 1e15))))
    after, report = rewrite(g, rules, trace=True)
    assert dict(report.firings) == {"tenth": 1, "sin_odd": 1}
    result = verify_rewrite(g, after, report.trace, rules=rules)
    assert result.ok, str(result)
    assert any(o.forgiven for t in result.trials for o in t.outputs)  # the outputs did differ


def test_a_replacement_that_fails_where_the_matched_nodes_run_fails_its_firing():
    rules = load_rules_text("rule zero_by_remainder: mul(i, 0) => remainder(i, i)\n", "zero.rules")
    b = GraphBuilder("g")
    i = b.input("i", "i64[64]")
    g = b.output(b.mul(i, 0))
    out, report = rewrite(g, rules, trace=True)
    (checked,) = verify_rewrite(g, out, report.trace, rules=rules).firings
    assert not checked.ok and "the replacement fails to run" in checked.problem and "ZeroDivisionError" in str(checked)
