"""ONNX lowerings of the elementwise ops (gawee.ops.elementwise): math, activations, arithmetic, comparisons, casts."""

from __future__ import annotations

import math

from gawee.backend.lower_onnx import ONNX
from gawee.ir.types import DType
from gawee.ops.base import binary_dtype


def _binary_onnx(op_type: str, compare: bool, negate: bool = False):
    """The ONNX op on operands cast to one type (ONNX does not promote); ``negate``: Not of its result."""

    def lower(c):
        dtype = binary_dtype(c.type(0), c.type(1)) if compare else c.out.dtype
        y = c.emit(op_type, c.x_as(0, dtype), c.x_as(1, dtype))
        return c.emit("Not", y) if negate else y

    return lower


def _mod_onnx(c, fmod: bool):
    """ONNX Mod: ``fmod=1`` is C's fmod (the sign of the dividend, torch.fmod); ``fmod=0`` takes the sign
    of the divisor (torch.remainder), which ONNX defines for integers only, so float remainder is fmod moved
    by b where the signs differ: exact, where a - floor(a / b) * b is off by b when a / b rounds to an integer."""
    a, b = c.x_as(0, c.out.dtype), c.x_as(1, c.out.dtype)
    if fmod or not c.out.dtype.is_float:
        return c.emit("Mod", a, b, fmod=int(fmod))
    r = c.emit("Mod", a, b, fmod=1)  # exact; then moved by b where its sign differs from b's (as torch computes it)
    zero = c.scalar(0, c.out.dtype)
    moved = c.emit(
        "And", c.emit("Not", c.emit("Equal", r, zero)), c.emit("Xor", c.emit("Less", r, zero), c.emit("Less", b, zero))
    )
    return c.emit("Where", moved, c.emit("Add", r, b), r)


def _rounded_div_onnx(c, mode: str) -> str:
    """Division rounded by ``mode`` ("floor" or "trunc") in the result's type. ONNX's Div truncates integers
    (C's division), so integer floor division is that quotient minus one where the remainder (C's fmod, the
    dividend's sign) is nonzero and its sign differs from the divisor's: -7 // 2 is -4, not -3. Floats: Floor
    of the quotient, or for trunc, Ceil where it is negative and Floor elsewhere."""
    dtype = c.out.dtype
    a, b = c.x_as(0, dtype), c.x_as(1, dtype)
    q = c.emit("Div", a, b)
    if dtype.is_float:
        if mode == "floor":
            return c.emit("Floor", q)
        return c.emit("Where", c.emit("Less", q, c.scalar(0, dtype)), c.emit("Ceil", q), c.emit("Floor", q))
    if mode == "trunc":
        return q
    zero = c.scalar(0, dtype)
    r = c.emit("Mod", a, b, fmod=1)
    fix = c.emit(
        "And", c.emit("Not", c.emit("Equal", r, zero)), c.emit("Xor", c.emit("Less", r, zero), c.emit("Less", b, zero))
    )
    return c.emit("Where", fix, c.emit("Sub", q, c.scalar(1, dtype)), q)


_MATH_ONNX = {
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "neg": "Neg",
    "abs": "Abs",
    "reciprocal": "Reciprocal",
    "sin": "Sin",
    "cos": "Cos",
    "erf": "Erf",
    "floor": "Floor",
    "ceil": "Ceil",
    "rsqrt": lambda c: c.emit("Reciprocal", c.emit("Sqrt", c.x(0))),
    "sign": lambda c: (  # torch's sign of nan is 0, ONNX's nan
        c.emit("Where", c.emit("IsNaN", c.x(0)), c.scalar(0, c.out.dtype), c.emit("Sign", c.x(0)))
        if c.out.dtype.is_float
        else c.emit("Sign", c.x(0))
    ),
    "logical_not": lambda c: c.emit("Not", c.x_as(0, DType.bool)),
    "bitwise_not": lambda c: c.emit("Not" if c.type(0).dtype is DType.bool else "BitwiseNot", c.x(0)),
    "isnan": "IsNaN",
    "isinf": "IsInf",
    "exp2": lambda c: c.emit("Pow", c.scalar(2.0, c.out.dtype), c.x_as(0, c.out.dtype)),
    "expm1": lambda c: c.emit("Sub", c.emit("Exp", c.x_as(0, c.out.dtype)), c.scalar(1.0, c.out.dtype)),
    "log2": lambda c: c.emit("Div", c.emit("Log", c.x_as(0, c.out.dtype)), c.scalar(math.log(2), c.out.dtype)),
    "log1p": lambda c: c.emit("Log", c.emit("Add", c.x_as(0, c.out.dtype), c.scalar(1.0, c.out.dtype))),
    "trunc": lambda c: (
        c.emit(
            "Where", c.emit("Less", c.x(0), c.scalar(0, c.out.dtype)), c.emit("Ceil", c.x(0)), c.emit("Floor", c.x(0))
        )
        if c.out.dtype.is_float
        else c.emit("Identity", c.x(0))
    ),
}
"""ONNX spelling of the plain math ops. ONNX has no expm1 or log1p: exp(x) - 1 and log(1 + x) lose the relative
accuracy of tiny x (not the absolute accuracy the exports are held to)."""


@ONNX.register("atan2")
def _atan2_onnx(c):
    """atan(y / x), moved by ±pi (the sign of y) where x is negative or -0; 0 or ±pi where y is ±0 (ONNX has no
    Atan2; atan2(±0, -0) is ±pi as torch's, though ONNX Runtime's Where returns -0 as 0)."""
    dtype = c.out.dtype
    y, x = c.x_as(0, dtype), c.x_as(1, dtype)
    zero, pi = c.scalar(0, dtype), c.scalar(math.pi, dtype)

    def negative(v: str) -> str:  # v < 0, or v is -0
        return c.emit("Or", c.emit("Less", v, zero), c.emit("IsInf", c.emit("Reciprocal", v), detect_positive=0))

    base = c.emit("Atan", c.emit("Div", y, x))
    shift = c.emit("Where", negative(y), c.emit("Neg", pi), pi)
    x_negative = negative(x)
    on_x_axis = c.emit("Where", x_negative, shift, y)
    off_axis = c.emit("Where", x_negative, c.emit("Add", base, shift), base)
    return c.emit("Where", c.emit("Equal", y, zero), on_x_axis, off_axis)


def _bitwise_onnx(bitwise: str, logical: str):
    """ONNX's Bitwise* take integers only: on bool (masks, ``a & b``) the logical op is the same function."""

    def lower(c):
        return _binary_onnx(logical if c.out.dtype is DType.bool else bitwise, False)(c)

    return lower


@ONNX.register("addcmul")
def _addcmul_onnx(c):
    dtype = c.out.dtype
    prod = c.emit("Mul", c.x_as(1, dtype), c.x_as(2, dtype))
    if c.attrs["value"] != 1:
        prod = c.emit("Mul", prod, c.scalar(c.attrs["value"], dtype))
    return c.emit("Add", c.x_as(0, dtype), prod)


ONNX.add("relu", "Relu")
ONNX.add("sigmoid", "Sigmoid")
ONNX.add("tanh", "Tanh")
ONNX.add("silu", lambda c: c.emit("Mul", c.x(0), c.emit("Sigmoid", c.x(0))))
ONNX.add("hardswish", "HardSwish")
ONNX.add("hardsigmoid", lambda c: c.emit("HardSigmoid", c.x(0), alpha=1 / 6, beta=0.5))
ONNX.add("mish", "Mish")
ONNX.add("gelu", lambda c: c.emit("Gelu", c.x(0), approximate=c.attrs["approximate"]))
ONNX.add(
    "hardtanh",
    lambda c: c.emit(
        "Clip", c.x(0), c.scalar(c.attrs["min_val"], c.out.dtype), c.scalar(c.attrs["max_val"], c.out.dtype)
    ),
)
ONNX.add("leaky_relu", lambda c: c.emit("LeakyRelu", c.x(0), alpha=float(c.attrs["negative_slope"])))
ONNX.add(
    "elu",
    lambda c: (
        c.emit("Elu", c.x(0), alpha=c.attrs["alpha"])
        if c.attrs["scale"] == c.attrs["input_scale"] == 1
        else c.fail("elu with scale or input_scale")
    ),
)
ONNX.add(
    "softplus",
    lambda c: c.emit(
        "Div",
        c.emit("Softplus", c.emit("Mul", c.x(0), c.scalar(c.attrs["beta"], c.out.dtype))),
        c.scalar(c.attrs["beta"], c.out.dtype),
    ),
)
ONNX.add(
    "clamp",
    lambda c: c.emit(
        "Clip", c.x(0), *("" if c.attrs[k] is None else c.scalar(c.attrs[k], c.out.dtype) for k in ("min", "max"))
    ),
)
for _name, _lowering in _MATH_ONNX.items():
    ONNX.add(_name, _lowering)
ONNX.add("round", lambda c: c.emit("Round", c.x(0)) if c.attrs["decimals"] == 0 else c.fail("round to decimals"))
ONNX.add("add", _binary_onnx("Add", False))
ONNX.add("sub", _binary_onnx("Sub", False))
ONNX.add("mul", _binary_onnx("Mul", False))
ONNX.add(
    "div",
    lambda c: (
        _binary_onnx("Div", False)(c)
        if c.attrs["rounding_mode"] is None
        else _rounded_div_onnx(c, c.attrs["rounding_mode"])
    ),
)
ONNX.add("pow", _binary_onnx("Pow", False))
ONNX.add("maximum", _binary_onnx("Max", False))
ONNX.add("minimum", _binary_onnx("Min", False))
ONNX.add("fmod", lambda c: _mod_onnx(c, fmod=True))
ONNX.add("remainder", lambda c: _mod_onnx(c, fmod=False))
ONNX.add("floor_divide", lambda c: _rounded_div_onnx(c, "floor"))
ONNX.add("eq", _binary_onnx("Equal", True))
ONNX.add("ne", _binary_onnx("Equal", True, negate=True))
ONNX.add("lt", _binary_onnx("Less", True))
ONNX.add("le", _binary_onnx("LessOrEqual", True))
ONNX.add("gt", _binary_onnx("Greater", True))
ONNX.add("ge", _binary_onnx("GreaterOrEqual", True))
for _name, _op_type in [("logical_and", "And"), ("logical_or", "Or"), ("logical_xor", "Xor")]:
    ONNX.add(_name, (lambda op_type: lambda c: c.emit(op_type, c.x_as(0, DType.bool), c.x_as(1, DType.bool)))(_op_type))
for _py in ("and", "or", "xor"):
    ONNX.add(f"bitwise_{_py}", _bitwise_onnx("Bitwise" + _py.capitalize(), _py.capitalize()))
ONNX.add("where", lambda c: c.emit("Where", c.x(0), c.x_as(1, c.out.dtype), c.x_as(2, c.out.dtype)))
ONNX.add("masked_fill", lambda c: c.emit("Where", c.x(1), c.x_as(2, c.out.dtype), c.x(0)))
ONNX.add("cast", lambda c: c.cast(c.x(0), c.out.dtype))
