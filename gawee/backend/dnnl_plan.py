"""oneDNN's C API through ctypes, and the plan that builds one graph's primitives (:class:`_Plan`).

The plan owns every handle it creates (destroyed with the module), gives each value a memory descriptor in the
module's activation layout, reorders operands between layouts (each reorder once per consumer layout), reorders
constants once into the layout a primitive asked for, reuses buffers by liveness, and races candidate kernels of
one convolution (:meth:`_Plan.fastest`). :mod:`gawee.backend.dnnl_conv` builds those candidates and
:mod:`gawee.backend.dnnl` lowers each op onto the plan.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType
from gawee.ops.nn import _pair as pair

# -- the C API (oneDNN 3.x, dnnl.h / dnnl_types.h) -----------------------------------------------------------
_P = ctypes.c_void_p
_DIMS = ctypes.c_int64 * 12
_ANY, _CPU, _IN_ORDER, _INFERENCE = 1, 1, 1, 96
_CONV_DIRECT = 1
_NCHW8C, _NCHW16C, _NHWC = 102, 78, 22
_QUERY_IMPL, _QUERY_ARG_MD = 8, 255
SRC, SRC_1, DST, WEIGHTS, BIAS, MULTIPLE_SRC = 1, 2, 17, 33, 41, 1024
ATTR_SCALES, ATTR_ZERO_POINTS = 4096, 8192  # DNNL_ARG_ATTR_SCALES | arg, DNNL_ARG_ATTR_ZERO_POINTS | arg

DTYPES = {DType.f32: 3, DType.bf16: 2, DType.i32: 4, DType.i8: 5, DType.u8: 6}
"""The types of the values this runtime holds, as oneDNN's data types (``dnnl_f32``, ...): bfloat16 where a
precision phase (rules/precision/bf16.rules) put a convolution, linear or pooling in it; int8 weights and the u8
codes of activations where rules/precision/int8.rules put a convolution in int8 (``conv2d_int8_static``)."""

FLOATS = frozenset({DType.f32, DType.bf16})
"""The floating-point types among :data:`DTYPES`: those a cast converts between (rounding to nearest even)."""

_TORCH_TYPES = {torch.float32: DType.f32, torch.bfloat16: DType.bf16, torch.int8: DType.i8, torch.uint8: DType.u8}


def _post_op_arg(index: int) -> int:
    """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1: a binary post-op's second operand."""
    return (1 << 15) * (index + 1) | SRC_1


ELTWISE = {
    "relu": (32, lambda p: (0.0, 0.0)),
    "leaky_relu": (32, lambda p: (p[0], 0.0)),
    "tanh": (33, lambda p: (0.0, 0.0)),
    "sigmoid": (41, lambda p: (0.0, 0.0)),
    "silu": (44, lambda p: (1.0, 0.0)),
    "hardswish": (52, lambda p: (1 / 6, 0.5)),
    "hardsigmoid": (40, lambda p: (1 / 6, 0.5)),
    "gelu": (49, lambda p: (0.0, 0.0)),
    "gelu_tanh": (43, lambda p: (0.0, 0.0)),
    "hardtanh": (47, lambda p: (p[0], p[1])),
    "mish": (51, lambda p: (0.0, 0.0)),
}
"""gawee's activations (the fused ``act`` vocabulary and the standalone ops) as oneDNN eltwise algorithms and
their (alpha, beta): hardswish and hardsigmoid are x·max(0, min(1, x/6 + 1/2)) and max(0, min(1, x/6 + 1/2)),
silu is swish with alpha 1, hardtanh is clip_v2 to [alpha, beta], leaky_relu is relu with the negative slope."""

_ELTWISE_LINEAR = 38
"""oneDNN's eltwise ``linear``: alpha * x + beta."""

BINARY = {"add": 0x1FFF0, "mul": 0x1FFF1, "sub": 0x1FFF5, "div": 0x1FFF4, "maximum": 0x1FFF2, "minimum": 0x1FFF3}
_POOL_MAX, _POOL_AVG_INCLUDE, _POOL_AVG_EXCLUDE = 0x1FF, 0x2FF, 0x3FF

LIBRARY_ENV = "GAWEE_DNNL_LIBRARY"

LAYOUTS = ("blocked", "channels_last", "per_conv")
"""The activation layouts a module can run in: channel-blocked everywhere (the default), channels-last (NHWC)
everywhere, or each convolution's own, measured here (``per_conv``: its fastest kernel in either layout, counting
the reorders of its operands; the ops between convolutions take their input's)."""

MEASURED = ("blocked", "channels_last")
"""The layouts ``per_conv`` times for each convolution."""


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int), ("hash", ctypes.c_char_p)]


class _Unsupported(Exception):
    """Why a node has no primitive here (the message is :func:`supports`'s answer)."""


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """The oneDNN library, or why it cannot be loaded."""
    path = os.environ.get(LIBRARY_ENV) or str(Path(sys.prefix) / "lib" / "libdnnl.so.3")
    if not Path(path).exists():
        return None, f"oneDNN's library is not installed (pip install onednn-cpu-gomp, or set {LIBRARY_ENV})"
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return None, f"oneDNN's library {path} cannot be loaded: {e}"
    lib.dnnl_version.restype = ctypes.POINTER(_Version)
    version = lib.dnnl_version().contents
    if version.major != 3:
        return None, f"{path} is oneDNN {version.major}.{version.minor}: this runtime calls oneDNN 3's C API"
    lib.dnnl_primitive_desc_query_md.restype = _P
    lib.dnnl_primitive_desc_query_md.argtypes = [_P, ctypes.c_int, ctypes.c_int]
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    lib.dnnl_memory_desc_get_size.argtypes = [_P]
    lib.dnnl_memory_desc_equal.restype = ctypes.c_int
    lib.dnnl_memory_desc_equal.argtypes = [_P, _P]
    lib.dnnl_primitive_execute.argtypes = [_P, _P, ctypes.c_int, _P]
    lib.dnnl_memory_set_data_handle.argtypes = [_P, _P]
    lib.dnnl_stream_wait.argtypes = [_P]
    lib.dnnl_post_ops_append_eltwise.argtypes = [_P, ctypes.c_int, ctypes.c_float, ctypes.c_float]
    lib.dnnl_post_ops_append_sum.argtypes = [_P, ctypes.c_float, ctypes.c_int32, ctypes.c_int]
    return lib, None


def unavailable() -> str | None:
    """Why this runtime cannot run here (the library is missing), or None."""
    return _load()[1]


def _lib() -> ctypes.CDLL:
    lib, why = _load()
    if lib is None:
        raise GaweeError(why, hint='use backend="torch"')
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise _Unsupported(f"oneDNN refused {what} (status {status})")


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _P)]


def block_size() -> int:
    """The channel block of the blocked layout: 16 floats where the CPU has AVX-512, else 8 (AVX2's vector)."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


# -- planning: the graph as a list of primitives ---------------------------------------------------------------
class _Buffer:
    """Storage shared by the values that view it (a reshape's output views its input's), back to the pool when
    the last of them is dead."""

    __slots__ = ("refs", "tensor")

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.refs = tensor, 0


class _HeldDescriptor:
    """A copy of a memory descriptor that outlives the plan that made it (a plan destroys its own handles)."""

    __slots__ = ("lib", "md")

    def __init__(self, lib, md: int):
        self.lib, self.md, held = lib, None, _P()
        _check(lib.dnnl_memory_desc_clone(ctypes.byref(held), _P(md)), "dnnl_memory_desc_clone")
        self.md = held.value

    def __del__(self):
        if self.md is not None:
            self.lib.dnnl_memory_desc_destroy(_P(self.md))


class _Tensor:
    """A value as the runtime holds it: its memory descriptor, its oneDNN memory over a buffer; and where the
    memory holds a float32 value's u8 codes on a grid (an int8 convolution's requantized result), the grid's
    ``(scale, zero point)``: the value is ``(code - zero point) * scale`` (:meth:`_Plan.operand` computes it for
    any reader but an int8 convolution quantizing to the same grid, :meth:`_Plan.codes`)."""

    __slots__ = ("buffer", "grid", "md", "memory")

    def __init__(self, md, memory, buffer: _Buffer | None, grid: tuple[float, int] | None = None):
        self.md, self.memory, self.buffer, self.grid = md, memory, buffer, grid


class _Plan:
    """Builds the primitives of one graph; owns every handle it creates (destroyed with the module)."""

    def __init__(self, graph: Graph, layout: str, trial: bool = False, shared: dict | None = None):
        if layout not in LAYOUTS:
            raise GaweeError(f"unknown oneDNN layout {layout!r}", hint=f"layout is one of {', '.join(LAYOUTS)}")
        self.lib = _lib()
        self.layout = layout
        self.block = block_size()
        self.handles: dict[int, str] = {}  # handle -> its destroy function, destroyed in reverse order of making
        self.keep: list[Any] = []  # what the primitives' arguments point to
        self.steps: list[tuple[Any, tuple, str]] = []  # (C function, its arguments, the kernel's name)
        self.impl: dict[int, str] = {}  # each primitive's implementation (oneDNN's name for its kernel)
        self.pool: dict[int, list[_Buffer]] = {}  # free buffers by size (float32 words)
        self.values: dict[Value, _Tensor] = {}
        self.converted: dict[Value, list[_Tensor]] = {}  # a value reordered to consumers' layouts
        self.conv_layouts: dict[str, str] = {}  # each convolution's (and batch norm's) activation layout
        self.conv_kernels: dict[str, str] = {}  # each convolution's (and batch norm's) kernel
        self.codes_written: list[str] = []  # the binary ops and max pools whose primitive writes u8 codes
        shared = {} if shared is None else shared  # what the modules of one selection share (DnnlModule)
        self.times: dict[tuple, float] = shared.setdefault("times", {})  # a candidate's call in a situation -> ms
        if trial:  # those it runs untimed are kept for this plan only
            self.times = dict(self.times)
        self.derived: dict[tuple, tuple] = shared.setdefault("derived", {})  # see derive
        arena = _Arena() if trial else shared.setdefault("arena", _Arena())  # a trial's races run on one of its own
        self.scratch = _Scratch(self, arena)  # the buffers races run on
        self.storage = _Storage()  # the module's buffers: activations and constants in its kernels' layouts
        self.trial = trial  # a trial build (see fastest): every candidate run once, none timed
        self.engine = self._new("dnnl_engine_destroy", self.lib.dnnl_engine_create, _CPU, 0)
        self.stream = self._new("dnnl_stream_destroy", self.lib.dnnl_stream_create, self.engine, _IN_ORDER)
        self.remaining = {v: v.num_uses for n in graph for v in n.inputs if v is not None}
        self.input_cells: dict[int, ctypes.c_void_p] = {}  # a graph input's memory -> its address, set each call

    # handles
    def _new(self, destroy: str, create, *args) -> int:
        handle = _P()
        args = [_P(a) if isinstance(a, int) else a for a in args]  # handles are pointers; int enums fit the slot
        _check(create(ctypes.byref(handle), *args), create.__name__)
        self.handles[handle.value] = destroy
        return handle.value

    def md(self, shape, tag: int | None = None, strides=None, dtype: DType = DType.f32) -> int:
        """A memory descriptor of ``dtype`` (one of :data:`DTYPES`): plain row-major, or the format ``tag`` (``_ANY``:
        the primitive's choice), or with these ``strides``."""
        shape, dt = list(shape) or [1], DTYPES[dtype]
        if tag is not None:
            create = self.lib.dnnl_memory_desc_create_with_tag
            return self._new("dnnl_memory_desc_destroy", create, len(shape), _DIMS(*shape), dt, tag)
        strides = strides or torch.empty(shape, device="meta").stride()
        create = self.lib.dnnl_memory_desc_create_with_strides
        return self._new("dnnl_memory_desc_destroy", create, len(shape), _DIMS(*shape), dt, _DIMS(*strides))

    def value_md(self, v: Value) -> int:
        """The plain row-major memory descriptor of the value ``v`` (its shape and type)."""
        return self.md(v.shape, dtype=v.dtype)

    def activation_md(self, shape, layout: str, dtype: DType = DType.f32) -> int:
        """A convolution's activation in ``layout`` (one of :data:`MEASURED`)."""
        tag = _NHWC if layout == "channels_last" else _NCHW16C if self.block == 16 else _NCHW8C
        return self.md(shape, tag, dtype=dtype)

    def layout_of(self, t: _Tensor, shape, dtype: DType = DType.f32) -> str | None:
        """Which of :data:`MEASURED` the tensor ``t`` of ``shape`` and ``dtype`` is in, if any."""
        for layout in MEASURED:
            if self.lib.dnnl_memory_desc_equal(_P(t.md), _P(self.activation_md(shape, layout, dtype))):
                return layout
        return None

    def memory(self, md: int, buffer: _Buffer | None, data_ptr: int | None = None) -> int:
        """A oneDNN memory over ``buffer``, or at ``data_ptr`` (0: an address each call sets)."""
        ptr = buffer.tensor.data_ptr() if buffer is not None else data_ptr
        return self._new("dnnl_memory_destroy", self.lib.dnnl_memory_create, md, self.engine, _P(ptr))

    def buffer(self, md: int) -> _Buffer:
        """Storage for ``md``: a dead value's of the same size, else new."""
        words = _words(self.lib, md)
        free = self.pool.get(words)
        if free:
            return free.pop()
        return _Buffer(self.storage.take(words))

    def tensor(self, md: int, grid: tuple[float, int] | None = None) -> _Tensor:
        buffer = self.buffer(md)
        buffer.refs += 1
        return _Tensor(md, self.memory(md, buffer), buffer, grid)

    def mark(self) -> tuple:
        """What :meth:`undo` restores: the steps, the copies of values in other layouts, the free buffers."""
        converted = {v: list(c) for v, c in self.converted.items()}
        return len(self.steps), converted, {size: list(free) for size, free in self.pool.items()}

    def undo(self, mark: tuple) -> None:
        """The plan as it was at ``mark``: a step planned since (a reorder) is dropped, and with it the copy it
        would have made (a later consumer would take it as made); a free buffer taken since is free again (an
        earlier step still writes it: dropped by everyone, it would be freed under that step)."""
        steps, self.converted, self.pool = mark
        del self.steps[steps:]
        for free in self.pool.values():
            for buffer in free:
                buffer.refs = 0

    def release(self, t: _Tensor) -> None:
        if t.buffer is not None:
            t.buffer.refs -= 1
            if t.buffer.refs == 0:
                self.pool.setdefault(t.buffer.tensor.numel(), []).append(t.buffer)

    def descriptor(self, create, *args, attr: int | None = None) -> int:
        """The primitive descriptor ``create(*args, attr)`` makes: what the primitive would choose, not compiled."""
        return self._new("dnnl_primitive_desc_destroy", create, *args, _P(attr))

    def primitive(self, create, *args, attr: int | None = None) -> tuple[int, int]:
        """The primitive descriptor ``create(*args, attr)`` makes, and its primitive (oneDNN compiles it now)."""
        pd = self.descriptor(create, *args, attr=attr)
        return pd, self.compiled(pd)

    def compiled(self, pd: int) -> int:
        """The primitive of the implementation ``pd`` is at, compiled now."""
        prim = self._new("dnnl_primitive_destroy", self.lib.dnnl_primitive_create, pd)
        self.impl[prim] = self._impl_name(pd)
        return prim

    def _impl_name(self, pd: int) -> str:
        impl = ctypes.c_char_p()
        self.lib.dnnl_primitive_desc_query(_P(pd), _QUERY_IMPL, 0, ctypes.byref(impl))
        return impl.value.decode() if impl.value else "?"

    def _drop(self, handle: int) -> None:
        """Destroys one of the plan's handles now (a primitive measured and not kept)."""
        destroy = self.handles.pop(handle, None)
        if destroy is not None:
            getattr(self.lib, destroy)(_P(handle))

    def implementations(self, create, *args, attr: int | None) -> list[tuple[int, int]]:
        """Every implementation oneDNN has of the primitive ``create(*args, attr)``, compiled: (the descriptor the
        primitive keeps, the primitive); the reference one only where there is no other. oneDNN's own first choice
        is a heuristic: on an AVX2 machine its second implementation of channels-last 1×1 convolutions
        (``jit_1x1``) took less time than its first (``brgconv_1x1``). Each implementation once: oneDNN 3.2's
        iteration visited a resnet50's implementations of a shape once more for each earlier convolution of that
        shape (the 4th 1×1 convolution of a shape, 4 times each). An implementation whose vectors are a quarter as
        wide as an earlier one's, or narrower (``jit:sse41`` after ``jit:avx512_core``: oneDNN keeps it for CPUs
        without the wider instructions), is left out: each of its instructions does a quarter of the work or less,
        and yet each race and each trial ran it."""
        pd, found, names, widest = self.descriptor(create, *args, attr=attr), [], set(), 0
        while True:
            name = self._impl_name(pd)
            bits = _vector_bits(name)
            widest = max(widest, bits)
            narrow = bits > 0 and bits * NARROW <= widest
            if not _reference(name) and not narrow and name not in names:
                names.add(name)
                prim = self.compiled(pd)
                own = _P()  # the descriptor the primitive keeps: ``pd`` moves on to the next implementation
                self.lib.dnnl_primitive_get_primitive_desc(_P(prim), ctypes.byref(own))
                found.append((own.value, prim))
            if self.lib.dnnl_primitive_desc_next_impl(_P(pd)) != 0:  # the last implementation was reached
                break
        return found or [self.primitive(create, *args, attr=attr)]

    def act_of(self, node: Node) -> tuple[str | None, tuple]:
        """The activation ``node``'s primitive applies as its post-op: its own ``act`` (the target phase,
        rules/targets/onednn/, gave it the activation that alone read its output)."""
        if node.attrs.get("act") is None:
            return None, ()
        return node.attrs["act"], tuple(node.attrs.get("act_params", ()))

    def queried(self, pd: int, arg: int) -> int:
        """The memory descriptor the primitive chose for its argument ``arg`` (owned by ``pd``)."""
        return self.lib.dnnl_primitive_desc_query_md(_P(pd), _QUERY_ARG_MD, arg)

    def step(self, prim: int, args: dict[int, int]) -> None:
        """``prim`` executed on ``args`` (argument → memory), a step of every call."""
        array = (_Arg * len(args))(*(_Arg(k, _P(m)) for k, m in args.items()))
        self.keep.append(array)
        self.steps.append((self.lib.dnnl_primitive_execute, (prim, self.stream, len(args), array), self.impl[prim]))

    def call(self, function, args: tuple, name: str) -> None:
        """A C function of gawee's own (returning 0, else a status) on ``args``, a step of every call."""
        self.steps.append((function, args, name))

    def reorder(self, src: _Tensor, md: int, dst: _Tensor | None = None, now: bool = False) -> _Tensor:
        """``src`` copied into the layout ``md``: a step of every call, or (``now``) once, at build time."""
        dst = dst or self.tensor(md)
        _, prim = self.primitive(self.lib.dnnl_reorder_primitive_desc_create, src.md, self.engine, md, self.engine)
        if not now:
            self.step(prim, {SRC: src.memory, DST: dst.memory})
            return dst
        args = (_Arg * 2)(_Arg(SRC, _P(src.memory)), _Arg(DST, _P(dst.memory)))
        _check(self.lib.dnnl_primitive_execute(prim, self.stream, 2, args), "a weight reorder")
        self.lib.dnnl_stream_wait(self.stream)
        return dst

    def accumulator(self, v: Value, md: int, grid: tuple[float, int]) -> _Tensor:
        """The destination of a convolution that adds ``v`` (held as u8 codes) by oneDNN's sum post-op, holding
        ``v``'s codes in ``md`` before its step, its own codes on ``grid`` after: ``v``'s own buffer where this
        reader is its last, nothing else holds that buffer and ``v`` is held in ``md`` already (the sum is made
        for accumulating in place); else a copy of its codes (a reorder, into ``md``'s layout where it differs)."""
        t = self.values[v]
        last = self.remaining.get(v) == 1 and not v.is_graph_output
        if last and t.buffer is not None and t.buffer.refs == 1 and self.lib.dnnl_memory_desc_equal(_P(t.md), _P(md)):
            t.buffer.refs += 1
            return _Tensor(md, self.memory(md, t.buffer), t.buffer, grid)
        dst = self.tensor(md, grid)
        self.reorder(t, md, dst)
        return dst

    def scaled(
        self, scales: dict[int, float | tuple[int, torch.Tensor]], zero_points: dict[int, int], attr: int | None = None
    ) -> tuple[int, dict[int, int]]:
        """``attr`` (new where None) with the float32 scales of the arguments in ``scales`` — one number, or (mask,
        a tensor of them: per output channel of a convolution's weights) — and one zero point for each argument
        of ``zero_points`` that is not 0; and the arguments of every call that give them (memories over tensors the
        plan keeps). A zero point of 0 is left out, as absent ones are 0: given one, even of 0, oneDNN's int8
        kernels take the path that subtracts it from every sum (and compensates the padded border for it)."""
        attr = attr or self._new("dnnl_primitive_attr_destroy", self.lib.dnnl_primitive_attr_create)
        args = {}
        for arg, value in scales.items():
            mask, data = value if isinstance(value, tuple) else (0, torch.tensor([value]))
            _check(self.lib.dnnl_primitive_attr_set_scales_mask(_P(attr), arg, mask), "scales")
            args[ATTR_SCALES | arg] = self._held(data.to(torch.float32).reshape(-1).contiguous(), DType.f32)
        for arg, value in zero_points.items():
            if value == 0:
                continue
            _check(self.lib.dnnl_primitive_attr_set_zero_points_mask(_P(attr), arg, 0), "zero points")
            args[ATTR_ZERO_POINTS | arg] = self._held(torch.tensor([value], dtype=torch.int32), DType.i32)
        return attr, args

    def _held(self, data: torch.Tensor, dtype: DType) -> int:
        """A oneDNN memory over the plain 1-d ``data`` (of ``dtype``), which the plan keeps."""
        self.keep.append(data)
        return self.memory(self.md(data.shape, dtype=dtype), None, data.data_ptr())

    def codes(self, v: Value, md: int, scale: float, zero_point: int) -> _Tensor:
        """The value ``v`` as the u8 codes in ``md`` of ``round(v * (1 / scale)) + zero_point``, saturated to [0, 255]
        (an int8 convolution's input, ``conv2d_int8_static``): the codes ``v`` is held as where it is on that very
        grid (a convolution requantized it for this reader), else quantized from its value by a reorder (its scale
        the float32 ``1 / scale``, multiplied, rounded to nearest even). Made once per grid and layout. oneDNN adds
        the zero point before it rounds: where ``v * (1 / scale)`` is exactly halfway between two integers and the
        zero point is odd, the code is the other neighbour — within the half step every int8 rule's bound allows
        for the rounding (rules/precision/int8.rules), and the torch lowering's quantizer rounds first."""
        t, grid = self.values[v], (scale, zero_point)
        if t.grid == grid and self.lib.dnnl_memory_desc_equal(_P(t.md), _P(md)):
            return t
        dst = self._copy(v, md, grid)
        if dst is not None:
            return dst
        if t.grid == grid:  # the codes into another layout
            dst = self.reorder(t, md)
            dst.grid = grid
        else:
            src = self.operand(v)
            dst = self.quantized(src, md, grid)
            self._own_quantizer(src, dst, v.shape, grid)
        self.converted.setdefault(v, []).append(dst)
        return dst

    def quantized(self, src: _Tensor, md: int, grid: tuple[float, int]) -> _Tensor:
        """The float32 ``src`` as its u8 codes in ``md`` on ``grid`` (scale, zero point): a reorder, its scale the
        float32 ``1 / scale``, multiplied, rounded to nearest even (:meth:`codes`)."""
        return self._scaled_reorder(src, md, {SRC: _inverse(grid[0])}, {DST: grid[1]}, grid)

    def _own_quantizer(self, src: _Tensor, dst: _Tensor, shape, grid: tuple[float, int]) -> None:
        """The quantizing reorder just planned (the last step: float32 ``src`` of ``shape`` into the codes ``dst``)
        replaced by gawee's kernel (:mod:`gawee.backend.quantize_nhwc`) where ``src`` is plain NCHW, ``dst`` is
        channels-last and the kernel measures faster on a probe image into ``dst``'s buffer (:meth:`own_kernel_wins`).
        The kernel reads the source's address each call: a graph input's (:attr:`input_cells`) or its buffer's."""
        from gawee.backend import quantize_nhwc

        cell = self.input_cells.get(src.memory) if src.buffer is None else ctypes.c_void_p(src.buffer.tensor.data_ptr())
        own = (
            quantize_nhwc.unavailable() is None
            and cell is not None
            and dst.buffer is not None
            and len(shape) == 4
            and self.lib.dnnl_memory_desc_equal(_P(src.md), _P(self.md(shape)))
            and self.layout_of(dst, shape, DType.u8) == "channels_last"
        )
        if not own:
            return
        execute, (prim, stream, n, array), name = self.steps[-1]
        # the race's source (a graph input has no address before a call), drawn without touching torch's global seed
        probe = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        probe_at, on_probe = ctypes.c_void_p(probe.data_ptr()), self.memory(src.md, None, probe.data_ptr())
        swapped = (_Arg * n)(*(_Arg(a.arg, _P(on_probe if a.arg == SRC else a.memory)) for a in array))
        function = quantize_nhwc.library().gawee_quantize_nhwc_u8
        sizes = (dst.buffer.tensor.data_ptr(), shape, _inverse(grid[0]), grid[1])
        args = lambda at: quantize_nhwc.args(ctypes.byref(at), *sizes)  # the source's address read through ``at``
        onednn = (name, lambda: execute(prim, stream, n, swapped))
        if self.own_kernel_wins(onednn, (quantize_nhwc.KERNEL, lambda: function(*args(probe_at))), "a quantization"):
            self.keep.append(cell)
            self.steps[-1] = (function, args(cell), quantize_nhwc.KERNEL)

    def own_kernel_wins(self, onednn: tuple[str, Callable], own: tuple[str, Callable], what: str) -> bool:
        """Whether gawee's kernel ``own`` (its name, a call returning a status) measures faster here than oneDNN's
        primitive ``onednn`` (its implementation's name, its execution) doing the same step: the two called in turn
        (:func:`gawee.backend.kernels.best_calls`). A trial build calls each once and keeps oneDNN's, as it races
        nothing. ``what`` names the step in an error."""
        from gawee.backend.kernels import best_calls

        runners = {
            onednn[0]: lambda: (_check(onednn[1](), what), self.lib.dnnl_stream_wait(self.stream)),
            own[0]: lambda: _check(own[1](), what),
        }
        if self.trial:
            for run in runners.values():
                run()
            return False
        times = best_calls(runners, (), min_rounds=3, max_rounds=10, budget_s=0.02)
        return min(times, key=times.__getitem__) == own[0]

    def reference(self, pd: int) -> bool:
        """Whether the primitive descriptor ``pd`` is at oneDNN's reference implementation."""
        return _reference(self._impl_name(pd))

    def _values_of(self, v: Value, t: _Tensor) -> _Tensor:
        """The float32 value ``v`` held as the codes ``t``: ``(code - zero point) * scale`` by a reorder into the
        codes' layout as float32 (once)."""
        md = self.retyped(t.md, v)
        dst = self._copy(v, md)
        if dst is None:
            scale, zero_point = t.grid
            dst = self._scaled_reorder(t, md, {SRC: scale}, {SRC: zero_point})
            self.converted.setdefault(v, []).append(dst)
        return dst

    def _scaled_reorder(self, src: _Tensor, md: int, scales: dict, zero_points: dict, grid=None) -> _Tensor:
        """``src`` reordered into ``md`` with ``scales`` and ``zero_points`` (:meth:`scaled`), a step of every call:
        a quantization (the result the codes on ``grid``) or a dequantization."""
        attr, args = self.scaled(scales, zero_points)
        dst = self.tensor(md, grid)
        create = self.lib.dnnl_reorder_primitive_desc_create
        _, prim = self.primitive(create, src.md, self.engine, md, self.engine, attr=attr)
        self.step(prim, {SRC: src.memory, DST: dst.memory, **args})
        return dst

    def _copy(self, v: Value, md: int, grid=None, buffered: bool = False) -> _Tensor | None:
        """The copy of ``v`` already made in ``md`` (its codes on ``grid``, or its values where that is None; in a
        buffer of the module's where ``buffered``), or None."""
        for c in self.converted.get(v, ()):
            held = c.grid == grid and (c.buffer is not None or not buffered)
            if held and self.lib.dnnl_memory_desc_equal(_P(c.md), _P(md)):
                return c
        return None

    def retyped(self, md: int, v: Value) -> int:
        """A memory descriptor of ``v``'s type in the layout of ``md``, one of u8 codes (a measured layout, else
        plain)."""
        held = _Tensor(md, None, None)
        layout = self.layout_of(held, v.shape, DType.u8) if v.type.rank == 4 else None
        return self.activation_md(v.shape, layout, v.dtype) if layout else self.value_md(v)

    def constant(self, data: torch.Tensor, md: int, shape=None) -> _Tensor:
        """A constant in the layout ``md`` asks for, reordered once now — or, where a module of the same selection
        reordered the same tensor to the same layout (its copies are derived from it: :meth:`derive`), read from that
        copy: a module never writes its constants, and the variants of one selection ask for the same weights in
        the same layouts wherever they chose the same kernel."""
        source = data
        dtype = _TORCH_TYPES.get(data.dtype, DType.f32)  # any other type is taken as float32
        data = data.detach().to(dtype.torch).contiguous()
        if shape is not None:
            data = data.reshape(shape)
        self.keep.append(data)
        plain = self.md(data.shape, dtype=dtype)
        src = _Tensor(plain, self.memory(plain, None, data.data_ptr()), None)
        if self.lib.dnnl_memory_desc_equal(_P(plain), _P(md)):
            return src
        copies = self.derive(f"reordered as {tuple(data.shape)}", source, list)  # (layout, tensor) pairs
        for layout, tensor in copies:
            if self.lib.dnnl_memory_desc_equal(_P(layout.md), _P(md)):
                buffer = _Buffer(tensor)
                self.keep.append(buffer)
                return _Tensor(md, self.memory(md, buffer), buffer)
        # a buffer of its own: a pooled one is an earlier activation's, which the steps before would overwrite
        buffer = _Buffer(self.storage.take(_words(self.lib, md)))
        self.keep.append(buffer)
        reordered = self.reorder(src, md, _Tensor(md, self.memory(md, buffer), buffer), now=True)
        copies.append((_HeldDescriptor(self.lib, md), buffer.tensor))
        return reordered

    def plain(self, v: Value) -> _Tensor:
        """The value in the plain row-major layout, in a buffer of the module's (a graph input's address is each
        call's, not the module's to view: copied)."""
        md = self.value_md(v)
        t = self.operand(v, md)
        if t.buffer is not None:
            return t
        if v.is_const:
            return self.reorder(t, md)
        copy = self._copy(v, md, buffered=True)
        if copy is None:
            copy = self.reorder(t, md)
            self.converted.setdefault(v, []).append(copy)
        return copy

    def operand(self, v: Value, md: int | None = None) -> _Tensor:
        """The value as a primitive's operand, reordered to ``md`` when that layout differs from its own."""
        if v.is_const:
            if not v.has_known_data:
                raise _Unsupported(f"constant {v.name} has no data")
            plain = md if md is not None else self.md(v.data.shape, dtype=_TORCH_TYPES.get(v.data.dtype, DType.f32))
            return self.constant(v.data, plain)
        t = self.values[v]
        if t.grid is not None:  # held as codes: its values first
            t = self._values_of(v, t)
        if md is None or self.lib.dnnl_memory_desc_equal(_P(t.md), _P(md)):
            return t
        copy = self._copy(v, md)
        if copy is None:
            copy = self.reorder(t, md)
            self.converted.setdefault(v, []).append(copy)
        return copy

    def fastest(self, candidates: list, reads: dict[int, Value | None], situation: tuple | None = None):
        """The candidate convolution kernel (a :class:`_Primitive`, :class:`_Winograd` or :class:`_Grouped`) whose
        call — after the reorders of the values it ``reads`` (argument → value) that its layout would need — is
        fastest here, each run on zero-filled scratch buffers, in rounds over the candidates
        (:func:`gawee.backend.kernels.best_calls`). The others are dropped.

        Each candidate's time is kept in :attr:`times` by the convolution's ``situation`` (its shapes, geometry and
        epilogue), the candidate, and the layouts it would reorder its operands from: a convolution of the same
        situation takes the kept times instead of timing again — in this plan (a resnet repeats its blocks'
        convolutions: resnet50's 53 convolutions took 25 races) and in the other modules of one selection that
        share them (``DnnlModule``'s ``shared``: ``per_conv`` races the same kernels as the fixed layouts, among
        others). Only the candidates without a kept time are timed, against the fastest kept one.

        In a ``trial`` plan (the build a trial process makes, to learn whether the module could crash this one:
        :attr:`gawee.backend.runtime.Runtime.isolated`) every candidate without a kept time makes its first call
        (one with a kept time ran in the caller already) and none is timed: the build there races the same
        candidates, after the trial showed that none of them crashes on the scratch buffers the race runs them
        on."""
        held: dict[Value, str | None] = {}  # each operand's layout, named once for all candidates
        plans = [self._reorders(kernel, reads, held) for kernel in candidates]
        keys = [
            (situation, kernel.key, plan[1]) if situation is not None and plan[1] is not None else None
            for kernel, plan in zip(candidates, plans)
        ]
        known = {i: self.times[key] for i, key in enumerate(keys) if key in self.times}
        fresh = [i for i in range(len(candidates)) if i not in known]
        if fresh:
            leader = [min(known, key=lambda i: (known[i], i))] if known and not self.trial else []
            measured = self._race(candidates, plans, sorted(fresh + leader))
            for i, ms in measured.items():
                if keys[i] is not None:
                    self.times[keys[i]] = min(ms, self.times.get(keys[i], ms))
                known[i] = ms
        winner = min(known, key=lambda i: (known[i], i))
        for i, kernel in enumerate(candidates):
            if i != winner:
                kernel.drop()
        return candidates[winner]

    def _reorders(
        self, kernel, reads: dict[int, Value | None], held: dict[Value, str | None]
    ) -> tuple[list[tuple[int, int]], tuple | None]:
        """The reorders ``kernel`` would need of the values it ``reads`` (each (from, to) memory descriptors: one per
        layout, whichever operands read it), and what tells them apart from another convolution's: each operand's
        layout where it is reordered from (None where one is held in a layout neither :meth:`layout_of` nor "plain"
        names; ``held`` keeps the names found, value by value)."""
        lib, needed, planned, named = self.lib, [], [], []
        for arg, v in reads.items():
            if v is None or v.is_const:
                continue
            t, want = self.values[v], kernel.wants(arg)
            known = [c.md for c in (t, *self.converted.get(v, ()))] + planned
            if any(lib.dnnl_memory_desc_equal(_P(md), _P(want)) for md in known):
                continue
            planned.append(want)
            needed.append((t.md, want))
            if v not in held:
                plain = lib.dnnl_memory_desc_equal(_P(t.md), _P(self.value_md(v)))
                held[v] = "plain" if plain else self.layout_of(t, v.shape, DType.u8 if t.grid else v.dtype)
            named.append((arg, held[v]))
        return needed, None if any(layout is None for _, layout in named) else tuple(named)

    def _race(self, candidates: list, plans: list, which: list[int]) -> dict[int, float]:
        """The fastest call of each candidate of index ``which`` (with its reorders, ``plans``: :meth:`_reorders`)
        in milliseconds; in a trial plan, each called once and said to take forever (untimed)."""
        from gawee.backend.kernels import best_calls

        lib, scratch, reorders, runners = self.lib, self.scratch, [], {}
        try:
            for i in which:  # a trial's candidates share buffers: their speed is not measured
                scratch.next_candidate(first=self.trial or not runners)
                steps = []
                for have, want in plans[i][0]:
                    _, reorder = self.primitive(
                        lib.dnnl_reorder_primitive_desc_create, have, self.engine, want, self.engine
                    )
                    reorders.append(reorder)
                    steps.append(scratch.step(reorder, {SRC: have, DST: want}))
                steps += candidates[i].scratch(scratch)

                def run(steps=steps) -> None:
                    for function, args, _ in steps:
                        _check(function(*args), "a measured kernel")
                    lib.dnnl_stream_wait(self.stream)

                runners[i] = run
            if self.trial:  # each called once; the module takes the fastest kept candidate, as the build there would
                for run in runners.values():
                    run()
                return dict.fromkeys(runners, math.inf)
            # No untimed first call: the scratch buffers are paged in (zero-filled) and a kernel's code is made when
            # its primitive is, so a first call takes about what the next ones do (benchmarks/README.md, "Runtime:
            # the oneDNN fusions as a target phase"), and the race's first round, which only drops candidates 1.5
            # times the leader's slowest (kernels.DECISIVE), is its warm-up.
            return best_calls(runners, (), min_rounds=3, max_rounds=10, budget_s=0.05)
        finally:
            scratch.close()
            for reorder in reorders:
                self._drop(reorder)

    def derive(self, what: str, tensor: torch.Tensor, make: Callable[[], Any]) -> Any:
        """``make()``, what is derived from ``tensor`` (``what`` says how: Winograd's transformed filters, the copies
        reordered to kernels' layouts), made once for the modules that share :attr:`derived` (one selection's: the
        variants transform and reorder the same weights). ``tensor`` is kept with it, so its identity names it while
        the entry lives."""
        key = (what, id(tensor), tensor._version)
        if key not in self.derived:
            self.derived[key] = (tensor, make())
        return self.derived[key][1]

    def done_with(self, node: Node) -> None:
        """Frees the buffers of the inputs ``node`` read for the last time."""
        for v in {v for v in node.inputs if v is not None and not v.is_const}:
            self.remaining[v] -= sum(1 for i in node.inputs if i is v)
            if self.remaining[v] == 0 and not v.is_graph_output and v in self.values:  # else never made (cat)
                for t in (self.values[v], *self.converted.pop(v, ())):
                    self.release(t)


class _Storage:
    """The memory a module's buffers are carved from — its activations and the constants reordered into its kernels'
    layouts — one after another (64-byte aligned) from private anonymous maps advised for transparent huge pages
    (``MADV_HUGEPAGE``; each map's carving starts on a 2 MiB boundary). Why: a module reads all of its weights on
    every call (resnet50's int8 module some 6,000 pages of 4 KiB), and on the heap's 4 KiB pages the same module's
    speed differed from process to process (benchmarks/README.md, static int8 notes). Where the OS has no
    transparent huge pages, or they are off (``never``), the maps are plain memory; the OS zero-fills a page on its
    first touch. A map lives as long as a buffer carved from it."""

    HUGE = 2 << 20
    """A huge page, in bytes."""
    BLOCK = 8 << 20
    """The smallest map, in bytes (a larger request gets a map of its own)."""
    ALIGN = 64
    """Each buffer starts on a cache line."""

    def __init__(self):
        self.block: torch.Tensor | None = None  # the current map, as bytes
        self.offset = self.end = 0

    def take(self, words: int) -> torch.Tensor:
        """``words`` float32 elements (uninitialized) carved from the current map, or from a new one."""
        size = -(-4 * words // self.ALIGN) * self.ALIGN
        if self.block is None or self.offset + size > self.end:
            length = -(-max(size, self.BLOCK) // self.HUGE) * self.HUGE + self.HUGE  # room to start on a boundary
            memory = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared maps get no huge pages
            with contextlib.suppress(AttributeError, OSError):  # no such advice, or a kernel without huge pages
                memory.madvise(mmap.MADV_HUGEPAGE)
            self.block = torch.frombuffer(memory, dtype=torch.uint8)
            self.offset, self.end = -self.block.data_ptr() % self.HUGE, length
        piece = self.block[self.offset : self.offset + 4 * words].view(torch.float32)
        self.offset += size
        return piece


class _Arena:
    """The memory races carve their candidates' scratch buffers from (:class:`_Scratch`), shared by the modules of
    one selection (``shared``) and given back with it: blocks in anonymous maps of their own, all zeros between
    races, as large together as the largest race asked for. Each page is written once before it is first handed
    out: a page of a fresh map that is only read maps the OS's one zero page, which every such read would then
    find in the cache. The blocks are left out of forked processes (``MADV_DONTFORK``, where the OS has it): a
    trial process never races on them, and a fork would leave each page write-protected here, to fault again on
    its next write (zero-filling such pages is several times slower: benchmarks/README.md, "Runtime: the oneDNN
    fusions as a target phase")."""

    BLOCK = 4 << 20
    """The smallest block, in float32 elements (16 MiB)."""
    KEPT = 64 << 20
    """Between builds, blocks up to this many elements (256 MiB) are kept for the next build's races; those past it
    are given back (:meth:`trim`): a model whose races ask for more (densenet121's at batch 4) touches them again in
    each build rather than hold them all through the builds."""
    PAGE = 1024
    """Slots start on 4 KiB boundaries (in float32 elements): no two buffers share a page or a cache line."""

    def __init__(self):
        self.blocks: list[torch.Tensor] = []
        self.touched: list[int] = []  # each block's elements written so far (from its start)

    def carve(self, cursor: tuple[int, int], size: int) -> tuple[torch.Tensor, tuple[int, int]]:
        """The ``size`` elements from ``cursor`` (a block and an offset) on, or from the start of the next block with
        room (one is added where none has), and the cursor after them."""
        size = -(-size // self.PAGE) * self.PAGE
        block, offset = cursor
        while block < len(self.blocks) and offset + size > self.blocks[block].numel():
            block, offset = block + 1, 0
        if block == len(self.blocks):
            self.blocks.append(_mapped_zeros(max(size, self.BLOCK)))
            self.touched.append(0)
        if offset + size > self.touched[block]:
            self.blocks[block][self.touched[block] : offset + size].zero_()
            self.touched[block] = offset + size
        return self.blocks[block][offset : offset + size], (block, offset + size)

    def trim(self) -> None:
        """Gives back the blocks past the first :data:`KEPT` elements."""
        kept, total = 0, 0
        while kept < len(self.blocks) and total + self.blocks[kept].numel() <= self.KEPT:
            total += self.blocks[kept].numel()
            kept += 1
        del self.blocks[kept:], self.touched[kept:]


class _Scratch:
    """The zero-filled buffers races run their candidates on (:meth:`_Plan._race`): a slot — the n-th buffer the k-th
    candidate of a race reads, or writes — is one buffer. Each candidate of a race has buffers of its own: one
    candidate's call leaves its buffers in the caches, which would make the next one's reads of the same buffers
    cheaper than they are in the module. A race's buffers are carved one after another from the start of an
    :class:`_Arena`, which every race reuses: allocated per race, they would take pages the process last wrote
    before it forked a trial process (each faults on its first write since), and freed at the race's end they
    would leave the heap as fragmented as the races' sizes. A buffer read is never written, so it stays zero; those
    written are zeroed again when the race ends. A trial's candidates each start at the arena's start instead (one
    set of buffers for all, as their speed is not measured)."""

    def __init__(self, plan: _Plan, arena: _Arena):
        self.plan, self.arena, self.memories = plan, arena, []
        self.cursor = (0, 0)  # the next slot's block and offset in the arena
        self.written: list[torch.Tensor] = []  # this race's slots written, zeroed when it ends

    def next_candidate(self, first: bool = False) -> None:
        """The next buffers asked for are the next candidate's: after the last one's, or (``first``: the first
        candidate of a race, or any of a trial's) from the arena's start."""
        if first:
            self.cursor = (0, 0)

    def zeros(self, md: int, written: bool = False) -> torch.Tensor:
        """The buffer of the next slot (one read, or one ``written``), at least the size of ``md``."""
        buffer, self.cursor = self.arena.carve(self.cursor, _words(self.plan.lib, md))
        if written:
            self.written.append(buffer)
        return buffer

    def memory(self, md: int, written: bool = False) -> tuple[int, torch.Tensor]:
        """A oneDNN memory of ``md`` over the next slot's buffer (:meth:`zeros`); and the buffer."""
        buffer, memory, plan = self.zeros(md, written), _P(), self.plan
        _check(
            plan.lib.dnnl_memory_create(ctypes.byref(memory), _P(md), _P(plan.engine), _P(buffer.data_ptr())), "scratch"
        )
        self.memories.append(memory)
        return memory.value, buffer

    def step(self, prim: int, mds: dict[int, int], fixed: dict[int, int] | None = None) -> tuple:
        """``prim`` with each argument (argument → memory descriptor) in a slot's buffer (its destination among
        those written), and the ``fixed`` ones (argument → memory: its scales) as they are: a step (function,
        arguments, the buffers to keep)."""
        made = {arg: self.memory(md, written=arg == DST) for arg, md in mds.items()}
        memories = {**{arg: memory for arg, (memory, _) in made.items()}, **(fixed or {})}
        args = (_Arg * len(memories))(*(_Arg(arg, _P(memory)) for arg, memory in memories.items()))
        buffers = [b for _, b in made.values()]
        return self.plan.lib.dnnl_primitive_execute, (prim, self.plan.stream, len(memories), args), buffers

    def free(self) -> None:
        """Lets go of the arena, trimmed for the next build (:meth:`_Arena.trim`): the build is done, and the
        module's kernels may keep the plan."""
        if self.arena is not None:
            self.arena.trim()
        self.arena = None

    def close(self) -> None:
        """Destroys the race's memories and zeroes the slots it wrote: the next race starts at the arena's start."""
        for memory in self.memories:
            self.plan.lib.dnnl_memory_destroy(memory)
        self.memories = []
        for buffer in self.written:
            buffer.zero_()
        self.written, self.cursor = [], (0, 0)


def _mapped_zeros(n: int) -> torch.Tensor:
    """``n`` float32 zeros in an anonymous memory map of their own: the OS zero-fills each page on its first
    touch (a page never touched costs nothing) and takes them back when the tensor dies, where a block from the
    heap would stay in the process (gawee.backend.allocator keeps freed memory) beside what the build allocates
    after it; left out of forked processes where the OS can (:class:`_Arena`). Until a page is written, reads of
    it find the OS's one shared zero page (:meth:`_Arena.carve` writes each before handing it out)."""
    memory = mmap.mmap(-1, 4 * n)
    if hasattr(mmap, "MADV_DONTFORK"):
        memory.madvise(mmap.MADV_DONTFORK)
    return torch.frombuffer(memory, dtype=torch.float32)


def _words(lib, md: int) -> int:
    """How many float32 elements hold a tensor of ``md`` (buffers are float32 tensors, whatever they hold)."""
    return max(1, -(-lib.dnnl_memory_desc_get_size(_P(md)) // 4))


def _pair(node: Node, name: str, default=(1, 1)) -> list[int]:
    """A 2-d geometry attribute as a list (an empty ``stride`` is the default: pooling's is the kernel)."""
    return list(pair(node.attrs.get(name) or default))


def _act(node: Node) -> tuple[str, tuple]:
    """A standalone activation node as the ``act`` vocabulary's name and parameters."""
    a = node.attrs
    if node.op == "gelu" and a.get("approximate", "none") != "none":
        return "gelu_tanh", ()
    if node.op == "leaky_relu":
        return "leaky_relu", (a.get("negative_slope", 0.01),)
    if node.op == "hardtanh":
        return "hardtanh", (a.get("min_val", -1.0), a.get("max_val", 1.0))
    return node.op, ()


def _const(v: Value | None, what: str) -> torch.Tensor | None:
    if v is None:
        return None
    if not v.has_known_data:
        raise _Unsupported(f"the {what} {v.name} is computed, not a constant")
    return v.data


def _post_ops(
    plan: _Plan,
    act: str | None,
    params,
    residual_md: int | None = None,
    summed: tuple[float, int] | None = None,
    codes: tuple[float, int] | None = None,
) -> int | None:
    """An attribute holding ``+ residual`` then ``act`` (an eltwise post-op). The residual is a binary post-op
    reading it in ``residual_md``, or (``summed``: its grid's ``(scale, zero point)``) oneDNN's sum post-op, which
    adds ``scale * (code - zero point)`` of the u8 codes the destination holds before the call. ``codes``: a grid's
    ``(scale, zero point)`` the result is mapped onto last, ``y * (1 / scale) + zero point`` (an eltwise linear
    post-op, the float32 ``1 / scale`` multiplied, as a quantizing reorder does), for a u8 destination."""
    if act is None and residual_md is None and summed is None and codes is None:
        return None
    if act is not None and act not in ELTWISE:
        raise _Unsupported(f"no oneDNN post-op for {act}")
    lib = plan.lib
    po = plan._new("dnnl_post_ops_destroy", lib.dnnl_post_ops_create)
    if summed is not None:
        scale, zero_point = summed
        _check(lib.dnnl_post_ops_append_sum(_P(po), scale, zero_point, DTYPES[DType.u8]), "a residual sum")
    elif residual_md is not None:
        _check(lib.dnnl_post_ops_append_binary(_P(po), BINARY["add"], _P(residual_md)), "a residual add")
    if act is not None:
        alg, alpha_beta = ELTWISE[act]
        _check(lib.dnnl_post_ops_append_eltwise(_P(po), alg, *alpha_beta(tuple(params))), f"a fused {act}")
    if codes is not None:
        scale, zero_point = codes
        linear = (_ELTWISE_LINEAR, _inverse(scale), float(zero_point))
        _check(lib.dnnl_post_ops_append_eltwise(_P(po), *linear), "a quantization")
    attr = plan._new("dnnl_primitive_attr_destroy", lib.dnnl_primitive_attr_create)
    _check(lib.dnnl_primitive_attr_set_post_ops(_P(attr), _P(po)), "post-ops")
    return attr


def _inverse(scale: float) -> float:
    """The float32 ``1 / scale`` a quantization multiplies by (the int8 op's semantics: ``conv2d_int8_static``)."""
    return float(1 / torch.tensor(scale, dtype=torch.float32))


NARROW = 4
"""An implementation whose vectors are this many times narrower than another's of the same primitive is no
candidate (:meth:`_Plan.implementations`)."""


def _vector_bits(implementation: str) -> int:
    """The width of the vectors ``implementation`` (a kernel's name: ``jit:avx512_core``, ``brgconv:avx2``) computes
    on, from the instruction set that ends its name; 0 where the name says none (``x64:gemm:jit``)."""
    isa = implementation.rsplit(":", 1)[-1]
    if isa.startswith(("avx512", "amx")):
        return 512
    if isa.startswith("avx"):
        return 256
    if isa.startswith("sse"):
        return 128
    return 0


def _reference(implementation: str) -> bool:
    """Whether ``implementation`` (a kernel's name) is oneDNN's reference one, which races only where nothing else
    computes the convolution. On AVX-512, oneDNN has no other for a convolution of 8 channels per group in the
    blocked layout (blocks of 16): there nine of RegNet's made a regnet_y_400mf call two orders of magnitude slower
    than with them in channels-last. Where oneDNN has only its reference kernel in the
    module's layout, the other layouts' kernels are candidates too."""
    return implementation.startswith("ref")
