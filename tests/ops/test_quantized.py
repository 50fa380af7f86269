"""The int8 ops' reference semantics: symmetric per-channel weight quantization, and the dynamic linear's input
quantization (torch's ChooseQuantizationParams with reduce_range)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gawee.errors import InferenceError
from gawee.ir.types import DType, TensorType
from gawee.ops import get_op
from gawee.ops import sampling as S
from gawee.ops.quantized import (
    SMALL_SCALE,
    activation_qparams,
    linear_int8_dynamic,
    quantize_per_channel_symmetric,
)
from gawee.testing.generate import DataDraw

F32, I8 = DType.f32, DType.i8


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_values_reconstruct_within_half_a_step(axis):
    torch.manual_seed(axis + 5)
    w = torch.randn(6, 9) * torch.logspace(-3, 3, 9)
    q, s = quantize_per_channel_symmetric(w, axis=axis)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (w.shape[axis],)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    shape = [1, 1]
    shape[axis] = -1
    step = s.reshape(shape)
    assert bool(((q.double() * step.double() - w.double()).abs() <= step.double() * (0.5 + 1e-6)).all())


def test_a_channel_of_zeros_gets_scale_one():
    q, s = quantize_per_channel_symmetric(torch.tensor([[0.0, 0.0], [1.0, -2.0]]), axis=0)
    assert s.tolist() == [1.0, pytest.approx(2 / 127)] and q.tolist() == [[0, 0], [64, -127]]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_the_input_qparams_are_torchs():
    """The scale and zero point torch's own dynamic quantization picks (reduce_range: [0, 127])."""
    torch.manual_seed(0)
    for x in (torch.randn(5, 7) * 30, torch.rand(3, 4), -torch.rand(3, 4), torch.randn(4, 4) * 1e-4, torch.zeros(2)):
        scale, zero = activation_qparams(x)
        q = torch.quantize_per_tensor_dynamic(x, torch.quint8, True)
        assert float(scale) == pytest.approx(q.q_scale(), rel=1e-7) and int(zero) == q.q_zero_point()
    assert float(activation_qparams(torch.randn(4, 4) * 1e-6)[0]) == SMALL_SCALE


def test_the_linear_multiplies_the_quantized_input():
    x = torch.tensor([[1.0, -0.5, 0.25]])
    q = torch.tensor([[127, 0, -127], [1, 2, 3]], dtype=torch.int8)
    s = torch.tensor([0.01, 0.5])
    got = linear_int8_dynamic(x, q, s, torch.tensor([1.0, 0.0]))
    scale, zero = activation_qparams(x)
    xq = torch.round(x / scale) * scale  # zero point aside, the input as the kernel sees it
    want = xq @ (q.float() * s[:, None]).T + torch.tensor([1.0, 0.0])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert float(zero) > 0  # a negative input moves the zero point off 0


@pytest.mark.parametrize("features", [3, 4096, 70_000])
def test_the_integer_product_is_exact_on_long_reductions(features):
    """The product of the quantized input with the int8 weight is the exact integer product (what the kernel's int32
    accumulator computes) at every reduction length gawee meets: sums past 2**24, which a float32 accumulator would
    round, equal an int64 product bit for bit."""
    gen = torch.Generator().manual_seed(features)
    x = torch.rand(4, features, generator=gen) - 0.1  # codes up to 127 past the zero point, a few below it
    w = torch.randint(-30, 128, (5, features), generator=gen).to(torch.int8)  # sums that grow past 2**24
    w[:, :2] = torch.tensor([127, -127], dtype=torch.int8)
    s = torch.rand(5, generator=gen) + 0.5
    scale, zero = activation_qparams(x)
    q = torch.clamp(torch.round(x * (1 / scale)) + zero.float(), 0, 255)
    exact = torch.matmul((q.double() - zero).to(torch.int64), w.to(torch.int64).T)
    assert torch.equal(linear_int8_dynamic(x, w, s), exact.float() * (scale * s))


def test_bad_operands_are_inference_errors():
    op = get_op("linear_int8_dynamic")
    good = [TensorType((2, 3), F32), TensorType((4, 3), I8), TensorType((4,), F32)]
    assert op.infer_types(good, op.complete_attrs({})) == [TensorType((2, 4), F32)]
    for bad in (
        [TensorType((2, 3), DType.f64), *good[1:]],
        [good[0], TensorType((4, 3), F32), good[2]],
        [*good[:2], TensorType((3,), F32)],
    ):
        with pytest.raises(InferenceError, match="linear_int8_dynamic"):
            op.infer_types(bad, op.complete_attrs({}))
    quantize = get_op("quantize_per_channel_symmetric")
    with pytest.raises(InferenceError, match="float tensor"):
        quantize.infer_types([TensorType((2, 3), DType.i32)], quantize.complete_attrs({}))


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_an_int8_convolutions_inferred_type_is_what_evaluating_it_gives(data):
    """conv2d_int8_static's type is inferred without running it (its quantizing steps are slow on meta tensors): for
    every draw of its sampler, the type evaluation on real data gives."""
    op = get_op("conv2d_int8_static")
    draw = DataDraw(data, F32)
    try:
        types, attrs = op.sample(draw, [S.FREE] * len(op.operands), {})
    except S.Reject:
        return
    attrs = op.complete_attrs(attrs)
    gen = torch.Generator().manual_seed(0)
    xs = [
        None if t is None else torch.randint(-127, 128, t.shape, generator=gen, dtype=torch.int8)
        if t.dtype is I8 else torch.rand(t.shape, generator=gen) + 0.5
        for t in types
    ]  # fmt: skip
    (out,) = op.run(xs, attrs)
    assert op.infer_types(types, attrs) == [TensorType.of(out)]


def test_an_int8_convolutions_bad_operands_are_its_inference_errors():
    op = get_op("conv2d_int8_static")
    x, w, s = TensorType((1, 4, 6, 6), F32), TensorType((8, 4, 3, 3), I8), TensorType((8,), F32)
    attrs = op.complete_attrs({"scale": 0.1, "zero_point": 3})
    assert op.infer_types([x, w, s, None, None], attrs) == [TensorType((1, 8, 4, 4), F32)]
    for types, bad in (
        ([x, TensorType((8, 4, 3, 3), F32), s, None, None], attrs),
        ([x, w, TensorType((4,), F32), None, None], attrs),
        ([x, w, s, None, TensorType((1, 8, 5, 5), F32)], attrs),
        ([x, w, s, None, None], {**attrs, "levels": 100}),
        ([x, w, s, None, None], {**attrs, "out_scale": -1.0}),
    ):
        with pytest.raises(InferenceError, match=r"conv2d_int8_static\("):
            op.infer_types(types, bad)
