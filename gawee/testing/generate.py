"""Derive examples from a rule's own text: a minimal graph whose root matches the rule's pattern.

The pattern is instantiated bottom-up. Each op node asks its OpDef's sampler for
valid operand types and attributes given what is already fixed (operands built by
inner patterns, variables bound earlier, attribute literals). Leaves become graph
inputs or constants; the guard's own atoms steer the choices (``const(w)`` makes w
a constant, ``per_channel(c, y)`` shapes c per channel of y, ``duplicate(y)`` builds
a twin node), each only most of the time, so that guard-false draws also occur.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gawee.dsl import ast as A
from gawee.dsl.compiler import Rule
from gawee.dsl.matcher import AttrList, AttrLit, AttrVar, LitM, OpM, VarM
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node, Value
from gawee.ir.symbolic import has_symbols
from gawee.ir.types import DType, Layout, TensorType
from gawee.numerics import fill as fill_style
from gawee.ops import OPAQUE, all_ops, get_op
from gawee.ops import sampling as S
from gawee.ops.base import REQUIRED
from gawee.testing.values import fill_class, is_class

FLOAT_DTYPES = [DType.f32, DType.f32, DType.f32, DType.f32, DType.f16, DType.bf16, DType.f64]
"""Dtype mix of the drawn examples (float32 most of the time)."""


STYLES = ["normal", "awkward", "ints", "wide"]
"""Styles of leaf data: wide is normal times a power of ten up to 1e4 (activations past relu6's 6)."""

CONST_STYLES = ["normal", "awkward", "ints", "wide", "special", "special", "special1", "special1"]
"""Styles of constants with no finite/positive hint: special draws from SPECIAL (the dtype's extremes)."""

FINITE_STYLES = ["normal", "awkward", "ints", "wide", "extreme", "extreme1"]
"""Styles of constants the guard wants finite: extreme draws from the finite part of SPECIAL."""

SMALL_STYLES = ["unit", "normal"]
"""Styles of constants the guard wants small (`reassociable(a, b)`): no wide or extreme draws."""


LARGE_SHARE = 0.25
"""Share of drawn examples that are large (see DataDraw.large)."""

LARGE_SIZE = 16
LARGE_RANK = 6


class DataDraw:
    """Adapts a hypothesis ``data`` object to the sampler protocol (gawee.ops.sampling.Draw)."""

    def __init__(self, data, dtype: DType, hints: Hints | None = None):
        from hypothesis import strategies as st

        self._data = data
        self._st = st
        self.dtype = dtype
        self.shapes: list[tuple[int, ...]] = []
        """Shapes of the example's tensors so far (a reshape may draw one of them: unflattening)."""
        self.wanted_sizes = sorted(hints.sizes) if hints is not None else []
        """Sizes the guard compares dims with (`x.shape[1] >= 5`): a size draw picks one of them now and then."""
        self.wanted_ranks = sorted(hints.rank_values) if hints is not None else []
        self.large = self.boolean(LARGE_SHARE)
        """A large instance: sizes up to LARGE_SIZE and ranks up to LARGE_RANK (within sampling.MAX_ELEMENTS)."""

    def size(self, lo: int, hi: int) -> int:
        wanted = [n for n in self.wanted_sizes if n >= lo]
        if wanted and self.boolean(0.3):
            return self.choice(wanted)
        return self.integers(lo, max(hi, LARGE_SIZE) if self.large else hi)

    def rank(self, lo: int, hi: int) -> int:
        wanted = [n for n in self.wanted_ranks if n >= lo]
        if wanted and self.boolean(0.3):
            return self.choice(wanted)
        return self.integers(lo, max(hi, LARGE_RANK) if self.large else hi)

    def integers(self, lo: int, hi: int) -> int:
        if hi < lo:
            raise S.Reject(f"no integer in [{lo}, {hi}]")
        return self._data.draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        options = list(options)
        if not options:
            raise S.Reject("nothing to choose from")
        return self._data.draw(self._st.sampled_from(options))

    def boolean(self, p: float = 0.5) -> bool:
        # True with probability p, as an integer threshold placed so that shrinking the integer
        # towards 0 shrinks the answer towards False (an input rather than a constant, no cancel mode)
        return self._data.draw(self._st.integers(0, 99)) >= 100 - round(p * 100)

    def floats(self, lo: float, hi: float) -> float:
        return self._data.draw(self._st.sampled_from([0.0, 1.0, lo, hi, (lo + hi) / 2, lo + (hi - lo) / 3]))


@dataclass
class Leaf:
    name: str
    value: Value
    style: str
    """How its values are drawn: normal, awkward, positive, ints or cancel:i (see gawee.numerics.CANCEL_MAGNITUDE);
    abs- before any of them for operands that must be nonnegative."""


@dataclass
class Example:
    """One drawn instance: a graph whose ``root`` matches the rule, plus how to fill its data."""

    graph: Graph
    root: Node
    leaves: list[Leaf] = field(default_factory=list)
    data_seed: int = 0
    dtype: DType = DType.f32
    bindings: dict[str, Value | None] = field(default_factory=dict)
    """The pattern's variables: name -> the Value of this graph it stands for."""

    def inputs(self, nonfinite: bool = True) -> list[torch.Tensor]:
        """Input data (reproducible); ``nonfinite`` lets awkward inputs hold inf and nan."""
        gen = torch.Generator().manual_seed(self.data_seed)
        styles = {id(leaf.value): leaf.style for leaf in self.leaves}
        return [
            in_layout(fill(v.type, styles.get(id(v), "normal"), gen, nonfinite=nonfinite), v.type.layout)
            for v in self.graph.inputs
        ]


def in_layout(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``x`` stored in ``layout`` (channels-last applies to 4-D tensors only)."""
    return x.contiguous(memory_format=torch.channels_last) if layout is Layout.channels_last and x.dim() == 4 else x


def fill(t: TensorType, style: str, gen: torch.Generator, nonfinite: bool = False) -> torch.Tensor:
    """Random data of type ``t`` in a style (see Leaf.style): a boundary class of values
    (gawee.testing.values) or one of gawee.numerics.fill's styles."""
    if is_class(style) and t.dtype is not DType.bool and not t.dtype.is_complex:
        return fill_class(t, style, gen, nonfinite=nonfinite)
    return fill_style(t, style, gen, nonfinite)


# -- hints from the guard ---------------------------------------------------------------
@dataclass
class Hints:
    const: set[str] = field(default_factory=set)
    maybe_absent: set[str] = field(default_factory=set)
    foldable: set[str] = field(default_factory=set)
    duplicate: set[str] = field(default_factory=set)
    shared: set[str] = field(default_factory=set)
    """the root's name where the guard wants it read more than once (`not single_use(c)`): returned twice."""
    along: dict[str, tuple[str, int]] = field(default_factory=dict)
    """c -> (y, dim): c should broadcast against y along dim only."""
    same: dict[str, str] = field(default_factory=dict)
    positive: set[str] = field(default_factory=set)
    finite: set[str] = field(default_factory=set)
    small: set[str] = field(default_factory=set)
    """constants the guard wants of small magnitude (`reassociable(a, b)`)."""
    values: dict[str, list[float]] = field(default_factory=dict)
    """c -> numbers the guard compares c's elements with (`all_equal(c, 0.5)`, `value(c) == 1`)."""
    attr_values: dict[str, list[float]] = field(default_factory=dict)
    """attribute variable -> values that satisfy a comparison with a literal (`lo <= -1`, `s < 0`)."""
    lengths: dict[str, list[int]] = field(default_factory=dict)
    """list attribute variable -> lengths the guard asks for (`len(s) == 3`)."""
    zeros: set[str] = field(default_factory=set)
    """list attribute variables the guard wants all zero (`all_zero(p)`)."""
    ranks: dict[str, int] = field(default_factory=dict)
    """leaf -> the rank the guard asks for (`w.rank == 1`)."""
    unit_dims: dict[str, set[int]] = field(default_factory=dict)
    """leaf -> dims the guard wants of size 1 (`m.shape[0] == 1`: a bias the same for every batch)."""
    dim_values: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    """leaf -> dim -> sizes that satisfy the guard's comparison of that dim with a number (`x.shape[2] >= 7`)."""
    sizes: set[int] = field(default_factory=set)
    """Every size the guard compares a dim with (`y.shape[-1] >= 5`): size draws pick them now and then."""
    rank_values: set[int] = field(default_factory=set)
    """Every rank the guard compares a rank with (`x.rank == 5`, `x.rank >= 5`)."""
    ops: dict[str, list[str]] = field(default_factory=dict)
    """y -> ops to pick for the `_(...)` bound to y (from `op(y) in {...}`)."""
    dtypes: list[str] = field(default_factory=list)
    """dtypes the guard asks for (`x.dtype in {i32, i64}`): the example's dtype is drawn from them."""
    shapes: dict[str, A.Expr] = field(default_factory=dict)
    """y -> the expression the guard equates with y's shape (`y.shape == x.shape`,
    `r.shape == [k.shape[0], k.shape[1] * e.shape[2], k.shape[2]]`): an op bound to y whose output
    shape is a free attribute (reshape's `shape`, expand's `size`) is given its value when the values it
    reads are drawn already."""
    layouts: dict[str, str] | None = None
    """leaf -> the layout the guard asks for (`x.layout == "channels_last"`, `layout(x) == ...`); not None
    when the guard mentions layouts at all: then every 4-D leaf is drawn in either layout."""


def hints_of(rule: Rule) -> Hints:
    h = Hints()
    guard = rule.ast.guard if rule.ast is not None else None
    if guard is not None:
        _collect(guard, h, positive=True)
    for m in [rule.matcher, *rule.extra_roots]:
        _literal_sizes(m, h)
    return h


def _literal_sizes(m: OpM, h: Hints) -> None:
    """Integer attribute literals of the pattern past the usual sizes (`slice(x, end=4)`, `kernel_size=[5, 5]`)
    are sizes worth drawing, with the next one: where a bound in the pattern starts to cut."""
    for am in m.attrs.values():
        items = am.items if isinstance(am, AttrList) else [am]
        for x in items:
            v = x.value if isinstance(x, AttrLit) else None
            if isinstance(v, int) and not isinstance(v, bool) and 4 <= v <= 16:
                h.sizes |= {v, v + 1}
    for sub in m.operands:
        if isinstance(sub, OpM):
            _literal_sizes(sub, h)


def _names(args) -> list[str]:
    return [a.value.name for a in args if a.value is not None and isinstance(a.value, A.EName)]


def _collect(e: A.Expr, h: Hints, positive: bool) -> None:
    if isinstance(e, A.EBool):
        _collect(e.left, h, positive)
        _collect(e.right, h, positive)
        if e.op == "or":  # `const(b) or absent(b)`: b may go either way
            for n in h.const & _mentioned(e):
                h.maybe_absent.add(n)
    elif isinstance(e, A.ENot):
        _collect(e.operand, h, not positive)
    elif (
        isinstance(e, A.EIn)
        and positive
        and not e.negate
        and isinstance(e.item, A.ECall)
        and e.item.func == "op"
        and _names(e.item.args)
    ):
        h.ops[_names(e.item.args)[0]] = [c.value for c in e.choices.items if isinstance(c, A.ELit)]
    elif isinstance(e, A.EIn) and positive and not e.negate and isinstance(e.item, A.EAttr) and e.item.name == "dtype":
        h.dtypes += [c.name for c in e.choices.items if isinstance(c, A.EName)]
    elif isinstance(e, A.ECompare) and _layout_of(e.left) is not None:
        h.layouts = h.layouts if h.layouts is not None else {}
        if isinstance(e.right, A.ELit) and isinstance(e.right.value, str) and (e.op == "==") == positive:
            h.layouts[_layout_of(e.left)] = e.right.value
    elif (
        isinstance(e, A.ECompare)
        and positive
        and e.op == "=="
        and isinstance(e.left, A.EAttr)
        and e.left.name == "dtype"
        and isinstance(e.right, A.EName)
    ):
        h.dtypes.append(e.right.name)
    elif isinstance(e, A.ECall) and not positive and e.func == "single_use":
        h.shared.update(_names(e.args))
    elif isinstance(e, A.ECall) and positive:
        names = _names(e.args)
        if e.func == "const":
            h.const.update(names)
        elif e.func == "absent":
            h.maybe_absent.update(names)
        elif e.func == "foldable":
            h.foldable.update(names)
        elif e.func == "duplicate":
            h.duplicate.update(names)
        elif e.func == "per_channel" and len(names) == 2:
            h.along[names[0]] = (names[1], 1)
        elif e.func == "along" and len(names) == 2 and isinstance(e.args[2].value, A.ELit):
            h.along[names[0]] = (names[1], int(e.args[2].value.value))
        elif e.func == "same_type" and len(names) == 2:
            h.same[names[1]] = names[0]
            h.same[names[0]] = names[1]
        elif e.func == "positive":
            h.positive.update(names)
        elif e.func == "all_zero":
            h.zeros.update(names)
        elif e.func == "finite":  # a guard's finite() asks a constant
            h.const.update(names)
            h.finite.update(names)
        elif e.func == "reassociable":
            h.const.update(names)
            h.finite.update(names)
            h.small.update(names)
        elif e.func == "all_equal" and len(names) == 1 and _number(e.args[1].value) is not None:
            h.values.setdefault(names[0], []).append(_number(e.args[1].value))
    elif isinstance(e, A.ECompare) and positive:
        if e.op == "==":
            for a, b in ((e.left, e.right), (e.right, e.left)):
                if isinstance(a, A.EAttr) and a.name == "shape" and isinstance(a.obj, A.EName):
                    h.shapes.setdefault(a.obj.name, b)
        flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
        for a, b, op in ((e.left, e.right, e.op), (e.right, e.left, flipped.get(e.op, e.op))):
            n = _number(b)
            if n is None:
                continue
            if isinstance(a, A.ECall) and a.func == "value" and _names(a.args) and op in ("==", "<=", ">="):
                h.values.setdefault(_names(a.args)[0], []).append(n)
            elif isinstance(a, A.ECall) and a.func == "len" and _names(a.args) and op == "==":
                h.lengths.setdefault(_names(a.args)[0], []).append(int(n))
            elif isinstance(a, A.EAttr) and a.name == "rank" and isinstance(a.obj, A.EName):
                if op == "==":
                    h.ranks[a.obj.name] = int(n)
                h.rank_values |= {int(n) + k for k in SATISFY.get(op, [0]) if 0 <= int(n) + k <= 6}
            elif n == 1 and op == "==" and _shape_index(a) is not None:
                name, i = _shape_index(a)
                h.unit_dims.setdefault(name, set()).add(i)
            elif _shape_index(a) is not None and op != "!=":
                name, i = _shape_index(a)
                values = [int(n) + k for k in SATISFY[op] if int(n) + k >= 0]
                h.dim_values.setdefault(name, {}).setdefault(i, []).extend(values)
                h.sizes |= set(values)
            elif isinstance(a, A.EName) and op != "!=":
                h.attr_values.setdefault(a.name, []).extend(n + k for k in SATISFY[op])


SATISFY = {"==": [0], "<=": [0, -1], ">=": [0, 1], "<": [-1, -2], ">": [1, 2]}
"""Offsets from n of values that satisfy `v op n` (the boundary first)."""


def _shape_index(e: A.Expr) -> tuple[str, int] | None:
    """``(x, i)`` of ``x.shape[i]`` with a literal ``i``, else None."""
    if isinstance(e, A.EIndex) and isinstance(e.obj, A.EAttr) and e.obj.name == "shape":
        i = _number(e.index)
        if isinstance(e.obj.obj, A.EName) and i is not None and i == int(i):
            return e.obj.obj.name, int(i)
    return None


def _layout_of(e: A.Expr) -> str | None:
    """``x`` of ``x.layout`` or ``layout(x)``, else None."""
    if isinstance(e, A.EAttr) and e.name == "layout" and isinstance(e.obj, A.EName):
        return e.obj.name
    if isinstance(e, A.ECall) and e.func == "layout" and _names(e.args):
        return _names(e.args)[0]
    return None


def _number(e) -> float | None:
    """The value of a numeric literal (``-1`` included), else None."""
    if isinstance(e, A.ENeg):
        inner = _number(e.operand)
        return None if inner is None else -inner
    if isinstance(e, A.ELit) and isinstance(e.value, (int, float)) and not isinstance(e.value, bool):
        return float(e.value)
    return None


def _mentioned(e: A.Expr) -> set[str]:
    out: set[str] = set()
    if isinstance(e, A.EName):
        out.add(e.name)
    for v in vars(e).values():
        if isinstance(v, A.Node):
            out |= _mentioned(v)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, A.Node):
                    out |= _mentioned(x)
    return out


# -- generation --------------------------------------------------------------------------
_ANY_OPS: list[str] | None = None

SHAPE_ATTRS = ("shape", "size")
"""Attributes that are an op's output shape (reshape's ``shape``, expand's ``size``): steered by `y.shape == E`."""


def _sampleable_ops() -> list[str]:
    global _ANY_OPS
    if _ANY_OPS is None:
        _ANY_OPS = sorted(n for n, op in all_ops().items() if op.sample is not None and n != OPAQUE)
    return _ANY_OPS


class Generator:
    """Builds one Example for ``rule`` from the choices of ``draw``. Raises S.Reject if the draw is invalid."""

    def __init__(
        self, rule: Rule, draw: DataDraw, hints: Hints, data: S.Draw | None = None, value_class: str | None = None
    ):
        self.rule = rule
        self.draw = draw
        """Where the structure comes from: operand types, attributes, absent operands, ops of `_(...)`."""
        self.data = data if data is not None else draw
        """Where the data comes from: leaf styles, constant seeds, the cancel mode (``draw`` unless given)."""
        self.scoped = data is not None
        """Small-scope enumeration (gawee.testing.scope): every hint of the guard is followed, every leaf
        the guard does not ask to be constant is a graph input, and only structure is drawn from ``draw``."""
        self.hints = hints
        self.value_class = value_class
        """A boundary class of values (gawee.testing.values) every leaf's data is drawn from, where the guard
        asks for nothing else (a `positive(c)` or `all_equal(c, v)` leaf keeps its own)."""
        self.graph = Graph(f"check_{rule.name}")
        self.env: dict[str, Value | None] = {}
        self.attr_env: dict[str, Any] = {}
        self.bound_before: set[str] = set()
        self.leaves: list[Leaf] = []
        self.partial_guard: list[tuple[frozenset[str], Any]] = []
        """Guard conjuncts decided by structure alone, with the names each reads (set when enumerating):
        each is evaluated as soon as its names are built, and a false one prunes the draw (``prune``)."""
        self._decided: set[int] = set()
        self.all_const = False
        draw = self.data
        self.cancel = draw.boolean(0.4)
        """Every float leaf in "cancel" style (see gawee.numerics.CANCEL_MAGNITUDE)."""
        self.cancel_run: int | None = draw.integers(0, 2) if self.cancel and draw.boolean(0.5) else None
        """When set, cancel values go M, -M, 0.3, M, ... in leaf (operand) order from this offset: the
        large pair cancels and a small term follows, the order that exposes reassociation."""
        self.steer = self.scoped or draw.boolean(0.75)
        """Follow the guard's const/absent hints for all leaves at once (a guard naming five constants
        then holds on most draws); otherwise each leaf goes its own way, so guard-false draws occur."""

    def example(self) -> Example:
        m = self.rule.matcher
        self.all_const = any(v == m.bind for v in self.hints.foldable)
        out = self.op(m)
        root = out.producer
        outputs = list(root.outputs)
        if m.bind in self.hints.duplicate and self.hinted(0.85):
            twin = self.graph.create_node(root.op, list(root.inputs), root.attrs, before=root)
            outputs = list(twin.outputs) + outputs
        if m.bind in self.hints.shared and self.hinted(0.85):  # a second use of the root: a graph output too
            outputs.append(root.outputs[0])
        for extra in self.rule.extra_roots:  # later roots share the variables bound so far
            outputs.append(self.op(extra))
        self.graph.set_outputs(outputs)
        seed = self.data.integers(0, 2**16)
        return Example(self.graph, root, self.leaves, seed, self.draw.dtype, dict(self.env))

    def hinted(self, p: float) -> bool:
        """Whether to follow a hint of the guard (with probability ``p``; always when enumerating)."""
        return True if self.scoped else self.draw.boolean(p)

    # -- one op pattern ------------------------------------------------------------------
    def op(self, m: OpM, want: TensorType | None = None) -> Value:
        """Build the op pattern ``m`` (its inner patterns first) and return its output. ``want``: the type
        the enclosing op would like this output to have (an elementwise op then takes its shape)."""
        if m.op is not None:
            op = m.op
        elif m.bind in self.hints.ops and self.hinted(0.9):
            op = self.draw.choice(self.hints.ops[m.bind])
        else:
            op = self.draw.choice(_sampleable_ops())
        opdef = get_op(op)
        n_slots = len(m.operands) if m.op is not None else len(opdef.operands)
        if opdef.variadic:
            fixed = len(opdef.operands) - 1
            extra = self.draw.integers(0, 1) if m.rest is not False else 0
            n_slots = max(len(m.operands), fixed) + extra if m.op is not None else fixed + self.draw.integers(1, 2)
        else:
            n_slots = len(opdef.operands)
        if len(m.operands) > n_slots:  # `_(a, b, ...)` drew an op of fewer operands
            raise S.Reject(f"{op} takes {n_slots} operands, the pattern gives {len(m.operands)}")
        matchers = list(m.operands) + [None] * (n_slots - len(m.operands))
        sampler = opdef.sample or (lambda d, sl, a: _fallback(d, sl, a, opdef))
        wants = self.demands(m, opdef, matchers, sampler)
        slots: list[Any] = []
        built: dict[int, Value] = {}
        for i, sub in enumerate(matchers):
            if isinstance(sub, OpM):
                built[i] = self.op(sub, wants.get(i))
                slots.append(built[i].type)
            else:
                slots.append(self.slot(m, sub))
        free = [i for i, slot in enumerate(slots) if slot is S.FREE]
        if want is not None and opdef.has_trait("elementwise") and free and S.first_fixed(slots) is None:
            slots[free[0]] = TensorType(want.shape, self.draw.dtype)  # the enclosing op's operand, top-down
        fixed = self.fixed_attrs(m, opdef)
        reason = ""
        # redraw until lists fit the pattern (dims=[d]) and the op accepts the draw; an enumeration tries once
        # (the other draws are other branches of its tree)
        for attempt in range(1 if self.scoped else 8):
            try:
                types, attrs = sampler(self.draw, slots, fixed)
            except S.Reject as e:
                reason = str(e)
                continue
            if not self.lists_fit(m, attrs):
                reason = "attribute lists of the wrong length"
                continue
            if self.steer and attempt < 5 and not self.lengths_fit(m, attrs):
                continue  # `len(s) == 3` in the guard: prefer lists of that length
            attrs = self.shape_from_guard(m, matchers, types, attrs, fixed)
            for name, am in m.attrs.items():  # `all_zero(p)` in the guard: zeros, half of the time
                value = attrs.get(name)
                wanted = isinstance(am, AttrVar) and am.var in self.hints.zeros and am.var not in self.attr_env
                if wanted and isinstance(value, tuple) and self.hinted(0.5):
                    attrs = {**attrs, name: (0,) * len(value)}
            try:
                opdef.infer_types(list(types), opdef.prepare_attrs(attrs, list(types)))
            except GaweeError as e:
                reason = e.message if hasattr(e, "message") else str(e)
                continue
            break
        else:
            raise S.Reject(f"{op}: {reason}")
        types = self.apply_shape_hints(matchers, types)
        attrs = self.bind_attrs(m, attrs)
        inputs: list[Value | None] = []
        for i, (sub, t) in enumerate(zip(matchers, types)):
            if i in built:
                inputs.append(built[i])
            elif isinstance(sub, VarM) and sub.name in self.env:
                inputs.append(self.env[sub.name])
            else:
                v = self.leaf(sub, t, opdef, i)
                inputs.append(v)
        try:
            node = self.graph.create_node(op, inputs, attrs)
        except GaweeError as e:
            raise S.Reject(str(e)) from None
        if m.output is not None:  # `split(...)[i]`
            if not -len(node.outputs) <= m.output < len(node.outputs):
                raise S.Reject(f"{op} has no output {m.output}")
            out = node.outputs[m.output]
        elif len(node.outputs) != 1 and not m.any_outputs:
            raise S.Reject("multi-output node")
        else:
            out = node.outputs[0]
        self.draw.shapes += [v.type.shape for v in [*node.inputs, out] if v is not None]
        want = self.hints.ranks.get(m.bind) if m.bind is not None else None
        if want is not None and out.type.rank != want and self.steer:
            raise S.Reject(f"the guard wants {m.bind}.rank == {want}")  # a node's rank follows its operands: redraw
        if m.bind is not None:
            self.env[m.bind] = out
        self.bind_canonical(m, node.attrs)
        self.prune(node)
        return out

    def prune(self, node: Node) -> None:
        """Raise S.Reject when a conjunct of ``partial_guard`` whose names are all built is false: no
        completion of this draw can satisfy the guard (constraint propagation for enumeration)."""
        if not self.partial_guard:
            return
        from gawee.dsl.library import GuardFailed
        from gawee.rewrite.context import RewriteContext

        env = {**self.attr_env, **self.env}
        for i, (names, part) in enumerate(self.partial_guard):
            if i in self._decided or not names <= env.keys():
                continue
            self._decided.add(i)
            try:
                ok = bool(part(RewriteContext(self.graph, self.rule, node, env)))
            except (GaweeError, GuardFailed, LookupError, TypeError, ValueError, AttributeError):
                continue  # undecided here: the whole guard decides on the finished instance
            if not ok:
                raise S.Reject("a conjunct of the guard is false for the structure drawn so far")

    def slot(self, m: OpM, sub) -> Any:
        """What an operand that is not an inner pattern leaves the sampler: the type of a variable bound
        already, ABSENT (an absent variable, `none`, an operand the pattern omits), or FREE."""
        if isinstance(sub, VarM) and sub.name in self.env:
            v = self.env[sub.name]
            return S.ABSENT if v is None else v.type
        if (isinstance(sub, LitM) and sub.value is None) or (sub is None and m.rest is False and m.op is not None):
            return S.ABSENT
        return S.FREE

    def demands(self, m: OpM, opdef, matchers, sampler) -> dict[int, TensorType]:
        """Operand types the op would draw where its operands are inner patterns (most of the time): an
        inner elementwise op then builds that shape, so `conv2d(mul(x, c), w)` gets a mul of a
        convolution's input, where building bottom-up alone draws a mul of any rank."""
        inner = [sub for sub in matchers if isinstance(sub, OpM) and sub.op is not None]
        if not any(get_op(sub.op).has_trait("elementwise") for sub in inner) or not self.hinted(0.8):
            return {}  # only an elementwise inner op takes the demand (other draws are left as they were)
        slots = [S.FREE if isinstance(sub, OpM) else self.slot(m, sub) for sub in matchers]
        try:
            types, _ = sampler(self.draw, slots, self.fixed_attrs(m, opdef))
        except (S.Reject, GaweeError):
            return {}
        return {i: t for i, (sub, t) in enumerate(zip(matchers, types)) if isinstance(sub, OpM) and t is not None}

    def shape_from_guard(self, m: OpM, matchers, types, attrs: dict[str, Any], fixed) -> dict[str, Any]:
        """`y.shape == E` in the guard and y's output shape is a free attribute (reshape's `shape`, expand's
        `size`): most steered draws (4 in 5) give it E's value, when E reads only values drawn already
        (bound earlier, operands of this op, or y's own drawn dims: `e.shape == [k.shape[0], e.shape[1]]`
        keeps the drawn dim 1 and takes dim 0 from k)."""
        want = self.hints.shapes.get(m.bind) if m.bind is not None else None
        name = next((n for n in SHAPE_ATTRS if n in attrs), None)
        if want is None or name is None or name in fixed or not self.steer or not self.hinted(0.8):
            return attrs
        operands = {
            sub.name: t for sub, t in zip(matchers, types) if isinstance(sub, VarM) and isinstance(t, TensorType)
        }
        drawn = attrs[name]
        if isinstance(drawn, tuple) and all(isinstance(d, int) and d >= 0 for d in drawn) and types:
            operands[m.bind] = TensorType(drawn, types[0].dtype)  # y's own dims in E: the drawn ones
        shape = self.shape_value(want, operands)
        ok = isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)
        return {**attrs, name: shape} if ok else attrs

    def shape_value(self, e: A.Expr, operands: dict[str, TensorType]) -> Any:
        """The value of a guard's shape arithmetic (names, `.shape`, `.rank`, indexing, lists, + - * //)
        over what is drawn so far; None when it reads anything else or anything not drawn yet."""
        if isinstance(e, A.ELit) and isinstance(e.value, int) and not isinstance(e.value, bool):
            return e.value
        if isinstance(e, A.EName):
            if e.name in operands:
                return operands[e.name]
            if self.env.get(e.name) is not None:
                return self.env[e.name].type
            return self.attr_env.get(e.name)
        if isinstance(e, A.EAttr) and e.name in ("shape", "rank"):
            t = self.shape_value(e.obj, operands)
            if not isinstance(t, TensorType) or has_symbols(t.shape):
                return None
            return tuple(t.shape) if e.name == "shape" else t.rank
        if isinstance(e, A.EIndex):
            obj, i = self.shape_value(e.obj, operands), self.shape_value(e.index, operands)
            ok = isinstance(obj, tuple) and isinstance(i, int) and -len(obj) <= i < len(obj)
            return obj[i] if ok else None
        if isinstance(e, A.EList):
            items = [self.shape_value(x, operands) for x in e.items]
            return tuple(items) if all(isinstance(x, int) for x in items) else None
        if isinstance(e, A.ENeg):
            v = self.shape_value(e.operand, operands)
            return -v if isinstance(v, int) else None
        if isinstance(e, A.EBin) and e.op in ("+", "-", "*", "//"):
            a, b = self.shape_value(e.left, operands), self.shape_value(e.right, operands)
            if not (isinstance(a, int) and isinstance(b, int)) or (e.op == "//" and b == 0):
                return None
            return a + b if e.op == "+" else a - b if e.op == "-" else a * b if e.op == "*" else a // b
        return None

    def bind_canonical(self, m: OpM, attrs: dict[str, Any]) -> None:
        """Attribute variables hold what the matcher will see: the node's canonical values (dims
        non-negative), not the drawn spelling (``dim=-1``)."""
        for name, am in m.attrs.items():
            value = attrs.get(name)
            if isinstance(am, AttrVar) and am.var not in self.bound_before:
                self.attr_env[am.var] = value
            elif isinstance(am, AttrList) and isinstance(value, tuple) and len(value) == len(am.items):
                for x, v in zip(am.items, value):
                    if isinstance(x, AttrVar) and x.var not in self.bound_before:
                        self.attr_env[x.var] = v

    def fixed_attrs(self, m: OpM, opdef) -> dict[str, Any]:
        attrs: dict[str, Any] = dict(m.defaults)
        for name, am in m.attrs.items():
            if isinstance(am, AttrLit):
                attrs[name] = am.value
            elif isinstance(am, AttrVar) and am.var in self.attr_env:
                attrs[name] = self.attr_env[am.var]
            elif isinstance(am, AttrVar) and am.var in self.hints.attr_values and self.hinted(0.6):
                # a value the guard compares the variable with (`lo <= -1`): drawn as the op's kind
                kind = opdef.attr(name).kind.rstrip("?") if opdef.attr(name) else "any"
                value = self.draw.choice(self.hints.attr_values[am.var])
                if kind in ("int", "ints") or (kind == "scalar" and value == int(value) and self.draw.boolean()):
                    value = int(value)
                if kind in ("int", "float", "scalar"):
                    attrs[name] = value
            elif isinstance(am, AttrList) and all(
                isinstance(x, AttrLit) or (isinstance(x, AttrVar) and x.var in self.attr_env) for x in am.items
            ):
                attrs[name] = tuple(x.value if isinstance(x, AttrLit) else self.attr_env[x.var] for x in am.items)
            elif (
                isinstance(am, AttrList)
                and any(isinstance(x, AttrVar) and x.var in self.hints.attr_values for x in am.items)
                and all(
                    isinstance(x, AttrLit)
                    or (isinstance(x, AttrVar) and (x.var in self.attr_env or x.var in self.hints.attr_values))
                    for x in am.items
                )
                and self.hinted(0.6)
            ):  # `kernel_size=[k, k] where k >= 4`: the items the guard compares with a number take such values
                picked = dict(self.attr_env)
                for x in am.items:
                    if isinstance(x, AttrVar) and x.var not in picked:
                        picked[x.var] = int(self.draw.choice(self.hints.attr_values[x.var]))
                attrs[name] = tuple(x.value if isinstance(x, AttrLit) else picked[x.var] for x in am.items)
        return attrs

    def lengths_fit(self, m: OpM, attrs: dict[str, Any]) -> bool:
        for name, am in m.attrs.items():
            want = self.hints.lengths.get(am.var) if isinstance(am, AttrVar) else None
            value = attrs.get(name)
            if want and am.var not in self.attr_env and isinstance(value, tuple) and len(value) not in want:
                return False
        return True

    @staticmethod
    def lists_fit(m: OpM, attrs: dict[str, Any]) -> bool:
        return all(
            isinstance(attrs.get(n), (tuple, list)) and len(attrs[n]) == len(am.items)
            for n, am in m.attrs.items()
            if isinstance(am, AttrList)
        )

    def bind_attrs(self, m: OpM, attrs: dict[str, Any]) -> dict[str, Any]:
        """Bind attribute variables to the drawn values; a variable seen before imposes its value."""
        self.bound_before = set(self.attr_env)
        attrs = dict(attrs)
        for name, am in m.attrs.items():
            value = attrs.get(name)
            if isinstance(am, AttrVar):
                attrs[name] = self.attr_env.setdefault(am.var, value)
            elif isinstance(am, AttrList):
                if not isinstance(value, (tuple, list)) or len(value) != len(am.items):
                    raise S.Reject(f"{name} is not a list of {len(am.items)}")
                items = list(value)
                for k, x in enumerate(am.items):
                    if isinstance(x, AttrVar):
                        items[k] = self.attr_env.setdefault(x.var, items[k])
                attrs[name] = tuple(items)
        return attrs

    def apply_shape_hints(self, matchers, types: list) -> list:
        types = list(types)
        names = [sub.name if isinstance(sub, VarM) else None for sub in matchers]
        for i, name in enumerate(names):
            if name is None or types[i] is None:
                continue
            want = self.hints.ranks.get(name)
            if want is not None and types[i].rank != want and name not in self.env and self.hinted(0.7):
                # `w.rank == 1` in the guard: the trailing dims of another operand (they broadcast against it)
                like = next((t for k, t in enumerate(types) if k != i and t is not None and t.rank >= want), None)
                if like is not None:
                    types[i] = TensorType(like.shape[like.rank - want :], types[i].dtype)
            sized = self.hints.dim_values.get(name, {})
            if sized and name not in self.env and self.hinted(0.8):  # `x.shape[2] >= 7`: solved, not hoped for
                shape = list(types[i].shape)
                for d, values in sized.items():
                    if -len(shape) <= d < len(shape):
                        shape[d] = self.draw.choice(values)
                types[i] = TensorType(tuple(shape), types[i].dtype)
            unit = self.hints.unit_dims.get(name, set())
            if unit and name not in self.env and self.hinted(0.8):  # `m.shape[0] == 1`: it broadcasts there
                shape = list(types[i].shape)
                for d in unit:
                    if -len(shape) <= d < len(shape):
                        shape[d] = 1
                types[i] = TensorType(tuple(shape), types[i].dtype)
            if name in self.hints.along and self.hinted(0.8):
                partner, d = self.hints.along[name]
                y = self._partner_type(partner, types, matchers)
                if y is not None and y.rank:
                    dd = d + y.rank if d < 0 else d
                    if 0 <= dd < y.rank:
                        keep = self.draw.integers(0, dd)  # leading dims dropped
                        shape = tuple(y.shape[dd] if k == dd else 1 for k in range(keep, y.rank))
                        types[i] = TensorType(shape, y.dtype)
            if name in self.hints.same and self.hinted(0.8):
                y = self._partner_type(self.hints.same[name], types, matchers)
                if y is not None:
                    types[i] = y
        return types

    def _partner_type(self, name: str, types, matchers) -> TensorType | None:
        if name in self.env and self.env[name] is not None:
            return self.env[name].type
        for sub, t in zip(matchers, types):
            if isinstance(sub, OpM) and sub.bind == name:
                return t
        return None

    def leaf(self, sub, t: TensorType | None, opdef, index: int) -> Value | None:
        name = sub.name if isinstance(sub, VarM) else None
        if t is None:
            if name is not None:
                self.env[name] = None
            return None
        if isinstance(sub, LitM):
            value = self.graph.constant(torch.full(t.shape, sub.value, dtype=t.dtype.torch), "lit")
            self.leaves.append(Leaf(value.name, value, "literal"))
            return value
        if (
            name is not None
            and name in self.hints.maybe_absent
            and opdef.operands[min(index, len(opdef.operands) - 1)].optional
            and self.draw.boolean(0.6 if self.steer else 0.2)
        ):
            self.env[name] = None
            return None
        hinted = name in self.hints.const
        constant = (
            self.all_const or (hinted and self.steer) or (not self.scoped and self.draw.boolean(0.5 if hinted else 0.2))
        )
        draw = self.data

        def follow(p: float) -> bool:  # a hint about the leaf's values: always followed when enumerating
            return self.scoped or draw.boolean(p)

        hinted_value = self.hints.values.get(name or "")
        if name in self.hints.positive:
            style = "positive" if follow(0.9) else draw.choice(CONST_STYLES)
        elif hinted_value and self.scoped:
            style = "value:" + repr(draw.choice(hinted_value))
        elif self.value_class is not None:  # a boundary class of values (gawee.testing.values)
            style = self.value_class + ("!finite" if name in self.hints.finite or name in self.hints.small else "")
            style += "" if constant else "!input"
        elif not constant:
            style = draw.choice(STYLES)
        elif name in self.hints.small and follow(0.9):
            style = draw.choice(SMALL_STYLES)
        elif name in self.hints.finite:
            style = draw.choice(FINITE_STYLES) if follow(0.9) else "nonfinite1"
        elif hinted_value and draw.boolean(0.8):
            style = "value:" + repr(draw.choice(hinted_value))
        else:
            style = draw.choice(CONST_STYLES)
        small = style in SMALL_STYLES and name in self.hints.small
        # a small constant the guard asks for stays small among cancelling leaves when steered: the rule is then
        # tested where the rest of the sum is huge
        if self.cancel and self.value_class is None and not style.startswith("value:") and not (small and self.steer):
            if self.cancel_run is None:
                style = f"cancel:{draw.integers(0, 2)}"
            else:
                style, self.cancel_run = f"cancel:{self.cancel_run % 3}", self.cancel_run + 1
        if opdef.operands[min(index, len(opdef.operands) - 1)].domain == "nonnegative":
            style = "abs-" + style
        base = name or opdef.operands[min(index, len(opdef.operands) - 1)].name
        if self.hints.layouts is not None and t.rank == 4:  # the guard reads layouts: draw both
            wanted = self.hints.layouts.get(name or "")
            if wanted in Layout._value2member_map_ and self.draw.boolean(0.7 if self.steer else 0.5):
                t = TensorType(t.shape, t.dtype, Layout(wanted))
            else:
                t = TensorType(t.shape, t.dtype, self.draw.choice(list(Layout)))
        if constant:
            gen = torch.Generator().manual_seed(draw.integers(0, 2**16))
            if style.startswith("value:"):  # the value the guard asks for (`all_equal(c, 0.5)`)
                data = torch.full(t.shape, float(style[6:]), dtype=torch.float64).to(t.dtype.torch)
            else:  # constants are not tamed: weights can be huge, tiny, inf or nan (see gawee.numerics.special_values)
                tame = name in self.hints.finite and style != "nonfinite1"  # finite(c): no inf/nan, but 1 in 10
                data = fill(t, style, gen, nonfinite=not tame)
            value = self.graph.constant(in_layout(data, t.layout), base)
        else:
            value = self.graph.add_input(t, base)
        self.leaves.append(Leaf(value.name, value, style))
        if name is not None:
            self.env[name] = value
        return value


def _fallback(draw, slots, attrs, opdef=None):
    """For ops without a sampler: free operands copy the first fixed type; attributes the pattern left
    free are drawn by kind (dims of the first operand for ints, some negative), optional ones may keep
    their default. The generator redraws until the op accepts the result."""
    like = S.first_fixed(slots) or S.tensor(draw)
    attrs = dict(attrs)
    for a in opdef.attrs if opdef is not None else ():
        if a.name not in attrs and (a.default is REQUIRED or draw.boolean(0.5)):
            try:
                attrs[a.name] = S.attr_value(draw, a.kind, like.rank)
            except S.Reject:
                if a.default is REQUIRED:
                    raise
    return [like if s is S.FREE else (None if s is S.ABSENT else s) for s in slots], attrs


def generate(rule: Rule, data, hints: Hints | None = None) -> Example:
    """Draw one Example for ``rule`` from a hypothesis ``data`` object (raises S.Reject)."""
    from hypothesis import strategies as st

    hints = hints or hints_of(rule)
    wanted = [DType(d) for d in hints.dtypes if d in DType._value2member_map_]

    def drawer() -> DataDraw:  # the example's dtype: mostly one the guard asks for, if it names any
        if wanted and data.draw(st.integers(0, 9)) < 8:
            return DataDraw(data, data.draw(st.sampled_from(wanted)), hints)
        return DataDraw(data, data.draw(st.sampled_from(FLOAT_DTYPES)), hints)

    draw = drawer()
    if rule.guard is None or not draw.boolean(STEER_GUARD):
        return Generator(rule, draw, hints).example()
    # Steered: of up to GUARD_TRIES candidates keep the first whose guard holds (the last one else), so
    # that guards naming shapes, ranks or dtypes (`x.rank == 4 and w.shape[2] == 1`) hold on most draws.
    found: Example | None = None
    reason = ""
    # half of the steered draws look further (rare guards); the choice is data, so replays are exact
    tries = GUARD_TRIES * (4 if draw.boolean(0.5) else 1)
    for i in range(tries):
        try:
            found = Generator(rule, draw if i == 0 else drawer(), hints).example()
        except S.Reject as e:
            reason = str(e)
            continue
        if guard_verdict(rule, found)[0]:
            return found
    if found is None:
        raise S.Reject(reason)
    return found


STEER_GUARD = 0.8
"""Share of draws steered towards guard-true candidates; the rest show what the guard excludes."""

GUARD_TRIES = 10


def guard_verdict(rule: Rule, ex: Example) -> tuple[bool | None, list[str]]:
    """(holds, every false conjunct) for the first match at the example's root; (None, []) if it does
    not match.

    Every conjunct is evaluated, not only up to the first false one: counting only the first would
    blame whichever comes first in the text (`const(w) and x.rank == 4 and ...`) for draws where a
    later, rarer one is false as well, and the "most often false" hint would point at the wrong one."""
    from gawee.dsl.library import GuardFailed
    from gawee.dsl.matcher import MatchContext
    from gawee.rewrite.context import RewriteContext
    from gawee.rewrite.driver import match_roots

    env: dict = {}
    for roots in match_roots(rule, ex.root, env, MatchContext()):
        ctx = RewriteContext(ex.graph, rule, roots, env)
        failed = []
        for text, part in rule.guard_parts:
            try:
                ok = bool(part(ctx))
            except (GaweeError, GuardFailed):
                ok = False
            if not ok:
                failed.append(text)
        return not failed, failed
    return None, []


def small(t: torch.Tensor, limit: int = 48) -> str:
    """A tensor as text: whole when small, else a summary."""
    if t.numel() <= limit:
        return str(t.tolist())
    flat = t.flatten().double()
    finite = flat[torch.isfinite(flat)]
    text = f"{t.numel()} values"
    if finite.numel():  # one nan would poison min, max and mean: the finite ones, and a count of the rest
        text += f", finite in [{finite.min().item():.4g}, {finite.max().item():.4g}], mean {finite.mean().item():.4g}"
    counts = [(int(n), what) for n, what in ((flat.isnan().sum(), "nan"), ((flat == math.inf).sum(), "inf"))]
    counts.append((int((flat == -math.inf).sum()), "-inf"))
    return text + "".join(f", {n} {what}" for n, what in counts if n)
