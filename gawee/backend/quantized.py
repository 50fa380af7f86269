"""The int8 dynamic linear kernel of the torch target: torch's ``quantized::linear_dynamic`` (fbgemm or oneDNN, as
torch's quantized engine says) on a weight prepacked once at build time, computing what the op
``linear_int8_dynamic`` (:mod:`gawee.ops.quantized`) computes: the input quantized per tensor to [0, levels]
(127: ``reduce_range``; 255: 8 bits, exact only where the CPU has VNNI), an integer product, a float32
dequantization and bias."""

from __future__ import annotations

import warnings

import torch

from gawee.cpu import no_vnni
from gawee.ops.nn import apply_act

ENGINES = frozenset({"x86", "fbgemm", "onednn"})
"""torch's quantized engines whose dynamic linear quantizes the input as the op's reference semantics do."""

KERNEL = "quantized::linear_dynamic"


def unavailable(levels: int = 127) -> str | None:
    """Why this torch's current quantized engine cannot run the kernel with inputs quantized to [0, levels] (x86
    CPUs can: fbgemm or oneDNN; 8-bit inputs only with VNNI, :func:`gawee.cpu.no_vnni`), or None."""
    engine = torch.backends.quantized.engine
    if engine not in ENGINES:
        return f"torch's quantized engine is {engine!r}, not one of {', '.join(sorted(ENGINES))}"
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return f"this torch has no {KERNEL}"
    if levels != 127:
        why = no_vnni()
        if why is not None:
            return f"{why}: its kernel computes 8-bit inputs inexactly"
    return None


class DynamicInt8Linear:
    """act(linear_dynamic(x, packed) + bias) for an int8 weight [out, in] with one float32 scale per row, packed
    now (with the bias when it is a constant of one element per row; otherwise the bias is added after). A named
    callable (``<node>_int8_linear(x)`` in the generated code), so fx can print it."""

    __module__ = "gawee"

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        act: str | None,
        act_params: tuple,
        levels: int = 127,
    ):
        self.__name__ = self.__qualname__ = f"{name}_int8_linear"
        rows = weight.shape[0]
        with warnings.catch_warnings():  # torch deprecates quantized tensors; its dynamic kernels still take them
            warnings.simplefilter("ignore")
            q = torch._make_per_channel_quantized_tensor(
                weight.contiguous(), scale.double(), torch.zeros(rows, dtype=torch.int64), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(q, bias)
        self.features = weight.shape[1]
        self.act, self.act_params = act, act_params
        self.reduce_range = levels == 127

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.features)
        y = torch.ops.quantized.linear_dynamic(flat, self.packed, self.reduce_range)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if bias is not None:
            y = y + bias
        if self.act == "relu":
            return y.relu_()
        return apply_act(y, self.act, self.act_params)
