"""Pooling ops: max and average pooling over windows, adaptive pooling to an output size, in 2-D and 3-D."""

from __future__ import annotations

import math

import torch.nn.functional as F

from gawee.ir.types import TensorType
from gawee.ops import sampling as S
from gawee.ops.base import (
    AtenBinding,
    Attr,
    OpDef,
    Operand,
    numel,
    register,
)
from gawee.ops.nn import PURE, _pair


def _pool_canon(attrs, _types):
    attrs["kernel_size"] = _pair(attrs["kernel_size"])
    attrs["stride"] = _pair(attrs["stride"]) if attrs["stride"] else attrs["kernel_size"]
    attrs["padding"] = _pair(attrs["padding"])
    if "dilation" in attrs:
        attrs["dilation"] = _pair(attrs["dilation"])
    return attrs


POOL_KERNEL = 5
"""The largest pooling window a sampler draws (windows of 4 and 5 included: where stride and padding bugs show)."""


def _pool_sample(has_dilation: bool):
    def sample(draw, slots, attrs):
        x = slots[0]
        if attrs.get("kernel_size"):
            k = attrs["kernel_size"]
        elif isinstance(x, TensorType) and x.rank in (3, 4):  # a window that fits the given input
            k = tuple(draw.integers(1, max(1, min(POOL_KERNEL, n))) for n in x.shape[-2:])
        else:
            k = (draw.integers(1, POOL_KERNEL), draw.integers(1, POOL_KERNEL))
        if any(kk < 1 for kk in _pair(k)):
            raise S.Reject(f"kernel_size {k}")
        drawn = {
            "kernel_size": k,
            "stride": draw.choice([(), (1, 1), (2, 2), (1, 2), (draw.integers(1, 3),)]),
            "padding": tuple(draw.integers(0, kk // 2) for kk in _pair(k)),
            "ceil_mode": draw.boolean(0.2),
        }
        if has_dilation:
            drawn["dilation"] = draw.choice([(1, 1), (1, 1), (2, 2), (1, 2)])
        else:
            drawn["count_include_pad"] = draw.boolean(0.7)
            drawn["divisor_override"] = None if draw.boolean(0.8) else draw.integers(1, 5)
        drawn = {**drawn, **attrs}
        if not isinstance(x, TensorType):  # big enough for the window
            need = [
                (kk - 1) * d + 1 - 2 * p
                for kk, d, p in zip(_pair(k), _pair(drawn.get("dilation", 1)), _pair(drawn["padding"]))
            ]
            spatial = tuple(max(n, 1) + draw.size(0, 3) for n in need)
            x = TensorType((*S.shape(draw, draw.integers(1, 2)), *spatial), draw.dtype)
        if x.rank not in (3, 4):
            raise S.Reject("pooling needs rank 3 or 4")
        return [x], drawn

    return sample


def _adaptive_pool_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.integers(3, 4))
    if x.rank not in (3, 4):
        raise S.Reject("pooling needs rank 3 or 4")
    size = draw.choice([(1, 1), (1,), tuple(draw.integers(1, d + 1) for d in x.shape[-2:])])
    return [x], {"output_size": size, **attrs}


def _window_flops(ins, outs, attrs):
    return outs[0].numel * math.prod(attrs["kernel_size"])


register(
    OpDef(
        "max_pool2d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool2d(
            self, kernel_size, stride, padding, dilation, ceil_mode
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0)),
            Attr("dilation", "ints", (1, 1)),
            Attr("ceil_mode", "bool", False),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool_canon,
        sample=_pool_sample(True),
        aten=("aten.max_pool2d.default", AtenBinding("aten.max_pool2d_with_indices.default", outputs=(0,))),
    )
)
register(
    OpDef(
        "avg_pool2d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: F.avg_pool2d(
            self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0)),
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool_canon,
        sample=_pool_sample(False),
        aten=("aten.avg_pool2d.default",),
    )
)
register(
    OpDef(
        "adaptive_avg_pool2d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_avg_pool2d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        sample=_adaptive_pool_sample,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
        aten=("aten.adaptive_avg_pool2d.default",),
    )
)
register(
    OpDef(
        "adaptive_max_pool2d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_max_pool2d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        sample=_adaptive_pool_sample,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"])},
        aten=(AtenBinding("aten.adaptive_max_pool2d.default", outputs=(0,)),),
    )
)


def _pool3d_canon(attrs, _types):
    attrs["kernel_size"] = _pair(attrs["kernel_size"], 3)
    attrs["stride"] = _pair(attrs["stride"], 3) if attrs["stride"] else attrs["kernel_size"]
    attrs["padding"] = _pair(attrs["padding"], 3)
    if "dilation" in attrs:
        attrs["dilation"] = _pair(attrs["dilation"], 3)
    return attrs


def _pool3d_sample(has_dilation: bool):
    """A (N,) C, D, H, W input and a window that fits it (padding at most half the kernel, as torch requires)."""

    def sample(draw, slots, attrs):
        x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.choice([4, 5]))
        if x.rank not in (4, 5):
            raise S.Reject("3-D pooling needs rank 4 or 5")
        k = _pair(attrs.get("kernel_size") or tuple(draw.integers(1, 2) for _ in range(3)), 3)
        if any(kk > d for kk, d in zip(k, x.shape[-3:])):
            raise S.Reject("kernel larger than the input")
        drawn = {
            "kernel_size": k,
            "stride": tuple(draw.integers(1, 2) for _ in range(3)),
            "padding": tuple(draw.integers(0, kk // 2) for kk in k),
            "ceil_mode": draw.boolean(0.2),
        }
        if has_dilation:
            drawn["dilation"] = (1, 1, 1)
        return [x], {**drawn, **attrs}

    return sample


def _adaptive3d_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.choice([4, 5]))
    if x.rank not in (4, 5):
        raise S.Reject("3-D adaptive pooling needs rank 4 or 5")
    size = tuple(draw.choice([1, d]) if draw.boolean(0.5) else draw.integers(1, max(d, 1)) for d in x.shape[-3:])
    return [x], {"output_size": size, **attrs}


register(
    OpDef(
        "max_pool3d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool3d(
            self, kernel_size, stride, padding, dilation, ceil_mode
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0, 0)),
            Attr("dilation", "ints", (1, 1, 1)),
            Attr("ceil_mode", "bool", False),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool3d_canon,
        sample=_pool3d_sample(True),
        aten=("aten.max_pool3d.default", AtenBinding("aten.max_pool3d_with_indices.default", outputs=(0,))),
        doc="max over (D, H, W) windows (video models: r3d, mc3, s3d)",
    )
)
register(
    OpDef(
        "avg_pool3d",
        (Operand("self"),),
        lambda self, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: F.avg_pool3d(
            self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        ),
        attrs=(
            Attr("kernel_size", "ints"),
            Attr("stride", "ints", ()),
            Attr("padding", "ints", (0, 0, 0)),
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        traits=PURE,
        flops=_window_flops,
        canonicalize=_pool3d_canon,
        sample=_pool3d_sample(False),
        aten=("aten.avg_pool3d.default",),
        doc="mean over (D, H, W) windows",
    )
)
register(
    OpDef(
        "adaptive_avg_pool3d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_avg_pool3d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"], 3)},
        sample=_adaptive3d_sample,
        aten=("aten.adaptive_avg_pool3d.default",),
        doc="mean over adaptive (D, H, W) bins; (1, 1, 1) is the global pooling of video classifiers",
    )
)
register(
    OpDef(
        "adaptive_max_pool3d",
        (Operand("self"),),
        lambda self, *, output_size: F.adaptive_max_pool3d(self, output_size),
        attrs=(Attr("output_size", "ints"),),
        traits=PURE,
        flops=lambda ins, outs, a: numel(ins[0]),
        canonicalize=lambda a, t: {**a, "output_size": _pair(a["output_size"], 3)},
        sample=_adaptive3d_sample,
        aten=(AtenBinding("aten.adaptive_max_pool3d.default", outputs=(0,)),),
        doc="max over adaptive (D, H, W) bins",
    )
)
