"""oneDNN's primitives as gawee's own runtime: each node's primitive created once, activations in blocked layouts.

Why: the torch lowering reaches oneDNN through torch's operators, which rebuild a primitive's descriptor on every call
(a cost per convolution comparable to a small convolution itself), and they run oneDNN's channels-last or plain
kernels. ONNX Runtime, the fastest CPU runtime on these models, creates each kernel once and keeps activations in a
channel-blocked layout (its NCHWc transformer, blocks of 8 channels on AVX2, 16 on AVX-512) between the graph's edges.
This module does the same with oneDNN itself: at build time it plans the rewritten graph into a list of primitives —
convolutions with their fused epilogues as post-ops, pooling (and means over the image), inner products, eltwise,
binary, concatenation, splits and permutations (reorders of regions, or through permuted strides) — with weights
reordered once into the layout each primitive asked for, and buffers reused by liveness; a call sets the input's
address and executes the list (each run of consecutive primitives in one call into C, :mod:`gawee.backend.run_steps`).
The layout of the activations is ``layout``: ``"blocked"`` (nChw8c / nChw16c, the block the CPU's vector width gives),
``"channels_last"`` (NHWC, where oneDNN 3's brgemm convolutions run), or ``"per_conv"``: every implementation oneDNN
has of each convolution, in both layouts, is compiled and timed here with the reorders of its operands that its layout
would need, and the fastest kept (the pooling, eltwise, binary and concatenation primitives between convolutions run
in their input's layout). Which is fastest depends on the CPU and the model (on an AVX2 machine, no layout won every
convolution of resnet50's shapes), so :func:`gawee.backend.compiler.whole_graph_choice` builds all three and measures
them on the machine. A convolution for which oneDNN has only its reference kernel in the module's layout runs in
another layout (:func:`_reference`: on AVX-512, RegNet's groups of 8 channels in blocks of 16). In every layout, a 3×3
stride-1 convolution also races gawee's own Winograd F(4×4, 3×3) kernel (:mod:`gawee.backend.winograd`: two C
transforms around oneDNN's matmul), kept where it measures fastest, and a convolution of 8 channels per group
(RegNet's) races gawee's grouped kernel (:mod:`gawee.backend.grouped`), a depthwise one (MobileNet's, EfficientNet's)
gawee's depthwise kernel with its activation (:mod:`gawee.backend.depthwise`), a max pool of u8 codes held channels-
last gawee's pooling kernel (:mod:`gawee.backend.pool_u8`), and the quantization of a float32 NCHW image into u8 codes
held channels-last gawee's quantizer (:mod:`gawee.backend.quantize_nhwc`). The fusions are the runtime's target phase
(``rules/targets/onednn/``), which ``gawee.compile`` runs before building it: an activation that alone reads a
convolution, linear, batch norm or binary op becomes its post-op, and a batch norm that alone reads a concatenation
along channels (DenseNet's layers) runs in one pass with it (``onednn_affine_cat``, :mod:`gawee.backend.affine_cat`);
this module lowers the target ops they produce (:mod:`gawee.ops.targets`).

The library is ``libdnnl.so.3`` from the ``onednn-cpu-gomp`` wheel (a dependency of gawee on x86-64 Linux), or the
file ``GAWEE_DNNL_LIBRARY`` names. It is loaded after torch, so it shares torch's OpenMP runtime (both name it
``libgomp.so.1``) and its thread count (``torch.set_num_threads``). The C API's enumerations are ABI-stable within
oneDNN 3.x; their values here are those of ``dnnl_types.h``, and ``tests/backend/test_dnnl.py`` checks every one
numerically against torch. An op without a primitive here, or one whose primitive oneDNN refuses, runs as a step
of its torch semantics on the plain layout (:func:`_torch_op`), so any graph runs. Static shapes, float32 and
bfloat16 values (the bf16 precision phase's: oneDNN's bf16 kernels compute them, accumulating in float32, and a
cast is a reorder; gawee's own kernels take float32 only), and the int8 phase's convolutions on oneDNN's int8
kernels (:func:`_conv2d_int8`); :func:`supports` says why a graph cannot run.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gawee.backend.dnnl_conv import _addressed, _conv, _Depthwise, _Quant
from gawee.backend.dnnl_plan import (
    _ANY,
    _DIMS,
    _INFERENCE,
    _P,
    _POOL_AVG_EXCLUDE,
    _POOL_AVG_INCLUDE,
    _POOL_MAX,
    BIAS,
    BINARY,
    DST,
    ELTWISE,
    FLOATS,
    LAYOUTS,
    MULTIPLE_SRC,
    SRC,
    SRC_1,
    WEIGHTS,
    _act,
    _Arg,
    _const,
    _pair,
    _Plan,
    _post_ops,
    _Tensor,
    _Unsupported,
    unavailable,
)
from gawee.backend.host import InputSignature, arrange, as_structure
from gawee.backend.run_steps import Program
from gawee.backend.runtime import Runtime
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType
from gawee.ops import get_op
from gawee.rewrite.ruleset import RuleSet, target_rules


def _conv2d(plan: _Plan, node: Node) -> _Tensor:
    a = node.attrs
    _, w, b, *residual = node.inputs
    weight, bias, padding = _const(w, "weight"), _const(b, "bias"), _pair(node, "padding", (0, 0))
    stride, dilation = _pair(node, "stride"), _pair(node, "dilation")
    return _conv(plan, node, weight, bias, a["groups"], stride, padding, dilation, (residual or [None])[0])


def _conv2d_int8(plan: _Plan, node: Node) -> _Tensor:
    """``conv2d_int8_static`` on oneDNN's int8 convolution (u8 codes times int8 weights, summed in int32; VNNI where
    the CPU has it): its input's codes made by a quantizing reorder, or read as they are where the convolution
    before requantized its result to this one's grid, and its result float32 or (``out_scale``) the codes of the
    next one's grid. Refused (a torch step computes it) for codes in [0, 127] (``levels``: oneDNN saturates u8 to
    255) or a weight that is not int8."""
    a = node.attrs
    _, w, weight_scale, b, *residual = node.inputs
    weight = _const(w, "weight")
    if a["levels"] != 255 or (a["out_scale"] and a["out_levels"] != 255) or weight.dtype != torch.int8:
        raise _Unsupported("an int8 convolution with codes in [0, 127]")
    out = (a["out_scale"], a["out_zero_point"]) if a["out_scale"] else None
    quant = _Quant(a["scale"], a["zero_point"], _const(weight_scale, "weight scale"), out)
    stride, padding, dilation = _pair(node, "stride"), _pair(node, "padding", (0, 0)), _pair(node, "dilation")
    bias = _const(b, "bias")
    return _conv(plan, node, weight, bias, a["groups"], stride, padding, dilation, (residual or [None])[0], quant)


def _scale_shift(weight, bias, mean, var, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An inference batch norm's per-channel scale and shift (y = x * scale + shift), computed in float64."""
    scale = torch.rsqrt(_const(var, "running_var").double() + eps)
    if weight is not None:
        scale = scale * _const(weight, "weight").double()
    shift = -_const(mean, "running_mean").double() * scale
    if bias is not None:
        shift = shift + _const(bias, "bias").double()
    return scale.float(), shift.float()


def _batch_norm(plan: _Plan, node: Node) -> _Tensor:
    """Inference batch norm (``onednn_batch_norm``) as a 1×1 depthwise convolution by its scale and shift, as ONNX
    Runtime's NCHWc transformer does: it then runs in the blocked layout and takes its activation as a post-op."""
    x, weight, bias, mean, var = node.inputs
    if x.dtype is not DType.f32:
        raise _Unsupported(f"a batch norm in {x.dtype}")
    scale, shift = _scale_shift(weight, bias, mean, var, node.attrs["eps"])
    c = x.shape[1]
    return _conv(plan, node, scale.reshape(c, 1, 1, 1), shift, c, [1, 1], [0, 0], [1, 1])


def _affine_cat(plan: _Plan, node: Node) -> _Tensor:
    """``onednn_affine_cat``: the batch norm (and its ReLU) applied while concatenating the parts along channels,
    one step (:mod:`gawee.backend.affine_cat`), in the layout of the first part held blocked or channels-last (the
    others reordered to it). Refused (a torch step computes it) for parts of another rank or dimension, constant
    parts, another activation, parts held in no such layout, or blocked parts whose channels are not a multiple of
    the block."""
    from gawee.backend import affine_cat

    weight, bias, mean, var, *parts = node.inputs
    out, act = node.output.shape, plan.act_of(node)[0]
    if (
        len(out) != 4
        or node.attrs["dim"] % 4 != 1
        or act not in affine_cat.ACTS
        or node.output.dtype is not DType.f32
        or any(v.is_const for v in parts)
    ):
        raise _Unsupported("a concatenation the affine_cat kernel does not take")
    layout = next(filter(None, (plan.layout_of(plan.values[v], v.shape) for v in parts)), None)
    block = plan.block if layout == "blocked" else 0
    if layout is None or (block and any(v.shape[1] % block for v in parts)):
        raise _Unsupported("parts in layouts the affine_cat kernel does not take")
    scale, shift = _scale_shift(weight, bias, mean, var, node.attrs["eps"])
    srcs = [_addressed(plan, plan.operand(v, plan.activation_md(v.shape, layout))) for v in parts]
    dst = plan.tensor(plan.activation_md(out, layout))
    coeffs = torch.stack([scale, shift]).contiguous()
    addresses = (_P * len(srcs))(*(_P(t.buffer.tensor.data_ptr()) for t in srcs))
    channels = (ctypes.c_int * len(parts))(*(v.shape[1] for v in parts))
    plan.keep += [coeffs, addresses, channels]
    act = affine_cat.ACTS[act]
    args = (addresses, channels, len(parts), dst.buffer.tensor.data_ptr(), coeffs[0].data_ptr(), coeffs[1].data_ptr())
    plan.call(affine_cat.library().gawee_affine_cat, (*args, act, out[0], out[2] * out[3], block), "gawee:affine_cat")
    plan.conv_layouts[node.name], plan.conv_kernels[node.name] = layout, "gawee:affine_cat"
    return dst


def _linear(plan: _Plan, node: Node) -> _Tensor:
    x, w, b = node.inputs
    weight, out = _const(w, "weight"), node.output.shape
    create = plan.lib.dnnl_inner_product_forward_primitive_desc_create
    mds = (plan.value_md(x), plan.md(weight.shape, _ANY, dtype=w.dtype), plan.md([out[1]]), plan.value_md(node.output))
    pd, prim = plan.primitive(create, plan.engine, _INFERENCE, *mds, attr=_post_ops(plan, *plan.act_of(node)))
    src = plan.operand(x, plan.queried(pd, SRC))
    wt = plan.constant(weight, plan.queried(pd, WEIGHTS))
    bt = plan.constant(_const(b, "bias") if b is not None else torch.zeros(out[1]), plan.queried(pd, BIAS))
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src.memory, WEIGHTS: wt.memory, BIAS: bt.memory, DST: dst.memory})
    return dst


def _pool(plan: _Plan, node: Node, alg: int, kernel, stride, padding, dilation=(1, 1), out=None) -> _Tensor:
    """The pooling ``node`` (its output of shape ``out``, if given, else its own) in its input's layout. A max pool
    of an input held as u8 codes (an int8 convolution requantized its result: rules/precision/int8.rules'
    ``requantize_through_max_pool``) pools the codes, its result the codes on the same grid: the largest code is
    the code of the largest value (dequantizing, ``(code - zero point) * scale`` with a positive scale, keeps their
    order), and a quarter of float32's bytes are read and written. Where oneDNN has only its reference kernel for
    them, the codes' values are pooled."""
    x, out = node.inputs[0], out or node.output.shape
    # the right and bottom padding that gives torch's output size: more with ceil_mode, less where floor drops rows
    pad_r = [
        max(0, (o - 1) * s + (k - 1) * d + 1 - i - p)
        for o, s, k, d, i, p in zip(out[2:], stride, kernel, dilation, x.shape[2:], padding)
    ]
    create = plan.lib.dnnl_pooling_forward_primitive_desc_create
    geometry = (_DIMS(*stride), _DIMS(*kernel), _DIMS(*(d - 1 for d in dilation)), _DIMS(*padding), _DIMS(*pad_r))
    held = None if x.is_const else plan.values[x]
    if alg == _POOL_MAX and held is not None and held.grid is not None:
        codes = plan.md(out, _ANY, dtype=DType.u8)
        pd = plan.descriptor(create, plan.engine, _INFERENCE, alg, held.md, codes, *geometry)
        if not plan.reference(pd):
            dst = plan.tensor(plan.queried(pd, DST), held.grid)
            _max_pool_codes(plan, held, plan.compiled(pd), dst, x.shape, out, (kernel, stride, padding, dilation))
            plan.codes_written.append(node.name)
            return dst
    src = plan.operand(x)
    dst_md = plan.md(out, _ANY, dtype=node.output.dtype)
    pd, prim = plan.primitive(create, plan.engine, _INFERENCE, alg, src.md, dst_md, *geometry)
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src.memory, DST: dst.memory})
    return dst


def _max_pool_codes(plan: _Plan, held: _Tensor, prim: int, dst: _Tensor, shape, out, geometry) -> None:
    """The max pool of the u8 codes ``held`` into ``dst`` (``geometry``: kernel, stride, padding, dilation) as a
    step: oneDNN's pooling primitive ``prim``, or gawee's kernel (:mod:`gawee.backend.pool_u8`) where both are held
    channels-last and it measures faster here on the module's buffers (:meth:`_Plan.own_kernel_wins`)."""
    from gawee.backend import pool_u8

    onednn = {SRC: held.memory, DST: dst.memory}
    own = (
        pool_u8.unavailable() is None
        and held.buffer is not None
        and dst.buffer is not None
        and plan.layout_of(held, shape, DType.u8) == "channels_last"
        and plan.layout_of(dst, out, DType.u8) == "channels_last"
        and pool_u8.windows_reach_the_image(shape[2:], out[2:], *geometry)
    )
    if not own:
        plan.step(prim, onednn)
        return
    function = pool_u8.library().gawee_max_pool_u8
    args = pool_u8.args(held.buffer.tensor.data_ptr(), dst.buffer.tensor.data_ptr(), shape, out, *geometry)
    lib, stream, array = plan.lib, plan.stream, (_Arg * 2)(*(_Arg(k, _P(m)) for k, m in onednn.items()))
    primitive = (plan.impl[prim], lambda: lib.dnnl_primitive_execute(prim, stream, 2, array))
    if plan.own_kernel_wins(primitive, (pool_u8.KERNEL, lambda: function(*args)), "a pool"):
        plan.call(function, args, pool_u8.KERNEL)
    else:
        plan.step(prim, onednn)


def _max_pool2d(plan: _Plan, node: Node) -> _Tensor:
    kernel = _pair(node, "kernel_size")
    stride, padding = _pair(node, "stride", kernel), _pair(node, "padding", (0, 0))
    return _pool(plan, node, _POOL_MAX, kernel, stride, padding, _pair(node, "dilation"))


def _avg_pool2d(plan: _Plan, node: Node) -> _Tensor:
    if node.attrs.get("divisor_override") is not None:
        raise _Unsupported("avg_pool2d with divisor_override")
    kernel = _pair(node, "kernel_size")
    stride, padding = _pair(node, "stride", kernel), _pair(node, "padding", (0, 0))
    x, out = node.inputs[0], node.output
    beyond = any(
        (o - 1) * s + k > i + 2 * p for o, s, k, i, p in zip(out.shape[2:], stride, kernel, x.shape[2:], padding)
    )
    counts_padding = node.attrs.get("count_include_pad", True) and any(padding)
    if counts_padding and beyond:  # torch counts the explicit padding only, oneDNN also ceil_mode's extra
        raise _Unsupported("avg_pool2d counting the padding, with a window past it (ceil_mode)")
    return _pool(plan, node, _POOL_AVG_INCLUDE if counts_padding else _POOL_AVG_EXCLUDE, kernel, stride, padding)


def _adaptive_avg_pool2d(plan: _Plan, node: Node) -> _Tensor:
    x, out = node.inputs[0], node.output
    if any(i % o for i, o in zip(x.shape[2:], out.shape[2:])):
        raise _Unsupported("adaptive_avg_pool2d to a size that does not divide the input's")
    kernel = [i // o for i, o in zip(x.shape[2:], out.shape[2:])]
    return _pool(plan, node, _POOL_AVG_EXCLUDE, kernel, kernel, [0, 0])


def _mean(plan: _Plan, node: Node) -> _Tensor:
    """The mean over the image (MnasNet's and ShuffleNet's global pooling) as an average pooling of the whole image,
    in the input's layout (a torch step would first reorder a blocked input to plain, and the reorder and the step
    took several times as long as ONNX Runtime's ReduceMean on mnasnet1_0); without ``keepdim``, the pooled (N, C, 1, 1)
    in the plain layout viewed as (N, C)."""
    x, a = node.inputs[0], node.attrs
    if sorted(d % 4 for d in a["dim"] or ()) != [2, 3] or a.get("dtype") is not None:
        raise _Unsupported("mean over other dimensions than the image's")
    n, c, h, w = x.shape
    pooled = _pool(plan, node, _POOL_AVG_EXCLUDE, [h, w], [h, w], [0, 0], out=[n, c, 1, 1])
    if a["keepdim"]:
        return pooled
    plain = plan.md([n, c, 1, 1], dtype=node.output.dtype)
    if not plan.lib.dnnl_memory_desc_equal(_P(pooled.md), _P(plain)):
        flat = plan.reorder(pooled, plain)
        plan.release(pooled)
        pooled = flat
    md = plan.value_md(node.output)
    return _Tensor(md, plan.memory(md, pooled.buffer), pooled.buffer)


def _eltwise(plan: _Plan, node: Node) -> _Tensor:
    act, params = _act(node)
    alg, alpha_beta = ELTWISE[act]
    src = plan.operand(node.inputs[0])
    alpha, beta = (ctypes.c_float(v) for v in alpha_beta(params))
    create = plan.lib.dnnl_eltwise_forward_primitive_desc_create
    pd, prim = plan.primitive(create, plan.engine, _INFERENCE, alg, src.md, src.md, alpha, beta)
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src.memory, DST: dst.memory})
    return dst


def _binary(plan: _Plan, node: Node) -> _Tensor:
    """``onednn_binary`` on oneDNN's binary primitive; ``onednn_binary_int8`` writing the u8 codes of its result on
    its grid (an eltwise linear post-op ``y * (1 / scale) + zero point``, then oneDNN's conversion to u8, rounding to
    nearest even and saturating to [0, 255]: refused for codes in [0, 127])."""
    a, b = node.inputs[:2]
    grid = (node.attrs["out_scale"], node.attrs["out_zero_point"]) if node.op == "onednn_binary_int8" else None
    if grid is not None and node.attrs["out_levels"] != 255:
        raise _Unsupported("a binary op requantized to codes in [0, 127]")
    out = node.output.shape
    if a.shape != out and "commutative" in get_op(node.attrs["alg"]).traits:
        a, b = b, a  # the full-size operand first: oneDNN broadcasts the second
    if a.shape != out:
        raise _Unsupported(f"{node.attrs['alg']} broadcasting its first operand")
    if not b.is_const and len(b.shape) != len(out):
        raise _Unsupported(f"{node.attrs['alg']} of operands of different ranks")
    src0 = plan.operand(a)
    # the second operand in the first one's layout (oneDNN's kernels for mixed layouts are its reference ones)
    shape = [1] * (len(out) - len(b.shape)) + list(b.shape)  # a scalar or smaller constant: as many dimensions
    layout = plan.layout_of(src0, out, a.dtype) if len(out) == 4 else None
    md = (
        src0.md
        if b.shape == a.shape and b.dtype is a.dtype
        else plan.activation_md(shape, layout, b.dtype)
        if layout
        else plan.md(shape, dtype=b.dtype)
    )
    src1 = plan.constant(_const(b, "operand"), md, shape) if b.is_const else plan.operand(b, md)
    create = plan.lib.dnnl_binary_primitive_desc_create
    alg, act = BINARY[node.attrs["alg"]], plan.act_of(node)
    if grid is not None:  # the codes in the first operand's layout
        codes = plan.activation_md(out, layout, DType.u8) if layout else plan.md(out, dtype=DType.u8)
        pd = plan.descriptor(create, plan.engine, alg, src0.md, src1.md, codes, attr=_post_ops(plan, *act, codes=grid))
        if plan.reference(pd):  # no other kernel writes them (a blocked layout): the float32 result
            y = _binary_step(plan, create, alg, src0, src1, out, act, node)
            v = node.output
            if not v.is_graph_output and all(_reads_on(r, v, node.attrs) for r in v.users()):
                return y  # which each reader quantizes to these very codes, into the layout it reads
            dst = plan.quantized(y, codes, grid)
            plan.release(y)  # read once, by the quantization: its buffer goes back to the module's pool
            return dst
        dst = plan.tensor(plan.queried(pd, DST), grid)
        plan.step(plan.compiled(pd), {SRC: src0.memory, SRC_1: src1.memory, DST: dst.memory})
        plan.codes_written.append(node.name)
        return dst
    return _binary_step(plan, create, alg, src0, src1, out, act, node)


def _reads_on(reader: Node, v: Value, grid: dict) -> bool:
    """Whether ``reader`` reads ``v`` only as an int8 convolution's input quantized to ``grid``'s ``out_scale``,
    ``out_zero_point`` and ``out_levels``: then it rounds ``v`` and ``v`` requantized to that grid to the same code."""
    return (
        reader.op == "conv2d_int8_static"
        and reader.inputs[0] is v
        and all(u is not v for u in reader.inputs[1:])
        and (reader.attrs["scale"], reader.attrs["zero_point"], reader.attrs["levels"])
        == (grid["out_scale"], grid["out_zero_point"], grid["out_levels"])
    )


def _binary_step(plan: _Plan, create, alg: int, src0: _Tensor, src1: _Tensor, out, act, node: Node) -> _Tensor:
    """The binary primitive ``alg`` of ``src0`` and ``src1`` with its activation ``act``: a float result in the
    layout oneDNN picks."""
    mds = (src0.md, src1.md, plan.md(out, _ANY, dtype=node.output.dtype))
    pd, prim = plan.primitive(create, plan.engine, alg, *mds, attr=_post_ops(plan, *act))
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src0.memory, SRC_1: src1.memory, DST: dst.memory})
    return dst


def _cat(plan: _Plan, node: Node) -> _Tensor:
    out = node.output.shape
    x0 = node.inputs[0]
    first = plan.operand(x0)
    layout = plan.layout_of(first, x0.shape, x0.dtype) if len(out) == 4 else None
    plain = plan.lib.dnnl_memory_desc_equal(_P(first.md), _P(plan.value_md(x0)))
    # all in the first one's layout (blocked, channels-last or plain): concatenating mixed layouts is oneDNN's
    # reference kernel (ShuffleNet's split part, plain, and its branch, blocked: a tenth of its call)
    want = lambda v: plan.activation_md(v.shape, layout, v.dtype) if layout else plan.value_md(v) if plain else None
    srcs = [first] + [plan.operand(v, want(v)) for v in node.inputs[1:]]
    mds = (_P * len(srcs))(*(_P(s.md) for s in srcs))
    create = plan.lib.dnnl_concat_primitive_desc_create
    dim = node.attrs.get("dim", 0) % len(out)
    pd, prim = plan.primitive(create, plan.engine, plan.md(out, _ANY, dtype=node.output.dtype), len(srcs), dim, mds)
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {DST: dst.memory, **{MULTIPLE_SRC + i: s.memory for i, s in enumerate(srcs)}})
    return dst


def _reshape(plan: _Plan, node: Node) -> _Tensor:
    """A view of the input in the plain row-major layout (reordered to it first where it is blocked)."""
    src = plan.plain(node.inputs[0])
    md = plan.value_md(node.output)
    src.buffer.refs += 1
    return _Tensor(md, plan.memory(md, src.buffer), src.buffer)


def _lower(plan: _Plan, node: Node) -> _Tensor | tuple[_Tensor, ...]:
    """``node`` planned on its primitive, else (no lowering, or one that cannot take this node: a convolution of
    rank 3, a linear of rank 3, an operand oneDNN refuses, a target op gawee's kernel does not take) as a torch step
    of its reference semantics."""
    if not planned(node):
        return _torch_op(plan, node)
    mark = plan.mark()
    try:
        return LOWERINGS[node.op](plan, node)
    except _Unsupported:
        plan.undo(mark)
        return _torch_op(plan, node)


def _permute(plan: _Plan, node: Node) -> _Tensor:
    """A permutation as one oneDNN reorder: the plain input read through its strides permuted like its dimensions
    into the plain layout of the output (ShuffleNet's channel shuffle is reshape → permute → reshape: views around
    this one copy)."""
    x, dims, out = node.inputs[0], node.attrs["dims"], node.output.shape
    if not 0 < len(out) <= 12 or 0 in out:
        raise _Unsupported("a permutation of no elements or more than 12 dimensions")
    src = plan.plain(x)
    strides = torch.empty(x.shape, device="meta").stride()
    md = plan.md(out, strides=[strides[d] for d in dims], dtype=x.dtype)
    return plan.reorder(_Tensor(md, plan.memory(md, src.buffer), None), plan.value_md(node.output))


def _split(plan: _Plan, node: Node) -> tuple[_Tensor, ...]:
    """Each part of a split a oneDNN reorder of a region of the input (a submemory) into a tensor of its own, in
    the input's layout where oneDNN takes the region there (blocked: the offsets along channels whole blocks), else
    of the plain input into the plain layout. A part nobody reads is not copied."""
    x, a = node.inputs[0], node.attrs
    src = plan.operand(x)
    layout = plan.layout_of(src, x.shape, x.dtype) if x.type.rank == 4 and src.buffer is not None else None
    regions = _regions(plan, src, node) if layout is not None else None
    if regions is None:
        src, layout = plan.plain(x), None
        regions = _regions(plan, src, node)
        if regions is None:
            raise _Unsupported(f"oneDNN takes no region of {x.name} along dimension {a['dim']}")
    outs = []
    for md, v in zip(regions, node.outputs):
        dst = plan.tensor(plan.activation_md(v.shape, layout, v.dtype) if layout else plan.value_md(v))
        if v.num_uses or v.is_graph_output:
            plan.reorder(_Tensor(md, plan.memory(md, src.buffer), None), dst.md, dst)
        outs.append(dst)
    return tuple(outs)


def _regions(plan: _Plan, src: _Tensor, node: Node) -> list[int] | None:
    """The memory descriptors of the parts of ``src`` the split ``node`` makes, or None where oneDNN refuses one."""
    shape, dim, offset, regions = list(node.inputs[0].shape), node.attrs["dim"], 0, []
    create = plan.lib.dnnl_memory_desc_create_submemory
    for size in node.attrs["split_sizes"]:
        dims, offsets = [*shape[:dim], size, *shape[dim + 1 :]], [0] * len(shape)
        offsets[dim], offset = offset, offset + size
        try:
            regions.append(plan._new("dnnl_memory_desc_destroy", create, src.md, _DIMS(*dims), _DIMS(*offsets)))
        except _Unsupported:
            return None
    return regions


def _torch_op(plan: _Plan, node: Node) -> tuple[_Tensor, ...]:
    """An op without a primitive here (a softmax, a layer norm, a convolution of rank 3: any op torch.export
    emits), or whose primitive oneDNN refused: its torch semantics (its registry record, as the interpreter runs
    it: a target op's with its activations) on its operands in the plain layout, each output copied into a buffer
    of the module's — one step, between the primitives of the ops around it."""
    op, attrs = get_op(node.op), dict(node.attrs)
    return _torch_step(plan, node, lambda args: op.run(args, attrs), f"torch:{node.op}")


def _linear_int8(plan: _Plan, node: Node) -> tuple[_Tensor, ...]:
    """``linear_int8_dynamic`` as a torch step on the int8 kernel measured faster for its shape, the weight
    prepacked now (:func:`gawee.backend.quantized.choose_linear`, as the torch lowering runs it), where its
    reference semantics (an exact product in float64) would convert the weight on every call. Refused where no
    such kernel can run here (:func:`gawee.backend.quantized.unavailable`) or the weight or scales are computed."""
    from gawee.backend import quantized

    x, w, scale, b = node.inputs
    a = node.attrs
    if quantized.unavailable(a["levels"]) is not None or not (w.has_known_data and scale.has_known_data):
        raise _Unsupported("an int8 linear torch's kernel cannot run here")
    packed = b.data if b is not None and b.has_known_data and tuple(b.shape) == (w.shape[0],) else None
    act = (a["act"], tuple(a["act_params"]))
    rows = math.prod(x.shape[:-1])
    choice = quantized.choose_linear(rows, w.shape[1], w.shape[0], b is not None, *act, a["levels"])
    kernel = quantized.make_linear(choice.kernel, node.name, w.data, scale.data, packed, *act, a["levels"], rows)
    late = b is not None and packed is None
    return _torch_step(plan, node, lambda args: (kernel(args[0], args[3] if late else None),), choice.kernel)


def _torch_step(plan: _Plan, node: Node, compute: Callable[[list], Sequence[torch.Tensor]], name: str):
    """``node`` as one step of ``compute`` (its operands as torch tensors, constants as they are, the others
    in the plain layout -> its outputs), each output copied into a buffer of the module's."""

    def operand(v: Value | None) -> torch.Tensor | None:
        if v is None:
            return None
        if not v.is_const:
            return _view(plan.plain(v), v)
        if not v.has_known_data:
            raise _Unsupported(f"constant {v.name} has no data")
        return v.data

    args = [operand(v) for v in node.inputs]
    outs = tuple(plan.tensor(plan.value_md(v)) for v in node.outputs)
    views = [_view(t, v) for t, v in zip(outs, node.outputs)]

    def step() -> int:
        with torch.no_grad():
            results = compute(args)
            for view, result in zip(views, results):
                view.copy_(result)
        return 0

    plan.call(step, (), name)
    return outs


def _view(t: _Tensor, v: Value) -> torch.Tensor:
    """The plain tensor ``t`` (in a buffer of the module's) as a torch tensor of the value ``v``'s shape and type,
    sharing its memory."""
    return t.buffer.tensor.view(v.dtype.torch)[: math.prod(v.shape)].view(v.shape)


def _cast(plan: _Plan, node: Node) -> _Tensor:
    """A conversion between float32 and bfloat16 as one oneDNN reorder, into the input's layout where it is held
    blocked or channels-last (else the plain one): bfloat16 is float32's upper half, rounded to nearest even, as
    torch's conversion is (tests/backend/test_dnnl.py checks it bit for bit, ties included)."""
    x, out = node.inputs[0], node.output
    if x.dtype not in FLOATS or out.dtype not in FLOATS:
        raise _Unsupported(f"a cast from {x.dtype} to {out.dtype}")
    src = plan.operand(x)
    layout = plan.layout_of(src, x.shape, x.dtype) if x.type.rank == 4 else None
    return plan.reorder(src, plan.activation_md(out.shape, layout, out.dtype) if layout else plan.value_md(out))


LOWERINGS = {
    "conv2d": _conv2d,
    "onednn_conv": _conv2d,
    "onednn_depthwise": _conv2d,
    "conv2d_int8_static": _conv2d_int8,
    "linear_int8_dynamic": _linear_int8,
    "onednn_batch_norm": _batch_norm,
    "linear": _linear,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "mean": _mean,
    "cat": _cat,
    "reshape": _reshape,
    "flatten": _reshape,
    "permute": _permute,
    "split": _split,
    "cast": _cast,
    **dict.fromkeys(ELTWISE.keys() - {"gelu_tanh"}, _eltwise),
    "onednn_binary": _binary,
    "onednn_binary_int8": _binary,
    "onednn_affine_cat": _affine_cat,
}
"""The ops this runtime runs, each with the function that plans its primitive."""

RANKS = {
    "conv2d": 4,
    "onednn_conv": 4,
    "onednn_depthwise": 4,
    "conv2d_int8_static": 4,
    "onednn_batch_norm": 4,
    "linear": 2,
    "max_pool2d": 4,
    "avg_pool2d": 4,
    "adaptive_avg_pool2d": 4,
    "mean": 4,
}
"""The rank of the first operand the lowerings of these ops take."""


def planned(node: Node) -> bool:
    """Whether ``node`` is planned on a primitive (else on a torch step, :func:`_torch_op`): its op has a lowering
    that takes its rank (oneDNN may still refuse it when the module is built)."""
    rank = RANKS.get(node.op)
    return node.op in LOWERINGS and (rank is None or node.inputs[0].type.rank == rank)


def torch_flops(graph: Graph) -> str | None:
    """Why a whole-graph choice need not build this runtime for ``graph``: more than a tenth of its floating-point
    operations would run as torch steps (a transformer's batched linears and matmuls), which the torch lowering
    runs without the steps' copies into the plain layout. None where the primitives compute most of them, or where
    the runtime cannot run the graph at all (:func:`supports` says why: symbolic shapes have symbolic FLOPs)."""
    from gawee.analysis.cost import node_cost

    if supports(graph) is not None:
        return None
    flops = {node: node_cost(node).flops or 0 for node in graph}
    steps = [node for node in graph if not planned(node) and flops[node]]
    total, stepped = sum(flops.values()), sum(flops[node] for node in steps)
    if not stepped or stepped <= 0.1 * total:
        return None
    ops = sorted({node.op for node in steps})
    return f"{stepped / total:.0%} of its FLOPs would run as torch steps ({', '.join(ops)})"


def supports(graph: Graph) -> str | None:
    """Why ``graph`` cannot run on this runtime, or None if it can (as far as its types and ops show; the
    primitives themselves are checked when the module is built)."""
    why = unavailable()
    if why is not None:
        return why
    for v in (*graph.inputs, *graph.outputs):
        if v.type.symbolic:
            return "symbolic shapes (primitives are created for one size)"
    for node in graph:
        primitive = node.op in LOWERINGS
        for v in (*node.inputs, *node.outputs):  # torch takes constants of any type, primitives int8 weights too
            if v is None or v.dtype in FLOATS or (v.is_const and (not primitive or v.dtype is DType.i8)):
                continue
            return f"{node.name} computes in {v.dtype} (float32 and bfloat16 only)"
    return None


class DnnlModule(torch.nn.Module):
    """The rewritten graph on oneDNN's primitives: call it with torch tensors, get torch tensors back (a tuple, or
    nested as ``output_structure``). ``module.kernels`` lists the implementation oneDNN chose for each primitive,
    ``module.conv_layouts`` the activation layout of each convolution (by node name; they differ with ``per_conv``),
    ``module.conv_kernels`` its kernel (oneDNN's implementation, or gawee's Winograd, grouped or depthwise kernel),
    ``module.moved_acts`` the depthwise convolutions that apply their producer's activation to their input,
    ``module.codes_written`` the binary ops (``onednn_binary_int8``) and max pools whose primitive writes u8 codes.
    A call is not reentrant: the intermediate buffers are the module's (a lock makes concurrent calls wait).
    ``trial``: built by a trial process, with its convolutions' candidate kernels run once each and not raced
    (:meth:`gawee.backend.dnnl_plan._Plan.fastest`). ``shared``: a dict the modules built in one selection share
    (the variants of :meth:`DnnlRuntime.builds`): the times of the candidate kernels raced (the layouts race many of
    the same kernels in the same situations), the weights transformed for gawee's kernels and those reordered to a
    kernel's layout."""

    def __init__(
        self,
        graph: Graph,
        *,
        output_structure: Any = None,
        layout: str = "blocked",
        trial: bool = False,
        shared: dict | None = None,
    ):
        super().__init__()
        why = supports(graph)
        if why is not None:
            raise GaweeError(f"{graph.name} cannot run on oneDNN's primitives: {why}", hint='use backend="torch"')
        plan = _Plan(graph, layout, trial, shared)
        self._finalizer = weakref.finalize(self, _destroy, plan.lib, plan.handles)
        self.inputs = []  # each input's memory and where gawee's kernels read its address: both set by each call
        for v in graph.inputs:
            md = plan.value_md(v)
            plan.values[v] = _Tensor(md, plan.memory(md, None, 0), None)
            memory = plan.values[v].memory
            plan.input_cells[memory] = ctypes.c_void_p(0)
            self.inputs.append((memory, plan.input_cells[memory]))
        self.outputs = []  # each output's memory (plain, its address set by each call), shape and torch dtype
        try:
            for node in graph:
                made = _lower(plan, node)
                for v, t in zip(node.outputs, made if isinstance(made, tuple) else (made,)):
                    plan.values[v] = t
                    if v.num_uses == 0 and not v.is_graph_output:  # a split's part nobody reads
                        plan.release(t)
                plan.done_with(node)
            for v in graph.outputs:
                plain = plan.value_md(v)
                out = _Tensor(plain, plan.memory(plain, None, 0), None)
                plan.reorder(plan.operand(v), plain, out)
                self.outputs.append((out.memory, tuple(v.shape), v.dtype.torch))
        except _Unsupported as e:
            raise GaweeError(
                f"{graph.name} cannot run on oneDNN's primitives: {e}", hint='use backend="torch"'
            ) from None
        finally:
            plan.scratch.free()
        self.lib, self.stream, self.layout = plan.lib, plan.stream, layout
        self.steps = [step[:2] for step in plan.steps]  # (function, arguments)
        self.kernels = [step[2] for step in plan.steps]
        self.program = Program(self.steps, plan.lib.dnnl_primitive_execute)
        self.conv_layouts = plan.conv_layouts
        self.conv_kernels = plan.conv_kernels
        self.codes_written = plan.codes_written
        self.moved_acts = {  # the depthwise convolutions gawee's kernel computes with their input's activation
            n.name: n.attrs["act_in"]
            for n in graph
            if n.op == "onednn_depthwise" and plan.conv_kernels.get(n.name) == _Depthwise.name
        }
        self._keep = (plan.keep, plan.values, plan.pool, plan.converted)
        self.signature = InputSignature.of(graph)
        self.output_structure = None if output_structure is None else as_structure(output_structure)
        self.gawee_report = None
        self._lock = threading.Lock()

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        xs = [x.detach().contiguous() for x in self.signature.inputs(args, kwargs)]
        outs = [torch.empty(shape, dtype=dtype) for _, shape, dtype in self.outputs]
        lib = self.lib
        with self._lock:
            for (memory, cell), x in zip(self.inputs, xs):
                lib.dnnl_memory_set_data_handle(memory, x.data_ptr())
                cell.value = x.data_ptr()
            for (memory, *_), y in zip(self.outputs, outs):
                lib.dnnl_memory_set_data_handle(memory, y.data_ptr())
            failed = self.program.run()
            if failed is not None:
                i, status = failed
                raise GaweeError(
                    f"the {self.kernels[i]} kernel (step {i}) failed to execute (status {status})",
                    hint='use backend="torch"',
                )
            lib.dnnl_stream_wait(self.stream)
        return arrange(outs, self.output_structure)


def _destroy(lib, handles) -> None:
    for handle, destroy in reversed(handles.items()):
        getattr(lib, destroy)(_P(handle))


class DnnlRuntime(Runtime):
    """oneDNN's primitives (:class:`DnnlModule`), one variant per activation layout (:data:`LAYOUTS`); tried apart
    first, as they and gawee's C kernels run on addresses gawee computes."""

    name = "onednn"
    target = "onednn"
    title = "oneDNN's primitives"
    variants = ("per_conv", *(layout for layout in LAYOUTS if layout != "per_conv"))
    """:data:`LAYOUTS`, ``per_conv`` first: it races every kernel the fixed layouts race (and more), so built first
    in a selection, its races' times serve theirs and its kernels need no second trial (``DnnlModule``'s
    ``shared``); asked for by name (``backend="onednn"``), it is kept unless another measures more than 5% faster."""
    isolated = True
    whole_graph = True

    def unavailable(self) -> str | None:
        return unavailable()

    @property
    def rules(self) -> RuleSet:
        """The bundled onednn target phase, without the phases of gawee's kernels that cannot be built here."""
        from gawee.backend import affine_cat, depthwise

        skip = ("2-affine_cat",) * (affine_cat.unavailable() is not None) + ("3-depthwise",) * (
            depthwise.unavailable() is not None
        )
        return target_rules(self.target, skip=skip)

    def cannot_run(self, graph: Graph) -> str | None:
        return supports(graph)

    def unpromising(self, graph: Graph) -> str | None:
        return torch_flops(graph)

    def build(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: Any = None,
        variant: str = "blocked",
        shared: dict | None = None,
    ) -> DnnlModule:
        return DnnlModule(graph, output_structure=output_structure, layout=variant, shared=shared)

    def builds(
        self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, shared: dict | None = None, **options
    ) -> tuple[Callable[[], DnnlModule], Callable[[], DnnlModule]]:
        """The build here races each convolution's candidate kernels, sharing the times, transformed and reordered
        weights with the other variants built with the same ``shared``; the trial process's build runs each kernel once,
        untimed (``DnnlModule``'s ``trial``), but those that ran here already."""
        return functools.partial(self.build, graph, example_inputs, shared=shared, **options), functools.partial(
            DnnlModule,
            graph,
            output_structure=options.get("output_structure"),
            layout=options.get("variant", "blocked"),
            trial=True,
            shared=shared,
        )


RUNTIME = DnnlRuntime()
