"""The solver's encodings agree with torch: each exact encoding evaluated on concrete awkward values gives
torch's result (in the scalar and the vectorized loop), each axiom holds of torch's kernel, and a fused
activation is its standalone op (the executor relies on all three)."""

import itertools
import math

import pytest
import torch
import z3

from gawee.ir.types import DType
from gawee.ops import get_op
from gawee.ops.nn import ACTIVATIONS, act_as_op, apply_act
from gawee.testing.smt import encode as E
from gawee.testing.smt.terms import float_bits

FLOATS = [DType.f16, DType.bf16, DType.f32, DType.f64]
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -1.5, 2.5, 3.0, 0.1, 1e-3, 6e4, 7e4, 3e38, 1e-40, float("inf"), float("-inf")]
SPECIAL += [float("nan"), 16777217.0, 1e300, 2.0**31, -(2.0**31) - 1]
PAIRS = [0.0, -0.0, 1.0, 0.1, -2.5, float("inf"), float("nan"), 65504.0]
INT_VALUES = {DType.i32: [0, 1, -1, 2**31 - 1, -(2**31), 12345], DType.i64: [0, -1, 2**63 - 1, -(2**63), 2**40 + 1]}
INT_VALUES[DType.i8] = [0, 1, -1, 127, -128, 77]
INT_VALUES[DType.u8] = [0, 1, 255, 128, 77]


def _value(dtype: DType, x):
    """x as a z3 literal of dtype (rounded as torch rounds it)."""
    if dtype.is_float:
        return E.literal(dtype, _key(dtype, x))
    return E.literal(dtype, int(x))


def _key(dtype, x):
    from gawee.testing.smt.terms import const_key

    return const_key(dtype, float(torch.tensor(x, dtype=torch.float64).to(dtype.torch).item()))


def _evaluate(expr, dtype: DType):
    v = z3.simplify(expr)
    return E.value_of(dtype, v)


def _same(a, b) -> bool:
    """Equal bit for bit, nan matching nan (and the sign of a zero)."""
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def _torch_both_loops(fn, *xs):
    """fn on one element (scalar loop) and on the element repeated 67 times (vector loop and tail)."""
    single = fn(*[x.reshape(1) for x in xs]).reshape(-1)[0].item()
    many = fn(*[x.reshape(1).expand(67).contiguous() for x in xs]).reshape(-1)
    return single, [many[i].item() for i in (0, 40, 66)]


def _allowed(expr, out: DType, choice) -> list | None:
    """The values a concrete encoding allows: one, both of an open Bool choice, or None for any."""
    if choice is None:  # (floor division's quotients past 2^p: an uninterpreted fmod, open)
        v = z3.simplify(expr)
        return [_evaluate(v, out)] if _is_value(v) else None
    if choice.sort() == z3.BoolSort():
        return [_evaluate(z3.substitute(expr, (choice, z3.BoolVal(v))), out) for v in (True, False)]
    v = z3.simplify(expr)
    return None if v.eq(choice) else [_evaluate(v, out)]


def _is_value(v) -> bool:
    return z3.is_fp_value(v) or z3.is_bv_value(v) or z3.is_true(v) or z3.is_false(v)


def _check(op, attrs, dtypes, out, args, fn):
    xs = [
        torch.tensor(a, dtype=torch.float64).to(d.torch) if d.is_float else torch.tensor(a, dtype=d.torch)
        for a, d in zip(args, dtypes)
    ]
    single, many = _torch_both_loops(fn, *xs)
    zargs = [_value(d, x.item()) for d, x in zip(dtypes, xs)]
    choice = None
    if op in E.NEEDS_CHOICE:
        choice = z3.Const("choice", E.sort(out if op == "cast" else DType.bool))
        zargs.append(choice)
    allowed = _allowed(E.ENCODINGS[op](zargs, dtypes, out, attrs), out, choice)
    if allowed is None:  # torch's result is open here (a cast out of range)
        return
    for torch_value in [single, *many]:
        value = float(torch_value) if out.is_float else torch_value
        assert any(_same(a, value) for a in allowed), (
            f"{op}{attrs} on {args} ({[str(d) for d in dtypes]}): torch gives {value}, the encoding {allowed}"
        )


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "relu": torch.relu,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "round": torch.round,
    "reciprocal": torch.reciprocal,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "floor_divide": torch.floor_divide,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_unary_encodings_match_torch(dtype):
    for op, fn in UNARY.items():
        for x in SPECIAL:
            _check(op, {}, [dtype], dtype, [x], fn)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_binary_encodings_match_torch(dtype):
    for op, fn in BINARY.items():
        for a, b in itertools.product(PAIRS, PAIRS):
            _check(op, {}, [dtype, dtype], dtype, [a, b], fn)
    for a, b in [(1.0, 0.1), (-7.0, 0.5), (5.0, -3.0), (1e30, 3.0), (-0.0, 2.0)]:
        for mode in ("floor", "trunc") if dtype in (DType.f32, DType.f64) else ("floor",):
            _check(
                "div",
                {"rounding_mode": mode},
                [dtype, dtype],
                dtype,
                [a, b],
                lambda x, y, m=mode: torch.div(x, y, rounding_mode=m),
            )
    for name, fn in [("eq", torch.eq), ("lt", torch.lt), ("ge", torch.ge), ("ne", torch.ne)]:
        for a, b in itertools.product(PAIRS[:8], PAIRS[:8]):
            _check(name, {}, [dtype, dtype], DType.bool, [a, b], fn)


@pytest.mark.parametrize("src", [*FLOATS, DType.i32, DType.i64, DType.u8, DType.i8], ids=str)
def test_cast_encodings_match_torch(src):
    values = SPECIAL if src.is_float else INT_VALUES[src]
    values = (
        [*values, 1 + 2 ** (-11) + 2 ** (-40), 2**24 + 2**16 + 1]
        if src in (DType.f64, DType.i64, DType.i32)
        else values
    )
    for out in [*FLOATS, DType.i32, DType.i64, DType.i8, DType.u8, DType.bool]:
        for x in values:
            if not src.is_float and not (-(2**63) <= x < 2**63):
                continue
            _check("cast", {"dtype": out.value}, [src], out, [x], lambda t, o=out: t.to(o.torch))


@pytest.mark.parametrize("dtype", [DType.i32, DType.i8, DType.u8], ids=str)
def test_integer_encodings_wrap_as_torch(dtype):
    values = INT_VALUES[dtype]
    for op in ("add", "sub", "mul", "maximum", "minimum"):
        for a, b in itertools.product(values, values):
            _check(op, {}, [dtype, dtype], dtype, [a, b], getattr(torch, op))
    for op in ("neg", "abs", "relu"):
        if dtype is DType.u8 and op == "neg":
            continue
        for a in values:
            _check(op, {}, [dtype], dtype, [a], getattr(torch, op))


@pytest.mark.parametrize("op", sorted(E.AXIOMS))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_axioms_hold_of_torch(op, dtype):
    fn = get_op(op).evaluate
    values = [*SPECIAL, -3.0, 20.0, -20.0, 88.0, -88.0, 1e-07, 0.7]
    for x in values:
        t = torch.tensor(x, dtype=torch.float64).to(dtype.torch)
        single, many = _torch_both_loops(fn, t)
        a = _value(dtype, t.item())
        for r in [single, *many]:
            for fact in E.axioms(op, {}, [dtype], dtype):
                for f in fact(a, _value(dtype, r), dtype):
                    assert z3.is_true(z3.simplify(f)), f"{op}({x}) = {r} in {dtype} breaks {f}"


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_a_fused_activation_is_its_standalone_op(act):
    params = {"hardtanh": (-0.5, 2.0), "leaky_relu": (0.1,)}.get(act, ())
    op, attrs = act_as_op(act, params)
    opdef = get_op(op)
    x = torch.tensor([*SPECIAL, -3.0, 0.7, 5.0], dtype=torch.float32).repeat(5)
    for dtype in (torch.float32, torch.float16):
        y = x.to(dtype)
        fused = apply_act(y, act, params)
        alone = opdef.evaluate(y, **opdef.complete_attrs(attrs))
        assert torch.equal(fused.isnan(), alone.isnan())
        assert torch.equal(fused.nan_to_num(0.0), alone.nan_to_num(0.0)), act


def test_sqrt_is_not_encoded_exactly():
    # torch's float32 sqrt is not IEEE's correctly rounded one: an exact encoding would prove false things
    x = torch.tensor([3e38], dtype=torch.float32)
    if torch.sqrt(x).item() != torch.sqrt(x.double()).float().item():
        assert "sqrt" not in E.ENCODINGS


def test_float_bits_round_trip():
    assert float_bits(DType.f16, 1.0) == 0x3C00 and float_bits(DType.bf16, -2.0) == 0xC000
