"""Elementwise ops: unary math and activations, binary arithmetic and comparisons, where, casts."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.ir.symbolic import broadcast_shapes
from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import AtenBinding, Attr, OpDef, Operand, binary_dtype, out_numel, register, zero_flops

EW = frozenset({"pure", "elementwise"})


def _same_type_if_float(fn):
    """Inference for unary ops that keep a floating type (meta evaluation otherwise)."""

    def infer(ins, attrs):
        (t,) = ins
        if t.dtype.is_float:
            return [t]
        out = fn(torch.empty(t.shape, dtype=t.dtype.torch, device="meta"), **attrs)
        return [TensorType.of(out)]

    return infer


def _unary_sample(draw_attrs):
    def sample(draw, slots, attrs):
        return [S.same_as_input(draw, slots, attrs)], {**(draw_attrs(draw) if draw_attrs else {}), **attrs}

    return sample


def unary(
    name: str,
    fn,
    *,
    aten: tuple = (),
    attrs: tuple = (),
    keeps_dtype: bool = True,
    draw_attrs=None,
    sample=None,
    onnx=None,
    mlir=None,
    doc: str = "",
) -> OpDef:
    """An elementwise op of one tensor; ``aten`` defaults to ``aten.<name>.default``.

    ``keeps_dtype``: a float operand gives the same type (else inference evaluates on meta).
    ``draw_attrs(draw)`` draws valid attributes for the soundness harness (``sample``: operand types too, for
    an op not defined on floats). ``onnx``, ``mlir``:
    see OpDef.onnx and OpDef.mlir.
    """
    return register(
        OpDef(
            name,
            (Operand("self"),),
            fn,
            attrs=attrs,
            traits=EW,
            infer=_same_type_if_float(fn) if keeps_dtype else None,
            flops=out_numel,
            sample=sample or _unary_sample(draw_attrs),
            aten=aten or (f"aten.{name}.default",),
            onnx=onnx,
            mlir=mlir,
            doc=doc,
        )
    )


def _binary_infer(ins, attrs):
    a, b = ins
    return [TensorType(tuple(torch.broadcast_shapes(a.shape, b.shape)), binary_dtype(a, b))]


def _bool_infer(ins, attrs):
    a, b = ins
    return [TensorType(tuple(torch.broadcast_shapes(a.shape, b.shape)), DType.bool)]


def _int_sample(draw, slots, attrs):
    like = S.first_fixed(slots) or S.tensor(draw, dtype=draw.choice([DType.i32, DType.i64, DType.bool]))
    return S.fill_free(draw, slots, [False] * len(slots), like), attrs


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


# -- MLIR lowerings (OpDef.mlir; see gawee.backend.mlir) -----------------------------------
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


def _div_mlir(c):
    mode, a, b = c.attrs["rounding_mode"], c.x(0), c.x(1)
    if mode is None:
        return c.div(a, b, c.out.dtype)
    if mode == "floor":
        return _floor_div_mlir(c, a, b)
    q = c.div(a, b, c.out.dtype)  # "trunc": integer division truncates already
    return _trunc_mlir(c, q) if c.out.dtype.is_float else q


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


def binary(
    name: str,
    fn,
    *,
    commutative: bool = False,
    compare: bool = False,
    to_float: bool = False,
    aten: tuple = (),
    attrs: tuple = (),
    sample=S.elementwise,
    onnx=None,
    mlir=None,
    doc: str = "",
) -> OpDef:
    """An elementwise op of two broadcasting tensors (a Scalar operand arrives as a 0-d constant).

    ``compare``: the result is bool; ``to_float``: integer operands give a float result
    (inferred by meta evaluation); otherwise the result has the promoted dtype. ``onnx``: an
    ONNX op type (operands cast to the result's type, or to the promoted type for comparisons)
    or a lowering function.
    """
    traits = EW | ({"commutative"} if commutative else set())
    infer = _bool_infer if compare else None if to_float else _binary_infer
    return register(
        OpDef(
            name,
            (Operand("self"), Operand("other")),
            fn,
            attrs=attrs,
            traits=traits,
            infer=infer,
            flops=out_numel,
            sample=sample,
            onnx=_binary_onnx(onnx, compare) if isinstance(onnx, str) else onnx,
            mlir=mlir,
            aten=aten or (f"aten.{name}.Tensor", f"aten.{name}.Scalar"),
            doc=doc,
        )
    )


# -- activations (also the vocabulary of fused `act=` attributes, see ops.nn) ------------
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return F.hardtanh(x, min_val, max_val)


unary("relu", torch.relu, onnx="Relu", mlir=lambda c: c.max(c.x(0), 0), doc="max(x, 0)")
unary("sigmoid", torch.sigmoid, onnx="Sigmoid", mlir="stablehlo.logistic")
unary("tanh", torch.tanh, onnx="Tanh", mlir="stablehlo.tanh")
unary(
    "silu",
    F.silu,
    onnx=lambda c: c.emit("Mul", c.x(0), c.emit("Sigmoid", c.x(0))),
    mlir=lambda c: c.mul(c.x(0), c.unary("stablehlo.logistic", c.x(0))),
    doc="x * sigmoid(x) (a.k.a. swish)",
)
unary("hardswish", F.hardswish, onnx="HardSwish", mlir=lambda c: c.mul(c.x(0), _hardsigmoid_mlir(c, c.x(0))))
unary(
    "hardsigmoid",
    F.hardsigmoid,
    onnx=lambda c: c.emit("HardSigmoid", c.x(0), alpha=1 / 6, beta=0.5),
    mlir=lambda c: _hardsigmoid_mlir(c, c.x(0)),
)
unary("mish", F.mish, onnx="Mish", mlir=lambda c: c.mul(c.x(0), c.unary("stablehlo.tanh", _softplus_mlir(c, c.x(0)))))
unary(
    "gelu",
    lambda self, approximate="none": F.gelu(self, approximate=approximate),
    attrs=(Attr("approximate", "str", "none"),),
    onnx=lambda c: c.emit("Gelu", c.x(0), approximate=c.attrs["approximate"]),
    mlir=lambda c: _gelu_mlir(c, c.x(0), c.attrs["approximate"]),
    draw_attrs=lambda d: {"approximate": d.choice(["none", "tanh"])},
)
unary(
    "hardtanh",
    hardtanh,
    attrs=(Attr("min_val", "float", -1.0), Attr("max_val", "float", 1.0)),
    aten=(
        "aten.hardtanh.default",
        AtenBinding("aten.relu6.default", convert=lambda args, types: {**args, "min_val": 0.0, "max_val": 6.0}),
    ),
    onnx=lambda c: c.emit(
        "Clip", c.x(0), c.scalar(c.attrs["min_val"], c.out.dtype), c.scalar(c.attrs["max_val"], c.out.dtype)
    ),
    mlir=lambda c: c.clamp(c.x(0), c.attrs["min_val"], c.attrs["max_val"]),
    draw_attrs=lambda d: (
        dict(zip(("min_val", "max_val"), sorted((d.floats(-2, 2), d.floats(-2, 6)))))
        if d.boolean(0.7)
        else {"min_val": 0.0, "max_val": 6.0}
    ),
    doc="clamp(x, min_val, max_val); relu6 is hardtanh(0, 6)",
)
unary(
    "leaky_relu",
    lambda self, negative_slope=0.01: F.leaky_relu(self, negative_slope),
    attrs=(Attr("negative_slope", "float", 0.01),),
    onnx=lambda c: c.emit("LeakyRelu", c.x(0), alpha=float(c.attrs["negative_slope"])),
    mlir=lambda c: c.select(c.compare("GT", c.x(0), 0), c.x(0), c.mul(c.x(0), c.attrs["negative_slope"])),
    draw_attrs=lambda d: {"negative_slope": d.floats(-1, 1)},
)
unary(
    "elu",
    lambda self, alpha=1.0, scale=1.0, input_scale=1.0: torch.ops.aten.elu(self, alpha, scale, input_scale),
    attrs=(Attr("alpha", "float", 1.0), Attr("scale", "float", 1.0), Attr("input_scale", "float", 1.0)),
    onnx=lambda c: (
        c.emit("Elu", c.x(0), alpha=c.attrs["alpha"])
        if c.attrs["scale"] == c.attrs["input_scale"] == 1
        else c.fail("elu with scale or input_scale")
    ),
    mlir=lambda c: c.mul(
        c.select(
            c.compare("GT", c.x(0), 0),
            c.x(0),
            c.mul(c.unary("stablehlo.exponential_minus_one", c.mul(c.x(0), c.attrs["input_scale"])), c.attrs["alpha"]),
        ),
        c.attrs["scale"],
    ),
)
unary(
    "softplus",
    lambda self, beta=1.0, threshold=20.0: F.softplus(self, beta, threshold),
    attrs=(Attr("beta", "float", 1.0), Attr("threshold", "float", 20.0)),
    onnx=lambda c: c.emit(
        "Div",
        c.emit("Softplus", c.emit("Mul", c.x(0), c.scalar(c.attrs["beta"], c.out.dtype))),
        c.scalar(c.attrs["beta"], c.out.dtype),
    ),
    mlir=lambda c: _softplus_mlir(c, c.x(0), c.attrs["beta"], c.attrs["threshold"]),
)
unary(
    "clamp",
    lambda self, min=None, max=None: torch.clamp(self, min, max),
    attrs=(Attr("min", "scalar?", None), Attr("max", "scalar?", None)),
    onnx=lambda c: c.emit(
        "Clip", c.x(0), *("" if c.attrs[k] is None else c.scalar(c.attrs[k], c.out.dtype) for k in ("min", "max"))
    ),
    mlir=lambda c: c.clamp(c.convert(c.x(0), c.out.dtype), c.attrs["min"], c.attrs["max"]),
    draw_attrs=lambda d: (
        lambda lo: {"min": lo, "max": d.choice([None, d.floats(-1, 3)]) if lo is not None else d.floats(-1, 3)}
    )(d.choice([None, d.floats(-2, 1)])),  # one bound at least: torch refuses clamp(x, None, None)
    aten=("aten.clamp.default", AtenBinding("aten.clamp_min.default"), AtenBinding("aten.clamp_max.default")),
    doc="min(max(x, min), max); either bound may be absent",
)

# -- plain math ---------------------------------------------------------------------------
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
"""ONNX spelling of the plain math ops registered below. ONNX has no expm1 or log1p: exp(x) - 1 and
log(1 + x) lose the relative accuracy of tiny x (not the absolute accuracy the exports are held to)."""

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


for _name, _fn in [
    ("exp", torch.exp),
    ("exp2", torch.exp2),
    ("expm1", torch.expm1),
    ("log", torch.log),
    ("log2", torch.log2),
    ("log1p", torch.log1p),
    ("sqrt", torch.sqrt),
    ("rsqrt", torch.rsqrt),
    ("neg", torch.neg),
    ("abs", torch.abs),
    ("reciprocal", torch.reciprocal),
    ("sin", torch.sin),
    ("cos", torch.cos),
    ("erf", torch.erf),
    ("floor", torch.floor),
    ("ceil", torch.ceil),
    ("trunc", torch.trunc),
    ("sign", torch.sign),
]:
    unary(_name, _fn, onnx=_MATH_ONNX.get(_name), mlir=_MATH_MLIR[_name])
for _name, _fn in [
    ("logical_not", torch.logical_not),
    ("bitwise_not", torch.bitwise_not),
    ("isnan", torch.isnan),
    ("isinf", torch.isinf),
]:
    unary(
        _name,
        _fn,
        keeps_dtype=False,
        sample=_int_sample if _name == "bitwise_not" else None,
        onnx=_MATH_ONNX[_name],
        mlir=_MATH_MLIR[_name],
    )
unary(
    "round",
    lambda self, decimals=0: torch.round(self, decimals=decimals),
    attrs=(Attr("decimals", "int", 0),),
    aten=("aten.round.default", "aten.round.decimals"),
    onnx=lambda c: c.emit("Round", c.x(0)) if c.attrs["decimals"] == 0 else c.fail("round to decimals"),
    mlir=lambda c: (
        c.fail("round to decimals")
        if c.attrs["decimals"]
        else c.unary("stablehlo.round_nearest_even", c.x(0))
        if c.out.dtype.is_float
        else c.x(0)
    ),
)


binary(
    "add",
    torch.add,
    commutative=True,
    onnx="Add",
    mlir="stablehlo.add",
    aten=(AtenBinding("aten.add.Tensor", fixed={"alpha": 1}), AtenBinding("aten.add.Scalar", fixed={"alpha": 1})),
)
binary(
    "sub",
    torch.sub,
    onnx="Sub",
    mlir="stablehlo.subtract",
    aten=(
        AtenBinding("aten.sub.Tensor", fixed={"alpha": 1}),
        AtenBinding("aten.sub.Scalar", fixed={"alpha": 1}),
        AtenBinding("aten.rsub.Scalar", rename={"self": "other", "other": "self"}, fixed={"alpha": 1}),
        AtenBinding("aten.rsub.Tensor", rename={"self": "other", "other": "self"}, fixed={"alpha": 1}),
    ),
)
binary("mul", torch.mul, commutative=True, onnx="Mul", mlir="stablehlo.multiply")
binary(
    "div",
    lambda self, other, rounding_mode=None: torch.div(self, other, rounding_mode=rounding_mode),
    to_float=True,
    sample=lambda d, sl, a: S.elementwise(d, sl, {"rounding_mode": d.choice([None, "floor"]), **a}),
    attrs=(Attr("rounding_mode", "str?", None),),
    onnx=lambda c: (
        _binary_onnx("Div", False)(c)
        if c.attrs["rounding_mode"] is None
        else _rounded_div_onnx(c, c.attrs["rounding_mode"])
    ),
    mlir=_div_mlir,
    aten=("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode"),
    doc="true division, or floor/trunc division with rounding_mode",
)
binary(
    "pow",
    torch.pow,
    onnx="Pow",
    mlir="stablehlo.power",
    aten=tuple(
        AtenBinding(f"aten.pow.{o}", rename={"exponent": "other"}) for o in ("Tensor_Tensor", "Tensor_Scalar", "Scalar")
    ),
    doc="self ** other; a Scalar base or exponent arrives as a 0-d constant",
)
binary(
    "maximum",
    torch.maximum,
    commutative=True,
    onnx="Max",
    mlir="stablehlo.maximum",
    aten=("aten.maximum.default", "aten.max.other"),
)
binary(
    "minimum",
    torch.minimum,
    commutative=True,
    onnx="Min",
    mlir="stablehlo.minimum",
    aten=("aten.minimum.default", "aten.min.other"),
)
binary("fmod", torch.fmod, onnx=lambda c: _mod_onnx(c, fmod=True), mlir="stablehlo.remainder")
binary("remainder", torch.remainder, onnx=lambda c: _mod_onnx(c, fmod=False), mlir=_remainder_mlir)
binary(
    "floor_divide",
    torch.floor_divide,
    onnx=lambda c: _rounded_div_onnx(c, "floor"),
    mlir=lambda c: _floor_div_mlir(c, c.x(0), c.x(1)),
    aten=("aten.floor_divide.default", "aten.floor_divide.Scalar"),
)


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


binary("atan2", torch.atan2, to_float=True, onnx=_atan2_onnx, mlir="stablehlo.atan2", aten=("aten.atan2.default",))
for _name, _fn in [("eq", torch.eq), ("ne", torch.ne)]:
    binary(
        _name,
        _fn,
        commutative=True,
        compare=True,
        onnx=_binary_onnx("Equal", True, negate=_name == "ne"),
        mlir=_compare_mlir(_name.upper()),
    )
for _name, _fn, _onnx in [
    ("lt", torch.lt, "Less"),
    ("le", torch.le, "LessOrEqual"),
    ("gt", torch.gt, "Greater"),
    ("ge", torch.ge, "GreaterOrEqual"),
]:
    binary(_name, _fn, compare=True, onnx=_onnx, mlir=_compare_mlir(_name.upper()))
for _name, _fn in [
    ("logical_and", torch.logical_and),
    ("logical_or", torch.logical_or),
    ("logical_xor", torch.logical_xor),
]:
    binary(
        _name,
        _fn,
        commutative=True,
        compare=True,
        aten=(f"aten.{_name}.default",),
        sample=_int_sample,
        onnx=(lambda op_type: lambda c: c.emit(op_type, c.x_as(0, DType.bool), c.x_as(1, DType.bool)))(
            {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}[_name]
        ),
        mlir=_logical_mlir("stablehlo." + _name[len("logical_") :]),
    )


def _bitwise_onnx(bitwise: str, logical: str):
    """ONNX's Bitwise* take integers only: on bool (masks, ``a & b``) the logical op is the same function."""

    def lower(c):
        return _binary_onnx(logical if c.out.dtype is DType.bool else bitwise, False)(c)

    return lower


for _name, _fn, _py in [
    ("bitwise_and", torch.bitwise_and, "and"),
    ("bitwise_or", torch.bitwise_or, "or"),
    ("bitwise_xor", torch.bitwise_xor, "xor"),
]:
    binary(
        _name,
        _fn,
        commutative=True,
        sample=_int_sample,
        onnx=_bitwise_onnx("Bitwise" + _py.capitalize(), _py.capitalize()),
        mlir="stablehlo." + _py,
        aten=(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.__{_py}__.Tensor", f"aten.__{_py}__.Scalar"),
        doc=f"the `__{_py}__` operator; on bool tensors, logical {_py}",
    )

register(
    OpDef(
        "where",
        (Operand("condition"), Operand("self"), Operand("other")),
        torch.where,
        traits=EW,
        flops=out_numel,
        sample=lambda d, sl, a: (_where_types(d, sl), a),
        onnx=lambda c: c.emit("Where", c.x(0), c.x_as(1, c.out.dtype), c.x_as(2, c.out.dtype)),
        mlir=lambda c: c.select(c.convert(c.x(0), DType.bool), c.x(1), c.x(2), dtype=c.out.dtype),
        aten=("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar"),
        doc="condition ? self : other, broadcasting all three",
    )
)

register(
    OpDef(
        "masked_fill",
        (Operand("self"), Operand("mask"), Operand("value")),
        lambda self, mask, value: torch.masked_fill(self, mask, value),
        traits=EW,
        flops=out_numel,
        sample=lambda d, sl, a: (_masked_fill_types(d, sl), a),
        onnx=lambda c: c.emit("Where", c.x(1), c.x_as(2, c.out.dtype), c.x(0)),
        mlir=lambda c: c.select(c.convert(c.x(1), DType.bool), c.x(2), c.x(0), dtype=c.out.dtype),
        aten=("aten.masked_fill.Scalar", "aten.masked_fill.Tensor"),
        doc="value where mask, else self; value is a 0-d tensor",
    )
)


def _addcmul_flops(ins, outs, attrs):
    """t1 * t2, times value unless it is 1, plus self: per output element."""
    return (2 if attrs["value"] == 1 else 3) * outs[0].numel


def _addcmul_sample(draw, slots, attrs):
    """Free operands are broadcast partners of the first fixed one; Reject when the three do not broadcast."""
    types, attrs = S.elementwise(draw, slots, {"value": draw.choice([1, 0.5, -2.0]), **attrs})
    try:
        torch.broadcast_shapes(*(t.shape for t in types))
    except RuntimeError:
        raise S.Reject("operands do not broadcast together") from None
    return types, attrs


def _addcmul_onnx(c):
    dtype = c.out.dtype
    prod = c.emit("Mul", c.x_as(1, dtype), c.x_as(2, dtype))
    if c.attrs["value"] != 1:
        prod = c.emit("Mul", prod, c.scalar(c.attrs["value"], dtype))
    return c.emit("Add", c.x_as(0, dtype), prod)


register(
    OpDef(
        "addcmul",
        (Operand("self"), Operand("tensor1"), Operand("tensor2")),
        lambda self, tensor1, tensor2, *, value: torch.addcmul(self, tensor1, tensor2, value=value),
        attrs=(Attr("value", "scalar", 1),),
        traits=EW,
        flops=_addcmul_flops,
        shape_formula=lambda t, a: [broadcast_shapes(*(x.shape for x in t))],  # torch's kernel pins a 0-d operand
        sample=_addcmul_sample,
        onnx=_addcmul_onnx,
        mlir=lambda c: c.add(c.x(0), c.mul(c.mul(c.x(1), c.x(2), c.out.dtype), c.attrs["value"]), c.out.dtype),
        aten=("aten.addcmul.default",),
        doc="self + value * tensor1 * tensor2, broadcasting all three (GRN of ConvNeXt-V2)",
    )
)


def _where_types(draw, slots):
    like = S.first_fixed(slots[1:]) or S.tensor(draw)
    cond = slots[0] if slots[0] is not S.FREE else S.broadcast_partner(draw, like, DType.bool)
    return [cond, *S.fill_free(draw, slots[1:], [False, False], like)]


def _masked_fill_types(draw, slots):
    x = S.same_as_input(draw, slots, {})
    mask = slots[1] if slots[1] is not S.FREE else S.broadcast_partner(draw, x, DType.bool)
    value = slots[2] if slots[2] is not S.FREE else TensorType((), x.dtype)
    return [x, mask, value]


def _cast_args(args, types):
    # Only a dtype change is a cast; moving devices or layouts stays opaque.
    if args.get("layout") not in (None, torch.strided) or args.get("pin_memory"):
        return None
    if args.get("device") is not None and torch.device(args["device"]).type != "cpu":
        return None
    args = {k: v for k, v in args.items() if k in ("self", "dtype")}
    if args.get("dtype") is None:
        args["dtype"] = types["self"].dtype.value
    return args


register(
    OpDef(
        "cast",
        (Operand("self"),),
        lambda self, dtype: self.to(DType.parse(dtype).torch, copy=True),
        attrs=(Attr("dtype", "dtype"),),
        traits=EW,
        infer=lambda ins, attrs: [TensorType(ins[0].shape, DType.parse(attrs["dtype"]), ins[0].layout)],
        flops=zero_flops,
        sample=lambda d, sl, a: (
            [S.same_as_input(d, sl, a)],
            {"dtype": d.choice(["f32", "f16", "bf16", "f64", "i32", "i64"]), **a},
        ),
        aten=(
            AtenBinding("aten._to_copy.default", convert=_cast_args),
            # the training IR's spellings (a capture that needs no functionalization keeps them): without
            # mutation, a result that may alias its input is the same values as a copy
            AtenBinding("aten.to.dtype", convert=_cast_args),
            AtenBinding("aten.to.dtype_layout", convert=_cast_args),
            AtenBinding("aten.to.device", convert=_cast_args),
        ),
        onnx=lambda c: c.cast(c.x(0), c.out.dtype),
        mlir=lambda c: c.convert(c.x(0), c.out.dtype),
        doc="element type conversion (a copy, also when the dtype does not change)",
    )
)
