"""StableHLO lowerings of the elementwise ops (gawee.ops.elementwise): math, activations, arithmetic, casts."""

from __future__ import annotations

import math

from gawee.backend.lower_mlir import MLIR
from gawee.ir.types import DType
from gawee.ops.base import binary_dtype


def _compare_mlir(direction: str):
    """``stablehlo.compare`` on the operands converted to their promoted type."""
    return lambda c: c.compare(direction, c.x(0), c.x(1), dtype=binary_dtype(c.type(0), c.type(1)))


def _logical_mlir(op: str):
    return lambda c: c.ew(op, c.convert(c.x(0), DType.bool), c.convert(c.x(1), DType.bool), dtype=DType.bool)


def _floor_div_mlir(c, a, b):
    """Floor division in the result's type: floor(a / b) for floats; for integers, the truncated
    quotient minus one where the remainder is nonzero and the signs differ."""
    dtype = c.out.dtype
    if dtype.is_float:
        return c.unary("stablehlo.floor", c.div(a, b, dtype))
    q, r = c.div(a, b, dtype), c.ew("stablehlo.remainder", a, b, dtype=dtype)
    fix = c.ew(
        "stablehlo.and",
        c.compare("NE", r, 0),
        c.compare("NE", c.compare("LT", r, 0), c.compare("LT", c.convert(b, dtype), 0)),
        dtype=DType.bool,
    )
    return c.select(fix, c.sub(q, 1), q)


@MLIR.register("div")
def _div_mlir(c):
    mode, a, b = c.attrs["rounding_mode"], c.x(0), c.x(1)
    if mode is None:
        return c.div(a, b, c.out.dtype)
    if mode == "floor":
        return _floor_div_mlir(c, a, b)
    q = c.div(a, b, c.out.dtype)  # "trunc": integer division truncates already
    return _trunc_mlir(c, q) if c.out.dtype.is_float else q


@MLIR.register("remainder")
def _remainder_mlir(c):
    """Python's modulo: C's fmod, plus ``other`` where the remainder's sign differs from it."""
    dtype = c.out.dtype
    r = c.ew("stablehlo.remainder", c.x(0), c.x(1), dtype=dtype)
    b = c.convert(c.x(1), dtype)
    fix = c.ew(
        "stablehlo.and",
        c.compare("NE", r, 0),
        c.compare("NE", c.compare("LT", r, 0), c.compare("LT", b, 0)),
        dtype=DType.bool,
    )
    return c.select(fix, c.add(r, b), r)


def _trunc_mlir(c, x):
    return c.select(c.compare("LT", x, 0), c.unary("stablehlo.ceil", x), c.unary("stablehlo.floor", x))


def _hardsigmoid_mlir(c, x):
    return c.div(c.clamp(c.add(x, 3), 0, 6), 6)


def _softplus_mlir(c, x, beta: float = 1.0, threshold: float = 20.0):
    """log1p(exp(beta x)) / beta, and x itself where beta x > threshold (torch's linear region)."""
    bx = c.mul(x, beta) if beta != 1 else x
    soft = c.unary("stablehlo.log_plus_one", c.unary("stablehlo.exponential", bx))
    if beta != 1:
        soft = c.div(soft, beta)
    return c.select(c.compare("GT", bx, threshold), x, soft)


def _gelu_mlir(c, x, approximate: str = "none"):
    if approximate == "tanh":
        inner = c.mul(c.add(x, c.mul(c.mul(c.mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi))
        return c.mul(c.mul(x, 0.5), c.add(c.unary("stablehlo.tanh", inner), 1))
    return c.mul(c.mul(x, 0.5), c.add(c.unary("chlo.erf", c.mul(x, math.sqrt(0.5))), 1))


def _isinf_mlir(c):
    x = c.x(0)
    if not x.dtype.is_float:
        return c.splat(False, DType.bool, x.shape)
    return c.compare("EQ", c.unary("stablehlo.abs", x), math.inf)


_MATH_MLIR = {
    "exp": "stablehlo.exponential",
    "exp2": lambda c: c.unary("stablehlo.exponential", c.mul(c.convert(c.x(0), c.out.dtype), math.log(2))),
    "expm1": "stablehlo.exponential_minus_one",
    "log": "stablehlo.log",
    "log2": lambda c: c.div(c.unary("stablehlo.log", c.convert(c.x(0), c.out.dtype)), math.log(2)),
    "log1p": "stablehlo.log_plus_one",
    "sqrt": "stablehlo.sqrt",
    "rsqrt": "stablehlo.rsqrt",
    "neg": "stablehlo.negate",
    "abs": "stablehlo.abs",
    "reciprocal": lambda c: c.div(1, c.convert(c.x(0), c.out.dtype), c.out.dtype),
    "sin": "stablehlo.sine",
    "cos": "stablehlo.cosine",
    "erf": "chlo.erf",
    "floor": "stablehlo.floor",
    "ceil": "stablehlo.ceil",
    "trunc": lambda c: _trunc_mlir(c, c.x(0)),
    "sign": lambda c: (  # torch's sign of nan is 0, StableHLO's nan
        c.select(c.compare("NE", c.x(0), c.x(0)), 0, c.unary("stablehlo.sign", c.x(0)))
        if c.out.dtype.is_float
        else c.unary("stablehlo.sign", c.x(0))
    ),
    "logical_not": lambda c: c.unary("stablehlo.not", c.convert(c.x(0), DType.bool)),
    "bitwise_not": "stablehlo.not",
    "isnan": lambda c: c.compare("NE", c.x(0), c.x(0)),
    "isinf": _isinf_mlir,
}
"""StableHLO spelling of the plain math ops (an op name, or a composition)."""


MLIR.add("relu", lambda c: c.max(c.x(0), 0))
MLIR.add("sigmoid", "stablehlo.logistic")
MLIR.add("tanh", "stablehlo.tanh")
MLIR.add("silu", lambda c: c.mul(c.x(0), c.unary("stablehlo.logistic", c.x(0))))
MLIR.add("hardswish", lambda c: c.mul(c.x(0), _hardsigmoid_mlir(c, c.x(0))))
MLIR.add("hardsigmoid", lambda c: _hardsigmoid_mlir(c, c.x(0)))
MLIR.add("mish", lambda c: c.mul(c.x(0), c.unary("stablehlo.tanh", _softplus_mlir(c, c.x(0)))))
MLIR.add("gelu", lambda c: _gelu_mlir(c, c.x(0), c.attrs["approximate"]))
MLIR.add("hardtanh", lambda c: c.clamp(c.x(0), c.attrs["min_val"], c.attrs["max_val"]))
MLIR.add("leaky_relu", lambda c: c.select(c.compare("GT", c.x(0), 0), c.x(0), c.mul(c.x(0), c.attrs["negative_slope"])))
MLIR.add(
    "elu",
    lambda c: c.mul(
        c.select(
            c.compare("GT", c.x(0), 0),
            c.x(0),
            c.mul(c.unary("stablehlo.exponential_minus_one", c.mul(c.x(0), c.attrs["input_scale"])), c.attrs["alpha"]),
        ),
        c.attrs["scale"],
    ),
)
MLIR.add("softplus", lambda c: _softplus_mlir(c, c.x(0), c.attrs["beta"], c.attrs["threshold"]))
MLIR.add("clamp", lambda c: c.clamp(c.convert(c.x(0), c.out.dtype), c.attrs["min"], c.attrs["max"]))
for _name, _lowering in _MATH_MLIR.items():
    MLIR.add(_name, _lowering)
MLIR.add(
    "round",
    lambda c: (
        c.fail("round to decimals")
        if c.attrs["decimals"]
        else c.unary("stablehlo.round_nearest_even", c.x(0))
        if c.out.dtype.is_float
        else c.x(0)
    ),
)
MLIR.add("add", "stablehlo.add")
MLIR.add("sub", "stablehlo.subtract")
MLIR.add("mul", "stablehlo.multiply")
MLIR.add("pow", "stablehlo.power")
MLIR.add("maximum", "stablehlo.maximum")
MLIR.add("minimum", "stablehlo.minimum")
MLIR.add("fmod", "stablehlo.remainder")
MLIR.add("floor_divide", lambda c: _floor_div_mlir(c, c.x(0), c.x(1)))
MLIR.add("atan2", "stablehlo.atan2")
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    MLIR.add(_name, _compare_mlir(_name.upper()))
for _name in ("logical_and", "logical_or", "logical_xor"):
    MLIR.add(_name, _logical_mlir("stablehlo." + _name[len("logical_") :]))
for _py in ("and", "or", "xor"):
    MLIR.add(f"bitwise_{_py}", "stablehlo." + _py)
MLIR.add("where", lambda c: c.select(c.convert(c.x(0), DType.bool), c.x(1), c.x(2), dtype=c.out.dtype))
MLIR.add("masked_fill", lambda c: c.select(c.convert(c.x(1), DType.bool), c.x(2), c.x(0), dtype=c.out.dtype))
MLIR.add("addcmul", lambda c: c.add(c.x(0), c.mul(c.mul(c.x(1), c.x(2), c.out.dtype), c.attrs["value"]), c.out.dtype))
MLIR.add("cast", lambda c: c.convert(c.x(0), c.out.dtype))
