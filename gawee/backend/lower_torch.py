"""The torch target's lowering table: how the torch backend (:mod:`gawee.backend.torch_backend`) runs the ops it
does not run by their reference semantics.

Each entry takes a :class:`gawee.backend.torch_backend.TorchLowering` and emits fx code through it; an op with no
entry runs its ``OpDef.evaluate`` with the attributes bound (``ctx.reference()``), which is correct everywhere.
The entries here use faster kernels where this torch has them: oneDNN's fused, prepacked convolution, the
linear and attention kernels measured fastest per shape, and in-place updates of dead operands.
"""

from __future__ import annotations

import math
import operator
from functools import partial

import torch

from gawee.backend import kernels, onednn, quantized
from gawee.backend.lowering import LoweringTable
from gawee.errors import GaweeError
from gawee.ir.registry import OPAQUE
from gawee.ir.symbolic import at_example, has_symbols
from gawee.ir.types import DType, Layout
from gawee.ops.nn import apply_act
from gawee.ops.opaque import decode_arg, resolve_target

TORCH = LoweringTable("torch")
"""Op name -> ``lower(ctx)``; ops not here run their reference semantics."""


@TORCH.register("conv2d")
def conv2d(ctx):
    """oneDNN's fused convolution on weights prepacked for the known input size (as Inductor's freezing
    does): act(conv + residual) in one kernel; the reference semantics where the kernel or dtype is missing."""
    x, w, b, r = (ctx.type(i) for i in range(4))
    a = ctx.attrs
    post = onednn.post_op(a["act"], a["act_params"])
    dilation = onednn.effective_dilation(w.shape[2:], a["dilation"])
    if not (
        ctx.options.fused_kernels
        and onednn.supports(x.dtype)
        and x.rank == 4
        and post is not None
        and w.dtype == x.dtype
        and (b is None or b.dtype == x.dtype)
        and (r is None or r.same_shape_dtype(ctx.node.output.type))
        and onednn.safe_geometry(x.shape, a["stride"], dilation)
    ):
        return ctx.reference()
    geometry = (list(a["padding"]), list(a["stride"]), dilation, a["groups"])
    weight = ctx.const(1)
    packing = {"padding": a["padding"], "stride": a["stride"], "dilation": dilation, "groups": a["groups"]}
    channels_last = x.layout is Layout.channels_last
    if weight is not None and _conv1x1_kernel(ctx, x, channels_last) == "gemm":
        matrix = ctx.buffer(weight.reshape(weight.shape[0], -1).contiguous(), "weight_matrix")
        residual = ctx.arg(3) if r is not None else None
        act = (a["act"], tuple(a["act_params"]))
        return ctx.call(kernels.conv1x1_gemm, ctx.arg(0), matrix, ctx.arg(2), residual, *act)
    if weight is not None and has_symbols(x.shape):  # packed at run time, once per input size met
        pack = partial(onednn.pack_conv_weight, weight, **packing, channels_last=channels_last)
        per_size = onednn.PackedPerSize(ctx.node.name, pack)
        per_size.for_size(at_example(x.shape))  # the example size, packed now
        weight = ctx.call(per_size, ctx.arg(0))
    elif weight is not None:
        packed = onednn.pack_conv_weight(weight, **packing, input_shape=x.shape, channels_last=channels_last)
        weight = ctx.buffer(packed, "packed_weight")
    else:
        weight = ctx.arg(1)
    mkldnn = torch.ops.mkldnn
    if r is None:
        return ctx.call(mkldnn._convolution_pointwise.default, ctx.arg(0), weight, ctx.arg(2), *geometry, *post)
    fused_act = a["act"] if a["act"] in onednn.BINARY_POST_OPS else None
    in_place = ctx.can_overwrite(3)
    if x.dtype is not DType.f32 and not onednn.binary_fuses(in_place, channels_last, a["groups"]):
        fused_act = None  # torch's fallback for this case adds and applies the relu in one op without bf16
    # the sum goes into the dead residual where nothing else reads it, as Inductor does: no allocation
    if in_place:
        op, operands = mkldnn._convolution_pointwise_.binary, (ctx.arg(3), ctx.arg(0))
    else:
        op, operands = mkldnn._convolution_pointwise.binary, (ctx.arg(0), ctx.arg(3))
    y = ctx.call(op, *operands, weight, ctx.arg(2), *geometry, "add", 1.0, fused_act, [], None)
    return y if fused_act == a["act"] else ctx.call(apply_act, y, a["act"], tuple(a["act_params"]))


def _conv1x1_kernel(ctx, x, channels_last: bool) -> str:
    """The kernel of a 1×1, stride-1, unpadded, one-group convolution on a static input — ``onednn`` or ``gemm``
    (:func:`gawee.backend.kernels.measure_conv1x1`, or as ``TorchOptions.conv1x1_kernel`` forces) — and
    ``onednn`` for every other convolution."""
    a, w = ctx.attrs, ctx.type(1)
    forced = ctx.options.conv1x1_kernel
    if forced not in kernels.CONV1X1_CHOICES:
        raise GaweeError(
            f"unknown 1x1 convolution kernel {forced!r}",
            hint=f"TorchOptions.conv1x1_kernel is one of {', '.join(kernels.CONV1X1_CHOICES)}",
        )
    if not (
        tuple(w.shape[2:]) == (1, 1)
        and a["groups"] == 1
        and tuple(a["stride"]) == (1, 1)
        and tuple(a["padding"]) == (0, 0)
        and not has_symbols(x.shape)
        and 0 not in x.shape
        and x.dtype is DType.f32  # the GEMM kernel is measured and built in float32
    ):
        return "onednn"
    shape, bias, residual = tuple(x.shape), ctx.type(2) is not None, ctx.type(3) is not None
    if forced != "measure":
        choice = kernels.forced_conv1x1(shape, w.shape[0], bias, residual, a["act"], forced)
    else:
        params = tuple(a["act_params"])
        choice = kernels.measure_conv1x1(shape, w.shape[0], bias, residual, a["act"], params, channels_last)
    ctx.record_kernel(choice)
    return choice.kernel


@TORCH.register("linear")
def linear(ctx):
    """act(linear) on the kernel measured fastest for its shape (gawee.backend.kernels: torch's GEMM,
    MKL's or oneDNN's prepacked one), the input flattened to a matrix."""
    return kernels.lower_linear(ctx)


@TORCH.register("linear_int8_dynamic")
def linear_int8_dynamic(ctx):
    """The int8 kernel measured faster for its shape (or forced: TorchOptions.int8_linear_kernel) on the int8
    weight and its scales prepacked now (gawee.backend.quantized: torch's dynamic quantized linear, or oneDNN's
    on gawee's quantizer's codes); the reference semantics where the weight or scales are not constants, the
    input may be empty, the CPU kernels are off (TorchOptions.fused_kernels), torch's quantized engine is not an
    x86 one, or the input is quantized to 8 bits on a CPU without VNNI."""
    weight, scale, bias = ctx.const(1), ctx.const(2), ctx.const(3)
    x = ctx.type(0)
    dynamic = has_symbols(x.shape)
    static = at_example(x.shape) if dynamic else x.shape
    a = ctx.attrs
    unusable = quantized.unavailable(a["levels"]) is not None or not ctx.options.fused_kernels
    if weight is None or scale is None or 0 in static or unusable:
        return ctx.reference()
    packed_bias = bias if bias is not None and tuple(bias.shape) == (weight.shape[0],) else None
    act = (a["act"], tuple(a["act_params"]))
    rows = math.prod(static[:-1])
    shape = (rows, weight.shape[1], weight.shape[0], ctx.type(3) is not None, *act, a["levels"])
    choice = quantized.choose_linear(*shape, forced=ctx.options.int8_linear_kernel)
    ctx.record_kernel(choice)
    kernel = quantized.make_linear(
        choice.kernel, ctx.node.name, weight, scale, packed_bias, *act, a["levels"], None if dynamic else rows
    )
    late_bias = ctx.arg(3) if ctx.type(3) is not None and packed_bias is None else None
    return ctx.call(kernel, ctx.arg(0), late_bias)


@TORCH.register("conv2d_int8_static")
def conv2d_int8_static(ctx):
    """oneDNN's int8 convolution on the weight prepacked now (gawee.backend.quantized): bias, residual and relu or
    hardtanh fused, a requantized result (``out_scale``) made by oneDNN and handed over as u8 codes where every
    reader is an int8 convolution on that grid that runs the kernel too. The reference semantics where the kernel
    cannot run (:func:`_int8_conv_kernel_runs`)."""
    x, r = ctx.type(0), ctx.type(4)
    a = ctx.attrs
    if not _int8_conv_kernel_runs(ctx.node, ctx.options.fused_kernels):
        return ctx.reference()
    weight, scale, bias = ctx.const(1), ctx.const(2), ctx.const(3)
    channels_last = x.layout is Layout.channels_last
    requantize = (a["out_scale"], a["out_zero_point"], a["out_levels"]) if a["out_scale"] else None
    out = ctx.node.output
    codes = (
        requantize is not None
        and not out.is_graph_output
        and all(
            use.node.op == "conv2d_int8_static"
            and use.index == 0
            and (use.node.attrs["scale"], use.node.attrs["zero_point"], use.node.attrs["levels"]) == requantize
            and _int8_conv_kernel_runs(use.node, ctx.options.fused_kernels)
            for use in out.uses
        )
    )
    kernel = quantized.StaticInt8Conv(
        ctx.node.name,
        weight,
        scale,
        bias,
        (a["stride"], a["padding"], onednn.effective_dilation(weight.shape[2:], a["dilation"]), a["groups"]),
        a["act"],
        tuple(a["act_params"]),
        a["scale"],
        a["zero_point"],
        a["levels"],
        None if has_symbols(x.shape) else tuple(x.shape),
        channels_last,
        requantize,
        codes,
    )
    if r is None:
        return ctx.call(kernel, ctx.arg(0))
    return ctx.call(kernel, ctx.arg(0), ctx.arg(4), ctx.can_overwrite(4) and channels_last)


def _int8_conv_kernel_runs(node, fused_kernels: bool) -> bool:
    """Whether the torch lowering runs oneDNN's int8 kernel for the ``conv2d_int8_static`` ``node``: its weight,
    scales and bias constants, an activation oneDNN fuses (:data:`gawee.backend.quantized.CONV_ACTS`), the CPU
    kernels on (TorchOptions.fused_kernels) and available (oneDNN, and VNNI for 8-bit inputs), a non-empty input,
    and a geometry oneDNN's convolutions get right (:func:`gawee.backend.onednn.safe_geometry`, and no window
    wholly in the padding: :func:`gawee.backend.onednn.window_in_padding`)."""
    x, w, s, b = node.inputs[:4]
    if not (fused_kernels and w is not None and w.has_known_data and s is not None and s.has_known_data):
        return False
    a = node.attrs
    static = at_example(x.shape) if has_symbols(x.shape) else x.shape
    dilation = onednn.effective_dilation(w.shape[2:], a["dilation"])
    return (
        (b is None or b.has_known_data)
        and a["act"] in quantized.CONV_ACTS
        and quantized.conv_unavailable(a["levels"]) is None
        and 0 not in static
        and onednn.safe_geometry(x.shape, a["stride"], dilation)
        and not onednn.window_in_padding(x.shape, w.shape[2:], a["stride"], a["padding"], dilation)
    )


@TORCH.register("scaled_dot_product_attention")
def scaled_dot_product_attention(ctx):
    """aten's fused kernel or oneDNN Graph's attention partition, whichever measured faster for the node's shapes
    (gawee.backend.attention)."""
    from gawee.backend.attention import lower_attention  # imported late: it loads oneDNN Graph's fuser

    return lower_attention(ctx)


@TORCH.register("add")
def add(ctx):
    """In place into a dead operand that owns its memory and has the result's type (no allocation)."""
    for i in (0, 1):
        if ctx.can_overwrite(i):
            return ctx.call(torch.Tensor.add_, ctx.arg(i), ctx.arg(1 - i))
    return ctx.reference()


def _in_place_lower_torch(method):
    """Lowering of a unary op whose torch method ``method`` writes in place: into its dead operand when that
    owns its memory and has the result's type (``can_overwrite``: no allocation; on densenet121 at batch 8 the
    ReLUs after its 62 unfoldable batch norms), else the op itself."""

    def lower(ctx):
        return ctx.call(method, ctx.arg(0)) if ctx.can_overwrite(0) else ctx.reference()

    return lower


IN_PLACE = (
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log1p",
    "sqrt",
    "rsqrt",
    "neg",
    "abs",
    "reciprocal",
    "sin",
    "cos",
    "erf",
    "floor",
    "ceil",
    "trunc",
    "sign",
    "logical_not",
    "bitwise_not",
)
"""Unary ops without attributes whose torch method ``<op>_`` writes in place."""

for _op in IN_PLACE:
    TORCH.add(_op, _in_place_lower_torch(getattr(torch.Tensor, f"{_op}_")))


@TORCH.register(OPAQUE)
def opaque(ctx):
    """A direct call of the recorded ATen overload (4-D operands made contiguous: it may be a view)."""
    fn = resolve_target(ctx.attrs["target"])
    inputs = tuple(ctx.standard(i) for i in range(len(ctx.node.inputs)))
    args, kwargs = ctx.dims(ctx.attrs["args"]), ctx.dims(ctx.attrs["kwargs"])
    out = ctx.call(fn, *decode_arg(args, inputs), **{k: decode_arg(v, inputs) for k, v in kwargs})
    returns = fn._schema.returns
    single = len(returns) == 1 and str(returns[0].type) == "Tensor"
    if len(ctx.node.outputs) == 1 and not single:
        return ctx.call(operator.getitem, out, 0)
    return out
