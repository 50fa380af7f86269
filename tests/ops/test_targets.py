"""Target ops (gawee.ops.targets): their reference semantics are their definitions, and the onednn target phase's
rules are proven by them; rules that change the computation are not, and the harness refutes them."""

from __future__ import annotations

import pytest
import torch

from gawee.ir.types import DType, TensorType
from gawee.ops import ACTIVATIONS, all_ops, apply_act, get_op
from gawee.ops.targets import ONEDNN_BINARY, ONEDNN_LAYOUTS
from gawee.rewrite.ruleset import load_rules_text, target_rules, variant_rules, variants
from gawee.testing import check_rule
from gawee.testing.unfold import Definition, prove

TARGET_OPS = sorted(name for name, op in all_ops().items() if op.core is not None)


def _core(name: str, attrs: dict) -> tuple[str, dict]:
    """What OpDef.core says ``name`` computes before its epilogue, as an op and its attributes."""
    op = get_op(name)
    core = attrs[op.core.removeprefix("attr:")] if op.core.startswith("attr:") else op.core
    return core, {a.name: attrs[a.name] for a in get_op(core).attrs if a.name in attrs}


def _operands(name: str) -> list[torch.Tensor]:
    if name == "onednn_batch_norm":
        return [torch.randn(2, 3, 4, 4), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.1]
    if name == "onednn_depthwise":
        return [torch.randn(2, 3, 6, 6), torch.randn(3, 1, 3, 3), torch.randn(3), torch.randn(2, 3, 6, 6)]
    if name == "onednn_conv":
        return [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(2, 4, 6, 6)]
    return [torch.randn(2, 3, 4, 4), torch.randn(3, 1, 1)]


def _variants(name: str) -> list[dict]:
    """Attributes of ``name`` apart from its epilogue, one dict per case the test runs."""
    if name == "onednn_binary":
        return [{"alg": alg} for alg in ONEDNN_BINARY]
    if name == "onednn_depthwise":
        conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 3}
        return [
            {**conv, "act_in": act_in, "layout": layout}
            for act_in, layout in zip((None, "silu", "relu", "hardswish"), (None, *ONEDNN_LAYOUTS))
        ]
    if name == "onednn_conv":
        conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
        return [{**conv, "layout": layout} for layout in (None, *ONEDNN_LAYOUTS)]
    return [{"eps": 1e-3, "layout": layout} for layout in (None, *ONEDNN_LAYOUTS)]


def test_the_target_ops_are_the_onednn_ones():
    assert TARGET_OPS == ["onednn_batch_norm", "onednn_binary", "onednn_conv", "onednn_depthwise"]


@pytest.mark.parametrize("name", TARGET_OPS)
@pytest.mark.parametrize("act", [None, *ACTIVATIONS])
def test_a_target_op_is_its_core_op_then_its_activation(name, act):
    """The definition the rule prover unfolds (the input through the prologue activation, OpDef.core, then the
    activation) is what evaluate computes."""
    torch.manual_seed(0)
    params = {"hardtanh": (-0.5, 0.75), "leaky_relu": (0.1,)}.get(act, ())
    for attrs in _variants(name):
        xs = _operands(name)
        got = get_op(name).run(xs, {**attrs, "act": act, "act_params": params})[0]
        core, core_attrs = _core(name, attrs)
        ins = [apply_act(xs[0], attrs.get("act_in")), *xs[1:]]
        want = apply_act(get_op(core).run(ins, core_attrs)[0], act, params)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_every_rule_of_the_onednn_target_phase_is_proven_by_definition():
    """All but onednn_affine_cat, whose `...parts` over cat's variadic operands the terms do not follow, and
    onednn_binary_int8_codes, whose requantization no core op defines (the small scope and the sampling check
    them: tests/test_rule_soundness.py)."""
    rules = target_rules("onednn").rules
    assert len(rules) >= 20
    unproven = [r.name for r in rules if not isinstance(prove(r), Definition)]
    assert unproven == ["onednn_affine_cat", "onednn_binary_int8_codes"]


def test_every_rule_of_the_onednn_variant_phases_is_proven_by_definition():
    """The layout phases (rules/targets/onednn/variants/): a layout is storage, which no definition reads."""
    assert variants("onednn") == ["blocked", "channels_last", "per_conv"]
    rules = [r for v in variants("onednn") for r in variant_rules("onednn", v).rules]
    assert len(rules) == 9
    assert all(isinstance(prove(r), Definition) for r in rules), [r.name for r in rules]


@pytest.mark.parametrize("name", ["onednn_conv", "onednn_depthwise", "onednn_batch_norm"])
def test_a_layout_the_runtime_does_not_know_is_refused(name):
    from gawee.errors import InferenceError
    from gawee.ir.types import TensorType

    attrs = {**_variants(name)[0], "layout": "nchw"}
    with pytest.raises(ValueError, match="layout is one of blocked, channels_last, any, not 'nchw'"):
        get_op(name).run(_operands(name), attrs)
    types = [TensorType.of(x) for x in _operands(name)]
    with pytest.raises(InferenceError, match="layout is one of"):
        get_op(name).infer_types(types, attrs)


UNSOUND = [
    # another binary op than the matched one
    'rule r: y: sub(a, c) => onednn_binary(a, c, alg="add")',
    # the operands swapped (sub does not commute)
    "rule r: y: sub(a, c) => onednn_binary(c, a, alg=op(y))",
    # an activation with an attribute among the any-op ones: gelu's approximate is dropped
    'rule r: r: _(y: onednn_binary(a, c, alg=f, act=none), ...) where single_use(y) and op(r) in {"relu", "gelu"}\n'
    "    => onednn_binary(a, c, alg=f, act=op(r))",
    # the batch norm's eps dropped
    "rule r: batch_norm(x, g, b, m, v, eps=e) => onednn_batch_norm(x, g, b, m, v)",
    # a SiLU moved into a convolution that keeps it on its producer too (applied twice)
    'rule r: y: conv2d(x0, w0, b0, act="silu", ...a0) |> conv2d(w, b, ...attrs)\n'
    '    => onednn_depthwise(y, w, b, act_in="silu", ...attrs)',
    # a layout phase's rule that drops the input activation of gawee's depthwise kernel
    "rule r: onednn_depthwise(x, w, b, layout=none, ...attrs) => conv2d(x, w, b, stride=attrs.stride,\n"
    "    padding=attrs.padding, dilation=attrs.dilation, groups=attrs.groups, act=attrs.act,\n"
    "    act_params=attrs.act_params, residual=attrs.residual)",
    # a layout phase's rule that drops the convolution's fused activation with its other attributes
    'rule r: conv2d(x, w, b, act=a, ...attrs) => onednn_conv(x, w, b, layout="blocked", ...attrs)',
    # a binary op requantized to twice the grid of the int8 convolution that reads it
    "rule r: onednn_binary(a, c, ...b) |> conv2d_int8_static(w, s, bias, r, scale=sc, zero_point=zp, ...k)\n"
    "    => conv2d_int8_static(onednn_binary_int8(a, c, out_scale=2 * sc, out_zero_point=zp, ...b), w, s, bias, r,\n"
    "    scale=sc, zero_point=zp, ...k)",
    # the convolution may carry an activation already, which the replacement overwrites
    'rule r: r: _(y: conv2d(x, w, b, ...attrs), ...) where single_use(y) and op(r) in {"relu", "tanh"}\n'
    "    => conv2d(x, w, b, act=op(r), ...attrs)",
]


@pytest.mark.parametrize("text", UNSOUND)
def test_a_target_rule_that_changes_the_computation_is_not_proven_and_is_refuted(text):
    rule = load_rules_text(text, "planted.rules").rules[0]
    assert not isinstance(prove(rule), Definition)
    assert check_rule(rule, examples=200).verdict == "UNSOUND"


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16, DType.f16, DType.f64])
@pytest.mark.parametrize("act", [None, "relu", "sigmoid", "leaky_relu"])
def test_a_target_ops_inference_is_what_evaluating_it_gives(dtype, act):
    """The target ops' own inference (cheaper than evaluating on meta tensors) gives evaluate's type, also with
    operands of mixed dtypes (the batch norm's statistics in float32) and integer binary operands."""
    from gawee.ir.types import TensorType
    from gawee.ops.base import meta_tensor

    params = {"leaky_relu": (0.1,)}.get(act, ())
    x, c = TensorType((2, 3, 4, 4), dtype), TensorType((3,), dtype)
    c32, ints = TensorType((3,), DType.f32), TensorType((2, 3, 4, 4), DType.i64)
    cases = [
        ("onednn_batch_norm", [x, c, c, c, c], {"eps": 1e-5}),
        ("onednn_batch_norm", [x, c32, None, c32, c32], {"eps": 1e-5}),
        (
            "onednn_affine_cat",
            [c, c, TensorType((5,), dtype), TensorType((5,), dtype), x, TensorType((2, 2, 4, 4), dtype)],
            {"dim": 1, "eps": 1e-5},
        ),
        *(("onednn_binary", [x, TensorType((3, 1, 1), dtype)], {"alg": alg}) for alg in ONEDNN_BINARY),
        *(("onednn_binary", [ints, ints], {"alg": alg}) for alg in ONEDNN_BINARY),
    ]
    for name, types, attrs in cases:
        op = get_op(name)
        attrs = op.prepare_attrs({**attrs, "act": act, "act_params": params}, types)
        try:
            want = [TensorType.of(t) for t in op.run([None if t is None else meta_tensor(t) for t in types], attrs)]
        except (RuntimeError, ValueError, TypeError):
            continue  # evaluation refuses these operands (a mixed-dtype batch norm torch does not take)
        assert op.infer(types, attrs) == [TensorType(w.shape, w.dtype) for w in want], (name, types, attrs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_binary_op_requantizes_only_a_float32_result(dtype):
    """oneDNN's binary primitive computes onednn_binary_int8's result in float32 before it rounds it to a code; in
    another float type the op's reference would round other values, so evaluation and inference refuse it."""
    from gawee.errors import InferenceError

    op, attrs = get_op("onednn_binary_int8"), {"alg": "mul", "out_scale": 0.05, "out_zero_point": 3, "out_levels": 255}
    x = torch.randn(1, 4, 3, 3, dtype=dtype)
    with pytest.raises(ValueError, match="float32 result"):
        op.evaluate(x, x, **attrs)
    with pytest.raises(InferenceError, match="float32 result"):
        op.infer_types([TensorType.of(x), TensorType.of(x)], attrs)
    assert op.evaluate(x.float(), x.float(), **attrs).dtype == torch.float32
