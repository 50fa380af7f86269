"""A convolution on oneDNN's plan: its candidate kernels and the race between them (:func:`_conv`).

The candidates are every implementation oneDNN has of the convolution in the layouts it may run in (one layout, or
both with ``per_conv``), gawee's Winograd F(4×4, 3×3) kernel for a 3×3 stride-1 one (:mod:`gawee.backend.winograd`),
its grouped kernel for 8 channels per group (:mod:`gawee.backend.grouped`) and its depthwise kernel
(:mod:`gawee.backend.depthwise`, the only one that applies an activation to its input: ``onednn_depthwise``'s
``act_in``). Each is timed with the reorders of its operands its layout would need, and the fastest kept.
"""

from __future__ import annotations

from typing import Any

import torch

from gawee.backend.dnnl_plan import (
    _ANY,
    _CONV_DIRECT,
    _DIMS,
    _INFERENCE,
    _P,
    BIAS,
    DST,
    MEASURED,
    SRC,
    WEIGHTS,
    _Arg,
    _Plan,
    _post_op_arg,
    _post_ops,
    _reference,
    _Scratch,
    _Tensor,
    _Unsupported,
)
from gawee.cpu import no_vnni
from gawee.ir.core import Node, Value
from gawee.ir.types import DType


class _Primitive:
    """A candidate convolution kernel: one of oneDNN's implementations in ``layout``, compiled; ``args`` are the
    arguments it takes."""

    def __init__(
        self,
        plan: _Plan,
        layout: str,
        pd: int,
        prim: int,
        args: tuple[int, ...],
        quant: _Quant | None = None,
        summed: bool = False,
    ):
        self.plan, self.layout, self.pd, self.prim, self.args, self.quant = plan, layout, pd, prim, args, quant
        self.summed = summed
        """Its residual is added by the sum post-op from the codes its destination holds (:meth:`_Plan.accumulator`)."""

    @property
    def name(self) -> str:
        return self.plan.impl[self.prim]

    @property
    def key(self) -> tuple:
        """What tells it from the other candidates of a convolution."""
        return self.layout, self.name

    def wants(self, arg: int) -> int:
        """The memory descriptor it reads (or writes) ``arg`` in."""
        return self.plan.queried(self.pd, arg)

    def scratch(self, scratch: _Scratch) -> list[tuple]:
        """Its call on zero-filled scratch buffers, as steps."""
        fixed = self.quant.args if self.quant is not None else None
        return [scratch.step(self.prim, {arg: self.wants(arg) for arg in self.args}, fixed)]

    def drop(self) -> None:
        self.plan._drop(self.prim)

    def build(self, x: Value, residual: Value | None, weight: torch.Tensor, bias: torch.Tensor, wshape) -> _Tensor:
        """Its step of every call (operands reordered to its layout, weights once now); the output."""
        plan, args, quant = self.plan, {}, self.quant
        if residual is not None and not self.summed:
            args[_post_op_arg(0)] = plan.operand(residual, self.wants(_post_op_arg(0))).memory
        if quant is not None:
            src = plan.codes(x, self.wants(SRC), quant.scale, quant.zero_point)
            args.update(quant.args)
        else:
            src = plan.operand(x, self.wants(SRC))
        w = plan.constant(weight, self.wants(WEIGHTS), wshape)
        b = plan.constant(bias, self.wants(BIAS))
        if self.summed:
            dst = plan.accumulator(residual, self.wants(DST), quant.out)
        else:
            dst = plan.tensor(self.wants(DST), quant.out if quant is not None else None)
        plan.step(self.prim, {SRC: src.memory, WEIGHTS: w.memory, BIAS: b.memory, DST: dst.memory, **args})
        return dst


class _Winograd:
    """A candidate convolution kernel for 3×3 stride-1 convolutions: Winograd F(4×4, 3×3)
    (:mod:`gawee.backend.winograd`) in ``layout``, in chunks of ``rows`` rows of tiles (each image has
    ``tiles[0]`` rows): per chunk, the input transform, oneDNN's matmul over the 36 transformed matrices (weights
    prepacked once), and the output transform adding the bias and residual and applying the activation. A chunk's
    transformed tiles stay in the CPU's caches between its steps where the whole image's would not."""

    name = "gawee:winograd_f4x4_3x3"

    def __init__(self, plan: _Plan, layout: str, x: Value, out: Value, padding, act, residual: bool, rows: int):
        from gawee.backend import winograd

        self.plan, self.layout, self.lib, self.act, self.residual = plan, layout, winograd.library(), act, residual
        (n, c, h, w), (k, oh, ow) = x.shape, out.shape[1:]
        self.tiles = winograd.tiles(h, padding[0]), winograd.tiles(w, padding[1])
        self.rows, self.chunks = rows, n * self.tiles[0] // rows
        t, e = rows * self.tiles[1], winograd.ALPHA**2
        self.geometry = (c, h, w, k, oh, ow, *padding)
        self.src_md, self.dst_md = plan.activation_md(x.shape, layout), plan.activation_md(out.shape, layout)
        self.v_md, self.m_md = plan.md([e, t, c]), plan.md([e, t, k])
        create = plan.lib.dnnl_matmul_primitive_desc_create
        self.pd, self.prim = plan.primitive(create, plan.engine, self.v_md, plan.md([e, c, k], _ANY), None, self.m_md)

    @staticmethod
    def candidates(plan: _Plan, layout: str, x: Value, out: Value, geometry, act, residual: bool) -> list[_Winograd]:
        """The Winograd kernels for this convolution in ``layout``: one per chunking of
        :func:`gawee.backend.winograd.chunkings` (none where it cannot compute it: see :func:`winograd.eligible`;
        the blocked layout must not pad the channels, as the transforms skip padding lanes)."""
        from gawee.backend import winograd

        kernel, stride, padding, dilation, groups = geometry
        cin, cout = x.shape[1], out.shape[1]
        blocks = layout != "blocked" or (cin % plan.block == 0 and cout % plan.block == 0)
        if not (blocks and winograd.eligible(cin, cout, kernel, stride, dilation, groups, act)):
            return []
        if winograd.unavailable() is not None:
            return []
        rows = winograd.chunkings(x.shape[0], cin, cout, x.shape[2], x.shape[3], padding)
        return [_Winograd(plan, layout, x, out, padding, act, residual, r) for r in rows]

    @property
    def key(self) -> tuple:
        return self.layout, self.name, self.rows

    def wants(self, arg: int) -> int:
        return self.src_md if arg == SRC else self.dst_md

    def _steps(self, src: int, v: tuple[int, int], m: tuple[int, int], w: int, bias: int, res, dst: int) -> list:
        """Each chunk's three steps, over these addresses (``v`` and ``m``: (oneDNN memory, address)): (function,
        arguments, name)."""
        from gawee.backend import winograd

        c, h, w_, k, oh, ow, pt, pl = self.geometry
        th, tw = self.tiles
        array = (_Arg * 3)(_Arg(SRC, _P(v[0])), _Arg(WEIGHTS, _P(w)), _Arg(DST, _P(m[0])))
        self.plan.keep.append(array)
        into = (src, v[1], c, h, w_, *_strides(self.plan, self.layout, c, h, w_), pt, pl, th, tw)
        out = _strides(self.plan, self.layout, k, oh, ow)
        steps = []
        for r0 in range(0, self.chunks * self.rows, self.rows):
            steps += [
                (self.lib.gawee_wino_input, (*into, r0, self.rows), "gawee:winograd_input"),
                (
                    self.plan.lib.dnnl_primitive_execute,
                    (self.prim, self.plan.stream, 3, array),
                    self.plan.impl[self.prim],
                ),
                (
                    self.lib.gawee_wino_output,
                    (m[1], dst, bias, res, winograd.ACTS[self.act], k, oh, ow, *out, th, tw, r0, self.rows),
                    "gawee:winograd_output",
                ),
            ]
        return steps

    def scratch(self, scratch: _Scratch) -> list[tuple]:
        src, res, dst = scratch.zeros(self.src_md), scratch.zeros(self.dst_md), scratch.zeros(self.dst_md, True)
        v, vb = scratch.memory(self.v_md, written=True)
        m, mb = scratch.memory(self.m_md, written=True)
        w, wb = scratch.memory(self.plan.queried(self.pd, WEIGHTS))
        bias = torch.zeros(self.geometry[3])
        keep = [src, dst, res, vb, mb, wb, bias]
        steps = self._steps(
            src.data_ptr(),
            (v, vb.data_ptr()),
            (m, mb.data_ptr()),
            w,
            bias.data_ptr(),
            res.data_ptr() if self.residual else None,
            dst.data_ptr(),
        )
        return [(function, args, keep) for function, args, _ in steps]

    def drop(self) -> None:
        self.plan._drop(self.prim)

    def build(self, x: Value, residual: Value | None, weight: torch.Tensor, bias: torch.Tensor, wshape) -> _Tensor:
        from gawee.backend import winograd

        plan = self.plan
        src, res = _operands(plan, x, residual, self.src_md, self.dst_md)
        filters = plan.derive("winograd", weight, lambda: winograd.weights(weight))
        w = plan.constant(filters, plan.queried(self.pd, WEIGHTS))
        b = bias.detach().to(torch.float32).contiguous()
        plan.keep.append(b)
        dst = plan.tensor(self.dst_md)
        v, m = plan.tensor(self.v_md), plan.tensor(self.m_md)
        address = lambda t: t.buffer.tensor.data_ptr()
        steps = self._steps(
            address(src),
            (v.memory, address(v)),
            (m.memory, address(m)),
            w.memory,
            b.data_ptr(),
            res and address(res),
            address(dst),
        )
        for function, args, name in steps:
            plan.call(function, args, name)
        plan.release(v)
        plan.release(m)
        return dst


class _Native:
    """A candidate convolution kernel of gawee's own (C, :mod:`gawee.backend.native`) in ``layout``: one step that
    reads the activations where oneDNN keeps them and adds the bias and residual and applies the activation.
    A subclass names its kernel and says how it packs the filters and bias and what its C function takes."""

    name = ""

    def __init__(self, plan: _Plan, layout: str, x: Value, out: Value, geometry, act, residual: bool):
        self.plan, self.layout, self.residual = plan, layout, residual
        self.src_md, self.dst_md = plan.activation_md(x.shape, layout), plan.activation_md(out.shape, layout)
        self.function, self.sizes, self.blank = self.kernel(plan, layout, x.shape, out.shape, geometry, act)

    def kernel(self, plan: _Plan, layout: str, x, out, geometry, act) -> tuple[Any, tuple, tuple]:
        """The C function, its arguments after the five addresses (source, filters, bias, residual, output), and
        zero filters and bias of the convolution's shapes (what :meth:`scratch` runs it on)."""
        raise NotImplementedError

    def pack(self, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The filters and bias in the order the kernel reads them."""
        raise NotImplementedError

    @property
    def key(self) -> tuple:
        return self.layout, self.name

    def wants(self, arg: int) -> int:
        return self.src_md if arg == SRC else self.dst_md

    def _step(self, src: int, w: int, bias: int, res, dst: int) -> tuple:
        return self.function, (src, w, bias, res, dst, *self.sizes), self.name

    def scratch(self, scratch: _Scratch) -> list[tuple]:
        src, res, dst = scratch.zeros(self.src_md), scratch.zeros(self.dst_md), scratch.zeros(self.dst_md, True)
        w, bias = (torch.zeros_like(t) for t in self.pack(*self.blank))
        function, args, _ = self._step(
            src.data_ptr(), w.data_ptr(), bias.data_ptr(), res.data_ptr() if self.residual else None, dst.data_ptr()
        )
        return [(function, args, [src, dst, res, w, bias])]

    def drop(self) -> None:
        pass

    def build(self, x: Value, residual: Value | None, weight: torch.Tensor, bias: torch.Tensor, wshape) -> _Tensor:
        plan = self.plan
        src, res = _operands(plan, x, residual, self.src_md, self.dst_md)
        w, b = self.pack(weight, bias)
        plan.keep += [w, b]
        dst = plan.tensor(self.dst_md)
        address = lambda t: t.buffer.tensor.data_ptr()
        plan.call(*self._step(address(src), w.data_ptr(), b.data_ptr(), res and address(res), address(dst)))
        return dst


class _Grouped(_Native):
    """gawee's kernel for convolutions of 8 channels per group (:mod:`gawee.backend.grouped`)."""

    name = "gawee:grouped8"

    @staticmethod
    def candidates(plan: _Plan, layout: str, x: Value, out: Value, geometry, act, residual: bool) -> list[_Grouped]:
        """The kernel for this convolution in ``layout``, where it computes it (see
        :func:`gawee.backend.grouped.eligible`; the blocked layout must not pad the output's channels, which the
        kernel leaves unwritten)."""
        from gawee.backend import grouped

        kernel, stride, _, dilation, groups = geometry
        cin, cout, ow = x.shape[1], out.shape[1], out.shape[3]
        if (layout == "blocked" and cout % plan.block != 0) or grouped.unavailable() is not None:
            return []
        if not grouped.eligible(cin, cout, groups, kernel, stride, dilation, ow, act):
            return []
        return [_Grouped(plan, layout, x, out, geometry, act, residual)]

    def kernel(self, plan: _Plan, layout: str, x, out, geometry, act) -> tuple[Any, tuple, tuple]:
        from gawee.backend import grouped

        kernel, stride, padding, dilation, groups = geometry
        (n, c, h, w), (k, oh, ow) = x, out[1:]
        src, dst = _strides(plan, layout, c, h, w), _strides(plan, layout, k, oh, ow)
        sizes = (n, groups, h, w, *src, oh, ow, *dst, *kernel, *stride, *padding, *dilation, grouped.ACTS[act])
        return grouped.library().gawee_group8_conv, sizes, (torch.zeros(k, c // groups, *kernel), torch.zeros(k))

    def pack(self, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from gawee.backend import grouped

        return grouped.weights(weight), bias.detach().to(torch.float32).contiguous()


class _Depthwise(_Native):
    """gawee's depthwise kernel with its activation (:mod:`gawee.backend.depthwise`)."""

    name = "gawee:depthwise"

    @staticmethod
    def computes(plan: _Plan, layout: str, x, out, geometry, act) -> bool:
        """Whether the kernel computes this convolution (shapes ``x``, ``out``) in ``layout`` (see
        :func:`gawee.backend.depthwise.eligible`): blocked where oneDNN's block is the kernel's vector,
        channels-last where the channels are a multiple of it."""
        from gawee.backend import depthwise

        if depthwise.unavailable() is not None:
            return False
        kernel, stride, padding, dilation, groups = geometry
        if not depthwise.eligible(x[1], out[1], groups, kernel, stride, padding, dilation, x[3], out[3], act):
            return False
        vector = depthwise.width()
        return plan.block == vector if layout == "blocked" else x[1] % vector == 0

    @staticmethod
    def candidates(
        plan: _Plan, layout: str, x: Value, out: Value, geometry, act, residual: bool, act_in: str | None = None
    ) -> list[_Depthwise]:
        """The kernel for this convolution (applying ``act_in`` to its input) in ``layout``, where it computes it."""
        if not _Depthwise.computes(plan, layout, x.shape, out.shape, geometry, act):
            return []
        return [_Depthwise(plan, layout, x, out, geometry, act, residual, act_in)]

    def __init__(self, plan: _Plan, layout: str, x: Value, out: Value, geometry, act, residual: bool, act_in=None):
        self.act_in = act_in
        super().__init__(plan, layout, x, out, geometry, act, residual)

    def kernel(self, plan: _Plan, layout: str, x, out, geometry, act) -> tuple[Any, tuple, tuple]:
        from gawee.backend import depthwise

        kernel, stride, padding, dilation, _ = geometry
        (n, c, h, w), (oh, ow) = x, out[2:]
        vector = depthwise.width()
        src, dst = list(_strides(plan, layout, c, h, w)[:4]), list(_strides(plan, layout, c, oh, ow)[:4])
        if layout == "channels_last":  # a chunk of channels is the next vector of the pixel's
            src[1] = dst[1] = vector
        sizes = (n, -(-c // vector), h, w, *src, oh, ow, *dst, *kernel, *stride, *padding, *dilation)
        acts = depthwise.ACTS[act], depthwise.ACTS[self.act_in]
        return depthwise.library().gawee_depthwise_conv, (*sizes, *acts), (torch.zeros(c, 1, *kernel), torch.zeros(c))

    def pack(self, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from gawee.backend import depthwise

        return depthwise.weights(weight, depthwise.width()), depthwise.bias(bias, depthwise.width())


def _strides(plan: _Plan, layout: str, channels: int, h: int, w: int) -> tuple[int, int, int, int, int]:
    """Where element (n, c, h, w) of an activation is in ``layout``: strides of n, of c's block, of h and w, and the
    block."""
    if layout == "channels_last":
        return w * h * channels, 0, w * channels, channels, channels
    blk = plan.block
    return -(-channels // blk) * h * w * blk, h * w * blk, w * blk, blk, blk


def _operands(
    plan: _Plan, x: Value, residual: Value | None, src_md: int, dst_md: int
) -> tuple[_Tensor, _Tensor | None]:
    """``x`` in ``src_md`` and ``residual`` (where there is one) in ``dst_md``, each in a buffer of the module's: what
    a kernel of gawee's own reads by address."""
    res = None if residual is None else _addressed(plan, plan.operand(residual, dst_md))
    return _addressed(plan, plan.operand(x, src_md)), res


def _addressed(plan: _Plan, t: _Tensor) -> _Tensor:
    """``t``, or a copy of it in a buffer of the module's where each call sets its address (a graph input)."""
    if t.buffer is None:
        t = plan.reorder(t, t.md)
        plan.keep.append(t)  # no value holds the copy: the module does
    return t


class _Quant:
    """An int8 convolution's grids (``conv2d_int8_static``): its input quantized to u8 codes with ``scale`` and
    ``zero_point``, its int8 weights' float32 ``weight_scales`` (one per output channel), and ``out``, the grid its
    result is requantized to for the next int8 convolution (``(scale, zero point)``, u8 codes), or None (float32).
    oneDNN computes what the op does: the integer sums times the float32 ``scale * weight_scale``, plus the bias,
    the residual post-op and the activation in float32, then (``out``) the codes of ``round(y * (1 / scale)) +
    zero point`` saturated to [0, 255]."""

    def __init__(self, scale: float, zero_point: int, weight_scales: torch.Tensor, out: tuple[float, int] | None):
        self.scale, self.zero_point, self.weight_scales, self.out = scale, zero_point, weight_scales, out
        self.args: dict[int, int] = {}  # the scales' and zero points' memories, set with the attribute

    def attr(self, plan: _Plan, attr: int | None, groups: int) -> int:
        """``attr`` (the post-ops, or None) with the scales and zero points, whose memories :attr:`args` keeps."""
        scales: dict[int, Any] = {SRC: self.scale, WEIGHTS: (3 if groups > 1 else 1, self.weight_scales)}
        zero_points = {SRC: self.zero_point}
        if self.out is not None:
            scales[DST], zero_points[DST] = self.out
        attr, self.args = plan.scaled(scales, zero_points, attr)
        return attr


def exact_int8(implementation: str) -> bool:
    """Whether oneDNN's int8 convolution ``implementation`` sums u8 codes up to 255 times int8 weights exactly: its
    instruction set has VNNI or AMX (``vpdpbusd``, ``tdpbusd``: each product added to an int32), or it is the GEMM
    kernel on a CPU with VNNI, which it then uses (:func:`gawee.cpu.no_vnni`). The others
    (``brgconv:avx512_core``, ``jit_uni_int8:avx2``) add pairs of products in int16 first (``vpmaddubsw``), which
    saturates at 32767: 255 · 127 · 2 is not held (a convolution of codes 255 and weights 127 came out half its
    value); tests/backend/test_dnnl.py runs that case on every kernel kept."""
    isa = implementation.rsplit(":", 1)[-1]
    return "vnni" in isa or "amx" in isa or (implementation.startswith("x64:gemm_s8u8s32") and no_vnni() is None)


def _conv(
    plan: _Plan, node: Node, weight, bias, groups: int, stride, padding, dilation, residual=None, quant=None
) -> _Tensor:
    """``act(conv(x) + residual)`` as one step, or Winograd's three, on the kernel measured fastest where there are
    several (every implementation oneDNN has, in each layout, with ``per_conv``); int8 with ``quant`` (a
    :class:`_Quant`)."""
    x, out = node.inputs[0], node.output
    cin, cout = x.shape[1], out.shape[1]
    kernel = list(weight.shape[2:])
    wshape = [groups, cout // groups, cin // groups, *kernel] if groups > 1 else [cout, cin, *kernel]
    dims = (_DIMS(*stride), _DIMS(*(d - 1 for d in dilation)), _DIMS(*padding), _DIMS(*padding))
    act, params = plan.act_of(node)
    create = plan.lib.dnnl_convolution_forward_primitive_desc_create
    tag = node.attrs.get("layout")  # set by a layout phase (rules/targets/onednn/variants/); else the module's
    mode = plan.layout if tag is None else "per_conv" if tag == "any" else tag

    wtype = {torch.bfloat16: DType.bf16, torch.int8: DType.i8}.get(weight.dtype, DType.f32)
    own = x.dtype is DType.f32 and out.dtype is DType.f32 and wtype is DType.f32  # gawee's kernels: float32 only
    src_type = DType.u8 if quant is not None else x.dtype
    dst_type = DType.u8 if quant is not None and quant.out is not None else out.dtype
    # A residual held as u8 codes, added into a result requantized to u8 codes: summed from the destination (oneDNN's
    # sum post-op reads the codes it holds with their grid's scale and zero point), not dequantized first.
    held = plan.values.get(residual) if residual is not None else None
    summed = held.grid if held is not None and held.grid is not None and dst_type is DType.u8 else None

    def descriptor(layout: str) -> tuple[tuple, int | None]:
        """The convolution's arguments in ``layout``, and its post-ops (the bias in float32, whatever the operands:
        oneDNN adds it to the float32 sums)."""
        # a few input channels (an image): read as they are, like ORT's NCHWc convolutions
        if cin < plan.block and groups == 1:
            src_md = plan.md(x.shape, _ANY, dtype=src_type)
        else:
            src_md = plan.activation_md(x.shape, layout, src_type)
        dst_md, b_md = plan.activation_md(out.shape, layout, dst_type), plan.md([cout])
        w_md = plan.md(wshape, _ANY, dtype=wtype)
        residual_md = None
        if residual is not None and summed is None:  # added in the layout the output gets: asked for first, then fixed
            probe = plan.descriptor(create, plan.engine, _INFERENCE, _CONV_DIRECT, src_md, w_md, b_md, dst_md, *dims)
            dst_md = residual_md = plan.queried(probe, DST)
            if dst_type is not residual.dtype:  # a requantized result: the residual is added before, in float32
                residual_md = plan.retyped(dst_md, residual)
        attr = _post_ops(plan, act, params, residual_md, summed)
        if quant is not None:
            attr = quant.attr(plan, attr, groups)
        return (plan.engine, _INFERENCE, _CONV_DIRECT, src_md, w_md, b_md, dst_md, *dims), attr

    reads = {SRC: x, **({DST if summed else _post_op_arg(0): residual} if residual is not None else {})}
    args = tuple(dict.fromkeys((SRC, WEIGHTS, BIAS, DST, *reads)))  # a summed residual is read from DST
    geometry = (kernel, stride, padding, dilation, groups)

    def candidates_in(layout: str) -> list:
        conv_args, attr = descriptor(layout)
        if mode == "per_conv":  # every kernel of each layout timed here, with the reorders it would need
            found = plan.implementations(create, *conv_args, attr=attr)
        else:
            found = [plan.primitive(create, *conv_args, attr=attr)]
        primitives = [_Primitive(plan, layout, pd, prim, args, quant, summed is not None) for pd, prim in found]
        if not own:
            return primitives
        return [
            *primitives,
            *_Winograd.candidates(plan, layout, x, out, geometry, act, residual is not None),
            *_Grouped.candidates(plan, layout, x, out, geometry, act, residual is not None),
            *_Depthwise.candidates(plan, layout, x, out, geometry, act, residual is not None),
        ]

    layouts = MEASURED if mode == "per_conv" else (mode,)
    act_in = node.attrs.get("act_in")  # onednn_depthwise's prologue (rules/targets/onednn/3-depthwise.rules)
    if act_in is not None:  # only gawee's depthwise kernel applies an activation to its input
        if not own:
            raise _Unsupported(f"gawee's depthwise kernel does not take {node.name} in {x.dtype}")
        operands = (x, out, geometry, act, residual is not None, act_in)
        candidates = [c for layout in layouts for c in _Depthwise.candidates(plan, layout, *operands)]
        if not candidates:
            raise _Unsupported(f"gawee's depthwise kernel does not take {node.name} in the {mode} layout")
    else:
        candidates = [c for layout in layouts for c in candidates_in(layout)]
        if all(_reference(c.name) for c in candidates if isinstance(c, _Primitive)):  # oneDNN has no kernel here
            candidates += [c for layout in MEASURED if layout not in layouts for c in candidates_in(layout)]
    if quant is not None:  # only the kernels whose int32 sums are exact for u8 codes up to 255
        exact = [c for c in candidates if exact_int8(c.name)]
        for c in candidates:
            if c not in exact:
                c.drop()
        if not exact:
            raise _Unsupported(f"oneDNN has no int8 kernel with exact sums for {node.name} here")
        candidates = exact
    real = [c for c in candidates if not _reference(c.name)]
    if real:
        for c in candidates:
            if c not in real:
                c.drop()
        candidates = real
    shapes = (*x.shape, *out.shape, *kernel, *stride, *padding, *dilation, groups)
    requantized = quant is not None and quant.out is not None
    residual_as = None if residual is None else "summed" if summed else "added"
    situation = (*shapes, src_type, wtype, dst_type, act, *params, residual_as, act_in, requantized)
    chosen = plan.fastest(candidates, reads, situation) if len(candidates) > 1 else candidates[0]
    plan.conv_layouts[node.name] = chosen.layout
    plan.conv_kernels[node.name] = chosen.name
    bias = bias if bias is not None else torch.zeros(cout)
    return chosen.build(x, residual, weight, bias, wshape)
