"""Backends: run a Graph as a torch module on fused kernels (to_torch), export it to ONNX (to_onnx)."""

from gawee.backend.torch_backend import BoundOp, TorchLowering, TorchOptions, to_torch

__all__ = ["BoundOp", "TorchLowering", "TorchOptions", "to_torch"]
