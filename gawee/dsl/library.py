"""The built-in functions of the rule language: predicates for `where`, helpers for replacements.

One record per builtin: its parameter and result kinds (checked at load time), where
it may be used, and its implementation. Python helpers supplied by the user at load
time (``load_rules(..., helpers=...)``) join this table for that rule set only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gawee.analysis.tensor_facts import SMALL, all_finite, elements
from gawee.cpu import no_vnni
from gawee.dsl import kinds as K
from gawee.ir.core import Node, Value
from gawee.ir.types import DType
from gawee.numerics import TOLERANCE
from gawee.ops import get_op
from gawee.ops.quantized import static_qparams


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[K.Kind, ...]
    returns: K.Kind
    impl: Callable[..., Any]
    """impl(ctx, *args): ctx is the rewrite context (graph, matched root)."""
    variadic: bool = False
    """The last parameter repeats (one or more times)."""
    where: str = "both"
    """"guard", "replace" or "both"."""
    doc: str = ""
    int_preserving: bool = False
    """The result is an int where every argument is (`min(e, x.shape[0])` fits an int attribute)."""
    fallback: bool = False
    """Two arguments, the second evaluated only where the first is absent (``default``): a fallback that is not
    needed is not built (``impl`` gives the same answer from both)."""
    node_check: Callable[[Node], bool] | None = None
    """A necessary condition, cheap to ask, on the node that computes the (one) argument: false there, the builtin
    is false. A rule whose guard is a conjunction with this builtin of its root's value as a term asks it before
    matching (``Rule.root_checks``), which spares the whole attempt at the nodes where it fails."""


class GuardFailed(Exception):
    """A builtin cannot answer for these arguments (e.g. `value(c)` of a varying constant): the guard is false."""


def _known(v: Value | None) -> torch.Tensor:
    if v is None or not v.has_known_data:
        raise GuardFailed("not a constant with known values")
    return v.data


def _along(c: Value | None, y: Value | None, dim: int) -> bool:
    """c broadcasts against y without growing y, varying along ``dim`` of y only."""
    if c is None or y is None or c.type.rank > y.type.rank:
        return False
    rank = y.type.rank
    dim = dim + rank if dim < 0 else dim
    if not 0 <= dim < rank:
        return False
    shape = (1,) * (rank - c.type.rank) + c.shape
    return all(s == 1 for i, s in enumerate(shape) if i != dim) and shape[dim] in (1, y.shape[dim])


def _inputs_constant(node: Node) -> bool:
    """Every operand of ``node`` is a constant or absent (``foldable``'s node check)."""
    for x in node._inputs:  # noqa: SIM110 (a loop: no generator made per node visited)
        if x is not None and x.data is None:
            return False
    return True


def _first_operand_shared(node: Node) -> bool:
    """``node``'s first present operand is read by another operand slot too: an earlier node computing the same
    would read it as well (``duplicate``'s node check, as ``RewriteContext.find_duplicate`` looks)."""
    for x in node._inputs:
        if x is not None:
            return len(x._uses) > 1
    return False


def _foldable(v: Value | None) -> bool:
    node = v.producer if v is not None else None
    if node is None:
        return False
    opdef = get_op(node.op)
    if any(o.type.symbolic for o in node.outputs):  # a constant's shape is static: x[:seq] of a buffer stays
        return False
    return opdef.has_trait("pure") and all(x is None or x.data is not None for x in node.inputs)


def _operand_size(v: Value | None) -> int:
    node = v.producer if v is not None else None
    if node is None:
        return 0
    distinct = {id(x): x for x in node.inputs if x is not None and x.data is not None}
    return sum(x.type.numel for x in distinct.values())


def _all_equal(c: Value | None, x: float) -> bool:
    """Every element of the constant ``c`` equals ``x`` as torch compares them (``c == x``); false when empty. A
    small constant compared in its own dtype is read into Python instead (exact: its elements and ``x`` rounded to
    that dtype are Python numbers), which costs less than two torch ops."""
    if c is None or not c.has_known_data:
        return False
    data = c.data
    n = data.numel()
    if n == 0:
        return False
    if n <= SMALL and not data.is_complex():
        ref = _compared_as(data.dtype, type(x), x)
        if ref is not None:
            for v in elements(data):  # noqa: SIM110 (a loop: no generator made per guard)
                if v != ref:
                    return False
            return True
    return bool((data == x).all().item())


@functools.lru_cache(maxsize=4096)
def _compared_as(dtype: torch.dtype, kind: type, x: Any) -> Any:
    """``x`` as torch compares it with a tensor of ``dtype``: rounded to ``dtype``, as a Python number; None where
    torch compares them in another dtype (an integer tensor against a float). ``kind`` tells 0, 0.0 and False apart
    (equal as keys, not to torch)."""
    try:
        if torch.result_type(torch.empty(1, dtype=dtype, device="meta"), x) != dtype:
            return None
        return torch.tensor(x, dtype=dtype).item()
    except (RuntimeError, TypeError, OverflowError):  # x does not fit the dtype: torch decides
        return None


def _reassociable(a: Value | None, b: Value | None) -> bool:
    """(x + a) + b against x + (a + b): the two differ by the roundings of the partial sums, at most a
    unit roundoff of |a| + |b| (besides x's own, which the original has too). Small constants keep that
    below the tolerance the equivalence checks allow; huge ones (1024 in float16, whose unit in the last
    place is 1) make a softmax's logits and its output differ."""
    x, y = _known(a), _known(b)
    if not (x.is_floating_point() and y.is_floating_point()) or x.dtype != y.dtype:
        return False
    tol = TOLERANCE.get(DType.from_torch(x.dtype))
    if tol is None or not (all_finite(x) and all_finite(y)):
        return False
    peak = (x.abs().max().item() if x.numel() else 0.0) + (y.abs().max().item() if y.numel() else 0.0)
    return peak * torch.finfo(x.dtype).eps / 2 <= tol / 2


def _value(c: Value | None) -> float:
    data = _known(c)
    flat = data.reshape(-1)
    if flat.numel() == 0 or not bool((flat == flat[0]).all()):
        raise GuardFailed("elements differ")
    return flat[0].item()


def _compose(p, q):
    """permute(permute(x, p), q) == permute(x, compose(p, q))."""
    if len(p) != len(q):
        raise GuardFailed("permutations of different lengths")
    return tuple(p[i] for i in q)


def _inverse(p):
    inv = [0] * len(p)
    for i, d in enumerate(p):
        inv[d] = i
    return tuple(inv)


def _swapped(p, i, j):
    p = list(p)
    try:
        p[i], p[j] = p[j], p[i]
    except IndexError:
        raise GuardFailed("index out of range") from None
    return tuple(p)


def _with_item(xs, i, v):
    if not -len(xs) <= i < len(xs):
        raise GuardFailed(f"index {i} out of range for {list(xs)}")
    out = list(xs)
    out[i] = v
    return tuple(out)


def _broadcastable(a: Value | None, b: Value | None) -> bool:
    if a is None or b is None:
        return False
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def _pure(v: Value | None) -> bool:
    return v is not None and v.producer is not None and get_op(v.producer.op).has_trait("pure")


def _static_qparams(low: float, high: float, levels: int) -> tuple[float, int]:
    """:func:`gawee.ops.quantized.static_qparams`; GuardFailed for a range it cannot quantize."""
    try:
        return static_qparams(low, high, levels)
    except ValueError as e:
        raise GuardFailed(str(e)) from None


def _finfo(dtype: str) -> torch.finfo:
    """The float format of a dtype name; GuardFailed for an integer or bool dtype (no rounding to speak of)."""
    d = DType.parse(dtype)
    if not d.is_float:
        raise GuardFailed(f"{dtype} is not a floating-point dtype")
    return torch.finfo(d.torch)


def _roundoff(dtype: str) -> float:
    """The unit roundoff u of a float dtype: rounding a normal number x to it moves it by at most u * |x|
    (half its machine epsilon: 2**-8 for bf16, 2**-24 for f32)."""
    return _finfo(dtype).eps / 2


def _underflow(dtype: str) -> float:
    """The absolute error of rounding a number below a float dtype's normal range to it: half the smallest
    subnormal (2**-134 for bf16). With ``_roundoff``: |fl(x) - x| <= u * |x| + underflow for every x in range."""
    info = _finfo(dtype)
    return info.smallest_normal * info.eps / 2


T, B, INT, F, L = K.TENSOR, K.BOOL, K.INT, K.FLOAT, K.LIST

BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in [
        Builtin(
            "const",
            (T,),
            B,
            lambda ctx, *vs: all(v is not None and v.data is not None for v in vs),
            variadic=True,
            doc="every argument is a constant (weights, buffers, folded values)",
        ),
        Builtin("absent", (T,), B, lambda ctx, v: v is None, doc="an optional operand that is not there"),
        Builtin("present", (T,), B, lambda ctx, v: v is not None, doc="an optional operand that is there"),
        Builtin(
            "single_use",
            (T,),
            B,
            lambda ctx, v: v is not None and v.num_uses == 1,
            doc="read by exactly one operand slot (a graph output counts as a use)",
        ),
        Builtin("is_output", (T,), B, lambda ctx, v: v is not None and v.is_graph_output, doc="a graph output"),
        Builtin("uses", (T,), INT, lambda ctx, v: 0 if v is None else v.num_uses, doc="number of uses"),
        Builtin("pure", (T,), B, lambda ctx, v: _pure(v), doc="produced by a deterministic, side-effect-free op"),
        Builtin(
            "duplicate",
            (T,),
            B,
            lambda ctx, v: ctx.find_duplicate(v) is not None,
            where="guard",
            node_check=_first_operand_shared,
            doc="an earlier node computes the same op on the same operands with the same attributes",
        ),
        Builtin("broadcastable", (T, T), B, lambda ctx, a, b: _broadcastable(a, b), doc="shapes broadcast together"),
        Builtin(
            "same_shape",
            (T, T),
            B,
            lambda ctx, a, b: a is not None and b is not None and a.shape == b.shape,
            doc="equal shapes",
        ),
        Builtin(
            "per_channel",
            (T, T),
            B,
            lambda ctx, c, y: y is not None and y.type.rank >= 2 and _along(c, y, 1),
            doc="c broadcasts against y along dim 1 only (shape [C,1,1], [1,C,1,1] or all ones)",
        ),
        Builtin(
            "along",
            (T, T, INT),
            B,
            lambda ctx, c, y, d: _along(c, y, d),
            doc="c broadcasts against y without growing it, varying along dim d of y only",
        ),
        Builtin(
            "same_type",
            (T, T),
            B,
            lambda ctx, a, b: a is not None and b is not None and a.type.same_shape_dtype(b.type),
            doc="equal shapes and dtypes",
        ),
        Builtin(
            "foldable",
            (T,),
            B,
            lambda ctx, v: _foldable(v),
            node_check=_inputs_constant,
            doc="produced by a pure op whose operands are all constants (and whose result's shape is static)",
        ),
        Builtin(
            "result_size",
            (T,),
            INT,
            lambda ctx, v: (
                sum(o.type.numel for o in v.producer.outputs if o.num_uses)
                if v is not None and v.producer is not None
                else 0
            ),
            doc="elements in the used outputs of v's node (an unused output of a multi-output node is never stored)",
        ),
        Builtin(
            "operand_size",
            (T,),
            INT,
            lambda ctx, v: _operand_size(v),
            doc="elements in the distinct constant operands of v's node",
        ),
        Builtin(
            "is_view",
            (T,),
            B,
            lambda ctx, v: v is not None and v.producer is not None and "view" in get_op(v.producer.op).traits,
            doc="produced by a view op (reshape, expand, permute...): free at run time",
        ),
        Builtin(
            "op",
            (T,),
            K.STR,
            lambda ctx, v: v.producer.op if v is not None and v.producer is not None else "",
            doc='the op that produced v ("" for inputs and constants)',
        ),
        Builtin(
            "all_equal", (T, F), B, lambda ctx, c, x: _all_equal(c, x), doc="a constant whose every element equals x"
        ),
        Builtin(
            "value", (T,), F, lambda ctx, c: _value(c), doc="the element of a constant whose elements are all equal"
        ),
        Builtin("finite", (T,), B, lambda ctx, c: all_finite(_known(c)), doc="a constant with no inf or nan"),
        Builtin(
            "positive", (T,), B, lambda ctx, c: bool((_known(c) > 0).all()), doc="a constant with every element > 0"
        ),
        Builtin(
            "reassociable",
            (T, T),
            B,
            lambda ctx, a, b: _reassociable(a, b),
            doc="two constants whose sum, added to a value, rounds as adding them in turn does, within the "
            "dtype's equivalence tolerance: (max|a| + max|b|) * unit roundoff <= tolerance / 2",
        ),
        Builtin("is_float", (T,), B, lambda ctx, v: v is not None and v.dtype.is_float, doc="a floating-point tensor"),
        Builtin("rank", (T,), INT, lambda ctx, v: v.type.rank, doc="number of dimensions"),
        Builtin("numel", (T,), INT, lambda ctx, v: v.type.numel, doc="number of elements"),
        Builtin("shape", (T,), L, lambda ctx, v: v.shape, doc="the shape, as a list"),
        Builtin("dtype", (T,), K.DTYPE, lambda ctx, v: v.dtype.value, doc="the element type"),
        Builtin(
            "layout",
            (T,),
            K.STR,
            lambda ctx, v: v.type.layout.value,
            doc='the memory layout: "contiguous" or "channels_last"',
        ),
        Builtin(
            "broadcast_shape",
            (T, T),
            L,
            lambda ctx, a, b: tuple(torch.broadcast_shapes(a.shape, b.shape)),
            doc="the shape a and b broadcast to",
        ),
        Builtin(
            "int8_levels",
            (),
            INT,
            lambda ctx: 255 if no_vnni() is None else 127,
            doc="the largest value this CPU's int8 kernels quantize an activation to exactly: 255 with VNNI, else 127",
        ),
        Builtin(
            "static_scale",
            (F, F, INT),
            F,
            lambda ctx, low, high, levels: _static_qparams(low, high, levels)[0],
            doc="the float32 scale that quantizes a calibrated range [low, high] (0 included) to [0, levels]",
        ),
        Builtin(
            "static_zero_point",
            (F, F, INT),
            INT,
            lambda ctx, low, high, levels: _static_qparams(low, high, levels)[1],
            doc="the zero point that goes with static_scale(low, high, levels), in [0, levels]",
        ),
        Builtin(
            "roundoff",
            (K.DTYPE,),
            F,
            lambda ctx, d: _roundoff(d),
            doc="the unit roundoff of a float dtype (2**-8 for bf16): relative error of one rounding",
        ),
        Builtin(
            "underflow",
            (K.DTYPE,),
            F,
            lambda ctx, d: _underflow(d),
            doc="half the smallest subnormal of a float dtype: absolute error of one rounding near zero",
        ),
        Builtin(
            "largest",
            (K.DTYPE,),
            F,
            lambda ctx, d: _finfo(d).max,
            doc="the largest finite number of a float dtype: past it, rounding to the dtype may give inf",
        ),
        Builtin("len", (L,), INT, lambda ctx, xs: len(xs), doc="length of a list"),
        Builtin("prod", (L,), INT, lambda ctx, xs: math.prod(xs), doc="product of a list"),
        Builtin(
            "compose",
            (L, L),
            L,
            lambda ctx, p, q: _compose(p, q),
            doc="the permutation of permute(permute(x, dims=p), dims=q)",
        ),
        Builtin("inverse", (L,), L, lambda ctx, p: _inverse(p), doc="the inverse permutation"),
        Builtin("identity", (INT,), L, lambda ctx, n: tuple(range(n)), doc="[0, 1, ..., n-1]"),
        Builtin(
            "swapped", (L, INT, INT), L, lambda ctx, p, i, j: _swapped(p, i, j), doc="p with items i and j exchanged"
        ),
        Builtin(
            "with_item", (L, INT, K.ANY), L, lambda ctx, xs, i, v: _with_item(xs, i, v), doc="xs with item i set to v"
        ),
        Builtin(
            "pad_left",
            (L, INT, K.ANY),
            L,
            lambda ctx, xs, n, v: (v,) * max(0, n - len(xs)) + tuple(xs),
            doc="xs with v in front until it has n items (a shape broadcast to rank n: pad_left(c.shape, n, 1))",
        ),
        Builtin("all_zero", (L,), B, lambda ctx, xs: all(x == 0 for x in xs), doc="every item is 0"),
        Builtin("min", (F, F), F, lambda ctx, a, b: min(a, b), doc="the smaller number", int_preserving=True),
        Builtin("max", (F, F), F, lambda ctx, a, b: max(a, b), doc="the larger number", int_preserving=True),
        Builtin("abs", (F,), F, lambda ctx, a: abs(a), doc="absolute value", int_preserving=True),
        Builtin(
            "fold",
            (T,),
            T,
            lambda ctx, v: ctx.fold(v),
            where="replace",
            doc="the value computed now: the node producing v, evaluated on its constant operands",
        ),
        Builtin(
            "original",
            (T,),
            T,
            lambda ctx, v: ctx.find_duplicate(v),
            where="replace",
            doc="the earlier node's output that `duplicate(v)` found",
        ),
        Builtin(
            "default",
            (T, T),
            T,
            lambda ctx, a, b: a if a is not None else b,
            where="replace",
            doc="a if present, else b (e.g. default(b, 0) for an absent bias; b is evaluated only then)",
            fallback=True,
        ),
    ]
}

NODE_CHECKS: dict[str, Callable[[Node], bool]] = {n: b.node_check for n, b in BUILTINS.items() if b.node_check}
"""Builtin name -> its node check (``Builtin.node_check``), as ``Rule.root_checks`` names them."""


@dataclass(frozen=True)
class Helper:
    """A user's Python function made callable from rules (an explicit opt-in at load time)."""

    fn: Callable[..., Any]
    returns: str = "any"
    """Kind name of the result: bool, int, float, str, list, dtype, tensor or any."""


def helper_builtin(name: str, helper: Helper | Callable) -> Builtin:
    """Wrap a helper as a Builtin taking any arguments; tensors arrive as gawee Values."""
    if not isinstance(helper, Helper):
        helper = Helper(helper)
    returns = {"bool": B, "int": INT, "float": F, "str": K.STR, "list": L, "dtype": K.DTYPE, "tensor": T, "any": K.ANY}[
        helper.returns
    ]
    return Builtin(
        name,
        (K.ANY,),
        returns,
        lambda ctx, *args: helper.fn(*args),
        variadic=True,
        doc=(helper.fn.__doc__ or "").strip().splitlines()[0] if helper.fn.__doc__ else "a Python helper",
    )


@dataclass(frozen=True)
class Assumption:
    """A numeric fact about the runtime values of a tensor that a rule may state (`assume finite(x)`).

    The rewriter cannot check it (the values exist only when the model runs), so a rule that
    assumes it is sound only for inputs where it holds: reports show it, and the soundness
    harness draws values that satisfy it and discards a draw only where the fact is false.
    """

    name: str
    holds: Callable[[torch.Tensor], torch.Tensor]
    """Element-wise: True where the fact holds."""
    doc: str


ASSUMPTIONS: dict[str, Assumption] = {
    a.name: a
    for a in [
        Assumption("finite", torch.isfinite, "no element is inf or nan"),
        Assumption("positive", lambda t: t > 0, "every element is > 0"),
        Assumption("nonnegative", lambda t: t >= 0, "every element is >= 0 (nan is not)"),
        Assumption("nonzero", lambda t: t != 0, "no element is 0 (or -0)"),
    ]
}
