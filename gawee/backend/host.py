"""Calling a module compiled for another runtime (ONNX Runtime, IREE, oneDNN Graph) with torch tensors: the inputs
checked against the compiled types and handed over as numpy arrays, the outputs given back as torch
tensors in the model's own nesting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from gawee.ir.types import DType, TensorType


def check_inputs(inputs: Sequence[torch.Tensor], types: Sequence[TensorType]) -> None:
    """TypeError naming the input that does not have its compiled type (or the count that differs)."""
    if len(inputs) != len(types):
        raise TypeError(f"the compiled module takes {len(types)} inputs, got {len(inputs)}")
    for i, (x, t) in enumerate(zip(inputs, types)):
        if tuple(x.shape) != t.shape or x.dtype != t.dtype.torch:
            raise TypeError(f"input {i} must be {t}, got {x.dtype}{list(x.shape)}")


def numpy_inputs(inputs: Sequence[torch.Tensor], types: Sequence[TensorType], runtime: str) -> list[np.ndarray]:
    """``inputs`` as contiguous numpy arrays; TypeError naming the input that does not have its compiled type."""
    check_inputs(inputs, types)
    arrays = []
    for x, t in zip(inputs, types):
        if t.dtype is DType.bf16:
            raise TypeError(f"bf16 inputs have no numpy form for {runtime}")
        arrays.append(x.detach().cpu().contiguous().numpy())
    return arrays


def arrange(outputs: Sequence[torch.Tensor], structure: Any) -> Any:
    """The outputs as a tuple, or nested as ``structure`` (a pytree spec: the model's own nesting)."""
    outs = tuple(outputs)
    return outs if structure is None else pytree.tree_unflatten(list(outs), structure)
