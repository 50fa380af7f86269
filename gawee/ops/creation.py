"""Tensor creation: full, arange, fill — tensors made from attributes (and operand shapes)."""

from __future__ import annotations

import torch

from gawee.ir.types import DType
from gawee.ops import sampling as S
from gawee.ops.base import AtenBinding, Attr, OpDef, Operand, register, zero_flops

CREATE = frozenset({"pure", "creation"})


def _plain_device(args) -> bool:
    dev = args.get("device")
    return (
        (dev is None or torch.device(dev).type in ("cpu", "meta"))
        and not args.get("pin_memory")
        and args.get("layout") in (None, torch.strided)
    )


def _full_from(shape_of, value_of, dtype_of):
    def convert(args, types):
        if not _plain_device(args):
            return None
        value = value_of(args)
        dtype = dtype_of(args, types)
        if dtype is None:
            dtype = (
                torch.get_default_dtype()
                if isinstance(value, float)
                else torch.bool
                if isinstance(value, bool)
                else torch.int64
            )
        return {"shape": list(shape_of(args, types)), "value": value, "dtype": dtype}

    return convert


def _self_shape(args, types):
    return types["self"].shape


def _self_dtype(args, types):
    return args.get("dtype") if args.get("dtype") is not None else types["self"].dtype.value


def _given_dtype(args, types):
    return args.get("dtype")


def _given_or_default_dtype(args, types):
    """zeros, ones, empty, scalar_tensor: no dtype is torch's default float dtype, whatever the value."""
    return args.get("dtype") if args.get("dtype") is not None else torch.get_default_dtype()


register(
    OpDef(
        "full",
        (),
        lambda *, shape, value, dtype: torch.full(shape, value, dtype=DType.parse(dtype).torch),
        attrs=(Attr("shape", "ints"), Attr("value", "scalar"), Attr("dtype", "dtype")),
        traits=CREATE,
        flops=zero_flops,
        sample=lambda d, sl, a: (
            [],
            {"shape": S.shape(d), "value": d.choice([0, 1, -2.5, 0.5]), "dtype": d.choice(["f32", "f16", "i64"]), **a},
        ),
        aten=(
            AtenBinding(
                "aten.full.default", convert=_full_from(lambda a, t: a["size"], lambda a: a["fill_value"], _given_dtype)
            ),
            AtenBinding(
                "aten.zeros.default", convert=_full_from(lambda a, t: a["size"], lambda a: 0, _given_or_default_dtype)
            ),
            AtenBinding(
                "aten.ones.default", convert=_full_from(lambda a, t: a["size"], lambda a: 1, _given_or_default_dtype)
            ),
            AtenBinding(
                "aten.empty.memory_format",
                convert=_full_from(lambda a, t: a["size"], lambda a: 0, _given_or_default_dtype),
            ),
            AtenBinding(
                "aten.scalar_tensor.default",
                convert=_full_from(lambda a, t: [], lambda a: a["s"], _given_or_default_dtype),
            ),
            AtenBinding("aten.new_zeros.default", convert=_full_from(lambda a, t: a["size"], lambda a: 0, _self_dtype)),
            AtenBinding("aten.new_ones.default", convert=_full_from(lambda a, t: a["size"], lambda a: 1, _self_dtype)),
            AtenBinding(
                "aten.new_full.default",
                convert=_full_from(lambda a, t: a["size"], lambda a: a["fill_value"], _self_dtype),
            ),
            AtenBinding("aten.new_empty.default", convert=_full_from(lambda a, t: a["size"], lambda a: 0, _self_dtype)),
            AtenBinding(
                "aten.full_like.default", convert=_full_from(_self_shape, lambda a: a["fill_value"], _self_dtype)
            ),
            AtenBinding("aten.zeros_like.default", convert=_full_from(_self_shape, lambda a: 0, _self_dtype)),
            AtenBinding("aten.ones_like.default", convert=_full_from(_self_shape, lambda a: 1, _self_dtype)),
            AtenBinding("aten.empty_like.default", convert=_full_from(_self_shape, lambda a: 0, _self_dtype)),
        ),
        doc="a tensor of `shape` filled with `value` (uninitialized `empty` is refined to zeros)",
    )
)


def _arange_args(args, types):
    if not _plain_device(args):
        return None
    start, end, step = args.get("start", 0), args["end"], args.get("step", 1)
    dtype = args.get("dtype")
    if dtype is None:
        dtype = torch.get_default_dtype() if any(isinstance(v, float) for v in (start, end, step)) else torch.int64
    return {"start": start, "end": end, "step": step, "dtype": dtype}


register(
    OpDef(
        "arange",
        (),
        lambda *, start, end, step, dtype: torch.arange(start, end, step, dtype=DType.parse(dtype).torch),
        attrs=(Attr("start", "scalar", 0), Attr("end", "scalar"), Attr("step", "scalar", 1), Attr("dtype", "dtype")),
        traits=CREATE,
        flops=zero_flops,
        aten=(
            AtenBinding("aten.arange.start_step", convert=_arange_args),
            AtenBinding("aten.arange.start", convert=_arange_args),
            AtenBinding("aten.arange.default", convert=_arange_args),
        ),
    )
)

register(
    OpDef(
        "fill",
        (Operand("self"), Operand("value")),
        lambda self, value: value.to(self.dtype).expand(self.shape).clone(),
        traits=frozenset({"pure"}),
        flops=zero_flops,
        aten=(
            "aten.fill.Tensor",
            "aten.fill.Scalar",
            AtenBinding("aten.zero.default", convert=lambda a, t: {**a, "value": 0}),
        ),
        doc="self's shape and dtype, every element `value` (a 0-d tensor); self's values are not read",
    )
)
