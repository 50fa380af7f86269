"""Shape formulas (OpDef.shape_formula): symbolic inference for ops whose torch fake kernel pins a size.

Soundness: on every sampled concrete instance a formula gives what evaluation gives, and over a symbolic
batch the inferred type, at several values of the symbol, is the concrete inference at that value."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gawee.errors import InferenceError
from gawee.ir.symbolic import Sym, draw_values
from gawee.ir.types import DType, TensorType
from gawee.ops import all_ops, get_op
from gawee.ops import sampling as S
from gawee.testing.generate import DataDraw

WITH_FORMULA = sorted(name for name, op in all_ops().items() if op.shape_formula is not None)


def test_the_ops_whose_fake_kernel_pins_a_size_declare_one():
    assert {"pad", "addcmul", "baddbmm", "scaled_dot_product_attention"} <= set(WITH_FORMULA)
    assert all(all_ops()[name].sample is not None for name in WITH_FORMULA)  # the tests below can draw them


def _draw(name, data):
    op = get_op(name)
    draw = DataDraw(data, data.draw(st.sampled_from([DType.f32, DType.f64])))
    try:
        types, attrs = op.sample(draw, [S.FREE] * len(op.operands), {})
        attrs = op.prepare_attrs(attrs, types)
        return op, types, attrs, op.infer_types(types, attrs)
    except (S.Reject, InferenceError):
        return None


@pytest.mark.parametrize("name", WITH_FORMULA)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_formula_agrees_with_evaluation_on_concrete_shapes(name, data):
    drawn = _draw(name, data)
    if drawn is None:
        return
    op, types, attrs, concrete = drawn
    try:
        shapes = op.shape_formula(types, attrs)
    except ValueError:  # a formula may decline (it must hold for every size), never disagree
        return
    assert [tuple(s) for s in shapes] == [t.shape for t in concrete]


@pytest.mark.parametrize("name", WITH_FORMULA)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_symbolic_batch_infers_what_every_size_evaluates_to(name, data):
    """Dimension 0 of the operands sized like the first one's becomes a symbol; where inference gives a
    type, it is the concrete type at every drawn value of the symbol."""
    drawn = _draw(name, data)
    if drawn is None:
        return
    op, types, attrs, _ = drawn
    first = next((t for t in types if t is not None and t.rank), None)
    if first is None:
        return
    b = first.shape[0]
    s = Sym("s0", 1, 16, max(b, 2))

    def batched(t, n):
        return t if t is None or t.rank != first.rank or t.shape[0] != b else TensorType((n, *t.shape[1:]), t.dtype)

    try:
        symbolic = op.infer_types([batched(t, s) for t in types], attrs)
    except InferenceError:  # refused: the op does not hold for every batch
        return
    for values in draw_values([s], 3):
        at = [batched(t, values[s]) for t in types]
        assert [t.at(values) for t in symbolic] == op.infer_types(at, op.prepare_attrs(attrs, at))


B = Sym("b", 1, 64, 2)


def test_zero_pad_of_a_dynamic_batch_is_inferred_not_refused():
    """torch's constant_pad_nd kernel pins the batch (guard_int): the swin window partition's pad."""
    pad = get_op("pad")
    x = TensorType((B, 7, 7, 96), DType.f32)
    for pads, out in [((0, 0, 0, 0, 0, 0), (B, 7, 7, 96)), ((0, 0, 0, 1, 0, 2), (B, 9, 8, 96))]:
        assert pad.infer_types([x], pad.prepare_attrs({"pad": pads}, [x])) == [TensorType(out, DType.f32)]
    grown = TensorType((2, B + 3), DType.f32)
    (y,) = pad.infer_types([grown], pad.prepare_attrs({"pad": (-3, 1)}, [grown]))
    assert y.shape == (2, B + 1)


@pytest.mark.parametrize(
    "pads, mode, why",
    [((-2, 0), "constant", "may be negative"), ((1, 1), "reflect", "fails at b = 1, the low end")],
)
def test_pad_of_a_symbolic_size_is_refused_when_some_size_would_fail(pads, mode, why):
    pad = get_op("pad")
    x = TensorType((3, B), DType.f32)
    with pytest.raises(InferenceError, match=why):
        pad.infer_types([x], pad.prepare_attrs({"pad": pads, "mode": mode}, [x]))


def test_broadcasting_formulas_with_0d_operands():
    """torch's addcmul and baddbmm kernels fail on a 0-d operand beside a symbolic one."""
    f32 = lambda *shape: TensorType(shape, DType.f32)
    addcmul = get_op("addcmul")
    assert addcmul.infer_types([f32(B, 3, 1), f32(), f32(1, 4)], {"value": 2.0}) == [f32(B, 3, 4)]
    with pytest.raises(InferenceError, match="is invalid"):
        addcmul.infer_types([f32(B, 3), f32(), f32(4, 3)], {"value": 2.0})
    baddbmm = get_op("baddbmm")
    attrs = baddbmm.complete_attrs({"beta": 0})
    assert baddbmm.infer_types([f32(), f32(B, 3, 4), f32(B, 4, 5)], attrs) == [f32(B, 3, 5)]
    with pytest.raises(InferenceError):
        baddbmm.infer_types([f32(), f32(B, 3, 4), f32(2, 4, 5)], attrs)
    sdpa = get_op("scaled_dot_product_attention")
    q, kv = f32(B, 2, 3, 4), f32(B, 2, 5, 4)
    assert sdpa.infer_types([q, kv, kv, f32()], sdpa.complete_attrs({})) == [f32(B, 2, 3, 4)]
