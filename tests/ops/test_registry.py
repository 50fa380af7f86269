"""The op registry is consistent: bindings name real ATen ops, inference agrees with evaluation."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gawee.ir.types import DType, TensorType
from gawee.ops import ACTIVATIONS, OPAQUE, REQUIRED, all_ops, apply_act, get_op
from gawee.ops.nn import act_as_op
from gawee.ops.opaque import resolve_target
from gawee.ops.quantized import RULE_ONLY
from gawee.ops.targets import TARGET_OPS

OPS = all_ops()


@pytest.mark.parametrize("name", sorted(OPS))
def test_opdef_is_well_formed(name):
    op = OPS[name]
    assert op.name == name
    for a in op.attrs:
        assert a.default is REQUIRED or a.accepts(a.default), f"{name}.{a.name}: bad default {a.default!r}"
    for b in op.aten:
        resolve_target(b.target)  # raises if torch has no such overload
    if name != OPAQUE:
        # an op only rules make (int8 quantization, a runtime's target ops) has no ATen spelling, by design
        made_by_rules = name in RULE_ONLY or name in TARGET_OPS
        assert op.aten or made_by_rules, f"{name} has no ATen spelling: capture can never produce it"
        assert op.flops is not None, f"{name} has no FLOPs formula"


def test_unknown_op_suggests_close_names():
    with pytest.raises(Exception, match="did you mean relu"):
        get_op("relux")


FLOAT = st.sampled_from([DType.f32, DType.f16, DType.bf16, DType.f64])
ANY = st.sampled_from([DType.f32, DType.f16, DType.i64, DType.i32, DType.bool, DType.u8])


@st.composite
def broadcast_pair(draw):
    rank = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    other = [draw(st.sampled_from([s, 1])) for s in shape][draw(st.integers(0, rank)) :]
    return tuple(shape), tuple(other)


def _sample(t: TensorType) -> torch.Tensor:
    if t.dtype is DType.bool:
        return torch.rand(t.shape) > 0.5
    if t.dtype.is_float:
        return (torch.rand(t.shape) + 0.5).to(t.dtype.torch)
    return torch.randint(1, 5, t.shape, dtype=t.dtype.torch)


ELEMENTWISE = sorted(
    n
    for n, op in OPS.items()
    if op.has_trait("elementwise") and len(op.operands) == 2 and all(a.default is not REQUIRED for a in op.attrs)
)
"""Binary elementwise ops that need no attribute (onednn_binary needs its alg: its definition is tested in
tests/ops/test_targets.py)."""
UNARY = sorted(n for n, op in OPS.items() if op.has_trait("elementwise") and len(op.operands) == 1 and not op.attrs)


@pytest.mark.parametrize("name", ELEMENTWISE)
@given(shapes=broadcast_pair(), da=ANY, db=ANY, swap=st.booleans())
def test_binary_inference_matches_evaluation(name, shapes, da, db, swap):
    op = get_op(name)
    ta, tb = TensorType(shapes[0], da), TensorType(shapes[1], db)
    if swap:
        ta, tb = tb, ta
    a, b = _sample(ta), _sample(tb)
    try:
        (out,) = op.run([a, b], op.complete_attrs({}))
    except RuntimeError:
        return  # torch rejects this dtype pair; so must inference (checked below)
    (inferred,) = op.infer_types([ta, tb], op.complete_attrs({}))
    assert inferred.same_shape_dtype(TensorType.of(out))


@pytest.mark.parametrize("name", UNARY)
@given(shape=st.lists(st.integers(1, 3), max_size=3), dtype=FLOAT)
def test_unary_inference_matches_evaluation(name, shape, dtype):
    op = get_op(name)
    t = TensorType(tuple(shape), dtype)
    try:
        (out,) = op.run([_sample(t)], {})
    except RuntimeError:
        return
    assert op.infer_types([t], {})[0].same_shape_dtype(TensorType.of(out))


def test_fused_activation_vocabulary_matches_the_unfused_ops():
    """Each fused activation is a registered standalone op whose attributes take its parameters, and
    apply_act runs exactly that op (gawee.testing.unfold proves fusion rules from this definition)."""
    x = torch.randn(64)
    for act, n in ACTIVATIONS.items():
        params = (-0.5, 0.7)[:n] if act == "hardtanh" else (0.1,) * n
        op, attrs = act_as_op(act, params)
        opdef = get_op(op)
        assert set(attrs) <= {a.name for a in opdef.attrs}, act
        assert len([v for v in attrs.values() if v in params]) == n, act
        assert torch.equal(apply_act(x, act, params), opdef.run([x], opdef.complete_attrs(attrs))[0]), act
        with pytest.raises(ValueError, match="parameters"):
            apply_act(x, act, (*params, 1.0))


def test_conv_flops_are_two_macs():
    op = get_op("conv2d")
    x, w = TensorType((2, 8, 10, 10), DType.f32), TensorType((16, 4, 3, 3), DType.f32)
    attrs = op.prepare_attrs({"padding": [1, 1], "groups": 2}, [x, w, None, None])
    (out,) = op.infer_types([x, w, None, None], attrs)
    assert out.shape == (2, 16, 10, 10)
    assert op.flops([x, w, None, None], [out], attrs) == 2 * out.numel * 4 * 3 * 3
    fused = {**attrs, "act": "relu"}
    assert op.flops([x, w, None, out], [out], fused) == 2 * out.numel * 4 * 3 * 3 + 2 * out.numel


def test_type_inference_cache_tells_an_int_attribute_from_an_equal_float():
    # 2 == 2.0 == True in Python: a cache keyed on == would give clamp(x: i64, min=2.0) the integer result
    # of clamp(x, min=2) seen before it, and the harness's draws would depend on the tests run before
    x = TensorType((2, 3), DType.i64)
    clamp = get_op("clamp")
    assert clamp.infer_types([x], {"min": 2}) == [TensorType((2, 3), DType.i64)]
    assert clamp.infer_types([x], {"min": 2.0}) == [TensorType((2, 3), DType.f32)]
    assert clamp.infer_types([x], {"min": 2}) == [TensorType((2, 3), DType.i64)]
