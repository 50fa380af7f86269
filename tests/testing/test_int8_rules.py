"""rules/precision/int8.rules in the soundness harness: each rule within its declared bound, and the same rules
declared with half the quantization error refuted on every seed."""

import pytest
import torch

from gawee import load_rules_text
from gawee.dsl import library
from gawee.ir.builder import GraphBuilder
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import PRECISIONS, load_rules
from gawee.testing.harness import APPROXIMATE_NOTE, check_rule
from tests.testing.test_approximate import assert_refuted_by_its_bound

INT8 = load_rules(PRECISIONS["int8"])


LINEAR = ["linear_int8", "linear_int8_smooth", "linear_int8_unbiased", "matmul_int8"]
CONV = [
    "conv2d_int8",
    "conv2d_int8_unbiased",
    "conv2d_int8_smooth",
    "conv2d_int8_residual",
    "conv2d_int8_residual_unbiased",
    "linear_int8_static",
    "linear_int8_static_smooth",
]
"""The static rules: each convolution's input, and a linear layer's 2-D input (as a 1x1 convolution), calibrated."""


def _tight_twins() -> list:
    """The bundled int8 linear rules with each rounding's error declared as a quarter of its scale instead of half
    (an input or weight rounded to nearest moves by up to half a step). Not linear_int8_smooth: its activations'
    Lipschitz constants (1/6 to 1.5 under one factor of 1.5) leave most of them slack for a halved rounding."""
    text = PRECISIONS["int8"].read_text()
    tight = text.replace("(0.5 + (lv - 127) / 128 + 512 * u)", "(0.25 + 512 * u)")
    tight = tight.replace("(0.5 + 256 * u)", "(0.25 + 256 * u)")
    assert tight.count("(0.25 + ") == 15  # both roundings of the four dynamic rules, the weight's of the static ones
    twins = [r for r in load_rules_text(tight, "tight.rules").rules if r.name in LINEAR and "smooth" not in r.name]
    assert len(twins) == 3 and all(r.approximate for r in twins)
    return twins


def _conv_twins(old: str, new: str, count: int) -> list:
    """The bundled static int8 convolution rules with ``old`` (in each bound) replaced by ``new``."""
    text = PRECISIONS["int8"].read_text()
    assert text.count(old) == count
    twins = [r for r in load_rules_text(text.replace(old, new), "twins.rules").rules if r.name in CONV]
    assert len(twins) == len(CONV) and all(r.approximate for r in twins)
    return twins


EXACT = ["drop_calibration", "requantize_for_int8_conv"]
REQUANTIZE = "requantize_calibrated_int8"
"""The approximate requantization: a result read through its annotation by several, one of them as a residual."""
RESIDUAL = "requantize_residual_for_int8_conv"
"""The approximate requantization of a result one int8 convolution alone adds as its residual (downsampling)."""
POOL = "requantize_through_max_pool"
"""The same through a max pool (a ResNet's stem): the pool's result read through its annotation."""


def test_every_rule_but_the_annotations_removal_and_the_exact_requantization_is_approximate():
    assert [r.name for r in INT8.rules] == [*LINEAR, *CONV, *EXACT, REQUANTIZE, RESIDUAL, POOL]
    assert all(r.approximate for r in INT8.rules if r.name not in EXACT)
    assert not any(INT8.rule(name).approximate for name in EXACT)
    assert all(INT8.rule(name).priority > INT8.rule("drop_calibration").priority for name in CONV)


@pytest.mark.parametrize("name", ["linear_int8_smooth", "conv2d_int8_smooth"])
def test_a_smooth_activation_without_its_lipschitz_factor_is_refuted(name, monkeypatch):
    """The smooth-activation rules declared with a fifth of the linear's or convolution's bound and no allowance
    for the activation's rounding: `check` finds an element past it."""
    _pin(monkeypatch, 255)
    text = PRECISIONS["int8"].read_text()
    declared = "1.5 * pre + 64 * u * (2 * magnitude + pre + 2) + 4 * underflow(f32)"
    assert text.count(declared) == 3
    (twin,) = [r for r in load_rules_text(text.replace(declared, "0.2 * pre"), "t.rules").rules if r.name == name]
    assert_refuted_by_its_bound(twin, 60, 0)


def _pin(monkeypatch, levels: int) -> int:
    """The activations' levels the rules choose (``int8_levels()``): 8 bits as on a CPU with VNNI, 7 without."""
    why = None if levels == 255 else "no VNNI (planted)"
    monkeypatch.setattr(library, "no_vnni", lambda: why)
    return levels


@pytest.fixture(params=[127, 255], ids=["7-bit", "8-bit"])
def levels(request, monkeypatch) -> int:
    return _pin(monkeypatch, request.param)


def test_the_rules_quantize_activations_to_the_levels_the_cpu_multiplies_exactly(levels):
    gb = GraphBuilder("mlp")
    x = gb.input("x", "f32[4,32]")
    w, b = gb.const(torch.randn(16, 32), "w"), gb.const(torch.randn(16), "b")
    graph, _ = rewrite(gb.output(gb.linear(x, w, b)), INT8)
    (node,) = [n for n in graph.nodes if n.op == "linear_int8_dynamic"]
    assert node.attrs["levels"] == levels


@pytest.mark.parametrize("rule", [r for r in INT8.rules if r.approximate], ids=lambda r: r.name)
def test_the_bundled_int8_rules_pass_check(rule, levels):
    result = check_rule(rule, examples=150 if rule.name in CONV else 60)  # their patterns are met less often
    assert result.ok, result.counterexample or result.error
    assert result.verdict == "sound" and result.tier == "tested"
    assert result.proof is None and result.proof_note == APPROXIMATE_NOTE
    assert result.fired >= 20  # checked on many instances, not vacuously


@pytest.mark.parametrize("rule", _tight_twins(), ids=lambda r: r.name)
@pytest.mark.parametrize("seed, levels", [(0, 127), (1, 255)])
def test_half_the_quantization_error_is_refuted_on_every_seed(rule, seed, levels, monkeypatch):
    _pin(monkeypatch, levels)
    assert_refuted_by_its_bound(rule, 60, seed)


@pytest.mark.parametrize("name", EXACT)
def test_the_exact_int8_rules_pass_check(name):
    result = check_rule(INT8.rule(name), examples=60)
    assert result.ok and result.fired >= 20, result.counterexample or result.error


def test_requantizing_to_another_grid_than_the_readers_is_refuted():
    """The requantization is exact only on the grid the reader rounds to: to twice its step, values move."""
    text = PRECISIONS["int8"].read_text()
    exact = "out_scale=sc, out_zero_point=zp, out_levels=lv, ...a1"
    assert text.count(exact) == 1
    doubled = text.replace(exact, "out_scale=2 * sc, out_zero_point=zp, out_levels=lv, ...a1")
    (twin,) = [r for r in load_rules_text(doubled, "t.rules").rules if r.name == "requantize_for_int8_conv"]
    assert check_rule(twin, examples=60).verdict == "UNSOUND"


SHAPES = ("conv2d_int8", "conv2d_int8_residual_unbiased", "linear_int8_static")
"""The two ends of the convolution rules' forms (bias and no residual; residual and no bias), and the linear
layer's: their twins are refuted the same way, and each refutation takes ~10 s of the suite (the linear layer's
twin without the clamping term only: a 2-D input is drawn less often, and a halved step needed 300 draws on some
seeds)."""


@pytest.mark.parametrize(
    "twin",
    [r for r in _conv_twins("(0.5 + 512 * u) * s", "(0.25 + 512 * u) * s", 7) if r.name in SHAPES[:2]],
    ids=lambda r: r.name + "-half-step",
)
@pytest.mark.parametrize("seed, levels", [(0, 127), (1, 255)])
def test_a_convolution_declared_with_half_the_input_step_is_refuted(twin, seed, levels, monkeypatch):
    _pin(monkeypatch, levels)
    assert_refuted_by_its_bound(twin, 60, seed)


@pytest.mark.parametrize(
    "twin",
    [
        r
        for r in _conv_twins(" + relu(x - (lv - z) * s) + relu(0 - z * s - x)", " + 0 * x", 7)  # ex keeps x's shape
        if r.name in SHAPES
    ],
    ids=lambda r: r.name + "-unclamped",
)
def test_a_convolution_bound_that_ignores_values_beyond_the_calibrated_range_is_refuted(twin, monkeypatch):
    """Calibration data need not cover what the model later sees: a bound that holds only inside the calibrated
    range is refuted (the harness draws ranges narrower than the data)."""
    _pin(monkeypatch, 255)
    assert_refuted_by_its_bound(twin, 200, 0)


def _chain(out_scale_of_reader: float):
    """Two 1x1 int8 convolutions, the first's result (3.39e38: 127 * 2.67e36) read by the second with input scale
    ``out_scale_of_reader``."""
    gb = GraphBuilder("chain")
    x = gb.input("x", "f32[1,1,1,1]")
    one = dict(stride=[1, 1], padding=[0, 0], scale=1.0, zero_point=0, levels=255)
    w = gb.const(torch.full((1, 1, 1, 1), 127, dtype=torch.int8))
    y = gb.conv2d_int8_static(x, w, gb.const(torch.full((1,), 2.67e36)), **one)
    z = gb.conv2d_int8_static(y, w, gb.const(torch.full((1,), 1e-38)), **{**one, "scale": out_scale_of_reader})
    return gb.output(z)


def test_requantizing_to_a_grid_whose_values_overflow_is_kept_from():
    """With the reader's scale 1.5e37, the first result's code 23 is 3.45e38 on the grid: past float32's largest,
    inf, which the reader rounds to 255 instead of 23. The rule's guard keeps it from such a scale; the same rule
    without it changes the result. At an ordinary scale it fires and changes nothing."""
    from gawee.interp import run

    x = torch.ones(1, 1, 1, 1)
    graph = _chain(1.5e37)
    (expected,) = run(graph, x)
    assert rewrite(graph, INT8)[1].firings["requantize_for_int8_conv"] == 0
    text = PRECISIONS["int8"].read_text()
    guard = "    where sc >= 1e-30 and sc * 256 < largest(f32)\n"
    assert text.count(guard) == 1
    unguarded = text[text.index("rule requantize_for_int8_conv") :].replace(guard, "")
    wrong, report = rewrite(graph, load_rules_text(unguarded, "unguarded.rules"))
    assert report.firings["requantize_for_int8_conv"] == 1 and not torch.equal(run(wrong, x)[0], expected)
    ordinary = _chain(0.05)
    rewritten, report = rewrite(ordinary, INT8)
    assert report.firings["requantize_for_int8_conv"] == 1
    assert torch.equal(run(rewritten, x)[0], run(ordinary, x)[0])


UNCLAMPED = {
    REQUANTIZE: (" + relu(y - (lv - zp) * sc) + relu(0 - zp * sc - y)", " + 0 * y"),
    RESIDUAL: (" + relu(y - (lv - zp) * sc) + relu(0 - zp * sc - y)", " + 0 * y"),
    POOL: (" + relu(m - (lv - zp) * sc) + relu(0 - zp * sc - m)", " + 0 * m"),
}
"""Each approximate requantization's bound without the distance to the range the codes are clamped to."""


@pytest.mark.parametrize("unclamped", [False, True], ids=["quarter-step", "unclamped"])
@pytest.mark.parametrize("name, seed", [(REQUANTIZE, 0), (REQUANTIZE, 1), (RESIDUAL, 0), (POOL, 0)])
def test_a_requantization_declared_too_tight_is_refuted(name, seed, unclamped, monkeypatch):
    """requantize_calibrated_int8, requantize_residual_for_int8_conv and requantize_through_max_pool declared with a
    quarter of the grid's step, or without the distance to the range the codes are clamped to (the data need not
    stay in the calibrated range): refuted."""
    _pin(monkeypatch, 255)
    text = PRECISIONS["int8"].read_text()
    old, new = UNCLAMPED[name] if unclamped else ("(0.5 + 1024 * u) * sc", "0.25 * sc")
    assert text.count(old) == (2 if unclamped and name != POOL else 1 if unclamped else 3)
    (twin,) = [r for r in load_rules_text(text.replace(old, new), "t.rules").rules if r.name == name]
    assert_refuted_by_its_bound(twin, 20 if name == RESIDUAL else 60, seed)  # its examples are the slowest to draw


def _block_chain(residual: bool):
    """conv → relu → conv [+ the first one's result] → relu: the first result read by the second convolution as its
    input, and (``residual``) as the residual it adds too."""
    torch.manual_seed(0)
    gb = GraphBuilder("blocks")
    x = gb.input("x", "f32[1,4,6,6]")
    w1, w2 = gb.const(torch.randn(4, 4, 3, 3) / 6), gb.const(torch.randn(4, 4, 3, 3) / 6)
    b1, b2 = gb.const(torch.randn(4)), gb.const(torch.randn(4))
    y = gb.conv2d(x, w1, b1, padding=[1, 1], act="relu")
    z = gb.conv2d(y, w2, b2, y, padding=[1, 1], act="relu") if residual else gb.conv2d(y, w2, b2, padding=[1, 1])
    return gb.output(z)


def test_a_result_read_as_input_and_residual_is_requantized_and_one_read_once_exactly():
    """Calibrated, the block's first result is read through one annotation as the next convolution's input and
    residual: requantize_calibrated_int8 puts it on that grid (its readers then take u8 codes). Read once, as an
    input only, the exact requantize_for_int8_conv does it, and the approximate rule leaves it alone."""
    from gawee.interp import run
    from gawee.rewrite.calibration import Calibration

    batches = Calibration.of([torch.randn(1, 4, 6, 6) for _ in range(2)], "2 batches")
    x = torch.randn(1, 4, 6, 6)
    for residual, fired in ((True, REQUANTIZE), (False, "requantize_for_int8_conv")):
        graph = _block_chain(residual)
        optimized, report = rewrite(graph, INT8, calibration=batches)
        other = "requantize_for_int8_conv" if residual else REQUANTIZE
        assert report.firings[fired] == 1 and report.firings[other] == 0 and report.firings[RESIDUAL] == 0
        first, second = [n for n in optimized if n.op == "conv2d_int8_static"]
        assert (
            first.attrs["out_scale"] == second.attrs["scale"]
            and first.attrs["out_zero_point"] == second.attrs["zero_point"]
        )
        if residual:
            assert second.inputs[4] is first.output and second.inputs[0] is first.output
        (expected,), (got,) = run(graph, x), run(optimized, x)
        assert float(torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)) > 0.99


def test_a_downsampling_branch_added_as_a_residual_is_requantized_to_its_annotations_grid():
    """A ResNet block's downsampling: the block's input goes through two convolutions, the second adding the
    downsampling convolution's result as its residual, which calibration annotated and nothing else reads.
    requantize_residual_for_int8_conv puts that result on the annotation's grid (the lowering then sums its u8 codes in
    the block's destination); the first convolution's result, the second's input alone, is left to the exact rule."""
    from gawee.interp import run
    from gawee.rewrite.calibration import Calibration

    torch.manual_seed(0)
    gb = GraphBuilder("downsampling")
    x = gb.input("x", "f32[1,4,6,6]")
    a = gb.conv2d(x, gb.const(torch.randn(8, 4, 1, 1) / 2), gb.const(torch.randn(8)), act="relu")
    d = gb.conv2d(x, gb.const(torch.randn(8, 4, 1, 1) / 2), gb.const(torch.randn(8)))
    z = gb.conv2d(a, gb.const(torch.randn(8, 8, 3, 3) / 8), gb.const(torch.randn(8)), d, padding=[1, 1], act="relu")
    graph = gb.output(z)
    batches = Calibration.of([torch.randn(1, 4, 6, 6) for _ in range(2)], "2 batches")
    optimized, report = rewrite(graph, INT8, calibration=batches)
    assert report.firings[RESIDUAL] == 1 and report.firings["requantize_for_int8_conv"] == 1
    assert report.firings[REQUANTIZE] == 0 and not any(n.op == "calibrated" for n in optimized)
    (last,) = [n for n in optimized if n.output is optimized.outputs[0]]
    downsampling = last.inputs[4].producer
    assert downsampling.op == "conv2d_int8_static" and downsampling.inputs[0] is optimized.inputs[0]
    assert downsampling.attrs["out_scale"] > 0 and last.attrs["out_scale"] == 0.0
    for _ in range(3):
        x = torch.randn(1, 4, 6, 6)
        (expected,), (got,) = run(graph, x), run(optimized, x)
        assert float(torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)) > 0.99


def test_a_stem_max_pool_hands_its_readers_the_codes_of_their_grid():
    """A ResNet's stem: convolution, max pool, then two convolutions reading the pool (the first block's and its
    downsampling one), calibrated. requantize_through_max_pool puts the stem's result on the grid the pool's readers
    quantize to (the lowering then pools u8 codes); the rewritten graph computes what the int8 graph without it
    does — the pool of the rounded values is the rounded pool, which the readers round to the same codes."""
    from gawee.interp import run
    from gawee.rewrite.calibration import Calibration

    torch.manual_seed(0)
    gb = GraphBuilder("stem")
    x = gb.input("x", "f32[1,3,12,12]")
    stem = gb.conv2d(x, gb.const(torch.randn(8, 3, 3, 3) / 4), gb.const(torch.randn(8)), padding=[1, 1], act="relu")
    pooled = gb.max_pool2d(stem, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])
    a = gb.conv2d(pooled, gb.const(torch.randn(8, 8, 1, 1) / 3), gb.const(torch.randn(8)))
    b = gb.conv2d(pooled, gb.const(torch.randn(8, 8, 3, 3) / 8), gb.const(torch.randn(8)), padding=[1, 1])
    graph = gb.output(gb.add(a, b))
    batches = Calibration.of([torch.randn(1, 3, 12, 12) for _ in range(2)], "2 batches")
    optimized, report = rewrite(graph, INT8, calibration=batches)
    assert report.firings[POOL] == 1
    first, *readers = [n for n in optimized if n.op == "conv2d_int8_static"]
    assert len(readers) == 2 and first.attrs["out_scale"] > 0
    assert all((first.attrs["out_scale"], first.attrs["out_zero_point"]) == (r.attrs["scale"], r.attrs["zero_point"])
               for r in readers)  # fmt: skip
    text = PRECISIONS["int8"].read_text()
    without = load_rules_text(text[: text.index(f"rule {POOL}")], "without.rules")  # the last rule of the file
    unpooled, report = rewrite(graph, without, calibration=batches)
    assert report.firings[POOL] == 0
    for _ in range(3):
        x = torch.randn(1, 3, 12, 12) * 1.5  # beyond the calibrated range too
        assert torch.allclose(run(optimized, x)[0], run(unpooled, x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_calibrated_classifier_becomes_a_static_int8_1x1_convolution(bias):
    """A linear layer on a 2-D calibrated input (a CNN's classifier after its pooling): linear_int8_static, a
    static int8 1x1 convolution between two reshapes, not the dynamic int8 linear; with or without a bias. Without
    the convolution (an MLP), calibration leaves the linear layer to the dynamic rules."""
    from gawee.interp import run
    from gawee.rewrite.calibration import Calibration

    torch.manual_seed(0)
    gb = GraphBuilder("classifier")
    x = gb.input("x", "f32[2,8,5,5]")
    pooled = gb.reshape(gb.conv2d(x, gb.const(torch.randn(8, 8, 1, 1) / 3), act="relu"), shape=[2, 200])  # a CNN
    w, b = gb.const(torch.randn(6, 200) / 10), gb.const(torch.randn(6)) if bias else None
    graph = gb.output(gb.linear(pooled, w, b))
    batches = Calibration.of([torch.randn(2, 8, 5, 5) for _ in range(3)], "3 batches")
    optimized, report = rewrite(graph, INT8, calibration=batches)
    assert report.firings["linear_int8_static"] == 1 and "linear_int8_dynamic" not in [n.op for n in optimized]
    assert [n.op for n in optimized if n.op.startswith("conv")] == ["conv2d_int8_static"] * 2
    xs = torch.randn(2, 8, 5, 5)
    (expected,), (got,) = run(graph, xs), run(optimized, xs)
    assert float(torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)) > 0.99
    mlp = GraphBuilder("mlp")
    h = mlp.input("h", "f32[2,200]")
    mlp_graph = mlp.output(mlp.linear(h, mlp.const(torch.randn(6, 200) / 10), None))
    optimized, report = rewrite(mlp_graph, INT8, calibration=Calibration.of([torch.randn(2, 200)], "1 batch"))
    assert report.calibrated == 0 and [n.op for n in optimized] == ["linear_int8_dynamic"]
