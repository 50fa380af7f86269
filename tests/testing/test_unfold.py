"""Proof by definition (gawee.testing.unfold): rules whose two sides are one computation are proven for every
shape; a rule that changes the computation in any way is not, and the definitions agree with the ops."""

import pytest
import torch

import gawee
from gawee.ir.core import Graph
from gawee.ir.types import DType, TensorType
from gawee.ops import ACTIVATIONS, get_op
from gawee.ops.nn import act_as_op
from gawee.rewrite.ruleset import load_rules_text
from gawee.testing import check_rule
from gawee.testing.unfold import Definition, prove

BY_DEFINITION = {
    "cse",
    "fold_constants",
    "alias",
    "clone",
    "dropout_eval",
    "dropout_zero",
    "cat_single",
    "reshape_reshape",
    "fuse_conv_residual",
    "fuse_conv_clamp",
    *(f"fuse_conv_{a}" for a in ACTIVATIONS),
    *(f"fuse_linear_{a}" for a in ("relu", "gelu", "gelu_tanh", "silu", "tanh")),
}


def _rule(text: str, name: str | None = None):
    rules = load_rules_text(text, "test.rules").rules
    return rules if name == "*" else rules[0]


def test_the_bundled_fusions_identities_cse_and_folding_are_proven_by_definition():
    proven = {r.name for r in gawee.default_rules().rules if isinstance(prove(r), Definition)}
    assert proven == BY_DEFINITION


@pytest.mark.parametrize(
    "text",
    [
        # another activation than the one matched
        'rule r: conv2d(x, w, b, act=none, ...attrs) |> relu() => conv2d(x, w, b, act="sigmoid", ...attrs)',
        # the matched convolution may already carry an activation, which the replacement overwrites
        'rule r: conv2d(x, w, b, ...attrs) |> relu() => conv2d(x, w, b, act="relu", ...attrs)',
        # a residual of another shape or dtype is broadcast or promoted by add, refused by the fused conv
        "rule r: y: conv2d(x, w, b, residual=none, act=none, ...attrs) |> add(r)\n"
        "    => conv2d(x, w, b, residual=r, ...attrs)",
        # the parameters swapped
        "rule r: conv2d(x, w, b, residual=none, act=none, ...attrs) |> hardtanh(min_val=lo, max_val=hi)\n"
        '    => conv2d(x, w, b, act="hardtanh", act_params=[hi, lo], ...attrs)',
        # an attribute the replacement drops
        'rule r: conv2d(x, w, b, act=none, ...attrs) |> relu() => conv2d(x, w, b, act="relu")',
        # fold and original need the guard that makes them the same computation
        "rule r: y: _(...) where pure(y) => fold(y)",
        "rule r: y: relu(x) => original(y)",
        # a copy holds the same values in a layout of its own: not the same operand of a transcendental op
        "rule r: tanh(clone(x)) => tanh(x)",
        # maximum's zero for (+0, -0) depends on the order: a reciprocal would tell +inf from -inf
        "rule r: reciprocal(maximum(x, y)) => reciprocal(maximum(y, x))",
        # dropout that trains is random
        "rule r: dropout(x, p=_, train=true) => x",
        # a literal operand is a new constant
        "rule r: y: add(x, 0) => x",
        # permute moves elements: a reshape of it is not a reshape of its operand
        "rule r: reshape(permute(x, dims=_), shape=s) => reshape(x, shape=s)",
        'rule r: reshape(y: _(x, ...), shape=s) where op(y) in {"reshape", "permute"} => reshape(x, shape=s)',
        # an any-op node taken case by case: one case (gelu's approximate attribute, left free) differs
        'rule r: r: _(y: relu(x), ...) where op(r) in {"tanh", "gelu"} => tanh(relu(x))',
        'rule r: r: _(relu(x), ...) where op(r) in {"sigmoid", "tanh"} => sigmoid(relu(x))',
        # a variadic op as the node: its other operands are not followed (cat(x, z) is not x)
        'rule r: r: _(x, ...) where op(r) in {"cat"} => x',
        # clamp is hardtanh only on floating-point tensors (torch's hardtanh keeps an integer dtype)
        "rule r: conv2d(x, w, b, residual=none, act=none, ...attrs) |> clamp(min=lo, max=hi)\n"
        '    => conv2d(x, w, b, act="hardtanh", act_params=[lo, hi], ...attrs)',
    ],
)
def test_a_rule_that_changes_the_computation_is_not_proven_by_definition(text):
    assert not isinstance(prove(_rule(text)), Definition)


def test_a_node_of_any_op_is_proven_for_each_op_the_guard_allows():
    rule = _rule('rule r: r: _(y: relu(x), ...) where op(r) in {"tanh", "sigmoid"} => r')
    assert isinstance(prove(rule), Definition)
    fused = 'rule r: r: _(y: conv2d(x, w, b, act=none, ...a), ...) where op(r) in {"relu", "tanh", "silu"}\n'
    assert isinstance(prove(_rule(fused + "    => conv2d(x, w, b, act=op(r), ...a)")), Definition)
    assert "(where" in prove(_rule(fused.replace('"silu"', '"gelu"') + "    => conv2d(x, w, b, act=op(r), ...a)"))


def test_copies_and_each_alternative_are_proven_by_definition():
    assert isinstance(prove(_rule("rule r: clone(alias(x)) => x")), Definition)
    assert isinstance(prove(_rule("rule r: reciprocal(add(x, y)) => reciprocal(add(y, x))")), Definition)
    assert isinstance(prove(_rule("rule r: dropout(x, p=0.0, train=_) |> relu() => relu(x)")), Definition)
    variants = _rule("rule r: (relu(x) | sigmoid(x)) |> alias() => clone(x)", "*")
    assert len(variants) == 2 and not any(isinstance(prove(r), Definition) for r in variants)
    variants = _rule("rule r: alias(clone(x) | dropout(x, p=_, train=false)) => x", "*")
    assert len(variants) == 2 and all(isinstance(prove(r), Definition) for r in variants)


def test_check_reports_a_definition_proof_for_every_shape():
    rule = next(r for r in gawee.default_rules().rules if r.name == "fuse_conv_gelu_tanh")
    result = check_rule(rule, examples=10, scope_budget=8)
    assert result.verdict == "proven"
    assert result.proof_note.startswith("proven for every shape")
    wrong = _rule('rule r: conv2d(x, w, b, ...attrs) |> relu() => conv2d(x, w, b, act="relu", ...attrs)')
    assert check_rule(wrong, examples=200).verdict == "UNSOUND"  # the sampling still finds what the terms leave


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32])
def test_hardtanh_is_clamp_on_floats(dtype):
    x = (torch.randn(257) * 8).to(dtype)
    if dtype.is_floating_point:
        x[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 0.0])
    hardtanh, clamp = get_op("hardtanh"), get_op("clamp")
    for lo, hi in [(-1.0, 1.0), (0, 6), (0.25, 3)]:
        (h,) = hardtanh.run([x], {"min_val": lo, "max_val": hi})
        (c,) = clamp.run([x], {"min": lo, "max": hi})
        if dtype.is_floating_point:
            assert torch.equal(h.isnan(), c.isnan()) and torch.equal(h[~h.isnan()], c[~c.isnan()])
        else:
            assert h.dtype == dtype  # not clamp: clamp by a float bound gives a float tensor


def test_no_activation_carries_no_parameters():
    g = Graph()
    x = g.add_input(TensorType((1, 2, 4, 4), DType.f32), "x")
    w = g.constant(torch.randn(3, 2, 1, 1), "w")
    assert g.create_node("conv2d", [x, w], {"act": None, "act_params": [0.5]}).attrs["act_params"] == ()
    v = g.add_input(TensorType((2, 4), DType.f32), "v")
    m = g.constant(torch.randn(3, 4), "m")
    assert g.create_node("linear", [v, m], {"act_params": [0.5]}).attrs["act_params"] == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_fused_epilogue_is_its_standalone_ops_bit_for_bit(dtype, channels_last):
    """The definition unfold relies on: conv2d(residual=r, act=a) is a(add(conv2d(), r)), and linear(act=a) is
    a(linear()), evaluated by the ops' own reference semantics on the same tensors."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 7, generator=gen, dtype=dtype) * 4
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(5, 3, 3, 3, generator=gen, dtype=dtype)
    b = torch.randn(5, generator=gen, dtype=dtype)
    conv, add = get_op("conv2d"), get_op("add")
    base = conv.complete_attrs({"padding": [1, 1]})
    (core,) = conv.run([x, w, b, None], base)
    r = torch.randn(core.shape, generator=gen, dtype=dtype).contiguous(memory_format=torch.preserve_format)
    (summed,) = add.run([core, r], {})
    lin = get_op("linear")
    v = torch.randn(4, 33, generator=gen, dtype=dtype) * 4
    m, c = torch.randn(6, 33, generator=gen, dtype=dtype), torch.randn(6, generator=gen, dtype=dtype)
    (plain,) = lin.run([v, m, c], lin.complete_attrs({}))
    for act, n in ACTIVATIONS.items():
        params = (-0.5, 0.7)[:n] if act == "hardtanh" else (0.1,) * n
        op, attrs = act_as_op(act, params)
        opdef = get_op(op)
        attrs = opdef.complete_attrs(attrs)
        (fused,) = conv.run([x, w, b, r], {**base, "act": act, "act_params": params})
        assert torch.equal(fused, opdef.run([summed], attrs)[0]), act
        (fused,) = lin.run([v, m, c], lin.complete_attrs({"act": act, "act_params": params}))
        assert torch.equal(fused, opdef.run([plain], attrs)[0]), act
