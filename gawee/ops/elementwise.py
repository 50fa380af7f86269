"""Elementwise ops: unary math and activations, binary arithmetic and comparisons, where, casts."""

from __future__ import annotations

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
    doc: str = "",
) -> OpDef:
    """An elementwise op of one tensor; ``aten`` defaults to ``aten.<name>.default``.

    ``keeps_dtype``: a float operand gives the same type (else inference evaluates on meta).
    ``draw_attrs(draw)`` draws valid attributes for the soundness harness (``sample``: operand types too, for
    an op not defined on floats).
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
    doc: str = "",
) -> OpDef:
    """An elementwise op of two broadcasting tensors (a Scalar operand arrives as a 0-d constant).

    ``compare``: the result is bool; ``to_float``: integer operands give a float result
    (inferred by meta evaluation); otherwise the result has the promoted dtype.
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
            aten=aten or (f"aten.{name}.Tensor", f"aten.{name}.Scalar"),
            doc=doc,
        )
    )


# -- activations (also the vocabulary of fused `act=` attributes, see ops.nn) ------------
def hardtanh(x, min_val=-1.0, max_val=1.0):
    """clamp for a floating-point tensor (torch's hardtanh is clamp there: the rule prover relies on it, see
    gawee.testing.unfold); torch's hardtanh otherwise, which keeps an integer tensor's dtype."""
    if x.is_floating_point():
        return torch.clamp(x, min_val, max_val)
    return F.hardtanh(x, min_val, max_val)


unary("relu", torch.relu, doc="max(x, 0)")
unary(
    "sigmoid",
    torch.sigmoid,
)
unary(
    "tanh",
    torch.tanh,
)
unary(
    "silu",
    F.silu,
    doc="x * sigmoid(x) (a.k.a. swish)",
)
unary(
    "hardswish",
    F.hardswish,
)
unary(
    "hardsigmoid",
    F.hardsigmoid,
)
unary(
    "mish",
    F.mish,
)
unary(
    "gelu",
    lambda self, approximate="none": F.gelu(self, approximate=approximate),
    attrs=(Attr("approximate", "str", "none"),),
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
    draw_attrs=lambda d: {"negative_slope": d.floats(-1, 1)},
)
unary(
    "elu",
    lambda self, alpha=1.0, scale=1.0, input_scale=1.0: torch.ops.aten.elu(self, alpha, scale, input_scale),
    attrs=(Attr("alpha", "float", 1.0), Attr("scale", "float", 1.0), Attr("input_scale", "float", 1.0)),
)
unary(
    "softplus",
    lambda self, beta=1.0, threshold=20.0: F.softplus(self, beta, threshold),
    attrs=(Attr("beta", "float", 1.0), Attr("threshold", "float", 20.0)),
)
unary(
    "clamp",
    lambda self, min=None, max=None: torch.clamp(self, min, max),
    attrs=(Attr("min", "scalar?", None), Attr("max", "scalar?", None)),
    draw_attrs=lambda d: (
        lambda lo: {"min": lo, "max": d.choice([None, d.floats(-1, 3)]) if lo is not None else d.floats(-1, 3)}
    )(d.choice([None, d.floats(-2, 1)])),  # one bound at least: torch refuses clamp(x, None, None)
    aten=("aten.clamp.default", AtenBinding("aten.clamp_min.default"), AtenBinding("aten.clamp_max.default")),
    doc="min(max(x, min), max); either bound may be absent",
)

# -- plain math ---------------------------------------------------------------------------


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
    unary(
        _name,
        _fn,
    )
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
    )
unary(
    "round",
    lambda self, decimals=0: torch.round(self, decimals=decimals),
    attrs=(Attr("decimals", "int", 0),),
    aten=("aten.round.default", "aten.round.decimals"),
)


binary(
    "add",
    torch.add,
    commutative=True,
    aten=(AtenBinding("aten.add.Tensor", fixed={"alpha": 1}), AtenBinding("aten.add.Scalar", fixed={"alpha": 1})),
)
binary(
    "sub",
    torch.sub,
    aten=(
        AtenBinding("aten.sub.Tensor", fixed={"alpha": 1}),
        AtenBinding("aten.sub.Scalar", fixed={"alpha": 1}),
        AtenBinding("aten.rsub.Scalar", rename={"self": "other", "other": "self"}, fixed={"alpha": 1}),
        AtenBinding("aten.rsub.Tensor", rename={"self": "other", "other": "self"}, fixed={"alpha": 1}),
    ),
)
binary(
    "mul",
    torch.mul,
    commutative=True,
)
binary(
    "div",
    lambda self, other, rounding_mode=None: torch.div(self, other, rounding_mode=rounding_mode),
    to_float=True,
    sample=lambda d, sl, a: S.elementwise(d, sl, {"rounding_mode": d.choice([None, "floor"]), **a}),
    attrs=(Attr("rounding_mode", "str?", None),),
    aten=("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode"),
    doc="true division, or floor/trunc division with rounding_mode",
)
binary(
    "pow",
    torch.pow,
    aten=tuple(
        AtenBinding(f"aten.pow.{o}", rename={"exponent": "other"}) for o in ("Tensor_Tensor", "Tensor_Scalar", "Scalar")
    ),
    doc="self ** other; a Scalar base or exponent arrives as a 0-d constant",
)
binary(
    "maximum",
    torch.maximum,
    commutative=True,
    aten=("aten.maximum.default", "aten.max.other"),
)
binary(
    "minimum",
    torch.minimum,
    commutative=True,
    aten=("aten.minimum.default", "aten.min.other"),
)
binary(
    "fmod",
    torch.fmod,
)
binary(
    "remainder",
    torch.remainder,
)
binary(
    "floor_divide",
    torch.floor_divide,
    aten=("aten.floor_divide.default", "aten.floor_divide.Scalar"),
)


binary("atan2", torch.atan2, to_float=True, aten=("aten.atan2.default",))
for _name, _fn in [("eq", torch.eq), ("ne", torch.ne)]:
    binary(
        _name,
        _fn,
        commutative=True,
        compare=True,
    )
for _name, _fn in [("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    binary(
        _name,
        _fn,
        compare=True,
    )
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
    )


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
        doc="element type conversion (a copy, also when the dtype does not change)",
    )
)
