"""The bundled rules on transformers: one linear per layer's Q/K/V (and a gated MLP's gate/up), GPT-2's
written-out GELU and Conv1D recognized, the optimized graph equal to the captured one."""

from collections import Counter

import pytest
import torch

import gawee
from gawee.equivalence import verify_equivalent
from gawee.frontend.capture import capture
from gawee.frontend.models import resolve
from gawee.rewrite.driver import rewrite

pytest.importorskip("transformers")

LAYERS = 2  # the small built-in configs (gawee.frontend.families.SIZES)


@pytest.fixture(scope="module")
def optimized():
    cache = {}

    def get(spec):
        if spec not in cache:
            source = resolve(spec)
            with torch.no_grad():  # biases as trained ones are: initialization's zeros are dropped (zero_bias)
                for name, p in source.module.named_parameters():
                    if name.endswith("bias") and not p.any():
                        p.normal_(0, 0.02)
            graph = capture(source.module, source.example_inputs, name=source.name)
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


@pytest.mark.parametrize("spec", ["hf:llama", "hf:t5-encoder"])
def test_rms_norms_written_out_become_rms_norm(optimized, spec):
    """T5's and Llama's RMSNorm (x * rsqrt(mean(x^2) + eps) * w): one rms_norm per norm (their weights are
    initialized to ones, which mul_one removes first)."""
    graph, after, report = optimized(spec)
    norms = 2 * LAYERS + 1  # before attention and MLP in each layer, and the final one
    assert report.firings["rms_norm_written"] == norms
    ops = Counter(n.op for n in after)
    assert ops["rms_norm"] == norms and ops["rsqrt"] == 0 and ops["pow"] == 0 and ops["mean"] == 0
    assert all(n.attrs["eps"] == pytest.approx(1e-6) for n in after if n.op == "rms_norm")
    assert verify_equivalent(graph, after).ok


class HFRMSNorm(torch.nn.Module):
    """Llama's RMSNorm as transformers writes it: float32 inside, the weight applied in the input's dtype."""

    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_written_in_float32_with_a_weight_becomes_one_rms_norm(dtype):
    model = HFRMSNorm(16).to(dtype)
    x = torch.randn(2, 5, 16).to(dtype)
    graph = gawee.capture(model, (x,))
    after, report = rewrite(graph)
    assert [n.op for n in after] == ["rms_norm"]
    assert after.nodes[0].inputs[1] is not None
    expected = {"rms_norm_written", "rms_norm_weight"} | ({"rms_norm_upcast"} if dtype != torch.float32 else set())
    assert expected <= set(report.firings)
    assert verify_equivalent(graph, after).ok


class WrittenLayerNorm(torch.nn.Module):
    """LayerNorm written out, as BERT ports and custom blocks do: two spellings of the variance and the scale."""

    def __init__(self, width, rsqrt):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(width))
        self.rsqrt = rsqrt

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        if self.rsqrt:
            y = c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5)
        else:
            y = c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + 1e-12)
        return self.weight * y + self.bias


@pytest.mark.parametrize("rsqrt", [False, True])
def test_layer_norm_written_out_becomes_one_layer_norm(rsqrt):
    model = WrittenLayerNorm(16, rsqrt)
    x = torch.randn(2, 5, 16) * 3 + 1
    graph = gawee.capture(model, (x,))
    after, report = rewrite(graph)
    assert [n.op for n in after] == ["layer_norm"]
    node = after.nodes[0]
    assert node.inputs[1] is not None and node.inputs[2] is not None
    assert node.attrs["eps"] == pytest.approx(1e-5 if rsqrt else 1e-12)
    assert {"layer_norm_written", "layer_norm_weight", "layer_norm_bias"} <= set(report.firings)
    assert verify_equivalent(graph, after).ok


class WrittenAttention(torch.nn.Module):
    """Attention written out as T5 (no scale) and GPT-2's eager path (times 1/sqrt(d)) write it."""

    def __init__(self, scaled):
        super().__init__()
        self.scaled = scaled

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2)
        if self.scaled:
            scores = scores * q.shape[-1] ** -0.5
        return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("scaled", [False, True])
def test_attention_written_out_becomes_sdpa(scaled):
    xs = tuple(torch.randn(1, 2, 5, 8) for _ in range(3))
    graph = gawee.capture(WrittenAttention(scaled), xs)
    after, report = rewrite(graph)
    assert [n.op for n in after] == ["scaled_dot_product_attention"]
    assert after.nodes[0].attrs["scale"] == pytest.approx(8**-0.5 if scaled else 1.0)
    assert report.firings["attention_written_scaled" if scaled else "attention_written"] == 1
    assert verify_equivalent(graph, after).ok


@pytest.mark.parametrize("shift,batch", [(0, 1), (2, 1), (0, 3), (2, 3)])
def test_swin_window_attention_with_its_bias_and_shifted_mask_becomes_sdpa(shift, batch):
    """torchvision's Swin attention scales q before the product, adds the relative-position bias and, in shifted
    windows, the window mask through a [batch, windows, ...] view: one sdpa with the biases summed, and the
    model's output unchanged (the interpreter and the compiled module against eager). At batch > 1 the mask
    differs per window but not per image: the sdpa runs over [batch, windows * heads] with a bias of batch 1."""
    from torchvision.models.swin_transformer import ShiftedWindowAttention

    torch.manual_seed(0)
    model = ShiftedWindowAttention(dim=16, window_size=[4, 4], shift_size=[shift, shift], num_heads=2).eval()
    with torch.no_grad():
        model.relative_position_bias_table.normal_(0, 1.0)  # zeros at initialization would hide the bias
    x = torch.randn(batch, 8, 8, 16)
    graph = gawee.capture(model, (x,))
    after, report = rewrite(graph)
    ops = Counter(n.op for n in after)
    assert ops["scaled_dot_product_attention"] == 1 and "softmax" not in ops and "matmul" not in ops
    if not shift:
        rule = "attention_written_biased_q_scaled"
    else:
        rule = "attention_written_biased_twice_q_scaled" if batch == 1 else "attention_windowed"
    assert report.firings[rule] == 1
    sdpa = next(n for n in after if n.op == "scaled_dot_product_attention")
    assert sdpa.inputs[3].is_const and sdpa.attrs["scale"] == pytest.approx(8**-0.5)
    if rule == "attention_windowed":  # 4 windows of 4x4 in an 8x8 image, 2 heads each
        assert sdpa.inputs[0].type.shape == (batch, 4 * 2, 16, 8) and sdpa.inputs[3].type.shape == (1, 4 * 2, 16, 16)
    assert verify_equivalent(graph, after).ok
    with torch.no_grad():
        torch.testing.assert_close(gawee.compile(model, (x,))(x), model(x), rtol=1e-4, atol=1e-5)
