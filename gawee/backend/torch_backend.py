"""to_torch: a Graph becomes a torch.fx.GraphModule that runs it, on oneDNN's fused kernels where torch has them.

Each node lowers through the torch target's table (:mod:`gawee.backend.lower_torch`): ``TORCH.get(op)(ctx)`` when the
op has one (conv2d and linear pick oneDNN's fused, prepacked kernels; the opaque ``aten``
op calls its recorded ATen overload), else the op's reference ``evaluate`` with the
node's attributes bound. ``ctx`` is a :class:`TorchLowering`: the node, its lowered
operands, and ways to emit fx code and hold new constants (prepacked weights).

Constants become buffers of the module. Each value is stored in the layout its type names: the
layout phase (``gawee.backend.layout``, applied when it runs the graph's convolutions faster on this
machine) puts ``to_layout`` nodes where activations change layout; outputs are always returned contiguous.
The module is for inference: the fused kernels have no autograd formulas.
"""

from __future__ import annotations

import dataclasses
import keyword
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from gawee.backend import kernels, layout
from gawee.backend.host import InputSignature, OutputStructure, SizeFormula, as_structure
from gawee.backend.lower_torch import TORCH
from gawee.backend.runtime import Alternatives, Runtime
from gawee.errors import GaweeError, IRError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.symbolic import Sym, has_symbols, symbols_of
from gawee.ir.types import Layout, TensorType
from gawee.ops import OpDef, get_op

NODE_META = "gawee_node"
"""fx node meta key: the gawee node a kernel was lowered from (read by :mod:`gawee.profile`)."""


@dataclass(frozen=True)
class TorchOptions:
    """How :func:`to_torch` lowers a graph."""

    fused_kernels: bool = True
    """Use oneDNN's fused, prepacked kernels where this torch has them; False runs every op as plain torch ops
    (the reference semantics), e.g. to compare or to run where oneDNN misbehaves."""
    linear_kernel: str = "measure"
    """How each ``linear`` picks its kernel: ``"measure"`` times the candidates (torch's GEMM, MKL's and
    oneDNN's prepacked ones; ``gawee.backend.kernels``) on this machine at compile time, once per distinct
    shape, and keeps the fastest; ``"aten"``, ``"mkl"`` or ``"onednn"`` forces one where it applies.
    The choices are listed in the module's ``gawee_kernels``."""
    conv1x1_kernel: str = "measure"
    """How each 1×1, stride-1, unpadded convolution picks its kernel: ``"measure"`` times oneDNN's fused
    convolution against the same product as one GEMM on the activations' own memory
    (``gawee.backend.kernels.measure_conv1x1``) once per distinct shape, and keeps the faster; ``"onednn"``
    or ``"gemm"`` forces one. Listed in ``gawee_kernels`` with the linears'."""
    int8_linear_kernel: str = "measure"
    """How each ``linear_int8_dynamic`` picks its kernel: ``"measure"`` times torch's dynamic quantized linear
    against oneDNN's u8 matmul on gawee's quantizer's codes (``gawee.backend.quantized.choose_linear``) once per
    distinct shape, and keeps the faster; ``"quantized::linear_dynamic"`` or ``"onednn::qlinear_pointwise"``
    forces one where it runs. Listed in ``gawee_kernels``."""
    attention_kernel: str = "measure"
    """How each ``scaled_dot_product_attention`` picks its kernel: ``"measure"`` times aten's fused kernel against
    oneDNN Graph's attention partition (``gawee.backend.attention``) once per distinct shape and mask, where the
    partition computes torch's result, and keeps the faster; ``"aten"`` or ``"onednn_graph"`` forces one. Listed
    in ``gawee_kernels``."""
    channels_last: bool | str = "measure"
    """Whether to apply the layout phase (``rules/layout/channels_last.rules``: convolutions on channels-last
    activations, converted at the graph's edges): ``"measure"`` lowers the graph without and with it when it
    has convolutions and keeps the phase only if it runs measurably faster on this machine
    (``gawee.backend.layout``; the choice is the module's ``gawee_layout``; ``gawee.compile`` times the two
    modules beside the whole-graph runtimes, one measurement for both choices); True applies it, False does not.
    oneDNN reorders NCHW activations into its blocked layout inside each fused convolution, channels-last
    ones it takes as they are; which wins depends on the CPU and the model."""
    whole_graph: bool | str = "measure"
    """:func:`gawee.compile` only (it measures on the example inputs; ``to_torch`` has none and ignores this):
    ``"measure"`` also builds the whole-graph runtimes of the rewritten graph (oneDNN Graph's partitions, oneDNN's
    primitives in each activation layout: ``gawee.backend.dnnl``) where measuring them costs at most as long as
    the compile took so far (``gawee.backend.compiler.WHOLE_GRAPH_SHARE``), and returns the fastest instead
    where it computes the model's outputs and measures more than 5% faster (the choice is
    ``module.gawee_report.backend``); False never does."""
    precision: str = "measure"
    """:func:`gawee.compile` with ``precision=`` only: ``"measure"`` also compiles the float32 module and keeps the
    reduced-precision one only where it does not measure more than 5% slower here (the report says what both
    took); ``"always"`` keeps it unmeasured."""
    keep_freed_memory: bool = True
    """:func:`gawee.compile` only: keep the memory a call frees in the process for the next call instead of letting
    glibc give it back to the OS, so the next call's writes do not fault the pages in again (process-wide, before
    anything is measured; ``gawee.backend.allocator``; the report's ``allocator`` says what was done). False leaves
    the allocator as it is."""


class BoundOp:
    """An op's reference semantics with a node's attributes bound: the default lowering.

    A named callable (not a lambda) so that fx can print and compile the generated code.
    """

    def __init__(self, opdef: OpDef, attrs: dict[str, Any], single_output: bool):
        self.evaluate = opdef.evaluate
        self.attrs = dict(attrs)
        self.single_output = single_output
        self.__name__ = opdef.name
        self.__qualname__ = self.__name__
        self.__module__ = "gawee"

    def __call__(self, *inputs, **sizes):
        out = self.evaluate(*inputs, **self.attrs, **sizes)
        if self.single_output and not isinstance(out, torch.Tensor):
            return out[0]
        return out

    def __repr__(self) -> str:
        return f"<{self.__name__} {self.attrs}>"


_ALLOCATING = frozenset({"conv2d", "conv2d_int8_static", "linear", "batch_norm", "layer_norm", "cat"})
"""Ops whose torch lowering always returns a tensor of its own, which a later op may overwrite once it is dead (a
linear's N-d result is a view of the matrix its GEMM allocated, which nothing else holds; ``torch.cat`` copies even
one tensor)."""


class TorchLowering:
    """What a torch lowering (:data:`gawee.backend.lower_torch.TORCH`) sees for one node.

    It returns the fx node computing the op's output (for a multi-output op, an fx node
    whose value is the sequence of outputs). Operands are lowered on demand, so a
    constant that the lowering replaces (a weight it prepacks) is never stored.
    """

    def __init__(self, builder: _Builder, node: Node, opdef: OpDef):
        self._builder = builder
        self.node = node
        self.opdef = opdef
        self.attrs = node.attrs
        self.options = builder.options

    # -- operands ------------------------------------------------------------------
    def arg(self, index: int) -> torch.fx.Node | None:
        """Operand ``index`` as an fx node (None for an absent optional operand)."""
        value = self.node.inputs[index]
        return None if value is None else self._builder.lowered(value)

    @property
    def args(self) -> list[torch.fx.Node | None]:
        return [self.arg(i) for i in range(len(self.node.inputs))]

    def standard(self, index: int) -> torch.fx.Node | None:
        """Operand ``index`` in torch's default contiguous layout (a copy only if its type is channels-last),
        for kernels that may depend on strides (opaque ATen ops)."""
        x = self.arg(index)
        t = self.type(index)
        if x is None or t is None or t.layout is not Layout.channels_last:
            return x
        return self.call_method("contiguous", x)

    def type(self, index: int) -> TensorType | None:
        value = self.node.inputs[index]
        return None if value is None else value.type

    def const(self, index: int) -> torch.Tensor | None:
        """The data of operand ``index`` if it is a constant with known values, else None."""
        value = self.node.inputs[index]
        return value.data if value is not None and value.has_known_data else None

    def is_last_use(self, index: int) -> bool:
        """Whether this node is the last reader of operand ``index``, a value computed in the graph
        that is not a graph output."""
        value = self.node.inputs[index]
        if value is None or value.producer is None or value.is_graph_output:
            return False
        return self._builder.last_reader.get(value) is self.node

    def can_overwrite(self, index: int) -> bool:
        """Whether this node may write its result into operand ``index``'s storage: the operand is dead
        after this node (:meth:`is_last_use`), has the result's shape and dtype, is no other operand of
        this node, and owns its memory — it was computed by an elementwise op (which allocates, or writes into
        a dead operand that did) or by an op whose lowering always allocates (:data:`_ALLOCATING`; a view, or an
        op that may return its input, could alias a live tensor)."""
        value = self.node.inputs[index]
        if not self.is_last_use(index) or not value.type.same_shape_dtype(self.node.outputs[0].type):
            return False
        if any(v is value for i, v in enumerate(self.node.inputs) if i != index):
            return False
        producer = value.producer
        return producer.op in _ALLOCATING or get_op(producer.op).has_trait("elementwise")

    # -- emitting code -------------------------------------------------------------
    def call(self, target: Callable, *args: Any, **kwargs: Any) -> torch.fx.Node:
        """A call of ``target`` in the generated code."""
        return self._builder.fx.create_node(
            "call_function", target, args, kwargs, name=self._builder.fx_name(self.node.name)
        )

    def derived(self, index: int, fn: Callable) -> torch.fx.Node:
        """``fn`` of operand ``index``, computed once per call of the module however many nodes ask for it (in the
        code of the first node that does): e.g. one attention mask's form that every layer's kernel reads."""
        value = self.node.inputs[index]
        key = (value, fn)
        if key not in self._builder.derived:
            self._builder.derived[key] = self.call(fn, self.arg(index))
        return self._builder.derived[key]

    def call_method(self, method: str, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self._builder.fx.create_node("call_method", method, args, kwargs)

    def record_kernel(self, choice) -> None:
        """Note the kernel this node runs on (a :class:`gawee.backend.kernels.KernelChoice`): the module
        lists each distinct choice once, with how many nodes use it, in ``gawee_kernels``."""
        self._builder.record_kernel(choice)

    def buffer(self, data: torch.Tensor, suffix: str) -> torch.fx.Node:
        """A new constant held by the module (e.g. a prepacked weight), named after this node."""
        return self._builder.new_buffer(data, f"{self.node.name}_{suffix}")

    def reference(self) -> torch.fx.Node:
        """The default lowering: the op's ``evaluate`` with this node's attributes bound (attributes holding
        symbolic sizes are passed at run time, computed from the input shapes)."""
        static = {k: v for k, v in self.attrs.items() if not has_symbols(v)}
        sizes = {k: self.dims(v) for k, v in self.attrs.items() if k not in static}
        bound = BoundOp(self.opdef, static, len(self.node.outputs) == 1)
        return self.call(bound, *self.args, **sizes)

    def dims(self, value: Any) -> Any:
        """``value`` (a dim, or a tuple of them) with every symbolic size an fx node computing it from
        the input shapes at run time; plain ints stay ints."""
        if isinstance(value, tuple):
            return tuple(self.dims(v) for v in value)
        if isinstance(value, list):
            return [self.dims(v) for v in value]
        return self._builder.size(value) if has_symbols(value) else value


def to_torch(
    graph: Graph,
    options: TorchOptions | None = None,
    *,
    output_structure: OutputStructure | pytree.TreeSpec | None = None,
) -> torch.fx.GraphModule:
    """A ``torch.fx.GraphModule`` computing ``graph``; constants are its buffers.

    Called with the graph inputs, by position or by name (checked first, as every runtime checks them:
    :class:`gawee.backend.host.InputSignature`), it returns the outputs as a tuple, like :func:`gawee.run` — or
    as the model returned them when ``output_structure`` is given (:class:`gawee.backend.host.OutputStructure`,
    or a pytree spec over the flat outputs). Raises IRError for a graph whose operand is neither an input, a
    constant nor computed earlier (run ``gawee.verify``).
    """
    options, build = _lowering(graph, options, output_structure)
    if options.channels_last == "measure":
        module, choice = layout.choose(graph, build)
    else:
        module, choice = build(layout.channels_last(graph) if options.channels_last else graph), None
    module.gawee_layout = choice
    return module


def to_torch_layouts(
    graph: Graph,
    options: TorchOptions | None = None,
    *,
    output_structure: OutputStructure | pytree.TreeSpec | None = None,
) -> layout.Candidates:
    """:func:`to_torch`'s modules before its layout measurement: where ``options.channels_last`` is ``"measure"``,
    the NCHW module and the channels-last one when the choice is to be measured (:func:`gawee.backend.layout.
    candidates`), for a caller that times them with other candidates (``gawee.compile``'s whole-graph choice) and
    settles the layout from that one measurement; else the one module :func:`to_torch` builds. Each module's
    ``gawee_layout`` is set once the choice is made (:func:`with_layout`)."""
    options, build = _lowering(graph, options, output_structure)
    if options.channels_last == "measure":
        return layout.candidates(graph, build)
    # the one module to_torch builds (channels-last where options force it), under the default's key
    return layout.Candidates({"contiguous": to_torch(graph, options, output_structure=output_structure)}, 0)


def with_layout(chosen: tuple[torch.fx.GraphModule, layout.LayoutChoice | None]) -> torch.fx.GraphModule:
    """The module of a settled :class:`gawee.backend.layout.Candidates` choice, its ``gawee_layout`` set."""
    module, choice = chosen
    module.gawee_layout = choice
    return module


def _lowering(
    graph: Graph, options: TorchOptions | None, output_structure
) -> tuple[TorchOptions, Callable[[Graph], torch.fx.GraphModule]]:
    """The options as they apply on the graph's device, checked, and how to lower a graph with them."""
    options = on_device(options or TorchOptions(), graph.device)
    if options.channels_last not in (True, False, "measure"):
        raise GaweeError(
            f"TorchOptions.channels_last is {options.channels_last!r}", hint='pass True, False or "measure"'
        )

    def build(g: Graph) -> torch.fx.GraphModule:
        return _Builder(g, options).build(output_structure)

    return options, build


def on_device(options: TorchOptions, device: torch.device) -> TorchOptions:
    """``options`` for a graph whose data lives on ``device``: on any device but the CPU, oneDNN's and MKL's
    kernels (CPU kernels) are off and the layout is not measured (that measurement runs on the CPU; an explicit
    ``channels_last=True`` stays), so every op runs its torch semantics where the model's constants are."""
    if device.type == "cpu":
        return options
    return dataclasses.replace(options, fused_kernels=False, channels_last=options.channels_last is True)


class _Builder:
    def __init__(self, graph: Graph, options: TorchOptions):
        self.graph = graph
        self.options = options
        self.fx = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[Value, torch.fx.Node] = {}
        self._attr_names: set[str] = set()
        self.last_reader: dict[Value, Node] = {}
        for node in graph:
            for v in node.inputs:
                if v is not None:
                    self.last_reader[v] = node
        self.kernels: dict[int, list] = {}  # id(choice) -> [choice, nodes using it]
        self.derived: dict[tuple[Value, Callable], torch.fx.Node] = {}  # TorchLowering.derived

    def record_kernel(self, choice) -> None:
        self.kernels.setdefault(id(choice), [choice, 0])[1] += 1

    # -- names and constants ---------------------------------------------------------
    def fx_name(self, name: str) -> str:
        name = re.sub(r"\W", "_", name) or "v"
        if name[0].isdigit() or keyword.iskeyword(name):
            name = f"v_{name}"
        return name

    def new_buffer(self, data: torch.Tensor, hint: str) -> torch.fx.Node:
        base = self.fx_name(hint)
        name, k = base, 0
        while name in self._attr_names or hasattr(self.root, name):
            k += 1
            name = f"{base}_{k}"
        self._attr_names.add(name)
        self.root.register_buffer(name, data)
        return self.fx.get_attr(name)

    def lowered(self, value: Value) -> torch.fx.Node:
        got = self.env.get(value)
        if got is None:
            if value.data is None:
                raise IRError(
                    f"%{value.name} is read before it is computed",
                    where=self.graph.name,
                    hint="the graph is not in topological order: run gawee.verify(graph)",
                )
            got = self.env[value] = self.new_buffer(value.data, value.name)
        return got

    # -- the walk ------------------------------------------------------------------
    def size(self, expr) -> torch.fx.Node:
        """An fx node computing a symbolic size from the symbols' values (bound on entry)."""
        got = self.sizes.get(expr)
        if got is None:
            if isinstance(expr, Sym):
                got = self.fx.call_function(operator.getitem, (self.symbol_values, self.symbol_order.index(expr)))
            else:
                syms = sorted(symbols_of(expr), key=str)
                fn = SizeFormula(expr, syms)
                got = self.fx.call_function(fn, tuple(self.size(s) for s in syms))
            self.sizes[expr] = got
        return got

    def build(self, output_structure: OutputStructure | pytree.TreeSpec | None) -> torch.fx.GraphModule:
        self.measured_before = kernels.measuring_seconds()
        # The module takes its inputs as every runtime does — by position or by name, checked first
        # (InputSignature): a dynamic graph's check also solves the symbols from the input shapes (range-checked),
        # which the sizes computed at run time read.
        check = InputSignature.of(self.graph)
        args, kwargs = self.fx.placeholder("*args"), self.fx.placeholder("**kwargs")
        inputs = self.fx.call_function(check.inputs, (args, kwargs))
        for k, value in enumerate(self.graph.inputs):
            self.env[value] = self.fx.call_function(operator.getitem, (inputs, k))
        self.sizes: dict = {}
        self.symbol_order = list(check.symbols)
        self.symbol_values = self.fx.call_function(check.values, (inputs,)) if check.symbols else None
        for node in self.graph:
            opdef = get_op(node.op)
            ctx = TorchLowering(self, node, opdef)
            known = len(self.fx.nodes)
            lower = TORCH.get(node.op)
            result = lower(ctx) if lower is not None else ctx.reference()
            for i, n in enumerate(reversed(self.fx.nodes)):  # the kernels of this node, for gawee.profile
                if i >= len(self.fx.nodes) - known:
                    break
                n.meta[NODE_META] = node.name
            if len(node.outputs) == 1:
                self.env[node.output] = result
            else:
                for i, v in enumerate(node.outputs):
                    self.env[v] = self.fx.call_function(operator.getitem, (result, i))
        outs = []
        for value in self.graph.outputs:  # kernels may pick other strides (oneDNN: by the weight's format)
            y = self.lowered(value)
            outs.append(self.fx.call_method("contiguous", (y,)) if value.type.rank >= 2 else y)
        if output_structure is None:
            self.fx.output(tuple(outs))
        else:  # a call, not a literal: fx would write a dict subclass (a ModelOutput) as a plain dict
            self.fx.output(self.fx.call_function(as_structure(output_structure), (outs,)))
        self.fx.eliminate_dead_code(is_impure_node=lambda n: n.target == check.inputs or n.is_impure())
        for n in list(self.fx.nodes):  # constants a lowering replaced (e.g. by their prepacked form)
            if n.op == "get_attr" and not n.users:
                self.fx.erase_node(n)
        used = {n.target for n in self.fx.nodes if n.op == "get_attr"}
        for name in [b for b, _ in self.root.named_buffers() if b not in used]:
            delattr(self.root, name)
        self.fx.lint()
        module = torch.fx.GraphModule(self.root, self.fx, class_name=_class_name(self.graph.name))
        module.gawee_kernels = [dataclasses.replace(c, nodes=n) for c, n in self.kernels.values()]
        module.gawee_graph = self.graph  # what the kernels' NODE_META names (the layout phase may have rewritten it)
        module.gawee_kernel_seconds = kernels.measuring_seconds() - self.measured_before
        return module


def _class_name(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name)
    return f"Gawee_{cleaned}" if cleaned else "GaweeModule"


class TorchRuntime(Runtime):
    """The torch lowering (:func:`to_torch`): every graph, on the model's device. The baseline of every measured
    choice. Not tried apart: torch's operators check what they are given and raise (its attention partitions,
    oneDNN Graph's, are tried apart in :mod:`gawee.backend.attention`)."""

    name = "torch"
    title = "the torch lowering"
    cpu_only = False
    options = ("options",)
    mismatch_hint = (
        "compile with options=TorchOptions(fused_kernels=False) to rule out the fused kernels, and report the model"
    )

    def unavailable(self) -> str | None:
        return None

    def build(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: OutputStructure | None = None,
        options: TorchOptions | None = None,
    ) -> torch.fx.GraphModule:
        return to_torch(graph, options, output_structure=output_structure)

    def alternatives(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: OutputStructure | None = None,
        options: TorchOptions | None = None,
    ) -> Alternatives:
        """The lowering without and with the layout phase where :func:`to_torch` would measure them
        (:func:`to_torch_layouts`; one module where it measures nothing)."""
        found = to_torch_layouts(graph, options, output_structure=output_structure)

        def settle(xs: Sequence[torch.Tensor]) -> tuple[str, torch.fx.GraphModule]:
            module = with_layout(found.settle(list(xs)))
            return next(name for name, m in found.modules.items() if m is module), module

        return Alternatives(dict(found.modules), lambda name, seconds: with_layout(found.chosen(name, seconds)), settle)


RUNTIME = TorchRuntime()
