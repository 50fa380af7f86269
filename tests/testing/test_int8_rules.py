"""rules/precision/int8.rules in the soundness harness: each rule within its declared bound, and the same rules
declared with half the quantization error refuted on every seed."""

import pytest
import torch

from gawee import load_rules_text
from gawee.dsl import library
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import PRECISIONS, load_rules
from gawee.testing.harness import APPROXIMATE_NOTE, check_rule
from tests.testing.test_approximate import assert_refuted_by_its_bound

INT8 = load_rules(PRECISIONS["int8"])


def _tight_twins() -> list:
    """The bundled int8 rules with each rounding's error declared as a quarter of its scale instead of half (an
    input or weight rounded to nearest moves by up to half a step). Not linear_int8_smooth: its activations'
    Lipschitz constants (1/6 to 1.5 under one factor of 1.5) leave most of them slack for a halved rounding."""
    text = PRECISIONS["int8"].read_text()
    tight = text.replace("(0.5 + (lv - 127) / 128 + 512 * u)", "(0.25 + 512 * u)")
    tight = tight.replace("(0.5 + 256 * u)", "(0.25 + 256 * u)")
    assert tight.count("(0.25 + ") == 8  # both roundings of each of the four rules
    twins = [r for r in load_rules_text(tight, "tight.rules").rules if r.name != "linear_int8_smooth"]
    assert len(twins) == 3 and all(r.approximate for r in twins)
    return twins


def test_every_rule_is_approximate():
    assert [r.name for r in INT8.rules] == ["linear_int8", "linear_int8_smooth", "linear_int8_unbiased", "matmul_int8"]
    assert all(r.approximate for r in INT8.rules)


def test_a_smooth_activation_without_its_lipschitz_factor_is_refuted():
    """linear_int8_smooth declared with a fifth of the linear's bound and no allowance for the activation's
    rounding: `check` finds an element past it."""
    text = PRECISIONS["int8"].read_text()
    declared = "1.5 * pre + 64 * u * (2 * magnitude + pre + 2) + 4 * underflow(f32)"
    assert text.count(declared) == 1
    (twin,) = [r for r in load_rules_text(text.replace(declared, "0.2 * pre"), "t.rules").rules if "smooth" in r.name]
    assert_refuted_by_its_bound(twin, 60, 0)


def _pin(monkeypatch, levels: int) -> int:
    """The activations' levels the rules choose (``int8_levels()``): 8 bits as on a CPU with VNNI, 7 without."""
    why = None if levels == 255 else "no VNNI (planted)"
    monkeypatch.setattr(library, "no_vnni", lambda: why)
    return levels


@pytest.fixture(params=[127, 255], ids=["7-bit", "8-bit"])
def levels(request, monkeypatch) -> int:
    return _pin(monkeypatch, request.param)


def test_the_rules_quantize_activations_to_the_levels_the_cpu_multiplies_exactly(levels):
    gb = GraphBuilder("mlp")
    x = gb.input("x", "f32[4,32]")
    w, b = gb.const(torch.randn(16, 32), "w"), gb.const(torch.randn(16), "b")
    graph, _ = rewrite(gb.output(gb.linear(x, w, b)), INT8)
    (node,) = [n for n in graph.nodes if n.op == "linear_int8_dynamic"]
    assert node.attrs["levels"] == levels


@pytest.mark.parametrize("rule", INT8.rules, ids=lambda r: r.name)
def test_the_bundled_int8_rules_pass_check(rule, levels):
    result = check_rule(rule, examples=60)
    assert result.ok, result.counterexample or result.error
    assert result.verdict == "sound" and result.tier == "tested"
    assert result.proof is None and result.proof_note == APPROXIMATE_NOTE
    assert result.fired >= 20  # checked on many instances, not vacuously


@pytest.mark.parametrize("rule", _tight_twins(), ids=lambda r: r.name)
@pytest.mark.parametrize("seed, levels", [(0, 127), (0, 255), (1, 255), (2, 255)])
def test_half_the_quantization_error_is_refuted_on_every_seed(rule, seed, levels, monkeypatch):
    _pin(monkeypatch, levels)
    assert_refuted_by_its_bound(rule, 60, seed)
