"""OpDef — the one record that says everything gawee knows about an op — and the registry."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

try:
    import cython
except ImportError:  # Cython is optional (the accel extra): the declarations below then do nothing
    from gawee import cython_shim as cython

from gawee.errors import InferenceError, IRError, first_line
from gawee.ir.registry import _REGISTRY, all_ops, get_op, has_op, register  # noqa: F401
from gawee.ir.symbolic import Sym, has_symbols, symbols_of
from gawee.ir.types import DType, Layout, TensorType

TypeList = Sequence[TensorType | None]

REQUIRED = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
"""Default of an attribute that every node must set."""

TRAITS = frozenset(
    {
        "commutative",  # op(a, b, ...) == op(b, a, ...) for the first two operands
        "elementwise",  # out[i] depends on in[i] only (after broadcasting)
        "view",  # output aliases the input: costs no FLOPs and no bytes
        "pure",  # deterministic and side-effect free: may be folded, CSE'd, erased
        "creation",  # makes a tensor from attributes alone (full, arange)
        "multi_output",  # several outputs (split, unbind): rules pick one by index, `split(...)[i]`
        "converts_layout",  # sets its output's memory layout itself (to_layout); see _with_layouts
    }
)


@dataclass(frozen=True)
class Operand:
    """A tensor operand. ``optional`` ones may be absent (None); a ``variadic`` one is last."""

    name: str
    optional: bool = False
    variadic: bool = False
    domain: str | None = None
    """Values the op expects here: "nonnegative" (a variance), or None for any."""


ATTR_KINDS = frozenset({"int", "float", "bool", "str", "ints", "floats", "scalar", "dtype", "any"})


@dataclass(frozen=True)
class Attr:
    """A plain-data attribute. ``kind`` is one of ATTR_KINDS, with a ``?`` suffix if None is allowed."""

    name: str
    kind: str
    default: Any = REQUIRED

    def __post_init__(self):
        if self.kind.rstrip("?") not in ATTR_KINDS:
            raise ValueError(f"attribute {self.name}: unknown kind {self.kind!r}")

    @property
    def nullable(self) -> bool:
        return self.kind.endswith("?")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        kind = self.kind.rstrip("?")
        if kind == "any":
            return True
        if kind == "int":
            return (isinstance(value, int) and not isinstance(value, bool)) or _symbolic_int(value)
        if kind == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "scalar":
            return isinstance(value, (int, float, bool)) or _symbolic_int(value)
        if kind == "bool":
            return isinstance(value, bool)
        if kind in ("str", "dtype"):
            return isinstance(value, str)
        if kind == "ints":
            return isinstance(value, tuple) and all(
                (isinstance(v, int) and not isinstance(v, bool)) or _symbolic_int(v) for v in value
            )
        if kind == "floats":
            return isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value)
        return False


@dataclass(frozen=True)
class AtenBinding:
    """How one ATen overload maps onto an op.

    Schema arguments bind to operands and attributes of the same name (``rename``
    maps an ATen argument name to a different gawee name). ``fixed`` lists ATen
    arguments that must hold the given value (else the node stays opaque); ``drop``
    lists arguments that are irrelevant here. ``outputs`` picks which ATen results the
    op computes; the others must be unused. ``convert`` gets the argument dict (ATen
    names, Scalars still plain) and the input types, and may rewrite it or return
    None to refuse.
    """

    target: str
    rename: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    drop: frozenset[str] = frozenset()
    outputs: tuple[int, ...] | None = None
    convert: Callable[[dict[str, Any], dict[str, TensorType | None]], dict[str, Any] | None] | None = None


FlopsFn = Callable[[TypeList, Sequence[TensorType], Mapping[str, Any]], int | None]
ShapeFormula = Callable[[TypeList, Mapping[str, Any]], list[tuple[Any, ...]]]


@dataclass(frozen=True, eq=False)
class OpDef:
    """Everything about one op: signature, traits, semantics, cost, and its ATen spellings.

    ``evaluate(*inputs, **attrs)`` is the reference semantics (torch ops; absent
    optional operands arrive as None, a variadic operand as the trailing positional
    arguments). Shape and dtype inference defaults to running ``evaluate`` on meta
    tensors; ``infer`` overrides it. ``flops`` returns None when there is no formula.
    """

    name: str
    operands: tuple[Operand, ...]
    evaluate: Callable[..., Any]
    attrs: tuple[Attr, ...] = ()
    traits: frozenset[str] = frozenset({"pure"})
    infer: Callable[[TypeList, Mapping[str, Any]], list[TensorType]] | None = None
    shape_formula: ShapeFormula | None = None
    """Output shapes as expressions of the operand shapes, ``shape_formula(in_types, attrs) -> [shape]``,
    for ops whose torch fake kernel specializes a size symbol (or fails) under symbolic shapes: symbolic
    inference uses it when fake evaluation does not give a result valid for every size (see
    ``_infer_symbolic``). It raises ValueError when no shape holds for every value of the symbols in
    range; on concrete shapes it must give what evaluation gives (tests/ops/test_shape_formulas.py)."""
    flops: FlopsFn | None = None
    bytes_accessed: Callable[[TypeList, Sequence[TensorType], Mapping[str, Any]], tuple[int, int]] | None = None
    canonicalize: Callable[[dict[str, Any], TypeList], dict[str, Any]] | None = None
    """Normalizes attributes given operand types (e.g. resolve -1 in a reshape)."""
    sample: Callable[..., tuple[list, dict]] | None = None
    """Draws a valid instance: ``sample(draw, slots, attrs) -> (operand types, attrs)``; see ops.sampling."""
    aten: tuple[AtenBinding | str, ...] = ()
    """ATen overloads that capture maps here; a plain string is a binding by names alone."""
    core: str | None = None
    """A target op's definition (:mod:`gawee.ops.targets`): the core op it computes before its fused epilogue
    (``act``) and after its prologue (``act_in``, an activation applied to its ``input`` first), named here or, as
    ``"attr:NAME"``, by its attribute NAME. That op takes the operands of the same names, and the attributes of the
    same names (the others at their defaults). The rule prover unfolds the target op so (gawee.testing.unfold);
    tests/ops/test_targets.py checks it against ``evaluate``."""
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "aten", tuple(b if isinstance(b, AtenBinding) else AtenBinding(b) for b in self.aten))
        object.__setattr__(self, "traits", frozenset(self.traits))
        unknown = set(self.traits) - TRAITS
        if unknown:
            raise ValueError(f"op {self.name}: unknown traits {sorted(unknown)}")
        for i, o in enumerate(self.operands):
            if o.variadic and i != len(self.operands) - 1:
                raise ValueError(f"op {self.name}: only the last operand may be variadic")
        object.__setattr__(self, "_attr_index", {a.name: a for a in self.attrs})

    # -- signature -----------------------------------------------------------------
    @property
    def variadic(self) -> bool:
        return bool(self.operands) and self.operands[-1].variadic

    @property
    def min_arity(self) -> int:
        n = 0
        for o in self.operands:
            if o.optional or o.variadic:
                break
            n += 1
        return n

    def missing_operand(self, inputs: list) -> str | None:
        """The name of the first operand that ``inputs`` (one per operand slot, None where absent) leaves out
        although it is not optional; None when every required one is there."""
        for o, v in zip(self.operands, inputs):
            if v is None and not (o.optional or o.variadic):
                return o.name
        return None

    @property
    def max_arity(self) -> float:
        return math.inf if self.variadic else len(self.operands)

    def attr(self, name: str) -> Attr | None:
        return self._attr_index.get(name)  # type: ignore[attr-defined]

    def has_trait(self, trait: str) -> bool:
        return trait in self.traits

    def complete_attrs(self, attrs: dict[str, Any], where: str = "") -> dict[str, Any]:
        """Fill defaults; refuse unknown attributes, missing required ones and ill-typed values."""
        from gawee.ir.core import freeze_attrs

        attrs = freeze_attrs(attrs)
        for k in attrs:
            if k not in self._attr_index:  # type: ignore[attr-defined]
                raise IRError(
                    f"op {self.name} has no attribute {k!r}",
                    where=where or None,
                    hint="its attributes: " + (", ".join(a.name for a in self.attrs) or "none"),
                )
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                v = attrs[a.name]
            elif a.default is REQUIRED:
                raise IRError(f"op {self.name} needs attribute {a.name!r} ({a.kind})", where=where or None)
            else:
                v = a.default
            if not a.accepts(v):
                raise IRError(f"attribute {a.name!r} of {self.name} must be {a.kind}, got {v!r}", where=where or None)
            out[a.name] = v
        return out

    def prepare_attrs(
        self, attrs: Mapping[str, Any], in_types: TypeList, where: str = "", *, shared: bool = False
    ) -> dict[str, Any]:
        """``complete_attrs`` then the op's canonicalization (which may need operand types). Both are functions
        of the attributes and operand types alone, so a prepared result is kept per op, attributes (told apart
        as ``infer_types``' cache does) and operand types; failures are not kept (their message names
        ``where``). Returns a fresh dict, or with ``shared`` the kept one (for a caller that only reads it)."""
        try:
            # a canonicalization may read the operand types; without one, the attributes decide alone
            key = (self.name, attrs_key(attrs), None if self.canonicalize is None else tuple(in_types))
            cached = _PREPARED.get(key)
        except TypeError:  # an unhashable attribute value
            key, cached = None, None
        if cached is not None:
            return cached if shared else dict(cached)
        out = self._prepare(attrs, in_types, where)
        if key is not None:
            if len(_PREPARED) > 65536:
                _PREPARED.clear()
            _PREPARED[key] = dict(out)
        return out

    def _prepare(self, attrs: Mapping[str, Any], in_types: TypeList, where: str) -> dict[str, Any]:
        from gawee.ir.core import freeze_attrs

        out = self.complete_attrs(attrs, where)
        if self.canonicalize is not None:
            try:
                out = {**out, **freeze_attrs(self.canonicalize(dict(out), in_types))}
            except (AttributeError, IndexError, KeyError, TypeError, ValueError, StopIteration, ZeroDivisionError) as e:
                # AttributeError: an operand the canonicalization reads is absent (None has no rank)
                raise InferenceError(
                    f"{self.name}: attributes {out} do not fit its operands: {first_line(e)}", where=where or None
                ) from None
        return out

    def prepare_and_infer(
        self, attrs: Mapping[str, Any], in_types: TypeList, where: str = ""
    ) -> tuple[dict[str, Any], tuple[TensorType, ...]]:
        """``prepare_attrs`` then ``infer_types`` on the result, as a new node of this op needs them: kept per op,
        attributes and operand types together (one key for both). The prepared attributes are shared: only read
        them (a Node copies its attributes)."""
        try:
            key = (self.name, attrs_key(attrs), tuple(in_types))
            cached = _NODE_CACHE.get(key)
        except TypeError:  # an unhashable attribute value
            key, cached = None, None
        if cached is not None:
            return cached
        prepared = self.prepare_attrs(attrs, in_types, where=where)
        found = (prepared, tuple(self.infer_types(in_types, prepared)))
        if key is not None:
            if len(_NODE_CACHE) > 65536:
                _NODE_CACHE.clear()
            _NODE_CACHE[key] = found
        return found

    # -- semantics -----------------------------------------------------------------
    def run(self, inputs: Sequence[torch.Tensor | None], attrs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        """Evaluate with torch; always returns a tuple of output tensors."""
        out = self.evaluate(*inputs, **attrs)
        if isinstance(out, torch.Tensor):
            return (out,)
        return tuple(out)

    def infer_types(self, in_types: TypeList, attrs: Mapping[str, Any]) -> list[TensorType]:
        """Output types for these operand types; raises InferenceError if the op rejects them."""
        key = (self.name, tuple(in_types), attrs_key(attrs))
        try:
            cached = _INFER_CACHE.get(key)
        except TypeError:  # an unhashable attribute value: skip the cache
            key, cached = None, None
        if cached is not None:
            return list(cached)
        try:
            if has_symbols(list(in_types)) or has_symbols(list(attrs.values())):
                result = _infer_symbolic(self, in_types, attrs)
            elif self.infer is not None:
                result = self.infer(in_types, attrs)
            else:
                args = [None if t is None else meta_tensor(t) for t in in_types]
                result = [TensorType.of(t) for t in self.run(args, attrs)]
            result = _with_layouts(self, in_types, attrs, result)
        except (
            RuntimeError,
            ValueError,
            TypeError,
            LookupError,  # an attribute value the op's own tables lack (act="gelu_exact"), an index past the end
            AttributeError,  # an operand the op reads is absent (None has no shape)
            NotImplementedError,
            AssertionError,
            ArithmeticError,
        ) as e:
            sig = ", ".join("_" if t is None else str(t) for t in in_types)
            raise InferenceError(f"{self.name}({sig}) with {dict(attrs)} is invalid: {first_line(e)}") from None
        if key is not None:
            if len(_INFER_CACHE) > 65536:
                _INFER_CACHE.clear()
            _INFER_CACHE[key] = tuple(result)
        return list(result)


_INFER_CACHE: dict[Any, tuple[TensorType, ...]] = {}
_NODE_CACHE: dict[Any, tuple[dict[str, Any], tuple[TensorType, ...]]] = {}
"""(op, attributes, operand types) -> (prepared attributes, output types) (``OpDef.prepare_and_infer``)."""
_PREPARED: dict[Any, dict[str, Any]] = {}
"""(op, attributes, operand types) -> prepared attributes (``OpDef.prepare_attrs``)."""


@cython.locals(out=list)
def attrs_key(attrs: Mapping[str, Any]) -> tuple:
    """A cache key of an attribute dict, telling values apart as :func:`_typed` does (the common values of
    attributes, ints, strings, flags and int tuples, inline)."""
    out = []
    for k, v in attrs.items():
        t = type(v)
        if t is int or t is str or t is bool or v is None or (t is tuple and _ints_only(v)):
            out.append((k, t, v))
        else:
            out.append((k, _typed(v)))
    return tuple(out)


@cython.locals(items=tuple)
def _ints_only(items: tuple) -> bool:
    """Every element is an int (not a bool or a float): such a tuple is its own key."""
    for x in items:  # noqa: SIM110 (a C loop: no generator)
        if type(x) is not int:
            return False
    return True


def _typed(v: Any) -> Any:
    """A cache key that tells apart what Python's == does not: 1, 1.0 and True (an int scalar keeps an
    integer result, a float one promotes it), 0.0 and -0.0, a list and a tuple."""
    t = type(v)
    if t is int or t is str or t is bool or v is None:  # the common cases first
        return (t, v)
    if t is tuple and _ints_only(v):  # ints only: no element to tell apart (stride=(1, 1))
        return (t, v)
    if isinstance(v, (tuple, list)):
        return (t, tuple([_typed(x) for x in v]))
    if isinstance(v, float):
        return (float, repr(v))
    return (t, v)


def _with_layouts(opdef: OpDef, in_types: TypeList, attrs: Mapping[str, Any], result: list) -> list[TensorType]:
    """The memory layout of each result — gawee's rule, not torch's meta kernels (which drop channels-last
    through convolutions and pick by operand order in elementwise ops). A ``converts_layout`` op's result has
    the layout its ``layout`` attribute names; a view's is what evaluation gave (view strides are not
    tracked); any other op's 4-D result is channels-last when its first operand, or an operand of the
    result's own shape, is a 4-D channels-last tensor — convolutions, pooling, normalization and
    elementwise ops keep their input's layout, as torch's CPU kernels do — and contiguous otherwise."""
    if opdef.has_trait("converts_layout"):
        layout = Layout(attrs["layout"])
        return [TensorType(t.shape, t.dtype, layout) for t in result]
    if opdef.has_trait("view"):
        return result

    def channels_last(i: int, t: TensorType | None, out: TensorType) -> bool:
        return t is not None and t.rank == 4 and t.layout is Layout.channels_last and (i == 0 or t.shape == out.shape)

    out = []
    for r in result:
        cl = r.rank == 4 and any(channels_last(i, t, r) for i, t in enumerate(in_types))
        layout = Layout.channels_last if cl else Layout.contiguous
        out.append(r if r.layout is layout else TensorType(r.shape, r.dtype, layout))
    return out


def _symbolic_int(v: Any) -> bool:
    return isinstance(v, sympy.Expr) and v.is_integer is not False and not v.is_Integer


def _infer_symbolic(opdef: OpDef, in_types: TypeList, attrs: Mapping[str, Any]) -> list[TensorType]:
    """Types of an op over symbolic shapes: its torch semantics run on fake tensors whose sizes are
    SymInts of the operands' symbols (torch's ShapeEnv), so every op gets symbolic inference from the
    same ``evaluate`` the static path uses. A result that would only hold for some values of the
    symbols (the op specialized a symbol to a constant) is refused — unless the op declares a
    ``shape_formula``, which then gives the shapes (some of torch's C++ kernels pin a size with
    ``guard_int`` where no guard is needed: ``constant_pad_nd`` pins the batch of a padded image)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, ValueRangesSLoc
    from torch.utils._sympy.value_ranges import ValueRanges

    syms = symbols_of(list(in_types)) | symbols_of(list(attrs.values()))
    env = ShapeEnv()
    for s in syms:
        env.backed_var_to_val[s] = sympy.Integer(_hint(s))
        env.var_to_range[s] = ValueRanges(s.lo, sympy.oo if s.hi is None else s.hi)
        sloc = env._get_sloc()
        env.var_to_range_sloc[s] = ValueRangesSLoc(sloc, sloc)

    def sym(d):
        if isinstance(d, sympy.Basic) and not d.is_Integer:
            return env.create_symintnode(d, hint=int(d.xreplace({s: _hint(s) for s in d.free_symbols})))
        return int(d) if isinstance(d, sympy.Basic) else d

    def conv(a):
        if isinstance(a, tuple):
            return tuple(conv(x) for x in a)
        return sym(a)

    try:
        with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True), _quiet_fake_tensor_log():
            args = []
            for t in in_types:
                if t is None:
                    args.append(None)
                    continue
                x = torch.empty(tuple(sym(d) for d in t.shape), dtype=t.dtype.torch)
                if t.layout is Layout.channels_last and t.rank == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                args.append(x)
            outs = opdef.run(args, {k: conv(v) for k, v in attrs.items()})
            result = [TensorType.of(t) for t in outs]
        fixed = [str(k) for k, v in env.replacements.items() if k in syms and not symbols_of(v)]
        if fixed:
            raise ValueError(f"the result holds only for a fixed value of {', '.join(fixed)}")
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
        if opdef.shape_formula is None:
            raise
        result = _infer_by_formula(opdef, in_types, attrs, syms)
    _check_at_the_low_end(opdef, in_types, attrs, syms, result)
    return result


def _check_at_the_low_end(opdef: OpDef, in_types: TypeList, attrs: Mapping[str, Any], syms: set[Sym], result) -> None:
    """The fake kernels assume a size symbol is not 0 or 1 (torch's guard ``s > 1`` is recorded for a
    convolution and a reflect pad alike, so guards cannot tell a real constraint), hence the result is
    checked by concrete inference with every symbol at the low end of its range: the op must accept it
    and give the result's shapes there."""
    from gawee.ir.symbolic import subs

    values = {s: s.lo for s in syms if s.lo != _hint(s)}
    if not values:
        return
    try:
        low = _infer_at(opdef, in_types, attrs, values)
    except InferenceError as e:
        sizes = ", ".join(f"{s} = {v}" for s, v in sorted(values.items(), key=str))
        raise ValueError(f"it fails at {sizes}, the low end of the range: {e.message}") from None
    if [t.shape for t in low] != [subs(t.shape, values) for t in result]:
        raise ValueError(f"its shapes at the low end of the range, {[list(t.shape) for t in low]}, follow no formula")


def _infer_by_formula(opdef: OpDef, in_types: TypeList, attrs: Mapping[str, Any], syms: set[Sym]) -> list[TensorType]:
    """Types from the op's ``shape_formula``: dtypes and layouts, and the operands' validity, from concrete
    inference at the symbols' hints, whose shapes the formula must reproduce there; every size it gives
    must be provably nonnegative over the symbols' ranges."""
    from gawee.ir.symbolic import dim, prove, subs

    values = {s: _hint(s) for s in syms}
    concrete = _infer_at(opdef, in_types, attrs, values)
    shapes = [tuple(dim(d) for d in shape) for shape in opdef.shape_formula(in_types, attrs)]
    if [subs(s, values) for s in shapes] != [t.shape for t in concrete]:
        raise ValueError(f"{opdef.name}'s shape formula gives {shapes}, evaluation {[t.shape for t in concrete]}")
    for shape in shapes:
        if any(prove(d, ">=", 0) is not True for d in shape):
            raise ValueError(f"a size of {list(shape)} may be negative for some values of the symbols")
    return [TensorType(shape, t.dtype, t.layout) for shape, t in zip(shapes, concrete)]


def _infer_at(
    opdef: OpDef, in_types: TypeList, attrs: Mapping[str, Any], values: Mapping[Sym, int]
) -> list[TensorType]:
    """Concrete inference with the symbols at ``values`` (operand shapes and symbolic attributes alike)."""
    from gawee.ir.symbolic import subs

    def at(v: Any) -> Any:
        return subs(v, values) if isinstance(v, (sympy.Basic, tuple, list)) else v

    types = [None if t is None else t.at(values) for t in in_types]
    return opdef.infer_types(types, {k: at(v) for k, v in attrs.items()})


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """Silences torch's log of a meta kernel's exception: symbolic inference handles that exception
    itself (a typed InferenceError, or the op's shape formula)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _hint(s: Sym) -> int:
    """The value torch's ShapeEnv assumes for ``s`` when a size check cannot be decided statically:
    the example, or a value of 2 or more when the example is 0 or 1 (which torch would specialize)."""
    if s.example >= 2 or (s.hi is not None and s.hi < 2):
        return s.example
    return min(max(s.lo, 2), s.hi) if s.hi is not None else max(s.lo, 2)


def meta_tensor(t: TensorType) -> torch.Tensor:
    x = torch.empty(t.shape, dtype=t.dtype.torch, device="meta")
    if t.layout is Layout.channels_last and t.rank == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


# -- helpers shared by op definitions --------------------------------------------------


def numel(t: TensorType | None) -> int:
    return 0 if t is None else t.numel


def out_numel(_ins: TypeList, outs: Sequence[TensorType], _attrs: Mapping[str, Any]) -> int:
    """FLOPs convention for elementwise ops: one per output element."""
    return sum(o.numel for o in outs)


def zero_flops(_ins: TypeList, _outs: Sequence[TensorType], _attrs: Mapping[str, Any]) -> int:
    """Data movement: no arithmetic."""
    return 0


def per_element(k: int) -> FlopsFn:
    return lambda ins, outs, attrs: k * sum(o.numel for o in outs)


def binary_dtype(a: TensorType, b: TensorType) -> DType:
    """torch's type promotion for two tensor operands (a 0-d tensor ranks below a dimensioned one)."""
    pa = torch.empty((1,) * min(a.rank, 1), dtype=a.dtype.torch, device="meta")
    pb = torch.empty((1,) * min(b.rank, 1), dtype=b.dtype.torch, device="meta")
    return DType.from_torch(torch.result_type(pa, pb))
