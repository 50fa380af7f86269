"""The int8 rules' bound written out in float64 (rules/precision/int8.rules, `linear_int8`), and a small MLP's
output held to it through both layers: shared by the optimize and compile tests of the int8 precision phase."""

import torch

from gawee.cpu import no_vnni
from gawee.ops.quantized import linear_int8_dynamic, quantize_per_channel_symmetric

U = 2.0**-24
UNDERFLOW = 2.0**-150

MODEL = """
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    return model, (torch.randn(4, 32),)
"""


def make() -> tuple[torch.nn.Sequential, torch.Tensor]:
    namespace: dict = {}
    exec(MODEL, namespace)
    model, (x,) = namespace["make"]()
    return model, x


def levels() -> int:
    """The levels the int8 rules quantize activations to on this CPU (``int8_levels()``)."""
    return 255 if no_vnni() is None else 127


def int8_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, lv: int | None = None) -> torch.Tensor:
    """linear_int8's declared bound on x [..., n], w [out, n], b [out], in float64, for activations quantized to
    [0, lv] (default: this CPU's levels)."""
    lv = levels() if lv is None else lv
    x, w, b = x.double(), w.double(), b.double()
    n = x.shape[-1]
    spread = x.clamp(min=0).amax() + (-x).clamp(min=0).amax()
    ex = (0.5 + (lv - 127) / 128 + 512 * U) * torch.clamp(spread / lv, min=6.1e-5)
    ew = (0.5 + 256 * U) * w.abs().amax(dim=1) / 127 + 127 * UNDERFLOW
    qe = ew * x.abs().sum(dim=-1, keepdim=True) + ex * w.abs().sum(dim=1) + n * ex * ew
    return qe + 5 * U * (x.abs() @ w.abs().T + qe + b.abs()) + UNDERFLOW * (n * 32768 + 1)


def assert_within_mlp_bound(model: torch.nn.Sequential, x: torch.Tensor, got: torch.Tensor) -> float:
    """``got`` (the int8 model's output on ``x``) is within the bound carried through both layers: the first
    layer's quantized output h' is within its bound of h, and the output within |h' - h| @ |W2|^T plus the
    second layer's bound at h'. Returns the largest error."""
    l1, l2 = model[0], model[2]
    w1, b1, w2, b2 = (t.detach() for t in (l1.weight, l1.bias, l2.weight, l2.bias))
    h = torch.relu(x.double() @ w1.double().T + b1.double())
    q1, s1 = quantize_per_channel_symmetric(w1, axis=0)
    h_int8 = linear_int8_dynamic(x, q1, s1, b1, act="relu", levels=levels())
    assert bool(((h_int8.double() - h).abs() <= int8_bound(x, w1, b1)).all())
    truth = h @ w2.double().T + b2.double()
    carried = (h_int8.double() - h).abs() @ w2.double().abs().T + int8_bound(h_int8, w2, b2)
    error = (got.double() - truth).abs()
    assert bool((error <= carried).all()), (error - carried).max()
    return float(error.max())
