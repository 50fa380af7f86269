"""Attention's kernel: aten's, or oneDNN Graph's partition, chosen by measurement where the partition is torch's result.

Which kernel wins is CPU-dependent, so the tests force a choice (``TorchOptions.attention_kernel``) or the winner of
the measurement, and check that the module computes the model's result either way, that the lowering calls the
partition only where it is sound, and that a partition computing something else is never chosen.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.backend import attention, kernels, onednn_graph
from gawee.backend.attention import Partition
from gawee.backend.torch_backend import TorchOptions
from gawee.errors import GaweeError

LOWERING = TorchOptions(whole_graph=False)
"""The torch lowering itself: these tests look at its kernels (oneDNN Graph's whole-graph runtime is not measured)."""

needs_fuser = pytest.mark.skipif(
    onednn_graph.unavailable("attention") is not None,
    reason="no oneDNN Graph fuser that passes its attention trial here",
)


class _Attend(torch.nn.Module):
    """Attentions without a mask; with a finite constant mask, a permuted one (swin_t's bias), a constant bool one;
    a constant mask that shuts a row; run-time float and bool masks; causal, on as many keys as queries and on more."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.randn(5, 5))
        self.register_buffer("permuted", torch.randn(5, 5, 3).permute(2, 0, 1))
        self.register_buffer("where", (torch.rand(5, 5) > 0.5) | torch.eye(5, dtype=torch.bool))
        shut = torch.zeros(5, 5)
        shut[2] = float("-inf")
        self.register_buffer("shut", shut)

    def forward(self, q, k, v, mask, keep):
        a = F.scaled_dot_product_attention(q, k, v)
        b = F.scaled_dot_product_attention(a, k, v, attn_mask=self.bias)
        c = F.scaled_dot_product_attention(b, k, v, attn_mask=self.permuted)
        d = F.scaled_dot_product_attention(c, k, v, attn_mask=self.where)
        e = F.scaled_dot_product_attention(d, k, v, attn_mask=self.shut)
        f = F.scaled_dot_product_attention(e, k, v, attn_mask=mask, scale=0.3)
        g = F.scaled_dot_product_attention(f, k, v, attn_mask=keep)
        h = F.scaled_dot_product_attention(g, k, v, is_causal=True)
        longer = torch.cat([k, v], dim=2)
        return F.scaled_dot_product_attention(h, longer, longer, is_causal=True)


def measuring_wins(monkeypatch, winner: str) -> list[list[str]]:
    """Every attention measured from now on picks ``winner``; the list of the candidates each measurement had."""
    measured = []

    def best_calls(runners, args, *rest):
        measured.append(sorted(runners))
        return {name: 1.0 if name == winner else 2.0 for name in runners}

    monkeypatch.setattr(kernels, "best_calls", best_calls)
    monkeypatch.setattr(attention, "_MEASURED", {})
    return measured


def _inputs(shut_row: bool = False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, generator=g)
    keep = (torch.rand(2, 1, 5, 5, generator=g) > 0.5) | torch.eye(5, dtype=torch.bool)
    if shut_row:  # rows no key is attended from, at run time: torch's kernel gives 0 there, a softmax NaN
        mask[0, 0, 1] = float("-inf")
        keep[1, 0, 3] = False
    return q, k, v, mask, keep


def _targets(module) -> list:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


@needs_fuser
def test_the_partition_runs_only_where_it_is_torchs_result_and_equals_the_model():
    net, xs = _Attend().eval(), _inputs()
    module = gawee.compile(net, xs, options=TorchOptions(attention_kernel="onednn_graph", whole_graph=False))
    partitions = [t for t in _targets(module) if isinstance(t, Partition)]
    # all but the constant mask that shuts a row
    assert len(partitions) == 8
    chosen = [c for c in module.gawee_kernels if c.op == "attention"]
    assert {c.kernel for c in chosen} == {"onednn_graph"} and sum(c.nodes for c in chosen) == 8
    assert sum(c.mask is not None for c in chosen) == 7
    for inputs in (xs, _inputs(shut_row=True)):  # a shut row at run time: that call runs aten's kernel
        torch.testing.assert_close(module(*inputs), net(*inputs), rtol=1e-5, atol=1e-5)


@needs_fuser
@pytest.mark.parametrize("winner", ["aten", "onednn_graph"])
def test_the_lowering_calls_the_kernel_that_measured_faster(monkeypatch, winner):
    measured = measuring_wins(monkeypatch, winner)
    net, xs = _Attend().eval(), _inputs()
    module = gawee.compile(net, xs, options=LOWERING)
    assert measured and all(names == ["aten", "onednn_graph"] for names in measured)
    partitions = [t for t in _targets(module) if isinstance(t, Partition)]
    assert len(partitions) == (8 if winner == "onednn_graph" else 0)
    assert {c.kernel for c in module.gawee_kernels if c.op == "attention"} == {winner}
    torch.testing.assert_close(module(*xs), net(*xs), rtol=1e-5, atol=1e-5)


class _Heads(torch.nn.Module):
    """An attention without a mask and a causal one (both in bf16 under the bf16 phase; the causal mask's term of 0
    and -inf is the same in bf16)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(F.scaled_dot_product_attention(q, k, v), k, v, is_causal=True)


@needs_fuser
@pytest.mark.parametrize("winner", ["aten", "onednn_graph"])
def test_a_bf16_attention_runs_the_partition_on_bf16_operands_within_the_rules_error(monkeypatch, winner):
    g = torch.Generator().manual_seed(0)
    net, xs = _Heads().eval(), tuple(torch.randn(1, 4, 24, 16, generator=g) for _ in range(3))
    shapes = tuple(tuple(x.shape) for x in xs)
    partition, why = attention._checked_partition(shapes, None, None, torch.bfloat16)  # tried in a child first
    if partition is None:
        pytest.skip(f"no bf16 attention partition on this CPU: {why}")
    measured = measuring_wins(monkeypatch, winner)
    module = gawee.compile(net, xs, precision="bf16", options=TorchOptions(whole_graph=False, precision="always"))
    assert module.gawee_report.rewrite.firings.get("sdpa_bf16") == 2
    chosen = [c for c in module.gawee_kernels if c.op == "attention"]
    assert [(c.dtype, c.mask is not None, c.nodes) for c in chosen] == [("bf16", False, 1), ("bf16", True, 1)]
    assert {c.kernel for c in chosen} == {winner} and measured == [["aten", "onednn_graph"]] * 2
    partitions = [t for t in _targets(module) if isinstance(t, Partition)]
    assert len(partitions) == (2 if winner == "onednn_graph" else 0)
    with torch.no_grad():
        got, want = module(*xs), net(*xs)
    error = (got - want).abs().max().item()
    assert 0 < error < 0.05 * want.abs().max().item()  # bf16 was used; the rules' bounds hold end to end


def test_a_bf16_attention_is_a_partition_problem_where_its_mask_is_the_same_in_bf16():
    from gawee.ir.types import DType, TensorType

    bf, f = TensorType((1, 2, 5, 8), DType.bf16), TensorType((1, 2, 5, 8), DType.f32)
    attrs = {"is_causal": False, "dropout_p": 0.0, "enable_gqa": False, "scale": None}
    assert attention.problem([bf, bf, bf], None, None, attrs).dtype == torch.bfloat16
    assert attention.problem([bf, f, bf], None, None, attrs) is None
    causal = attention.problem([bf, bf, bf], None, None, {**attrs, "is_causal": True})
    assert causal.dtype == causal.mask.dtype == torch.bfloat16 and torch.isinf(causal.mask).sum() == 10
    shut = torch.rand(5, 5) > 0.5
    shut.fill_diagonal_(True)
    kept = attention.problem([bf, bf, bf], TensorType((5, 5), DType.bool), shut, attrs)  # a constant bool mask
    assert kept.dtype == torch.bfloat16 and torch.equal(kept.mask.isinf().reshape(5, 5), ~shut)
    biased = TensorType((5, 5), DType.f32), torch.randn(5, 5)  # a float mask's values would round in bf16
    assert attention.problem([bf, bf, bf], *biased, attrs) is None
    assert attention.problem([bf, bf, bf], TensorType((5, 5), DType.bool), None, attrs) is None  # a run-time one
    assert attention.problem([f, f, f], None, None, attrs).dtype == torch.float32


class _Layers(torch.nn.Module):
    """Three attention layers reading one run-time mask, as a transformer's do."""

    def forward(self, q, k, v, keep):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return q


@needs_fuser
def test_a_run_time_mask_is_made_a_term_once_per_call_for_every_layer_that_reads_it():
    net, (q, k, v, _, keep) = _Layers().eval(), _inputs()
    module = gawee.compile(
        net, (q, k, v, keep), options=TorchOptions(attention_kernel="onednn_graph", whole_graph=False)
    )
    targets = _targets(module)
    assert targets.count(onednn_graph.additive_mask) == 1
    assert len([t for t in targets if isinstance(t, Partition)]) == 3
    for inputs in ((q, k, v, keep), _inputs(shut_row=True)[:3] + _inputs(shut_row=True)[4:]):
        torch.testing.assert_close(module(*inputs), net(*inputs), rtol=1e-5, atol=1e-5)


class _Grouped(torch.nn.Module):
    """Grouped-query attention (4 query heads per key/value head): causal, with a constant bool mask, with a run-time
    mask over heads and one over the query heads, and with a mask that shuts a row at run time."""

    def __init__(self):
        super().__init__()
        self.register_buffer("where", (torch.rand(1, 1, 6, 6) > 0.5) | torch.eye(6, dtype=torch.bool))

    def forward(self, q, k, v, mask, per_head):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        b = F.scaled_dot_product_attention(a, k, v, attn_mask=self.where, enable_gqa=True)
        c = F.scaled_dot_product_attention(b, k, v, attn_mask=mask, enable_gqa=True)
        return F.scaled_dot_product_attention(c, k, v, attn_mask=per_head, enable_gqa=True, scale=0.2)


@needs_fuser
def test_grouped_query_attention_runs_folded_into_as_many_heads_as_the_keys_have():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 8, 6, 16, generator=g), torch.randn(2, 2, 6, 16, generator=g), torch.randn(2, 2, 6, 16)
    mask = torch.randn(2, 1, 6, 6, generator=g)
    per_head = torch.randn(2, 8, 6, 6, generator=g)
    net = _Grouped().eval()
    module = gawee.compile(
        net, (q, k, v, mask, per_head), options=TorchOptions(attention_kernel="onednn_graph", whole_graph=False)
    )
    partitions = [t for t in _targets(module) if isinstance(t, Partition)]
    assert len(partitions) == 4 and {p.groups for p in partitions} == {4}
    # timed and compiled as 2 heads of 4 x 6 rows
    assert {c.query for c in module.gawee_kernels if c.op == "attention"} == {(2, 2, 24, 16)}
    torch.testing.assert_close(module(q, k, v, mask, per_head), net(q, k, v, mask, per_head), rtol=1e-5, atol=1e-5)
    mask[1, 0, 2] = float("-inf")  # a row shut at run time: aten's grouped kernel runs that call
    torch.testing.assert_close(module(q, k, v, mask, per_head), net(q, k, v, mask, per_head), rtol=1e-5, atol=1e-5)


def test_a_partition_that_computes_something_else_is_not_a_candidate(monkeypatch):
    def wrong(query, key, value, mask=None, scale=None):
        return torch.matmul(torch.softmax(torch.matmul(query, key.transpose(-1, -2)), -1), value)  # scale lost

    monkeypatch.setattr(onednn_graph, "written_attention", wrong)
    monkeypatch.setattr(attention, "_MEASURED", {})
    choice, partition = attention.choose(((1, 2, 6, 16),) * 3, None, None)
    assert partition is None and choice.kernel == "aten" and not choice.ms
    assert "partition differs from aten's result" in str(choice)
    forced, partition = attention.choose(((1, 2, 6, 16),) * 3, None, None, "onednn_graph")
    assert partition is None and forced.kernel == "aten"


def test_without_the_fuser_attention_runs_on_aten(monkeypatch):
    no_attention = lambda part="partitions": "planted: no attention" if part == "attention" else None
    monkeypatch.setattr(onednn_graph, "unavailable", no_attention)
    monkeypatch.setattr(attention, "_MEASURED", {})
    net, xs = _Attend().eval(), _inputs()
    module = gawee.compile(net, xs, options=LOWERING)
    assert not [t for t in _targets(module) if isinstance(t, Partition)]
    torch.testing.assert_close(module(*xs), net(*xs), rtol=1e-5, atol=1e-5)


def test_a_fuser_that_crashes_on_attention_keeps_its_partitions_and_attention_runs_on_aten(monkeypatch):
    """The trial's attention runs in the child process after its convolutions: an abort there costs the attention
    candidate only."""
    monkeypatch.setattr(onednn_graph, "TRIAL", 'print("partitions ok", flush=True); import os; os.abort()')
    monkeypatch.setattr(attention, "_MEASURED", {})
    onednn_graph._trial.cache_clear()
    try:
        assert onednn_graph.unavailable() is None and "attention" in onednn_graph.unavailable("attention")
        net, xs = _Attend().eval(), _inputs()
        module = gawee.compile(net, xs, options=LOWERING)
        assert not [t for t in _targets(module) if isinstance(t, Partition)]
        assert {c.kernel for c in module.gawee_kernels if c.op == "attention"} == {"aten"}
        torch.testing.assert_close(module(*xs), net(*xs), rtol=1e-5, atol=1e-5)
    finally:
        monkeypatch.undo()
        onednn_graph._trial.cache_clear()


def test_additive_mask_is_the_term_that_gives_torchs_result_or_none():
    where = torch.tensor([[True, False], [False, True]])
    term = torch.tensor([[[[0.0, -torch.inf], [-torch.inf, 0.0]]]])
    assert torch.equal(onednn_graph.additive_mask(where), term)
    assert onednn_graph.additive_mask(torch.tensor([[True, False], [False, False]])) is None  # a row attends nothing
    partly = torch.tensor([[0.5, -torch.inf], [1.0, 2.0]])
    assert torch.equal(onednn_graph.additive_mask(partly), partly.view(1, 1, 2, 2))  # 4-D, as the fuser needs
    assert onednn_graph.additive_mask(torch.zeros(1, 1, 1, 1, 2)) is None
    for bad in ([[-torch.inf, -torch.inf], [0.0, 0.0]], [[torch.nan, 0.0]], [[torch.inf, 0.0]]):
        assert onednn_graph.additive_mask(torch.tensor(bad)) is None
    assert onednn_graph.additive_mask(torch.zeros(2, 2, dtype=torch.float16)) is None


def test_unknown_attention_kernel_is_a_typed_error():
    net, xs = _Attend().eval(), _inputs()
    with pytest.raises(GaweeError, match="unknown attention kernel 'flash'") as e:
        gawee.compile(net, xs, options=TorchOptions(attention_kernel="flash"))
    assert "onednn_graph" in e.value.hint
