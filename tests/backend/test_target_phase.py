"""A runtime's target phase: its fusions as rules (rules/targets/<runtime>/) that gawee.compile runs on the graph
it builds that runtime from, that the compile report counts, and that `optimize --target` traces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gawee
from gawee.backend import dnnl, dnnl_plan, runtime
from gawee.cli import main
from gawee.errors import GaweeError
from gawee.interp import run
from gawee.ir.serialize import load
from gawee.rewrite.ruleset import target_dir, target_rules, targets

MODEL = """
import torch
import torch.nn as nn


class SqueezeExcite(nn.Module):
    '''A convolution, its batch norm and a squeeze-and-excitation gate: x * sigmoid(conv(pool(x))), then a
    batch norm and a leaky ReLU that the bundled rules leave standalone (the norm follows a multiply).'''

    def __init__(self):
        super().__init__()
        # 16 channels: whole blocks of oneDNN's blocked layout with AVX-512 as with AVX2
        self.conv, self.gate, self.bn = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16)

    def forward(self, x):
        y = self.conv(x)
        y = y * torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))
        return torch.nn.functional.leaky_relu(self.bn(y), 0.2) + x


def make():
    torch.manual_seed(0)
    model = SqueezeExcite().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    return model, (torch.randn(2, 16, 10, 10),)
"""


def _model():
    namespace: dict = {}
    exec(MODEL, namespace)
    return namespace["make"]()


def test_onednn_has_the_bundled_target_phase_and_the_others_none():
    assert targets() == ["onednn"]
    bundled = {r.name for r in target_rules("onednn").rules}
    used = {r.name for r in runtime.get("onednn").rules.rules}  # less the phases of kernels not built here
    assert "onednn_binary" in used and used <= bundled
    assert runtime.get("torch").rules is None
    graph, _ = gawee.rewrite(gawee.capture(*_model()))
    same, report = runtime.get("torch").lower(graph)
    assert same is graph and report is None
    with pytest.raises(GaweeError, match="no target phase 'tpu'"):
        target_dir("tpu")


def test_lowering_rewrites_into_target_ops_and_keeps_the_values():
    model, (x,) = _model()
    graph, _ = gawee.rewrite(gawee.capture(model, (x,)))
    lowered, report = dnnl.RUNTIME.lower(graph)
    assert [n.op for n in graph].count("batch_norm") == 1  # the graph itself is left as it was
    ops = {(n.op, n.attrs.get("alg"), n.attrs.get("act")) for n in lowered}
    assert ("onednn_binary", "mul", None) in ops  # the gate
    assert ("onednn_batch_norm", None, "leaky_relu") in ops  # the norm with its activation as a post-op
    assert ("onednn_binary", "add", None) in ops
    assert report.firings["onednn_batch_norm_leaky_relu"] == 1
    with torch.no_grad():
        torch.testing.assert_close(run(lowered, x)[0], model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(dnnl.unavailable() is not None, reason="oneDNN's primitives are not available here")
def test_compile_runs_the_target_phase_and_reports_its_rules():
    model, (x,) = _model()
    module = gawee.compile(model, (x,), backend="onednn:blocked")
    choice = module.gawee_report.backend
    assert choice.target_rules["onednn_binary"] == 2
    assert choice.target_rules["onednn_batch_norm_leaky_relu"] == 1
    # the variant's phase too: the rules that made the module built (rules/targets/onednn/variants/blocked.rules)
    assert choice.target_rules["onednn_conv_blocked"] == 2 and choice.target_rules["onednn_batch_norm_blocked"] == 1
    assert "its target rules fired: " in str(choice)
    # where choosing took its time: one variant asked for, so nothing is timed against it
    assert set(choice.spent) == {"target phases", "trials", "builds"} and "choosing took" in str(choice)
    assert all(s >= 0 for s in choice.spent.values())
    assert "torch:" not in " ".join(module.kernels)  # every node on a primitive, the activation as a post-op
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-4)


def test_optimize_traces_the_target_phase(capsys, tmp_path):
    src = tmp_path / "se.py"
    src.write_text(MODEL)
    out_json = tmp_path / "se-onednn.json"
    code = main(["optimize", f"{src}:make", "--target", "onednn", "--trace", "-o", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "onednn_batch_norm_leaky_relu (rules/targets/onednn/1-post_ops.rules:" in out  # traced
    assert "onednn_binary x2" in out  # counted among the rules fired
    assert "onednn_binary" in {n.op for n in load(out_json)}
    code = main(["optimize", f"{src}:make", "--target", "tpu"])
    assert code != 0 and "no target phase 'tpu'" in capsys.readouterr().err
    # a variant's phase after it: the activation layout of each convolution, traced and counted like any rule
    code = main(["optimize", f"{src}:make", "--target", "onednn:channels_last", "--trace", "-o", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "onednn_conv_channels_last (rules/targets/onednn/variants/channels_last.rules:" in out
    assert "onednn_conv_channels_last x2" in out and "onednn_batch_norm_channels_last x1" in out
    layouts = {n.attrs["layout"] for n in load(out_json) if n.op in ("onednn_conv", "onednn_batch_norm")}
    assert layouts == {"channels_last"}
    code = main(["optimize", f"{src}:make", "--target", "onednn:nchw"])
    err = capsys.readouterr().err
    assert code != 0 and "no phase for the variant onednn:nchw" in err and "onednn:per_conv" in err


POINTWISE = """rule pointwise_channels_last:
    conv2d(x, w, b, ...attrs) where w.shape[2] == 1 and w.shape[3] == 1
    => onednn_conv(x, w, b, layout="channels_last", ...attrs)
"""
"""docs/rules.md's example ("Variant phases")."""

MIXED = f"""
# 1x1 convolutions in channels-last, the others blocked: a node keeps the first layout it gets
{POINTWISE}
rule others_blocked:
    conv2d(x, w, b, ...attrs) => onednn_conv(x, w, b, layout="blocked", ...attrs)

rule bn_blocked:
    onednn_batch_norm(x, g, b, m, v, layout=none, ...attrs)
    => onednn_batch_norm(x, g, b, m, v, layout="blocked", ...attrs)
"""


@pytest.mark.skipif(dnnl.unavailable() is not None, reason="oneDNN's primitives are not available here")
@pytest.mark.parametrize("variant", ["blocked", "channels_last", "per_conv", "mixed"])
def test_a_variant_phase_decides_each_convolutions_layout(variant, monkeypatch):
    """The layout each convolution's activations take in oneDNN's module is what a phase's rules set on it (the
    module's own ``layout`` is only the default for a node no rule reached): the bundled variants give the module
    the module-wide layout would, and a rule file of an author's mixes them as it says."""
    from gawee.rewrite.ruleset import load_rules_text, variant_rules

    model, (x,) = _model()
    graph, _ = dnnl.RUNTIME.lower(gawee.rewrite(gawee.capture(model, (x,)))[0])
    phase = load_rules_text(MIXED, "mixed.rules") if variant == "mixed" else variant_rules("onednn", variant)
    tagged, _ = gawee.rewrite(graph, phase)
    convs = [n for n in tagged if n.op in ("onednn_conv", "onednn_batch_norm")]
    assert len(convs) == 3 and all("layout" in n.attrs for n in convs)
    other = "channels_last" if variant == "blocked" else "blocked"  # the module's default, which no node takes
    enumerated = []  # a convolution's every oneDNN kernel listed, in one layout (what "any" races; a fixed layout
    implementations = dnnl_plan._Plan.implementations  # takes oneDNN's first kernel alone)
    monkeypatch.setattr(
        dnnl_plan._Plan, "implementations", lambda plan, *a, **k: enumerated.append(1) or implementations(plan, *a, **k)
    )
    module = dnnl.DnnlModule(tagged, layout=other)
    layouts = [module.conv_layouts[n.name] for n in convs]
    if variant == "mixed":
        assert layouts == ["blocked", "channels_last", "blocked"]  # the 3x3, the 1x1 gate, the batch norm
        assert POINTWISE in (Path(__file__).parents[2] / "docs" / "rules.md").read_text()
    elif variant == "per_conv":  # every convolution raced all of oneDNN's kernels in both layouts
        assert len(enumerated) == 3 * 2 and set(layouts) <= {"blocked", "channels_last"}
    else:
        assert layouts == [variant] * 3 and enumerated == []
        assert list(dnnl.DnnlModule(graph, layout=variant).conv_layouts.values()) == layouts
    with torch.no_grad():
        torch.testing.assert_close(module(x)[0], model(x), rtol=1e-4, atol=1e-4)


def test_the_docs_example_of_a_runtime_fusion_loads_and_is_sound():
    """docs/rules.md, "Target phases": the worked example of adding a fusion to the oneDNN runtime."""
    import re

    from gawee.rewrite.ruleset import load_rules_text
    from gawee.testing import check_rule

    doc = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text(encoding="utf-8")
    section = doc.split("## Target phases", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    (block,) = re.findall(r"```\n(.*?)```", section, re.S)
    (rule,) = load_rules_text(block, "docs/rules.md").rules
    assert rule.name == "onednn_binary_clamp"
    result = check_rule(rule, examples=40)
    assert result.verdict in ("proven", "sound") and result.fired > 0, result.verdict
    # an integer tensor is clamped to float bounds in float; the fused one would keep its integer dtype
    unguarded = block.replace(" and a.dtype == f32 and c.dtype == f32", "")
    assert check_rule(load_rules_text(unguarded, "docs/rules.md").rules[0], examples=40).verdict == "UNSOUND"


DENSE = """
import torch
import torch.nn as nn


class Dense(nn.Module):
    '''Two DenseNet layers: each normalizes the concatenation of everything before it, then a ReLU and a conv.'''

    def __init__(self):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(16), nn.Conv2d(16, 16, 3, padding=1)
        self.bn2, self.conv2 = nn.BatchNorm2d(32), nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = self.conv1(torch.relu(self.bn1(x)))
        return self.conv2(torch.relu(self.bn2(torch.cat([x, y], 1))))


def make():
    torch.manual_seed(0)
    model = Dense().eval()
    for bn in (model.bn1, model.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return model, (torch.randn(2, 16, 8, 8),)
"""


def test_the_affine_cat_phase_runs_where_its_kernel_builds(monkeypatch):
    from gawee.backend import affine_cat

    namespace: dict = {}
    exec(DENSE, namespace)
    model, (x,) = namespace["make"]()
    graph, _ = gawee.rewrite(gawee.capture(model, (x,)))
    monkeypatch.setattr(affine_cat, "unavailable", lambda: None)
    lowered, report = dnnl.RUNTIME.lower(graph)
    assert [(n.op, n.attrs.get("act")) for n in lowered if n.op.startswith("onednn_")] == [
        ("onednn_batch_norm", "relu"),
        ("onednn_affine_cat", "relu"),
    ]
    assert report.firings["onednn_affine_cat"] == 1
    with torch.no_grad():
        torch.testing.assert_close(run(lowered, x)[0], model(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(affine_cat, "unavailable", lambda: "no C compiler")
    assert "onednn_affine_cat" not in {r.name for r in dnnl.RUNTIME.rules.rules}
    lowered, _ = dnnl.RUNTIME.lower(graph)
    assert "onednn_affine_cat" not in {n.op for n in lowered} and "cat" in {n.op for n in lowered}
