"""1×1 convolutions as one GEMM: the kernel is exact in every layout and epilogue, and gawee.compile runs the
kernel it measured (or was told) on exactly the 1×1, stride-1, unpadded, one-group convolutions.

Which candidate wins depends on the CPU and the shape, so the tests never assume it: they check that the
choice is recorded, is the fastest of what was measured, and is what the generated fx code calls.
"""

import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.backend import kernels
from gawee.backend.torch_backend import TorchOptions
from gawee.errors import GaweeError
from gawee.ops.nn import apply_act


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(1, 6, 5, 7), (3, 6, 5, 7), (2, 6, 1, 1)])
def test_gemm_equals_the_convolution_with_every_epilogue(shape, channels_last):
    g = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
    weight = torch.randn(4, shape[1], 1, 1, generator=g)
    for bias in (None, torch.randn(4, generator=g)):
        for residual in (None, torch.randn(shape[0], 4, *shape[2:], generator=g).contiguous(memory_format=fmt)):
            for act, params in ((None, ()), ("relu", ()), ("hardtanh", (0.0, 6.0)), ("hardswish", ())):
                kept = None if residual is None else residual.clone()
                got = kernels.conv1x1_gemm(x, weight.view(4, -1), bias, residual, act, params)
                y = F.conv2d(x, weight, bias)
                expected = apply_act(y if residual is None else y + residual, act, params)
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
                assert got.is_contiguous(memory_format=fmt)  # the input's layout, no copy back
                assert residual is None or torch.equal(residual, kept)  # operands are never written


class SqueezeExcite(torch.nn.Module):
    """1×1 convolutions of every kind: expand (+BN+ReLU6), a squeeze-excitation on a 1×1 map, a residual
    projection; and a strided 1×1 and a 3×3, which keep oneDNN."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.BatchNorm2d(16), torch.nn.ReLU6())
        self.squeeze = torch.nn.Conv2d(16, 4, 1)
        self.excite = torch.nn.Conv2d(4, 16, 1)
        self.project = torch.nn.Conv2d(16, 8, 1, bias=False)
        self.strided = torch.nn.Conv2d(8, 8, 1, stride=2)
        self.spatial = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.expand(x)
        s = torch.sigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        y = self.project(y * s) + x
        return self.spatial(self.strided(y))


def _gemm_calls(module) -> int:
    return sum(n.op == "call_function" and n.target is kernels.conv1x1_gemm for n in module.graph.nodes)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("kernel", ["measure", *kernels.CONV1X1_KERNELS])
def test_compiled_module_runs_the_chosen_kernel_and_equals_eager(kernel, channels_last):
    torch.manual_seed(0)
    model = SqueezeExcite().eval()
    with torch.no_grad():
        model.expand[1].running_mean.normal_()
        model.expand[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 8, 12, 12)
    options = TorchOptions(conv1x1_kernel=kernel, channels_last=channels_last, whole_graph=False)
    module = gawee.compile(model, (x,), options=options)
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-5)
    eligible = 4  # expand, squeeze, excite, project: not the strided 1×1 nor the 3×3
    choices = [c for c in module.gawee_report.kernels if c.op == "conv1x1"]
    assert sum(c.nodes for c in choices) == eligible
    assert _gemm_calls(module) == sum(c.nodes for c in choices if c.kernel == "gemm")
    assert any(c.residual for c in choices)  # the projection's residual add is part of its kernel
    if kernel == "measure":
        assert all(c.ms[c.kernel] == min(c.ms.values()) and set(c.ms) == {"onednn", "gemm"} for c in choices)
    else:
        assert all(c.kernel == kernel and not c.ms for c in choices)  # forced: nothing measured


def test_measured_choice_is_cached_per_shape():
    first = kernels.measure_conv1x1((1, 16, 7, 7), 32, True, False, "relu", min_rounds=2, budget_s=0.0)
    again = kernels.measure_conv1x1((1, 16, 7, 7), 32, True, False, "relu", min_rounds=2, budget_s=0.0)
    assert again is first and first.ms[first.kernel] == min(first.ms.values())  # chosen before rounding: ties
    assert str(first).startswith("conv1x1 49x16->32+bias+relu")


def test_unknown_conv1x1_kernel_is_a_typed_error():
    m = torch.nn.Conv2d(4, 3, 1).eval()
    with pytest.raises(GaweeError, match="unknown 1x1 convolution kernel") as e:
        gawee.to_torch(gawee.capture(m, (torch.randn(1, 4, 5, 5),)), TorchOptions(conv1x1_kernel="blas"))
    assert "measure" in str(e.value.hint)
