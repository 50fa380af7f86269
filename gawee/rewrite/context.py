"""RewriteContext: what a rule's guard and replacement see while it fires on one node.

Replacement builders call ``emit_op`` (``emit`` by name) for every op they construct: an op whose operands
are all constants is evaluated on the spot into a new constant (this is how weight
folding is written in rule text); any other op becomes a node inserted before the root.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

try:
    import cython
except ImportError:  # Cython is optional (the accel extra): the declarations below then do nothing
    from gawee import cython_shim as cython

from gawee.analysis.tensor_facts import SMALL, abs_peak, abs_range, all_finite, elements, kept_abs_range
from gawee.dsl.const_fold import NotConstant
from gawee.dsl.library import GuardFailed
from gawee.errors import GaweeError, RewriteError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import TensorType
from gawee.ops import OpDef, get_op

if TYPE_CHECKING:
    from gawee.dsl.compiler import Rule


def detached_constant(data: torch.Tensor) -> Value:
    """A constant not yet in any graph; it is named when a node first reads it."""
    return Value(TensorType.of(data), "", data=data)


@cython.locals(v=Value)
def _constant_data(inputs: list[Value | None]) -> list[torch.Tensor | None] | None:
    """The data of ``inputs`` when every one present is a constant (absent ones as None), else None."""
    data = []
    for v in inputs:
        if v is None:
            data.append(None)
        elif v.data is None:
            return None
        else:
            data.append(v.data)
    return data


def _finite(t: torch.Tensor | None) -> bool:
    """No inf or nan in ``t`` (absent operands and meta tensors hold none)."""
    if t is None or t.is_meta:
        return True
    return all_finite(t)


EXACT_ZEROS = frozenset({"add", "sub"})
"""Ops whose float result is zero exactly when the exact result is (with gradual underflow,
x - y == 0 only if x == y): no underflow check needed."""


@cython.locals(
    values=list, x=cython.double, total=cython.double, top=cython.double, bottom=cython.double, zero=cython.bint
)
def _fold_problem(opdef, data: list, attrs: dict, result: torch.Tensor) -> str | None:
    """Why a constant that a replacement just folded must not be used, else None.

    Overflow: finite constants turned into inf/nan (f16 weights scaled past 65504). Underflow: a
    nonzero value rounded to zero (tiny weights times a tiny batch-norm scale), so that where the
    original computed ``inf * w * s = inf`` the folded graph would give ``inf * 0 = nan``; checked in
    float64 only where the result has a zero. A product shown safe by its operands' magnitudes is not read
    (:func:`_product_is_safe`); any other result is read once in the common case (:func:`result_problem`).
    """
    headroom = _HEADROOM.get(result.dtype)
    if headroom is not None and result.numel() <= SMALL and not result.is_meta:
        # the common case (a small float32/16, bfloat16 result) of result_problem, read once in Python: its sum
        # (an inf or nan makes it one; these few cannot overflow float64), extremes and zeros in one loop
        if "view" in opdef.traits:
            return None  # a view moves values: it makes no new ones
        values = elements(result)
        if not values:
            return None
        total, top, bottom, zero = 0.0, -math.inf, math.inf, False
        for x in values:
            total += x
            if x > top:
                top = x
            if x < bottom:
                bottom = x
            if x == 0.0:  # -0.0 too
                zero = True
        if total - total == 0 and top <= headroom and -bottom <= headroom and (not zero or opdef.name in EXACT_ZEROS):
            return None  # no inf or nan, none past the headroom, no zero where a product could underflow to one
        return result_problem(opdef, data, attrs, result)
    if "view" in opdef.traits or not result.is_floating_point() or result.is_meta:
        return None
    n = result.numel()
    if n == 0 or (n > SMALL and opdef.name == "mul" and _product_is_safe(data, result)):
        return None  # a small result costs less to read than its operands
    return result_problem(opdef, data, attrs, result)


def result_problem(opdef, data: list, attrs: dict, result: torch.Tensor) -> str | None:
    """:func:`_fold_problem` found by reading the (non-empty, floating) result: its largest magnitude, with its
    smallest where a zero must be looked for (``abs_range``), element by element in float64 where those show
    an inf, a nan or a zero."""
    zeros_matter = result.dtype != torch.float64 and opdef.name not in EXACT_ZEROS
    if zeros_matter:
        lo, hi = abs_range(result)
    else:
        lo, hi = math.nan, abs_peak(result)
    finite = math.isfinite(hi)
    if not finite and all(_finite(d) for d in data):
        return f"folding {opdef.name} overflowed {result.dtype}"
    if finite and result.dtype != torch.float64 and hi > _headroom(result.dtype):
        operands = [abs_peak(d) for d in data if isinstance(d, torch.Tensor) and d.is_floating_point()]
        if hi > max(operands, default=0.0):  # no real weight is this large: only a fold can make one
            return (
                f"folding {opdef.name} made a constant of {hi:.3g}, past {result.dtype}'s headroom (max^(3/4)): "
                "products with it can overflow where the original's did not"
            )
    if finite and (not zeros_matter or lo != 0):
        return None
    # rare cases, element by element against float64: non-finite operands (an inf or nan weight in one
    # channel must not hide an overflow or underflow in another), or a zero in the result
    wide = [d.double() if d is not None and d.is_floating_point() else d for d in data]
    try:
        (exact,) = opdef.run(wide, attrs)
    except (GaweeError, RuntimeError, ValueError, TypeError):
        return None
    if exact.shape != result.shape:
        return None
    if not finite:
        new = ~torch.isfinite(result) & torch.isfinite(exact)
        if opdef.has_trait("elementwise"):  # exact also overflows in float64: compare with the operands
            try:
                ins = [torch.isfinite(d) for d in data if isinstance(d, torch.Tensor) and d.is_floating_point()]
                new |= ~torch.isfinite(result) & torch.stack(torch.broadcast_tensors(result, *ins)[1:]).all(0)
            except RuntimeError:
                pass
        if bool(new.any()):
            return f"folding {opdef.name} overflowed {result.dtype}"
    if zeros_matter and bool(((result == 0) & (exact != 0)).any()):
        return f"folding {opdef.name} underflowed {result.dtype} to zero"
    return None


@functools.cache
def _headroom(dtype: torch.dtype) -> float:
    """The largest magnitude a folded constant of ``dtype`` may have: max^(3/4), so that a product with it
    overflows only where the original's could."""
    return torch.finfo(dtype).max ** 0.75


OPERAND_PASS = 4096
"""Elements below which :func:`_product_is_safe` reads an operand whose magnitudes are not kept (a per-channel
scale); a larger one (a weight) is shown safe only from magnitudes its guard's ``finite`` kept."""


_ROUNDING = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
"""Unit roundoff of the dtypes whose products of two values are exact in float64 (53 bits hold 2 × 24)."""

_HEADROOM = {dtype: _headroom(dtype) for dtype in _ROUNDING}
""":func:`_headroom` of those dtypes, whose small folded constants :func:`_fold_problem` reads in Python."""

_PRODUCT_LIMITS = {dtype: (u, _HEADROOM[dtype], torch.finfo(dtype).smallest_normal) for dtype, u in _ROUNDING.items()}
"""dtype -> (unit roundoff, headroom, smallest normal value): what :func:`_product_is_safe` compares a product's
bounds with."""


def _product_is_safe(data: list, result: torch.Tensor) -> bool:
    """Whether ``result = a * b`` (broadcast) passes every check of :func:`_fold_problem`, shown from the
    operands' magnitudes alone when those are cheap to know (small operands, or a weight whose ``abs_range``
    its guard computed) — so a folded weight is not read again. With a = |a_i| and b = |b_j| in
    [lo_a, hi_a] and [lo_b, hi_b], the exact product lies in [lo_a·lo_b, hi_a·hi_b] (computed exactly in
    float64), and rounding to the result's dtype is monotonic: every element is finite and under the
    headroom (max^(3/4)) when hi_a·hi_b·(1 + u) is under it, and is
    nonzero when lo_a·lo_b is at least the smallest normal value (not merely subnormal: a process that
    flushes subnormals to zero would round those to zero). False: not shown (the result is checked)."""
    dtype = result.dtype
    limits = _PRODUCT_LIMITS.get(dtype)
    if limits is None or len(data) != 2:
        return False
    ranges = []
    for d in data:
        if type(d) is not torch.Tensor or d.dtype != dtype:
            return False
        n = d.numel()
        if n == 0:
            return False
        known = abs_range(d) if n < OPERAND_PASS else kept_abs_range(d)  # a pass over a small operand only
        if known is None:
            return False
        ranges.append(known)
    (lo_a, hi_a), (lo_b, hi_b) = ranges
    if not (math.isfinite(hi_a) and math.isfinite(hi_b)):  # nan compares false below, inf too
        return False
    u, headroom, smallest_normal = limits
    return hi_a * hi_b * (1 + u) <= headroom and lo_a * lo_b >= smallest_normal


def fold_device(data: list[torch.Tensor | None], graph_device: torch.device) -> torch.device | None:
    """The device a constant subexpression is evaluated on: the device of its first operand that is not on
    the CPU (the model's constants live there), else the graph's when that is an accelerator (literals and
    creation ops are made on the CPU); None: where they are (a CPU graph, or literals of a meta-device graph,
    whose values stay known)."""
    for t in data:
        if t is not None and not t.is_cpu:
            return t.device
    return graph_device if graph_device.type not in ("cpu", "meta") else None


def to_device(t: torch.Tensor | None, device: torch.device | None) -> torch.Tensor | None:
    """``t`` moved to ``device`` (None: left where it is)."""
    return t if t is None or device is None or t.device == device else t.to(device)


@functools.cache
def _promoted(kind: type, dtype: torch.dtype, rank: int, default: torch.dtype) -> torch.dtype:
    """The dtype torch gives a Python number of type ``kind`` against a tensor of ``dtype`` (0-d or not):
    it depends on nothing else, so it is asked of torch once per combination."""
    probe = torch.empty((1,) * rank, dtype=dtype, device="meta")
    return torch.result_type(probe, kind(1))


_SCALARS: dict[tuple, torch.Tensor] = {}
"""0-d tensors for the numbers replacements use (eps, 0, 1), shared: constants are immutable."""


def _scalar(x: Any, rank: int | None, like: torch.dtype | None) -> torch.Tensor:
    """The 0-d tensor of the number ``x``, typed as torch promotes it against a tensor of rank ``rank`` (0 or 1)
    and dtype ``like`` (None: alone, floats in the default dtype)."""
    if like is not None:
        if type(x) in (bool, int, float, complex):
            dtype = _promoted(type(x), like, rank, torch.get_default_dtype())
        else:
            dtype = torch.result_type(torch.empty((1,) * rank, dtype=like, device="meta"), x)
    else:
        dtype = torch.get_default_dtype() if isinstance(x, float) else None
    key = (type(x), x, dtype)
    t = _SCALARS.get(key)
    if t is None:
        t = _SCALARS.setdefault(key, torch.tensor(x, dtype=dtype))
    return t


class RewriteContext:
    __slots__ = (
        "_device",
        "_on_host",
        "env",
        "graph",
        "new_nodes",
        "root",
        "roots",
        "rule",
        "with_cache",
        "with_fns",
        "with_tensors",
    )

    def __init__(
        self,
        graph: Graph,
        rule: Rule,
        root: Node | list[Node],
        env: dict[str, Any],
        device: torch.device | None = None,
    ):
        self.graph = graph
        self._device = device
        self._on_host: bool | None = None
        self.rule = rule
        self.roots = root if isinstance(root, list) else [root]
        """The nodes the rule's roots matched, in pattern order (one unless the rule has several roots)."""
        self.root = min(self.roots, key=graph.position) if len(self.roots) > 1 else self.roots[0]
        """Where the replacement goes: before the earliest root, so every root's users see it."""
        self.env = env
        self.new_nodes: list[Node] = []
        self.with_cache: list[Any] = []
        self.with_tensors: list[Any] = []
        """The `with` bindings' tensors, as the replacement's compiled constant subexpressions computed them."""
        self.with_fns: list[Any] = []

    @property
    def device(self) -> torch.device:
        """The graph's device (``Graph.device``; given by the driver, which computes it once)."""
        if self._device is None:
            self._device = self.graph.device
        return self._device

    @property
    def on_host(self) -> bool:
        """The graph is on the CPU or the meta device: constants on the CPU are folded where they are."""
        if self._on_host is None:
            self._on_host = self.device.type in ("cpu", "meta")
        return self._on_host

    def _evaluate(self, opdef, data: list, attrs: dict) -> tuple[list, tuple[torch.Tensor, ...]]:
        """``opdef`` run on constant ``data`` moved to one device (``fold_device``), its results left there: a
        model's constants are folded where they live, literals joining them. Returns the moved data and the
        results."""
        if self.on_host:
            for d in data:
                if d is not None and not d.is_cpu:
                    break
            else:
                return data, opdef.run(data, attrs)  # fold_device would say None: left where they are
        device = fold_device(data, self.device)
        data = [to_device(d, device) for d in data]
        return data, tuple(to_device(t, device) for t in opdef.run(data, attrs))

    def error(self, message: str, hint: str | None = None) -> RewriteError:
        return RewriteError(
            f"rule {self.rule.name} ({self.rule.location}) on node {self.root.name}: {message}", hint=hint
        )

    # -- building ------------------------------------------------------------------------
    def tensor(self, x: Any, like: Value | None = None) -> Value:
        """A Python number as a 0-d constant, typed as torch promotes it against ``like``."""
        if isinstance(x, Value):
            return x
        if isinstance(x, (list, tuple)):
            raise self.error(f"a list {x!r} cannot be used as a tensor")
        if like is None:
            return detached_constant(_scalar(x, None, None))
        return detached_constant(_scalar(x, min(like.type.rank, 1), like.dtype.torch))

    # -- constant subexpressions compiled to closures over tensors (gawee.dsl.const_fold) ------------------
    def scalar_data(self, x: Any, like: torch.Tensor | None) -> torch.Tensor:
        """The tensor :meth:`tensor` makes of the number ``x`` against a constant whose data is ``like``."""
        if type(x) not in (bool, int, float, complex):
            raise NotConstant  # a list, an absent value: the general path reports it
        return _scalar(x, None, None) if like is None else _scalar(x, min(like.dim(), 1), like.dtype)

    def fold_data(self, opdef: OpDef, attrs: dict[str, Any], data: list) -> torch.Tensor:
        """``opdef`` evaluated on the constants ``data`` with its prepared ``attrs``, as :meth:`emit_op` folds it
        (the op's ``evaluate``, the result's check): its tensor, GuardFailed where the result must not be used,
        NotConstant where the op fails or gives several results (the general path then words the failure)."""
        try:
            t = opdef.evaluate(*data, **attrs)
        except (GaweeError, RuntimeError, ValueError, TypeError, IndexError):
            raise NotConstant from None
        if type(t) is not torch.Tensor:
            raise NotConstant
        problem = _fold_problem(opdef, data, attrs, t)
        if problem is not None:
            raise GuardFailed(problem)
        return t

    def constant(self, t: torch.Tensor) -> Value:
        """A folded tensor as the new constant the general path would have made of it."""
        return Value(TensorType.of(t), "", data=t)

    def emit(
        self, op: str, inputs: list[Value | None], attrs: dict[str, Any], multi: bool = False
    ) -> Value | tuple[Value, ...]:
        """Build ``op(inputs, attrs)``: evaluated now if every operand is constant, else a new node.
        ``multi``: the op has several outputs, all returned (a tuple)."""
        return self.emit_op(get_op(op), inputs, attrs, multi)

    @cython.locals(v=Value, node=Node)
    def emit_op(
        self,
        opdef: OpDef,
        inputs: list[Value | None],
        attrs: dict[str, Any],
        multi: bool = False,
        prepared: dict[str, Any] | None = None,
    ) -> Value | tuple[Value, ...]:
        """:meth:`emit` of the op ``opdef`` (a replacement looks its ops up once, when it is compiled).
        ``prepared``: ``attrs`` as ``OpDef.prepare_attrs`` makes them, shared and only read (a replacement whose
        attributes are literals prepares them once, when it is compiled)."""
        if prepared is not None and not multi and self.on_host:
            folded = self._fold_host(opdef, inputs, prepared)
            if folded is not None:
                return folded
        op = opdef.name
        missing = opdef.missing_operand(inputs)
        if missing is not None:
            raise self.error(f"cannot build {op}: its operand {missing} is absent (guard with present(...))")
        try:
            if "pure" in opdef.traits:
                data = _constant_data(inputs)
                if data is not None:
                    return self._fold(opdef, inputs, data, attrs, multi, prepared)
            if not opdef.variadic and len(inputs) < len(opdef.operands):  # absent trailing optionals, as create_node
                inputs = [*inputs, *([None] * (len(opdef.operands) - len(inputs)))]
            in_types = [None if v is None else v.type for v in inputs]
            if prepared is None:
                attrs, types = opdef.prepare_and_infer(attrs, in_types, where=op)
            else:
                attrs, types = prepared, opdef.infer_types(in_types, prepared)
            if len(self.roots) > 1:
                self._check_available(inputs)
            name = self.graph.peek_name(op)
            for i, v in enumerate(inputs):
                if v is not None and v.data is not None and not v.name:  # a constant folded just now
                    operand = opdef.operands[min(i, len(opdef.operands) - 1)].name
                    self._adopt(v, f"{name}.{operand}")
            node = self.graph.create_node(
                op, inputs, attrs, types=types, name=name, source=self.rule.tag, before=self.root, prepared=True
            )
        except GaweeError as e:
            raise self.error(f"cannot build {op}: {e.message}") from None
        except (RuntimeError, ValueError, TypeError, IndexError) as e:  # torch refused a constant subexpression
            raise self.error(f"evaluating {op} on constants failed: {str(e).splitlines()[0]}") from None
        self.new_nodes.append(node)
        if multi:
            return tuple(node.outputs)
        if len(node.outputs) != 1:
            raise self.error(f"{op} has {len(node.outputs)} outputs: pick one with `[i]`")
        return node.outputs[0]

    @cython.locals(v=Value)
    def _fold_host(self, opdef: OpDef, inputs: list[Value | None], prepared: dict[str, Any]) -> Value | None:
        """The common fold, without the general path's steps: a pure op of one result, every operand a constant on
        the CPU (none absent), its attributes prepared when the replacement was compiled. What the general path
        would do then — run the op, check the result (:meth:`fold_data`), wrap it — in one step; None where
        these conditions do not hold (the general path takes it, errors included)."""
        if "pure" not in opdef.traits:
            return None
        data = []
        for v in inputs:
            if v is None:
                return None
            d = v.data
            if d is None or not d.is_cpu:
                return None
            data.append(d)
        try:
            return self.constant(self.fold_data(opdef, prepared, data))
        except NotConstant:
            return None  # the general path runs it again and reports the failure as it words it

    def _fold(self, opdef, inputs: list, data: list, attrs: dict, multi: bool, prepared: dict | None = None):
        """``opdef`` evaluated now on the constants ``data`` (of ``inputs``): new detached constants, or
        GuardFailed when a result must not be used (:func:`_fold_problem`). ``prepared``: as ``emit_op``'s."""
        if prepared is not None:
            attrs = prepared
        else:  # the prepared attributes are read by the op only; the operand types matter only to a canonicalization
            in_types = None if opdef.canonicalize is None else [None if v is None else v.type for v in inputs]
            attrs = opdef.prepare_attrs(attrs, in_types, where=opdef.name, shared=True)
        data, out = self._evaluate(opdef, data, attrs)
        if len(out) != 1:
            if not multi:
                raise self.error(f"{opdef.name} has {len(out)} outputs: pick one with `[i]`")
            for t in out:
                problem = _fold_problem(opdef, data, attrs, t)
                if problem is not None:
                    raise GuardFailed(problem)
            return tuple(detached_constant(t) for t in out)
        (t,) = out
        problem = _fold_problem(opdef, data, attrs, t)
        if problem is not None:
            raise GuardFailed(problem)
        v = detached_constant(t)
        return (v,) if multi else v

    @cython.locals(v=Value)
    def _check_available(self, inputs: list[Value | None]) -> None:
        """With several roots the replacement goes before the earliest one: an operand computed after
        that point (inside a later root's pattern) cannot reach it, and the match is abandoned."""
        here = self.graph.position(self.root)
        for v in inputs:
            if v is not None and v.producer is not None and self.graph.position(v.producer) > here:
                raise GuardFailed(f"%{v.name} is computed after %{self.root.name}, where the replacement goes")

    @cython.locals(v=Value)
    def name_result(self, v: Value) -> Value:
        if v.data is not None and not v.name:
            self._adopt(v, f"{self.root.name}.const")
        return v

    @cython.locals(v=Value)
    def _adopt(self, v: Value, name: str) -> None:
        """Name a constant folded by this replacement (checked by _fold_problem) as it enters the graph, and put
        it on an accelerator graph's device (a literal is made on the CPU)."""
        if not self.on_host:  # on the host fold_device gives None: the constant stays where it is
            v.data = to_device(v.data, fold_device([], self.device))
        v.name = self.graph.unique_name(name)

    @cython.locals(node=Node)
    def rollback(self) -> None:
        """Remove the nodes a replacement built (it was abandoned)."""
        for node in reversed(self.new_nodes):
            if node.graph is self.graph and not any(o.num_uses for o in node.outputs):
                self.graph.erase_node(node)
        self.new_nodes.clear()

    # -- builtins that need the graph -------------------------------------------------
    def fold_node(self, node: Node) -> list[Value]:
        """Every output of ``node``, evaluated now on its constant operands."""
        if any(v is not None and v.data is None for v in node.inputs):
            raise self.error(
                f"fold() needs constant operands; {node.name} reads a computed value",
                hint="guard the rule with foldable(y)",
            )
        opdef = get_op(node.op)
        try:
            _, outs = self._evaluate(opdef, [None if v is None else v.data for v in node.inputs], node.attrs)
        except RuntimeError as e:
            raise self.error(f"evaluating {node.name} failed: {str(e).splitlines()[0]}") from None
        return [detached_constant(t) for t in outs]

    def fold(self, v: Value) -> Value:
        if v is None or v.producer is None:
            raise self.error("fold() takes the output of a matched node")
        return self.fold_node(v.producer)[v.output_index]

    def find_duplicate(self, v: Value | None) -> Value | None:
        """The same output of an earlier node computing the same op, operands and attributes."""
        if v is None or v.producer is None:
            return None
        node = v.producer
        if not get_op(node.op).has_trait("pure"):
            return None
        first = next((x for x in node.inputs if x is not None), None)
        if first is None:
            return None
        position = self.graph.position(node)
        for use in first.uses:
            other = use.node
            if (
                other is not node
                and other.op == node.op
                and other.inputs == node.inputs
                and other.attrs == node.attrs
                and len(other.outputs) == len(node.outputs)
                and self.graph.position(other) < position
            ):
                return other.outputs[v.output_index]
        return None
