"""The bundled rules on transformers: one linear per layer's Q/K/V (and a gated MLP's gate/up), GPT-2's
written-out GELU and Conv1D recognized, the optimized graph equal to the captured one."""

from collections import Counter

import pytest

from gawee.equivalence import verify_equivalent
from gawee.frontend.models import load_graph
from gawee.rewrite.driver import rewrite

pytest.importorskip("transformers")

LAYERS = 2  # the small built-in configs (gawee.frontend.families.SIZES)


@pytest.fixture(scope="module")
def optimized():
    cache = {}

    def get(spec):
        if spec not in cache:
            graph, _ = load_graph(spec)
            after, report = rewrite(graph)
            cache[spec] = graph, after, report
        return cache[spec]

    return get


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("hf:bert", "fuse_three_projections"),
        ("hf:llama", "fuse_three_projections_unbiased"),
        ("hf:t5-encoder", "fuse_three_projections_unbiased"),
    ],
)
def test_each_layers_qkv_projections_become_one_linear(optimized, spec, rule):
    graph, after, report = optimized(spec)
    assert report.firings[rule] == LAYERS
    ops = Counter(n.op for n in after)
    assert ops["split"] >= LAYERS
    assert ops["linear"] == Counter(n.op for n in graph)["linear"] - 2 * LAYERS - (LAYERS if "llama" in spec else 0)
    assert verify_equivalent(graph, after).ok


def test_gated_mlp_gate_and_up_become_one_linear(optimized):
    _, _, report = optimized("hf:llama")
    assert report.firings["fuse_two_projections_unbiased"] == LAYERS


def test_gpt2_gelu_and_conv1d_are_recognized(optimized):
    graph, after, report = optimized("hf:gpt2")
    assert report.firings["gelu_tanh_written"] == LAYERS
    assert report.firings["addmm_to_linear"] == 4 * LAYERS
    ops = Counter(n.op for n in after)
    fused = [n for n in after if n.op == "linear" and n.attrs.get("act") == "gelu_tanh"]
    assert ops["gelu"] + len(fused) == LAYERS  # a gelu node, or fused into the linear before it
    assert ops["addmm"] == 0 and ops["tanh"] == 0 and ops["pow"] == 0
    assert verify_equivalent(graph, after).ok
