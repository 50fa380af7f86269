"""gawee's quantization of float32 NCHW into u8 codes held channels-last (gawee/backend/quantize_nhwc.py): the
codes oneDNN's scaled reorder computes, bit for bit, ties, saturation and non-finite values included."""

import ctypes

import pytest
import torch

from gawee.backend import dnnl, quantize_nhwc
from gawee.backend import dnnl_plan as P
from gawee.ir.core import Graph
from gawee.ir.types import DType

pytestmark = [
    pytest.mark.skipif(quantize_nhwc.unavailable() is not None, reason=str(quantize_nhwc.unavailable())),
    pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable())),
]


def _onednn_codes(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """oneDNN's scaled reorder of ``x`` into u8 codes held channels-last, as the runtime plans it
    (``_Plan.quantized``)."""
    plan = P._Plan(Graph("codes"), "channels_last")
    shape = list(x.shape)
    src = P._Tensor(plan.md(shape), plan.memory(plan.md(shape), None, x.data_ptr()), None)
    dst = plan.quantized(src, plan.activation_md(shape, "channels_last", DType.u8), (scale, zero_point))
    function, args, _ = plan.steps[-1]
    assert function(*args) == 0
    plan.lib.dnnl_stream_wait(plan.stream)
    n, c, h, w = shape
    codes = dst.buffer.tensor.view(torch.uint8)[: x.numel()].clone()
    dnnl._destroy(plan.lib, plan.handles)
    return codes.reshape(n, h, w, c)


def _gawee_codes(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    n, c, h, w = x.shape
    out = torch.full((n, h, w, c), 7, dtype=torch.uint8)
    at = ctypes.c_void_p(x.data_ptr())
    args = quantize_nhwc.args(ctypes.byref(at), out.data_ptr(), x.shape, P._inverse(scale), zero_point)
    assert quantize_nhwc.library().gawee_quantize_nhwc_u8(*args) == 0
    return out


@pytest.mark.parametrize(
    "shape, scale, zero_point",
    [
        ((1, 3, 224, 224), 0.0173, 117),  # an image: past the threads' split, the three-channel loop
        ((2, 3, 9, 11), 0.5, 3),  # pixels no block holds whole; two images
        ((1, 1, 70, 3), 0.25, 0),
        ((2, 5, 8, 8), 0.03, 255),
        ((1, 4, 130, 1), 1.0, 128),
    ],
)
def test_the_kernel_computes_onednns_codes(shape, scale, zero_point):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3
    flat = x.view(-1)
    inverse = P._inverse(scale)
    # ties: values whose scaled value is exactly halfway between two integers (a zero point added before the
    # rounding moves which neighbour is even), saturation, and the non-finite
    k = torch.randint(-300, 300, (flat.numel() // 3,)).float()
    flat[: k.numel()] = (k + 0.5) / inverse
    flat[-6:] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.0])
    assert torch.equal(_gawee_codes(x, scale, zero_point), _onednn_codes(x, scale, zero_point))
