"""oneDNN's primitives as gawee's own runtime: each node's primitive created once, activations in blocked layouts.

Why: the torch lowering reaches oneDNN through torch's operators, which rebuild a primitive's descriptor on every
call (a cost per convolution comparable to a small convolution itself), and they run oneDNN's
channels-last or plain kernels. ONNX Runtime, the fastest CPU runtime on these models, creates each kernel once
and keeps activations in a channel-blocked layout (its NCHWc transformer, blocks of 8 channels on AVX2, 16 on
AVX-512) between the graph's edges. This module does the same with oneDNN itself: at build time it plans the
rewritten graph into a list of primitives — convolutions with their fused epilogues as post-ops, pooling (and
means over the image), inner products, eltwise, binary, concatenation, splits and permutations (reorders of
regions, or through permuted strides) — with weights reordered once into the layout each primitive
asked for, and buffers reused by liveness; a call sets the input's address and executes the list (a small,
fixed cost per primitive through ctypes). The layout of the activations is ``layout``: ``"blocked"`` (nChw8c /
nChw16c, the block the CPU's vector width gives), ``"channels_last"`` (NHWC, where oneDNN 3's brgemm convolutions
run), or ``"per_conv"``: every implementation oneDNN has of each convolution, in both layouts, is compiled and timed
here with the reorders of its operands that its layout would need, and the fastest kept (the pooling, eltwise,
binary and concatenation primitives between convolutions run in their input's layout). Which is fastest depends on the
CPU and the model (on an AVX2 machine, no layout won every convolution of resnet50's shapes), so
:func:`gawee.backend.compiler.whole_graph_choice` builds all three and measures them on the machine. A convolution
for which oneDNN has only its reference kernel in the module's layout runs in another layout (:func:`_reference`:
on AVX-512, RegNet's groups of 8 channels in blocks of 16). In every
layout, a 3×3 stride-1 convolution also races gawee's own Winograd F(4×4, 3×3) kernel
(:mod:`gawee.backend.winograd`: two C transforms around oneDNN's matmul), kept where it measures fastest, and a
convolution of 8 channels per group (RegNet's) races gawee's grouped kernel (:mod:`gawee.backend.grouped`), a
depthwise one (MobileNet's, EfficientNet's) gawee's depthwise kernel with its activation
(:mod:`gawee.backend.depthwise`). The fusions are the runtime's target phase (``rules/targets/onednn/``), which
``gawee.compile`` runs before building it: an activation that alone reads a convolution, linear, batch norm or
binary op becomes its post-op, and a batch norm that alone reads a concatenation along channels (DenseNet's layers)
runs in one pass with it (``onednn_affine_cat``, :mod:`gawee.backend.affine_cat`); this module lowers the target
ops they produce (:mod:`gawee.ops.targets`).

The library is ``libdnnl.so.3`` from the ``onednn-cpu-gomp`` wheel (a dependency of gawee on x86-64 Linux), or the
file ``GAWEE_DNNL_LIBRARY`` names. It is loaded after torch, so it shares torch's OpenMP runtime (both name it
``libgomp.so.1``) and its thread count (``torch.set_num_threads``). The C API's enumerations are ABI-stable within
oneDNN 3.x; their values here are those of ``dnnl_types.h``, and ``tests/backend/test_dnnl.py`` checks every one
numerically against torch. An op without a primitive here, or one whose primitive oneDNN refuses, runs as a step
of its torch semantics on the plain layout (:func:`_torch_op`), so any graph runs. Static shapes and float32 only;
:func:`supports` says why a graph cannot run.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch

from gawee.backend.host import InputSignature, arrange, as_structure
from gawee.backend.runtime import Runtime
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType
from gawee.ops import get_op
from gawee.ops.nn import _pair as pair
from gawee.rewrite.ruleset import RuleSet, target_rules

# -- the C API (oneDNN 3.x, dnnl.h / dnnl_types.h) -----------------------------------------------------------
_P = ctypes.c_void_p
_DIMS = ctypes.c_int64 * 12
_F32, _ANY, _CPU, _IN_ORDER, _INFERENCE = 3, 1, 1, 1, 96
_CONV_DIRECT = 1
_NCHW8C, _NCHW16C, _NHWC = 102, 78, 22
_QUERY_IMPL, _QUERY_ARG_MD = 8, 255
SRC, SRC_1, DST, WEIGHTS, BIAS, MULTIPLE_SRC = 1, 2, 17, 33, 41, 1024


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


class _Tensor:
    """A value as the runtime holds it: its memory descriptor, its oneDNN memory over a buffer."""

    __slots__ = ("buffer", "md", "memory")

    def __init__(self, md, memory, buffer: _Buffer | None):
        self.md, self.memory, self.buffer = md, memory, buffer


class _Plan:
    """Builds the primitives of one graph; owns every handle it creates (destroyed with the module)."""

    def __init__(self, graph: Graph, layout: str):
        if layout not in LAYOUTS:
            raise GaweeError(f"unknown oneDNN layout {layout!r}", hint=f"layout is one of {', '.join(LAYOUTS)}")
        self.lib = _lib()
        self.layout = layout
        self.block = block_size()
        self.handles: list[tuple[str, int]] = []  # (destroy function, handle), destroyed in reverse
        self.keep: list[Any] = []  # what the primitives' arguments point to
        self.steps: list[tuple[Any, tuple, str]] = []  # (C function, its arguments, the kernel's name)
        self.impl: dict[int, str] = {}  # each primitive's implementation (oneDNN's name for its kernel)
        self.pool: dict[int, list[_Buffer]] = {}
        self.values: dict[Value, _Tensor] = {}
        self.converted: dict[Value, list[_Tensor]] = {}  # a value reordered to consumers' layouts
        self.conv_layouts: dict[str, str] = {}  # each convolution's (and batch norm's) activation layout
        self.conv_kernels: dict[str, str] = {}  # each convolution's (and batch norm's) kernel
        self.raced: dict[tuple, int] = {}  # a race's situation, candidates and operand layouts -> the winner
        self.engine = self._new("dnnl_engine_destroy", self.lib.dnnl_engine_create, _CPU, 0)
        self.stream = self._new("dnnl_stream_destroy", self.lib.dnnl_stream_create, self.engine, _IN_ORDER)
        self.remaining = {v: v.num_uses for n in graph for v in n.inputs if v is not None}

    # handles
    def _new(self, destroy: str, create, *args) -> int:
        handle = _P()
        args = [_P(a) if isinstance(a, int) else a for a in args]  # handles are pointers; int enums fit the slot
        _check(create(ctypes.byref(handle), *args), create.__name__)
        self.handles.append((destroy, handle.value))
        return handle.value

    def md(self, shape, tag: int | None = None, strides=None) -> int:
        """A float32 memory descriptor: plain row-major, or the format ``tag`` (``_ANY``: the primitive's choice), or
        with these ``strides``."""
        shape = list(shape) or [1]
        if tag is not None:
            create = self.lib.dnnl_memory_desc_create_with_tag
            return self._new("dnnl_memory_desc_destroy", create, len(shape), _DIMS(*shape), _F32, tag)
        strides = strides or torch.empty(shape, device="meta").stride()
        create = self.lib.dnnl_memory_desc_create_with_strides
        return self._new("dnnl_memory_desc_destroy", create, len(shape), _DIMS(*shape), _F32, _DIMS(*strides))

    def activation_md(self, shape, layout: str) -> int:
        """A convolution's activation in ``layout`` (one of :data:`MEASURED`)."""
        return self.md(shape, _NHWC if layout == "channels_last" else _NCHW16C if self.block == 16 else _NCHW8C)

    def layout_of(self, t: _Tensor, shape) -> str | None:
        """Which of :data:`MEASURED` the tensor ``t`` of ``shape`` is in, if any."""
        for layout in MEASURED:
            if self.lib.dnnl_memory_desc_equal(_P(t.md), _P(self.activation_md(shape, layout))):
                return layout
        return None

    def memory(self, md: int, buffer: _Buffer | None, data_ptr: int | None = None) -> int:
        """A oneDNN memory over ``buffer``, or at ``data_ptr`` (0: an address each call sets)."""
        ptr = buffer.tensor.data_ptr() if buffer is not None else data_ptr
        return self._new("dnnl_memory_destroy", self.lib.dnnl_memory_create, md, self.engine, _P(ptr))

    def buffer(self, md: int) -> _Buffer:
        """Storage for ``md``: a dead value's of the same size, else new."""
        size = self.lib.dnnl_memory_desc_get_size(md)
        free = self.pool.get(size)
        if free:
            return free.pop()
        return _Buffer(torch.empty(max(1, size // 4), dtype=torch.float32))

    def tensor(self, md: int) -> _Tensor:
        buffer = self.buffer(md)
        buffer.refs += 1
        return _Tensor(md, self.memory(md, buffer), buffer)

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
                self.pool.setdefault(t.buffer.tensor.numel() * 4, []).append(t.buffer)

    def descriptor(self, create, *args, attr: int | None = None) -> int:
        """The primitive descriptor ``create(*args, attr)`` makes: what the primitive would choose, not compiled."""
        return self._new("dnnl_primitive_desc_destroy", create, *args, _P(attr))

    def primitive(self, create, *args, attr: int | None = None) -> tuple[int, int]:
        """The primitive descriptor ``create(*args, attr)`` makes, and its primitive (oneDNN compiles it now)."""
        pd = self.descriptor(create, *args, attr=attr)
        return pd, self._compile(pd)

    def _compile(self, pd: int) -> int:
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
        for i, (destroy, h) in enumerate(self.handles):
            if h == handle:
                getattr(self.lib, destroy)(_P(self.handles.pop(i)[1]))
                return

    def implementations(self, create, *args, attr: int | None) -> list[tuple[int, int]]:
        """Every implementation oneDNN has of the primitive ``create(*args, attr)``, compiled: (the descriptor the
        primitive keeps, the primitive); the reference one only where there is no other. oneDNN's own first choice
        is a heuristic: on an AVX2 machine its second implementation of channels-last 1×1 convolutions
        (``jit_1x1``) took less time than its first (``brgconv_1x1``). Each implementation once: oneDNN 3.2's
        iteration visited a resnet50's implementations of a shape once more for each earlier convolution of that
        shape (the 4th 1×1 convolution of a shape, 4 times each)."""
        pd, found, names = self.descriptor(create, *args, attr=attr), [], set()
        while True:
            name = self._impl_name(pd)
            if not _reference(name) and name not in names:
                names.add(name)
                prim = self._compile(pd)
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

    def constant(self, data: torch.Tensor, md: int, shape=None) -> _Tensor:
        """A constant in the layout ``md`` asks for, reordered once now."""
        data = data.detach().to(torch.float32).contiguous()
        if shape is not None:
            data = data.reshape(shape)
        self.keep.append(data)
        plain = self.md(data.shape)
        src = _Tensor(plain, self.memory(plain, None, data.data_ptr()), None)
        if self.lib.dnnl_memory_desc_equal(_P(plain), _P(md)):
            return src
        # a buffer of its own: a pooled one is an earlier activation's, which the steps before would overwrite
        buffer = _Buffer(torch.empty(max(1, self.lib.dnnl_memory_desc_get_size(md) // 4)))
        self.keep.append(buffer)
        return self.reorder(src, md, _Tensor(md, self.memory(md, buffer), buffer), now=True)

    def plain(self, v: Value) -> _Tensor:
        """The value in the plain row-major layout, in a buffer of the module's (a graph input's address is each
        call's, not the module's to view: copied)."""
        md = self.md(v.shape)
        t = self.operand(v, md)
        if t.buffer is not None:
            return t
        if v.is_const:
            return self.reorder(t, md)
        copies = self.converted.setdefault(v, [])
        for c in copies:
            if c.buffer is not None and self.lib.dnnl_memory_desc_equal(_P(c.md), _P(md)):
                return c
        copies.append(self.reorder(t, md))
        return copies[-1]

    def operand(self, v: Value, md: int | None = None) -> _Tensor:
        """The value as a primitive's operand, reordered to ``md`` when that layout differs from its own."""
        if v.is_const:
            if not v.has_known_data:
                raise _Unsupported(f"constant {v.name} has no data")
            return self.constant(v.data, md if md is not None else self.md(v.data.shape))
        t = self.values[v]
        if md is None or self.lib.dnnl_memory_desc_equal(_P(t.md), _P(md)):
            return t
        copies = self.converted.setdefault(v, [])
        for c in copies:
            if self.lib.dnnl_memory_desc_equal(_P(c.md), _P(md)):
                return c
        copies.append(self.reorder(t, md))
        return copies[-1]

    def fastest(self, candidates: list, reads: dict[int, Value | None], situation: tuple | None = None):
        """The candidate convolution kernel (a :class:`_Primitive`, :class:`_Winograd` or :class:`_Grouped`) whose
        call — after the reorders of the values it ``reads`` (argument → value) that its layout would need — is
        fastest here, each run on zero-filled scratch buffers, in rounds over the candidates
        (:func:`gawee.backend.kernels.best_calls`). The others are dropped. A convolution of the same ``situation``
        (its shapes, geometry and epilogue), with the same candidates and its operands held in the same layouts,
        takes the winner of the race run for the first one in this plan (a resnet repeats its blocks' convolutions:
        resnet50's 53 convolutions took 25 races)."""
        held = tuple(self._held(v) for v in reads.values())
        key = situation and (situation, tuple(c.key for c in candidates), held)
        winner = self.raced.get(key) if key else None
        if winner is None:
            winner = self._race(candidates, reads)
            if key:
                self.raced[key] = winner
        for i, kernel in enumerate(candidates):
            if i != winner:
                kernel.drop()
        return candidates[winner]

    def _held(self, v: Value | None) -> tuple | None:
        """The layouts ``v`` is held in (its own, then the copies converted for other consumers)."""
        if v is None or v.is_const:
            return None
        return tuple(self.layout_of(t, v.shape) for t in (self.values[v], *self.converted.get(v, ())))

    def _race(self, candidates: list, reads: dict[int, Value | None]) -> int:
        """The index of the fastest candidate (see :meth:`fastest`)."""
        from gawee.backend.kernels import best_calls

        lib, memories, reorders, runners = self.lib, [], [], {}
        for i, kernel in enumerate(candidates):
            steps, planned = [], []
            for arg, v in reads.items():
                if v is None or v.is_const:
                    continue
                have, want = self.values[v].md, kernel.wants(arg)
                known = [c.md for c in (self.values[v], *self.converted.get(v, ()))] + planned
                if not any(lib.dnnl_memory_desc_equal(_P(md), _P(want)) for md in known):
                    planned.append(want)  # one reorder, whichever operands read it in that layout
                    _, reorder = self.primitive(
                        lib.dnnl_reorder_primitive_desc_create, have, self.engine, want, self.engine
                    )
                    reorders.append(reorder)
                    steps.append(self.scratch_step(reorder, {SRC: have, DST: want}, memories))
            steps += kernel.scratch(memories)

            def run(steps=steps) -> None:
                for function, args, _ in steps:
                    _check(function(*args), "a measured kernel")
                lib.dnnl_stream_wait(self.stream)

            run()  # warm: the first call of a primitive pages its buffers and code in
            runners[i] = run
        try:
            best = best_calls(runners, (), min_rounds=3, max_rounds=10, budget_s=0.05) if len(runners) > 1 else {0: 0}
        finally:
            for memory in memories:
                lib.dnnl_memory_destroy(memory)
            for reorder in reorders:
                self._drop(reorder)
        return min(best, key=lambda i: (best[i], i))

    def zeros(self, md: int) -> torch.Tensor:
        """A zero-filled scratch buffer the size of ``md``."""
        return torch.zeros(max(1, self.lib.dnnl_memory_desc_get_size(_P(md)) // 4))

    def scratch_memory(self, md: int, memories: list) -> tuple[int, torch.Tensor]:
        """A oneDNN memory of ``md`` over a zero-filled scratch buffer of its own, added to ``memories``; and the
        buffer."""
        buffer = self.zeros(md)
        memory = _P()
        _check(
            self.lib.dnnl_memory_create(ctypes.byref(memory), _P(md), _P(self.engine), _P(buffer.data_ptr())), "scratch"
        )
        memories.append(memory)
        return memory.value, buffer

    def scratch_step(self, prim: int, mds: dict[int, int], memories: list) -> tuple:
        """``prim`` with each argument (argument → memory descriptor) in a zero-filled scratch buffer of its own:
        a step (function, arguments, the buffers to keep); its memories are added to ``memories``."""
        made = {arg: self.scratch_memory(md, memories) for arg, md in mds.items()}
        args = (_Arg * len(made))(*(_Arg(arg, _P(memory)) for arg, (memory, _) in made.items()))
        return self.lib.dnnl_primitive_execute, (prim, self.stream, len(made), args), [b for _, b in made.values()]

    def done_with(self, node: Node) -> None:
        """Frees the buffers of the inputs ``node`` read for the last time."""
        for v in {v for v in node.inputs if v is not None and not v.is_const}:
            self.remaining[v] -= sum(1 for i in node.inputs if i is v)
            if self.remaining[v] == 0 and not v.is_graph_output and v in self.values:  # else never made (cat)
                for t in (self.values[v], *self.converted.pop(v, ())):
                    self.release(t)


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


def _post_ops(plan: _Plan, act: str | None, params, residual_md: int | None = None) -> int | None:
    """An attribute holding ``+ residual`` (a binary post-op) then ``act`` (an eltwise post-op)."""
    if act is None and residual_md is None:
        return None
    if act is not None and act not in ELTWISE:
        raise _Unsupported(f"no oneDNN post-op for {act}")
    lib = plan.lib
    po = plan._new("dnnl_post_ops_destroy", lib.dnnl_post_ops_create)
    if residual_md is not None:
        _check(lib.dnnl_post_ops_append_binary(_P(po), BINARY["add"], _P(residual_md)), "a residual add")
    if act is not None:
        alg, alpha_beta = ELTWISE[act]
        _check(lib.dnnl_post_ops_append_eltwise(_P(po), alg, *alpha_beta(tuple(params))), f"a fused {act}")
    attr = plan._new("dnnl_primitive_attr_destroy", lib.dnnl_primitive_attr_create)
    _check(lib.dnnl_primitive_attr_set_post_ops(_P(attr), _P(po)), "post-ops")
    return attr


class _Primitive:
    """A candidate convolution kernel: one of oneDNN's implementations in ``layout``, compiled; ``args`` are the
    arguments it takes."""

    def __init__(self, plan: _Plan, layout: str, pd: int, prim: int, args: tuple[int, ...]):
        self.plan, self.layout, self.pd, self.prim, self.args = plan, layout, pd, prim, args

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

    def scratch(self, memories: list) -> list[tuple]:
        """Its call on zero-filled scratch buffers, as steps."""
        return [self.plan.scratch_step(self.prim, {arg: self.wants(arg) for arg in self.args}, memories)]

    def drop(self) -> None:
        self.plan._drop(self.prim)

    def build(self, x: Value, residual: Value | None, weight: torch.Tensor, bias: torch.Tensor, wshape) -> _Tensor:
        """Its step of every call (operands reordered to its layout, weights once now); the output."""
        plan, args = self.plan, {}
        if residual is not None:
            args[_post_op_arg(0)] = plan.operand(residual, self.wants(_post_op_arg(0))).memory
        src = plan.operand(x, self.wants(SRC))
        w = plan.constant(weight, self.wants(WEIGHTS), wshape)
        b = plan.constant(bias, self.wants(BIAS))
        dst = plan.tensor(self.wants(DST))
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

    def scratch(self, memories: list) -> list[tuple]:
        plan = self.plan
        src, dst, res = (plan.zeros(md) for md in (self.src_md, self.dst_md, self.dst_md))
        v, vb = plan.scratch_memory(self.v_md, memories)
        m, mb = plan.scratch_memory(self.m_md, memories)
        w, wb = plan.scratch_memory(plan.queried(self.pd, WEIGHTS), memories)
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
        w = plan.constant(winograd.weights(weight), plan.queried(self.pd, WEIGHTS))
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

    def scratch(self, memories: list) -> list[tuple]:
        src, dst, res = (self.plan.zeros(md) for md in (self.src_md, self.dst_md, self.dst_md))
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


def _conv(plan: _Plan, node: Node, weight, bias, groups: int, stride, padding, dilation, residual=None) -> _Tensor:
    """``act(conv(x) + residual)`` as one step, or Winograd's three, on the kernel measured fastest where there are
    several (every implementation oneDNN has, in each layout, with ``per_conv``)."""
    x, out = node.inputs[0], node.output
    cin, cout = x.shape[1], out.shape[1]
    kernel = list(weight.shape[2:])
    wshape = [groups, cout // groups, cin // groups, *kernel] if groups > 1 else [cout, cin, *kernel]
    dims = (_DIMS(*stride), _DIMS(*(d - 1 for d in dilation)), _DIMS(*padding), _DIMS(*padding))
    act, params = plan.act_of(node)
    create = plan.lib.dnnl_convolution_forward_primitive_desc_create

    def descriptor(layout: str) -> tuple[tuple, int | None]:
        """The convolution's arguments in ``layout``, and its post-ops."""
        # a few input channels (an image): read as they are, like ORT's NCHWc convolutions
        src_md = plan.md(x.shape, _ANY) if cin < plan.block and groups == 1 else plan.activation_md(x.shape, layout)
        dst_md, w_md, b_md = plan.activation_md(out.shape, layout), plan.md(wshape, _ANY), plan.md([cout])
        if residual is not None:  # added in the layout the output gets: asked for first, then fixed
            probe = plan.descriptor(create, plan.engine, _INFERENCE, _CONV_DIRECT, src_md, w_md, b_md, dst_md, *dims)
            dst_md = plan.queried(probe, DST)
        attr = _post_ops(plan, act, params, dst_md if residual is not None else None)
        return (plan.engine, _INFERENCE, _CONV_DIRECT, src_md, w_md, b_md, dst_md, *dims), attr

    reads = {SRC: x, **({_post_op_arg(0): residual} if residual is not None else {})}
    args, geometry = (SRC, WEIGHTS, BIAS, DST, *reads), (kernel, stride, padding, dilation, groups)

    def candidates_in(layout: str) -> list:
        conv_args, attr = descriptor(layout)
        if plan.layout == "per_conv":  # every kernel of each layout timed here, with the reorders it would need
            found = plan.implementations(create, *conv_args, attr=attr)
        else:
            found = [plan.primitive(create, *conv_args, attr=attr)]
        return [
            *(_Primitive(plan, layout, pd, prim, args) for pd, prim in found),
            *_Winograd.candidates(plan, layout, x, out, geometry, act, residual is not None),
            *_Grouped.candidates(plan, layout, x, out, geometry, act, residual is not None),
            *_Depthwise.candidates(plan, layout, x, out, geometry, act, residual is not None),
        ]

    layouts = MEASURED if plan.layout == "per_conv" else (plan.layout,)
    act_in = node.attrs.get("act_in")  # onednn_depthwise's prologue (rules/targets/onednn/3-depthwise.rules)
    if act_in is not None:  # only gawee's depthwise kernel applies an activation to its input
        own = (x, out, geometry, act, residual is not None, act_in)
        candidates = [c for layout in layouts for c in _Depthwise.candidates(plan, layout, *own)]
        if not candidates:
            raise _Unsupported(f"gawee's depthwise kernel does not take {node.name} in the {plan.layout} layout")
    else:
        candidates = [c for layout in layouts for c in candidates_in(layout)]
        if all(_reference(c.name) for c in candidates if isinstance(c, _Primitive)):  # oneDNN has no kernel here
            candidates += [c for layout in MEASURED if layout not in layouts for c in candidates_in(layout)]
    real = [c for c in candidates if not _reference(c.name)]
    if real:
        for c in candidates:
            if c not in real:
                c.drop()
        candidates = real
    shapes = (*x.shape, *out.shape, *kernel, *stride, *padding, *dilation, groups)
    situation = (*shapes, act, *params, residual is None, act_in)
    chosen = plan.fastest(candidates, reads, situation) if len(candidates) > 1 else candidates[0]
    plan.conv_layouts[node.name] = chosen.layout
    plan.conv_kernels[node.name] = chosen.name
    bias = bias if bias is not None else torch.zeros(cout)
    return chosen.build(x, residual, weight, bias, wshape)


def _reference(implementation: str) -> bool:
    """Whether ``implementation`` (a kernel's name) is oneDNN's reference one, which races only where nothing else
    computes the convolution. On AVX-512, oneDNN has no other for a convolution of 8 channels per group in the
    blocked layout (blocks of 16): there nine of RegNet's made a regnet_y_400mf call two orders of magnitude slower
    than with them in channels-last. Where oneDNN has only its reference kernel in the
    module's layout, the other layouts' kernels are candidates too."""
    return implementation.startswith("ref")


def _conv2d(plan: _Plan, node: Node) -> _Tensor:
    a = node.attrs
    _, w, b, *residual = node.inputs
    weight, bias, padding = _const(w, "weight"), _const(b, "bias"), _pair(node, "padding", (0, 0))
    stride, dilation = _pair(node, "stride"), _pair(node, "dilation")
    return _conv(plan, node, weight, bias, a["groups"], stride, padding, dilation, (residual or [None])[0])


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
    if len(out) != 4 or node.attrs["dim"] % 4 != 1 or act not in affine_cat.ACTS or any(v.is_const for v in parts):
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
    mds = (plan.md(x.shape), plan.md(weight.shape, _ANY), plan.md([out[1]]), plan.md(out))
    pd, prim = plan.primitive(create, plan.engine, _INFERENCE, *mds, attr=_post_ops(plan, *plan.act_of(node)))
    src = plan.operand(x, plan.queried(pd, SRC))
    wt = plan.constant(weight, plan.queried(pd, WEIGHTS))
    bt = plan.constant(_const(b, "bias") if b is not None else torch.zeros(out[1]), plan.queried(pd, BIAS))
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src.memory, WEIGHTS: wt.memory, BIAS: bt.memory, DST: dst.memory})
    return dst


def _pool(plan: _Plan, node: Node, alg: int, kernel, stride, padding, dilation=(1, 1), out=None) -> _Tensor:
    """The pooling ``node`` (its output of shape ``out``, if given, else its own) in its input's layout."""
    x, out = node.inputs[0], out or node.output.shape
    # the right and bottom padding that gives torch's output size: more with ceil_mode, less where floor drops rows
    pad_r = [
        max(0, (o - 1) * s + (k - 1) * d + 1 - i - p)
        for o, s, k, d, i, p in zip(out[2:], stride, kernel, dilation, x.shape[2:], padding)
    ]
    src = plan.operand(x)
    create = plan.lib.dnnl_pooling_forward_primitive_desc_create
    geometry = (_DIMS(*stride), _DIMS(*kernel), _DIMS(*(d - 1 for d in dilation)), _DIMS(*padding), _DIMS(*pad_r))
    pd, prim = plan.primitive(create, plan.engine, _INFERENCE, alg, src.md, plan.md(out, _ANY), *geometry)
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src.memory, DST: dst.memory})
    return dst


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
    plain = plan.md([n, c, 1, 1])
    if not plan.lib.dnnl_memory_desc_equal(_P(pooled.md), _P(plain)):
        flat = plan.reorder(pooled, plain)
        plan.release(pooled)
        pooled = flat
    md = plan.md([n, c])
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
    a, b = node.inputs[:2]
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
    layout = plan.layout_of(src0, out) if len(out) == 4 else None
    md = src0.md if b.shape == a.shape else plan.activation_md(shape, layout) if layout else plan.md(shape)
    src1 = plan.constant(_const(b, "operand"), md, shape) if b.is_const else plan.operand(b, md)
    create = plan.lib.dnnl_binary_primitive_desc_create
    mds = (src0.md, src1.md, plan.md(out, _ANY))
    alg = BINARY[node.attrs["alg"]]
    pd, prim = plan.primitive(create, plan.engine, alg, *mds, attr=_post_ops(plan, *plan.act_of(node)))
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {SRC: src0.memory, SRC_1: src1.memory, DST: dst.memory})
    return dst


def _cat(plan: _Plan, node: Node) -> _Tensor:
    out = node.output.shape
    first = plan.operand(node.inputs[0])
    layout = plan.layout_of(first, node.inputs[0].shape) if len(out) == 4 else None
    plain = plan.lib.dnnl_memory_desc_equal(_P(first.md), _P(plan.md(node.inputs[0].shape)))
    # all in the first one's layout (blocked, channels-last or plain): concatenating mixed layouts is oneDNN's
    # reference kernel (ShuffleNet's split part, plain, and its branch, blocked: a tenth of its call)
    want = lambda v: plan.activation_md(v.shape, layout) if layout else plan.md(v.shape) if plain else None
    srcs = [first] + [plan.operand(v, want(v)) for v in node.inputs[1:]]
    mds = (_P * len(srcs))(*(_P(s.md) for s in srcs))
    create = plan.lib.dnnl_concat_primitive_desc_create
    dim = node.attrs.get("dim", 0) % len(out)
    pd, prim = plan.primitive(create, plan.engine, plan.md(out, _ANY), len(srcs), dim, mds)
    dst = plan.tensor(plan.queried(pd, DST))
    plan.step(prim, {DST: dst.memory, **{MULTIPLE_SRC + i: s.memory for i, s in enumerate(srcs)}})
    return dst


def _reshape(plan: _Plan, node: Node) -> _Tensor:
    """A view of the input in the plain row-major layout (reordered to it first where it is blocked)."""
    src = plan.plain(node.inputs[0])
    md = plan.md(node.output.shape)
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
    md = plan.md(out, strides=[strides[d] for d in dims])
    return plan.reorder(_Tensor(md, plan.memory(md, src.buffer), None), plan.md(out))


def _split(plan: _Plan, node: Node) -> tuple[_Tensor, ...]:
    """Each part of a split a oneDNN reorder of a region of the input (a submemory) into a tensor of its own, in
    the input's layout where oneDNN takes the region there (blocked: the offsets along channels whole blocks), else
    of the plain input into the plain layout. A part nobody reads is not copied."""
    x, a = node.inputs[0], node.attrs
    src = plan.operand(x)
    layout = plan.layout_of(src, x.shape) if x.type.rank == 4 and src.buffer is not None else None
    regions = _regions(plan, src, node) if layout is not None else None
    if regions is None:
        src, layout = plan.plain(x), None
        regions = _regions(plan, src, node)
        if regions is None:
            raise _Unsupported(f"oneDNN takes no region of {x.name} along dimension {a['dim']}")
    outs = []
    for md, v in zip(regions, node.outputs):
        dst = plan.tensor(plan.activation_md(v.shape, layout) if layout else plan.md(v.shape))
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

    def operand(v: Value | None) -> torch.Tensor | None:
        if v is None:
            return None
        if not v.is_const:
            return _view(plan.plain(v), v.shape)
        if not v.has_known_data:
            raise _Unsupported(f"constant {v.name} has no data")
        return v.data

    args = [operand(v) for v in node.inputs]
    outs = tuple(plan.tensor(plan.md(v.shape)) for v in node.outputs)
    views = [_view(t, v.shape) for t, v in zip(outs, node.outputs)]

    def step() -> int:
        with torch.no_grad():
            results = op.run(args, attrs)
            for view, result in zip(views, results):
                view.copy_(result)
        return 0

    plan.call(step, (), f"torch:{node.op}")
    return outs


def _view(t: _Tensor, shape) -> torch.Tensor:
    """The plain tensor ``t`` (in a buffer of the module's) as a torch tensor of ``shape``, sharing its memory."""
    return t.buffer.tensor[: math.prod(shape)].view(shape)


LOWERINGS = {
    "conv2d": _conv2d,
    "onednn_depthwise": _conv2d,
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
    **dict.fromkeys(ELTWISE.keys() - {"gelu_tanh"}, _eltwise),
    "onednn_binary": _binary,
    "onednn_affine_cat": _affine_cat,
}
"""The ops this runtime runs, each with the function that plans its primitive."""

RANKS = {
    "conv2d": 4,
    "onednn_depthwise": 4,
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
        for v in (*node.inputs, *node.outputs):  # torch takes constants of any type
            if v is not None and v.dtype is not DType.f32 and (primitive or not v.is_const):
                return f"{node.name} computes in {v.dtype} (float32 only)"
    return None


class DnnlModule(torch.nn.Module):
    """The rewritten graph on oneDNN's primitives: call it with torch tensors, get torch tensors back (a tuple, or
    nested as ``output_structure``). ``module.kernels`` lists the implementation oneDNN chose for each primitive,
    ``module.conv_layouts`` the activation layout of each convolution (by node name; they differ with ``per_conv``),
    ``module.conv_kernels`` its kernel (oneDNN's implementation, or gawee's Winograd, grouped or depthwise kernel),
    ``module.moved_acts`` the depthwise convolutions that apply their producer's activation to their input.
    A call is not reentrant: the intermediate buffers are the module's (a lock makes concurrent calls wait)."""

    def __init__(self, graph: Graph, *, output_structure: Any = None, layout: str = "blocked"):
        super().__init__()
        why = supports(graph)
        if why is not None:
            raise GaweeError(f"{graph.name} cannot run on oneDNN's primitives: {why}", hint='use backend="torch"')
        plan = _Plan(graph, layout)
        self._finalizer = weakref.finalize(self, _destroy, plan.lib, plan.handles)
        self.inputs = []  # each input's memory: its address is set by each call
        for v in graph.inputs:
            md = plan.md(v.shape)
            plan.values[v] = _Tensor(md, plan.memory(md, None, 0), None)
            self.inputs.append(plan.values[v].memory)
        self.outputs = []  # each output's memory (plain, its address set by each call) and shape
        try:
            for node in graph:
                made = _lower(plan, node)
                for v, t in zip(node.outputs, made if isinstance(made, tuple) else (made,)):
                    plan.values[v] = t
                    if v.num_uses == 0 and not v.is_graph_output:  # a split's part nobody reads
                        plan.release(t)
                plan.done_with(node)
            for v in graph.outputs:
                plain = plan.md(v.shape)
                out = _Tensor(plain, plan.memory(plain, None, 0), None)
                plan.reorder(plan.operand(v), plain, out)
                self.outputs.append((out.memory, tuple(v.shape)))
        except _Unsupported as e:
            raise GaweeError(
                f"{graph.name} cannot run on oneDNN's primitives: {e}", hint='use backend="torch"'
            ) from None
        self.lib, self.stream, self.layout = plan.lib, plan.stream, layout
        self.steps = [step[:2] for step in plan.steps]  # (function, arguments)
        self.kernels = [step[2] for step in plan.steps]
        self.conv_layouts = plan.conv_layouts
        self.conv_kernels = plan.conv_kernels
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
        outs = [torch.empty(shape) for _, shape in self.outputs]
        lib = self.lib
        with self._lock:
            for memory, x in zip(self.inputs, xs):
                lib.dnnl_memory_set_data_handle(memory, x.data_ptr())
            for (memory, _), y in zip(self.outputs, outs):
                lib.dnnl_memory_set_data_handle(memory, y.data_ptr())
            for i, (function, args) in enumerate(self.steps):
                status = function(*args)
                if status:
                    raise GaweeError(
                        f"the {self.kernels[i]} kernel (step {i}) failed to execute (status {status})",
                        hint='use backend="torch"',
                    )
            lib.dnnl_stream_wait(self.stream)
        return arrange(outs, self.output_structure)


def _destroy(lib, handles) -> None:
    for destroy, handle in reversed(handles):
        getattr(lib, destroy)(_P(handle))


class DnnlRuntime(Runtime):
    """oneDNN's primitives (:class:`DnnlModule`), one variant per activation layout (:data:`LAYOUTS`); tried apart
    first, as they and gawee's C kernels run on addresses gawee computes."""

    name = "onednn"
    target = "onednn"
    title = "oneDNN's primitives"
    variants = LAYOUTS
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
        return torch_flops(self.lower(graph)[0])  # the ops its target phase makes are planned, not torch steps

    def build(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: Any = None,
        variant: str = "blocked",
    ) -> DnnlModule:
        return DnnlModule(graph, output_structure=output_structure, layout=variant)


RUNTIME = DnnlRuntime()
