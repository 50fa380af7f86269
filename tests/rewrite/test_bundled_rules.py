"""The bundled rules on real models: ResNet-18 reaches its target; other models stay equivalent."""

import copy
import re

import pytest
import torch

import gawee
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.ruleset import RULES_DIR
from tests.conftest import captured


def test_resnet18_reaches_the_target():
    g, _, x = captured("resnet18")
    out, report = gawee.rewrite(g)
    counts = gawee.cost(out).op_counts
    assert "batch_norm" not in counts and "relu" not in counts and "add" not in counts
    assert counts == {"conv2d": 20, "adaptive_avg_pool2d": 1, "linear": 1, "max_pool2d": 1, "reshape": 1}
    assert len(out) <= 24
    convs = [n for n in out if n.op == "conv2d"]
    assert sum(n.attrs["act"] == "relu" for n in convs) == 17
    assert sum(n.inputs[3] is not None for n in convs) == 8  # every residual add lives in a conv
    before, after = gawee.cost(g), gawee.cost(out)
    assert after.bytes_written <= 0.40 * before.bytes_written
    assert gawee.verify_equivalent(g, out, [x]).ok
    assert report.firings == {
        "fold_conv_bn": 20,
        "fuse_conv_relu": 17,
        "fuse_conv_residual": 8,
        "flatten_to_reshape": 1,
    }


def test_zero_biases_are_dropped_and_others_kept():
    """torchvision initializes MobileNetV3's convolution and linear biases to zero: each goes (zero_bias rules);
    a bias with a nonzero element stays."""
    g, model, x = captured("mobilenet_v3_small")
    zero = {
        kind: sum(isinstance(m, cls) and m.bias is not None and not m.bias.any() for m in model.modules())
        for kind, cls in (("conv2d", torch.nn.Conv2d), ("linear", torch.nn.Linear))
    }
    assert zero == {"conv2d": 18, "linear": 2}  # the squeeze-excitation 1x1s, the classifier
    model = copy.deepcopy(model)  # g holds the model's parameters
    with torch.no_grad():
        model.classifier[3].bias[0] = 1.0
    g_kept = gawee.capture(model, (x,))
    for graph, linears in ((g, 2), (g_kept, 1)):
        out, report = gawee.rewrite(graph)
        assert report.firings["conv2d_zero_bias"] == zero["conv2d"]
        assert report.firings["linear_zero_bias"] == linears
        assert sum(n.op == "linear" and n.inputs[2] is not None for n in out) == 2 - linears
        assert gawee.verify_equivalent(graph, out, [x]).ok


@pytest.mark.parametrize(
    "name", ["mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "swin_t", "shufflenet_v2_x0_5"]
)
def test_other_models_optimize_and_stay_equivalent(name):
    g, _, x = captured(name)
    out, _ = gawee.rewrite(g)
    gawee.verify(out)
    assert len(out) <= len(g)
    report = gawee.verify_equivalent(g, out, [x])
    assert report.ok, str(report)


def test_every_bundled_rule_has_a_one_line_lhs_rhs_comment():
    rules = gawee.default_rules()
    assert [p.name for p in rules.phases] == ["1-simplify", "2-fold", "2-recognize", "3-fuse"]
    for r in rules.rules:
        assert re.search(r"->", r.comment), f"{r.name} ({r.location}) lacks its `# lhs -> rhs` comment"


def test_bundled_rule_files_are_where_default_rules_finds_them():
    assert sorted(p.name for p in RULES_DIR.glob("*.rules")) == [
        "1-simplify.rules",
        "2-fold.rules",
        "2-recognize.rules",
        "3-fuse.rules",
    ]


def _conv_bn(w_scale: float, gamma_scale: float, dtype=torch.float32):
    b = GraphBuilder("conv_bn")
    x = b.input("x", f"{'f16' if dtype == torch.float16 else 'f32'}[1,2,3,3]")
    w = b.const((torch.rand(2, 2, 1, 1) + 0.5).to(dtype) * w_scale, "w")
    y = b.conv2d(x, w)
    ones = torch.ones(2, dtype=dtype)
    return b.output(b.batch_norm(y, b.const(ones * gamma_scale), b.const(ones), b.const(ones), b.const(ones)))


@pytest.mark.parametrize(
    "w_scale, gamma_scale, dtype, folds",
    [
        (1.0, 1.0, torch.float32, True),
        (1e-30, 1e-30, torch.float32, False),  # w * s underflows to 0: inf * 0 would be nan, not inf
        (1e4, 1e4, torch.float16, False),  # w * s overflows f16 (> 65504)
    ],
)
def test_a_fold_that_underflows_or_overflows_is_abandoned(w_scale, gamma_scale, dtype, folds):
    g = _conv_bn(w_scale, gamma_scale, dtype)
    out, report = gawee.rewrite(g)
    assert (report.firings["fold_conv_bn"] == 1) is folds
    x = torch.tensor([float("-inf"), 1.0, 2.0]).repeat(1, 2, 3, 1).to(dtype)
    assert gawee.verify_equivalent(g, out, [x]).ok


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_large"])
def test_the_layout_phase_converts_only_at_the_graph_edges(name):
    from gawee.backend import layout

    g, _, x = captured(name)
    optimized, _ = gawee.rewrite(g)
    laid_out = layout.channels_last(optimized)
    conversions = [n for n in laid_out if n.op == "to_layout"]
    assert conversions, "the phase converted nothing"
    for n in conversions:  # into channels-last from a graph input, or back to NCHW for a graph output
        assert n.inputs[0] in laid_out.inputs or n.output in laid_out.outputs, n
    convs = [n for n in laid_out if n.op == "conv2d"]
    assert convs and all(n.inputs[0].type.layout.value == "channels_last" for n in convs)
    assert gawee.verify_equivalent(optimized, laid_out, [x]).ok


def test_the_layout_phase_is_not_a_default_phase():
    from gawee.backend import layout

    assert layout.PHASE.parent == RULES_DIR / "layout"
    assert not any("to_layout" in r.comment for r in gawee.default_rules().rules)
    assert [p.name for p in gawee.load_rules(RULES_DIR, RULES_DIR / "layout").phases][-1] == "channels_last"
