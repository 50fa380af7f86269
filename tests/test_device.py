"""A graph whose data lives off the CPU is rewritten, verified and lowered where it lives.

No accelerator is needed: torch's lazy-tensor device (TorchScript backend, CPU kernels) is a device other than the
CPU with real values, on which mixing in a CPU tensor fails as it does on a GPU (a 0-d CPU tensor is allowed, as
there); the meta device has no values. Lazy tensors' ``split`` is broken (its pieces read as CPU tensors), so the
graphs run there have no split.
"""

from __future__ import annotations

import copy

import pytest
import torch

import gawee
from gawee.backend import compiler
from gawee.equivalence import verify_rewrite


@pytest.fixture(scope="module")
def lazy():
    try:
        import torch._lazy.ts_backend

        torch._lazy.ts_backend.init()
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"torch's lazy-tensor device is unavailable: {e}")
    return torch.device("lazy", 0)


class ConvHead(torch.nn.Module):
    """conv + batch norm (fold_conv_bn: weight * a CPU-made reshape of the scale), relu, a linear times a literal."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 5, padding=2)  # 4800 weights: a folded constant scanned as a large one
        self.bn = torch.nn.BatchNorm2d(64)
        self.fc = torch.nn.Linear(64, 80)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3))) * 0.5


class Projections(ConvHead):
    """ConvHead, then three projections of one input (fuse_three_projections_unbiased: cat of the weights)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(80, 80, bias=False) for _ in range(3))

    def forward(self, x):
        y = super().forward(x)
        return self.q(y) + self.k(y) + self.v(y)


@pytest.mark.parametrize("device", ["meta", "lazy"])
def test_bundled_rules_fold_where_the_constants_live(device, request):
    """Folding evaluates on the constants' device and leaves its results there: literals (eps, 0.5, reshape
    shapes) made on the CPU join them, and the checks of a folded constant read it there."""
    if device == "lazy":
        device = request.getfixturevalue("lazy")
    graph = gawee.capture(Projections().eval(), (torch.randn(2, 3, 8, 8),)).to(device)
    assert graph.device == torch.device(device)
    out, report = gawee.rewrite(graph, gawee.default_rules())
    assert "fuse_three_projections_unbiased" in report.firings
    if graph.device.type != "meta":  # meta has no values: the guards that read them refuse
        assert {"fold_conv_bn", "fold_linear_mul"} <= set(report.firings)
    assert {v.data.device for v in out.constants()} == {torch.device(device)}


def test_a_graph_on_another_device_is_verified_lowered_and_compiled_there(lazy, monkeypatch):
    model = ConvHead().eval()
    x = torch.randn(2, 3, 8, 8)
    graph = gawee.capture(model, (x,)).to(lazy)
    out, report = gawee.rewrite(graph, gawee.default_rules(), trace=True)
    verification = verify_rewrite(graph, out, report.trace, distributions=("normal", "x100"))
    assert verification.ok, verification
    torch.testing.assert_close(gawee.to_torch(out)(x.to(lazy))[0].cpu(), model(x))

    # gawee.compile of the model on that device (torch.export cannot trace lazy tensors: captured on the CPU)
    capture = compiler.capture
    monkeypatch.setattr(
        compiler, "capture", lambda m, xs, **kw: capture(copy.deepcopy(m).cpu(), [a.cpu() for a in xs], **kw).to(lazy)
    )
    on_device = copy.deepcopy(model).to(lazy)
    module = gawee.compile(on_device, (x.to(lazy),))
    torch.testing.assert_close(module(x.to(lazy)).cpu(), model(x))
    not_measured = module.gawee_report.backend.not_candidates
    assert not_measured and all("runs on the CPU only" in why for why in not_measured.values())
    with pytest.raises(gawee.GaweeError, match="'onnxruntime' runs on the CPU only; the model is on lazy"):
        gawee.compile(on_device, (x.to(lazy),), backend="onnxruntime")
