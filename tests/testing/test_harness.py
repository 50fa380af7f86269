"""The harness is itself tested: every planted unsound rule is caught, every correct twin passes."""

import contextlib
import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

import gawee
from gawee.cli import main
from gawee.testing import check_rule
from gawee.testing.harness import _no_worse
from tests.conftest import HARNESS

DATA = Path(__file__).resolve().parents[1] / "data"
UNSOUND = gawee.load_rules(DATA / "unsound").rules
TWINS = gawee.load_rules(DATA / "twins").rules


HIT_RATE = 0.5
"""Every corpus and bundled rule's guard must hold on at least this share of the drawn examples."""


def test_the_corpus_is_big_enough():
    assert len(UNSOUND) >= 30 and len(TWINS) >= 30


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_planted_unsound_rule_is_caught(rule):
    result = check_rule(rule, examples=200)
    HARNESS["planted unsound"] += 1
    HARNESS["caught"] += result.verdict == "UNSOUND"
    HARNESS["examples"] += result.examples
    HARNESS["seconds"] += result.seconds
    assert result.verdict == "UNSOUND", f"{rule.name} ({rule.location}) slipped through: {result.verdict}"
    cx = str(result.counterexample)
    assert rule.name in cx and "before:" in cx and "values:" in cx


@pytest.mark.parametrize("rule", TWINS, ids=[r.name for r in TWINS])
def test_correct_twin_passes(rule):
    result = check_rule(rule, examples=100)
    HARNESS["correct twins"] += 1
    HARNESS["twins passing"] += result.verdict in ("proven", "sound")
    HARNESS["examples"] += result.examples
    HARNESS["seconds"] += result.seconds
    assert result.verdict in ("proven", "sound"), str(result.counterexample or result.guard_failures)
    assert result.hit_rate >= HIT_RATE, f"guard held on {result.hit_rate:.0%}: {result.guard_failures.most_common(2)}"


def test_counterexamples_are_shrunk_and_readable():
    rule = next(r for r in UNSOUND if r.name == "reassociate_floats")
    cx = check_rule(rule, examples=200).counterexample
    text = str(cx)
    assert "max abs error" in text and "> allowed" in text
    assert re.search(r"%x: f\d\d\[1?\] =", text)  # shrunk to a single element
    assert cx.max_error > cx.allowed


def test_runs_are_reproducible_with_a_seed():
    rule = next(r for r in TWINS if r.name == "bias_per_channel")
    a, b = check_rule(rule, 60, seed=7), check_rule(rule, 60, seed=7)
    assert (a.examples, a.guard_hits, a.fired) == (b.examples, b.guard_hits, b.fired)


def test_draws_do_not_depend_on_the_modules_the_process_imported(tmp_path, monkeypatch):
    """Hypothesis mixes the literals of imported local modules into its draws; the harness must not let a
    user's helper module (or a capture that imports gawee's frontend) change what one seed draws."""
    rule = next(r for r in TWINS if r.name == "bias_per_channel")

    def drawn() -> list[str]:
        seen: list[str] = []
        check_rule(rule, 40, on_example=lambda ex, xs: seen.append(f"{ex.graph} {[x.tolist() for x in xs]}"))
        return seen

    before = drawn()
    literals = ", ".join(f"{n}, {n / 7}" for n in range(101, 60000, 150))  # hypothesis reads at most 1024
    (tmp_path / "gawee_user_literals.py").write_text(f"LITERALS = [{literals}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "gawee_user_literals", importlib.import_module("gawee_user_literals"))
    assert drawn() == before


def test_guard_coverage_and_necessity_are_reported():
    rules = gawee.load_rules_text(
        "rule rare: y: relu(x) where x.numel == 81 => y\n"
        "rule needed: y: reshape(x, shape=_) where y.shape == x.shape => x\n"
        "rule vacuous: y: relu(x) where x.rank >= 0 and x.rank < 100 => relu(relu(x))\n",
        "cov.rules",
    )
    rare, needed, vacuous = (check_rule(r, 100, scope_budget=0) for r in rules.rules)
    assert rare.verdict in ("untested", "weak") and rare.hit_rate < 0.05  # random draws alone
    solved = gawee.load_rules_text("rule r: relu(x) where x.rank == 4 and x.shape[1] == 3 => relu(x)\n", "s.rules")
    assert check_rule(solved.rules[0], 20, scope_budget=0).hit_rate > 0.5  # a guard on dims: solved, not hoped for
    assert needed.guard_verdict == "needed" and needed.guard_needed > 0
    assert vacuous.guard_verdict == "always true"


def test_check_cli_exit_codes(capsys):
    assert main(["check", str(DATA / "twins" / "algebra.rules"), "--examples", "50"]) == 0
    out = capsys.readouterr().out
    assert "softmax_with_max" in out and "0 unsound" in out
    assert (
        main(["check", str(DATA / "unsound" / "algebra.rules"), "--examples", "100", "--rule", "cast_any_dtype"]) == 1
    )
    out = capsys.readouterr().out
    assert "cast_any_dtype" in out and "is unsound" in out and re.search(r"\b(f16|bf16|f32|f64|i\d+|u8)\b", out)
    assert main(["check", str(DATA / "nope.rules")]) == 2
    assert "no such rules file" in capsys.readouterr().err


def test_a_rewrite_that_avoids_an_overflow_of_the_original_is_not_flagged():
    """f16 linear + add folded into the bias: the original overflows in one element (-inf where float64
    gives -40942), the rewrite does not; another element overflows in both. Element by element the
    rewrite is no farther from the truth, so it is accepted; one that is farther is not."""
    ref = torch.tensor([float("-inf"), float("inf"), 3.0], dtype=torch.float16)
    truth = torch.tensor([-40942.3, 79222.0, 3.0], dtype=torch.float64)
    better = torch.tensor([-40960.0, float("inf"), 3.0], dtype=torch.float16)
    assert _no_worse(ref, better, truth, allowed=0.5)
    assert not _no_worse(ref, torch.tensor([-40960.0, float("inf"), 4.0], dtype=torch.float16), truth, allowed=0.5)
    assert not _no_worse(ref, better, None, allowed=0.5)
    # nan in the original where the truth is -inf (inf + -inf after an f16 overflow), -inf in the rewrite
    nan_ref = torch.tensor([float("nan"), 1.0], dtype=torch.float16)
    exact = torch.tensor([float("-inf"), 1.0], dtype=torch.float64)
    assert _no_worse(nan_ref, torch.tensor([float("-inf"), 1.0], dtype=torch.float16), exact, allowed=0.5)
    assert not _no_worse(nan_ref, torch.tensor([float("inf"), 1.0], dtype=torch.float16), exact, allowed=0.5)
    # nan in the original where the finite truth overflows f16 (torch's f16 gelu(inf) is nan on one CPU kernel,
    # inf on another): inf is the truth correctly rounded, so the rewrite that gives it is right; -inf is not
    big = torch.tensor([3.002e6, 1.0], dtype=torch.float64)
    assert _no_worse(nan_ref, torch.tensor([float("inf"), 1.0], dtype=torch.float16), big, allowed=0.5)
    assert not _no_worse(nan_ref, torch.tensor([float("-inf"), 1.0], dtype=torch.float16), big, allowed=0.5)


def test_an_ill_conditioned_float64_original_is_not_taken_for_the_truth():
    """float64 instances have no wider truth. conv + batch_norm with a bias and a mean of 1e17 and
    gamma -1e17: torch's batch_norm computes x*scale + shift with terms near 3e25 that cancel, so the
    original is off by about 1e9 where the folded conv is exact. The harness sees that the original
    swings by more than that when its inputs and constants move by one unit roundoff, and does not
    blame the rewrite; a well-conditioned graph swings by rounding only."""
    from gawee.ir.builder import GraphBuilder
    from gawee.testing.harness import own_rounding

    def bn_graph(mean: float):
        b = GraphBuilder("bn")
        x = b.input("x", "f64[1,1,1,1]")
        f64 = torch.float64
        w, bias = b.const(torch.full((1, 1, 1, 2), 0.3, dtype=f64)), b.const(torch.tensor([1e17], dtype=f64))
        y = b.conv2d(x, w, bias, padding=[0, 1], dilation=[1, 2])
        stats = [torch.tensor([v], dtype=f64) for v in (-1e17, 0.3, mean, 1e17)]
        return b.output(b.batch_norm(y, *[b.const(t) for t in stats]))

    x = torch.tensor([[[[-1e17]]]], dtype=torch.float64)
    g = bn_graph(1e17)
    ref = gawee.run(g, x)
    assert own_rounding(g, [x], ref)[0] > 1e8  # the original cannot be trusted to 1e8 here
    calm = bn_graph(0.0)
    assert own_rounding(calm, [x], gawee.run(calm, x))[0] < 1e-6 * gawee.run(calm, x)[0].abs().item()
    rules = gawee.load_rules(DATA / "twins" / "bn.rules").rules
    assert check_rule(next(r for r in rules if r.name == "bn_keeps_bias"), examples=200, seed=0).verdict == "sound"


def test_the_hint_counts_every_false_conjunct():
    """Every false conjunct of a guard-false draw is counted, not only the first in the text: counting
    the first only blamed whichever came first (`x.rank == 4` below) for draws where a later, rarer
    one was false too, so the "most often false" hint named the wrong conjunct."""
    from gawee.ir.core import Graph
    from gawee.ir.types import DType, TensorType
    from gawee.testing.generate import Example, guard_verdict

    rule = gawee.load_rules_text(
        "rule r: y: relu(x) where x.rank == 2 and x.shape[0] == 3 and x.shape[1] == 3 => y\n", "blame.rules"
    ).rules[0]
    g = Graph("g")
    x = g.add_input(TensorType((2, 3), DType.f32), "x")
    node = g.create_node("relu", [x], {})
    g.set_outputs(list(node.outputs))
    assert guard_verdict(rule, Example(g, node)) == (False, ["x.shape[0] == 3"])
    g2 = Graph("g2")
    x2 = g2.add_input(TensorType((2, 2, 2), DType.f32), "x")
    node2 = g2.create_node("relu", [x2], {})
    g2.set_outputs(list(node2.outputs))
    holds, failed = guard_verdict(rule, Example(g2, node2))
    assert not holds and failed == ["x.rank == 2", "x.shape[0] == 3", "x.shape[1] == 3"]


def _draws(text: str, n: int = 150):
    """The first ``n`` examples generate() draws for the (only) rule of ``text``."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gawee.ops import sampling as S
    from gawee.testing.generate import generate, hints_of

    rule = gawee.load_rules_text(text, "draws.rules").rules[0]
    hints, out = hints_of(rule), []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True)
    @given(st.data())
    def collect(data):
        with contextlib.suppress(S.Reject):
            out.append(generate(rule, data, hints))

    collect()
    return out


def _constant(ex, name: str) -> torch.Tensor:
    return next(v.data for v in ex.graph.constants() if v.name == name)


def test_constants_are_sometimes_huge_or_not_finite_unless_the_guard_says_finite():
    free = _draws("rule r: softmax(add(x, c), dim=d) where const(c) => softmax(x, dim=d)\n")
    guarded = _draws("rule r: softmax(add(x, c), dim=d) where const(c) and finite(c) => softmax(x, dim=d)\n")

    def big(c):  # the harness's huge values: sqrt(max) of the dtype and above (float32's for f64)
        return torch.finfo(c.dtype if c.dtype != torch.float64 else torch.float32).max ** 0.5

    def shares(draws):
        cs = [_constant(ex, "c") for ex in draws if any(v.name == "c" for v in ex.graph.constants())]
        nonfinite = sum(bool((~torch.isfinite(c.double())).any()) for c in cs) / len(cs)
        huge = sum(bool((c.abs() >= big(c) / 2).any()) for c in cs) / len(cs)
        return nonfinite, huge

    nonfinite, huge = shares(free)
    assert nonfinite > 0 and huge > 0 and nonfinite + huge > 0.05, (nonfinite, huge)
    nonfinite, _ = shares(guarded)
    assert nonfinite < 0.2


def test_reshapes_of_the_same_rank_move_elements():
    draws = _draws("rule r: y: reshape(x, shape=_) => y\n", 200)
    moved = [ex for ex in draws if ex.root.output.type.rank == ex.root.inputs[0].type.rank]
    assert any(ex.root.output.type.shape != ex.root.inputs[0].type.shape for ex in moved)


@pytest.mark.parametrize(
    "text",
    [
        "rule r: transpose(matmul(a, b), dim0=-2, dim1=-1) => transpose(matmul(a, b), dim0=-2, dim1=-1)\n",
        "rule r: cat(x, y, dim=-1) => cat(x, y, dim=-1)\n",
        "rule r: cat(x, y, dim=3) => cat(x, y, dim=3)\n",
        "rule r: linear(x, transpose(w, dim0=0, dim1=1), b) => linear(x, transpose(w, dim0=0, dim1=1), b)\n",
        "rule r: mean(x, dim=[-1], keepdim=true, dtype=none) => mean(x, dim=[-1], keepdim=true)\n",
        "rule r: permute(x, dims=[0, -1, 1]) => permute(x, dims=[0, -1, 1])\n",
        "rule r: softmax(x, dim=-1) => softmax(x, dim=-1)\n",
        "rule r: reshape(x, shape=[-1]) => reshape(x, shape=[-1])\n",
        "rule r: squeeze(x, dims=[-1]) => squeeze(x, dims=[-1])\n",
        "rule r: cumsum(x, dim=-1, dtype=none) => cumsum(x, dim=-1)\n",
    ],
)
def test_negative_and_literal_attributes_are_generated(text):
    """A literal attribute (negative dims included) is matched against the node's canonical value, and
    the harness draws instances for it: the identity rule matches them, not refused or crashed (it never
    fires: a replacement that rebuilds what it matched is not applied)."""
    result = check_rule(gawee.load_rules_text(text, "attrs.rules").rules[0], 30)
    assert result.guard_hits >= 10 and not result.error and result.counterexample is None, (
        result.verdict,
        result.error,
    )


def test_every_sampler_draws_or_rejects():
    """Samplers of every registered op, on random fixed operand types and attributes: a draw or a
    typed Reject, never another exception (an exception inside generation is a harness bug)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gawee.ir.types import DType, TensorType
    from gawee.ops import all_ops
    from gawee.ops import sampling as S
    from gawee.testing.generate import DataDraw

    # by name: the draws do not hang on the order the op modules registered their ops in
    ops = sorted((op for op in all_ops().values() if op.sample is not None), key=lambda op: op.name)
    shapes = st.lists(st.integers(0, 4), max_size=5).map(tuple)
    slot = st.one_of(st.just(S.FREE), st.just(S.ABSENT), shapes.map(lambda s: TensorType(s, DType.f32)))
    ints = st.integers(-5, 5)
    value = st.one_of(ints, st.lists(ints, max_size=4).map(tuple), st.none(), st.booleans(), st.floats(-3, 3))

    @settings(max_examples=400, database=None, deadline=None, derandomize=True)
    @given(st.sampled_from(ops), st.data())
    def run(op, data):
        n = len(op.operands) + (data.draw(st.integers(0, 2)) if op.variadic else 0)
        slots = [data.draw(slot) for _ in range(n)]
        names = [a.name for a in op.attrs]
        attrs = data.draw(st.dictionaries(st.sampled_from(names), value, max_size=2)) if names else {}
        attrs = {k: v for k, v in attrs.items() if op.attr(k).accepts(v)}  # what a pattern may fix
        with contextlib.suppress(S.Reject):
            op.sample(DataDraw(data, DType.f32), slots, attrs)

    run()


@pytest.mark.parametrize(
    "op, shapes, attrs", [("select_scatter", [(2, 0), None], {"dim": 1}), ("embedding", [(0, 0), None], {})]
)
def test_a_sampler_rejects_operands_that_leave_nothing_to_draw(op, shapes, attrs):
    """A dim of size 0 leaves select_scatter no index and embedding no row: a Reject, not hypothesis's
    InvalidArgument for an empty range (found by the test above under other draws)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gawee.ir.types import DType, TensorType
    from gawee.ops import all_ops
    from gawee.ops import sampling as S
    from gawee.testing.generate import DataDraw

    slots = [S.FREE if s is None else TensorType(s, DType.f32) for s in shapes]

    @settings(max_examples=5, database=None, deadline=None, derandomize=True)
    @given(st.data())
    def run(data):
        with pytest.raises(S.Reject):
            all_ops()[op].sample(DataDraw(data, DType.f32), slots, attrs)

    run()


def test_symbolic_mode_checks_rules_at_several_batch_sizes():
    from gawee.rewrite.ruleset import default_rules
    from gawee.testing.harness import check_rule

    rules = {r.name: r for r in default_rules().rules}
    for name in ("fuse_conv_relu",):
        result = check_rule(rules[name], examples=20, symbolic=True)
        assert result.verdict in ("proven", "sound"), result.counterexample
        assert result.symbolic_fired > 0  # the dynamic-batch variants were rewritten and checked


def test_elements_whose_sums_overflow_in_some_order_are_not_compared():
    """A sum whose terms pass float32's range is inf in one order and finite in another: neither side fixes
    the order, so such elements are not evidence. An inf operand is not a large sum: it still counts."""
    from gawee.ir.builder import GraphBuilder
    from gawee.testing.harness import _orderless, partial_sum_bounds

    b = GraphBuilder("g")
    x = b.input("x", "f32[2,3]")
    g = b.output(b.sum(x, dim=[1]))
    big = torch.finfo(torch.float32).max
    xs = [torch.tensor([[big, big, -big], [1.0, float("inf"), 2.0]])]
    (bound,) = partial_sum_bounds(g, xs)
    ref = torch.zeros(2)
    assert _orderless(ref, bound).tolist() == [False, True]
    assert _orderless(ref, torch.tensor([1.0, 2.0], dtype=torch.float64)) is None
