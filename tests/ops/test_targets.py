"""Target ops (gawee.ops.targets): their reference semantics are their definitions, and the onednn target phase's
rules are proven by them; rules that change the computation are not, and the harness refutes them."""

from __future__ import annotations

import pytest
import torch

from gawee.ir.types import DType
from gawee.ops import ACTIVATIONS, all_ops, apply_act, get_op
from gawee.ops.targets import ONEDNN_BINARY
from gawee.rewrite.ruleset import load_rules_text, target_rules
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
    return [torch.randn(2, 3, 4, 4), torch.randn(3, 1, 1)]


def _variants(name: str) -> list[dict]:
    """Attributes of ``name`` apart from its epilogue, one dict per case the test runs."""
    if name == "onednn_binary":
        return [{"alg": alg} for alg in ONEDNN_BINARY]
    if name == "onednn_depthwise":
        conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 3}
        return [{**conv, "act_in": act_in} for act_in in (None, "silu", "relu", "hardswish")]
    return [{"eps": 1e-3}]


def test_the_target_ops_are_the_onednn_ones():
    assert TARGET_OPS == ["onednn_batch_norm", "onednn_binary", "onednn_depthwise"]


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
    """All but onednn_affine_cat, whose `...parts` over cat's variadic operands the terms do not follow (the small
    scope and the sampling check it: tests/test_rule_soundness.py)."""
    rules = target_rules("onednn").rules
    assert len(rules) >= 20
    unproven = [r.name for r in rules if not isinstance(prove(r), Definition)]
    assert unproven == ["onednn_affine_cat"]


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
