"""The soundness harness: every rule checked on random instances derived from its own text.

For each drawn example (see ``generate``) whose root matches the pattern, the guard
is evaluated. If it holds, the rule is applied there (and only there) and the result
must have the same output shapes and dtypes and agree numerically with the original
on random inputs that include awkward values. If it does not hold, the rewrite is
applied anyway: when that breaks equivalence, the guard is shown to be needed.

Numeric agreement: max|after - before| <= tol(dtype) x scale + 2 x max|before - truth|,
where truth is the original graph evaluated in float64 and scale = max(1, max|truth|).
The second term forgives a rewrite for rounding no worse than the original's own. Failing
that, the rewrite still passes if, element by element, it agrees with the original or is
no farther from the truth than the original was (it avoided an overflow of the original).

An approximate rule (`within bound`) is judged by its bound instead: element by element, the
rewrite agrees with the original or |after - truth| <= bound + |before - truth|, the bound
evaluated in float64 on the instance's data (gawee.rewrite.bound).
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gawee.dsl.compiler import Rule
from gawee.dsl.library import GuardFailed
from gawee.dsl.matcher import MatchContext
from gawee.errors import GaweeError, RewriteError
from gawee.interp import run, run_observed
from gawee.ir.core import Graph, Value
from gawee.ir.symbolic import Sym, draw_values
from gawee.ir.types import DType, TensorType
from gawee.numerics import TOLERANCE, format_error, no_farther, output_error, upcast
from gawee.numerics import recast as _recast
from gawee.ops import sampling as S
from gawee.rewrite.bound import evaluate_bound
from gawee.rewrite.context import RewriteContext
from gawee.rewrite.driver import fire, match_roots
from gawee.rewrite.ruleset import RuleSet
from gawee.testing import unfold
from gawee.testing.generate import Example, Leaf, fill, generate, guard_verdict, hints_of, small
from gawee.testing.scope import BUDGET, COMPLETE, LEVELS, Scope, build, enumerate_scope
from gawee.testing.smt.verdict import RuleProof, prove_rule
from gawee.testing.values import classes_for
from gawee.threads import torch_threads

MIN_FIRED = 10
"""Fewer firing examples than this and a rule is reported as weakly tested."""

APPROXIMATE_NOTE = "approximate rule: the solver proves equality, and this rule declares an error bound instead"
"""Why an approximate rule is never *proven*: its verdict rests on the sampled and enumerated instances."""

SOLVER_DRAWS = 8
"""Distinct drawn instances the solver decides when the small-scope enumeration gave it none."""


@dataclass
class Counterexample:
    rule: str
    reason: str
    before: str
    after: str
    values: list[tuple[str, str, str]]
    """(name, type, data) of every input and constant."""
    max_error: float = 0.0
    allowed: float = 0.0
    assumed: list[str] = field(default_factory=list)
    """The rule's `assume` facts, all true for these values."""
    found_by: str = "sampling"
    """How the instance was found: sampling, or the small-scope enumeration (its level and value class)."""

    def __str__(self) -> str:
        lines = [f"counterexample for {self.rule}: {self.reason}", f"  found by {self.found_by}"]
        if self.allowed or self.max_error:
            lines.append(f"  max abs error {format_error(self.max_error)} > allowed {format_error(self.allowed)}")
        if self.assumed:
            lines.append(f"  assuming {', '.join(self.assumed)} (true for these values)")
        lines.append("  values:")
        lines += [f"    %{n}: {t} = {d}" for n, t, d in self.values]
        lines.append("  before:")
        lines += ["    " + x for x in self.before.splitlines()]
        lines.append("  after:")
        lines += ["    " + x for x in self.after.splitlines()]
        return "\n".join(lines)


@dataclass
class Extent:
    """The largest instance a rule was checked on: the shape with the most elements, the highest rank,
    the widest kernel (a convolution's weight or a pooling window; 0 without either)."""

    shape: tuple[int, ...] = ()
    rank: int = 0
    kernel: int = 0

    def note(self, graph: Graph) -> None:
        """Widen the extent to cover every value and kernel of ``graph``."""
        values = [*graph.inputs, *graph.constants(), *(v for node in graph for v in node.outputs)]
        for v in values:
            shape = tuple(int(d) for d in v.type.shape if isinstance(d, int))
            if len(shape) == v.type.rank and math.prod(shape) > math.prod(self.shape or (0,)):
                self.shape = shape
            self.rank = max(self.rank, v.type.rank)
        for node in graph:
            kernel = node.attrs.get("kernel_size")
            if isinstance(kernel, int) or (isinstance(kernel, tuple) and kernel):
                self.kernel = max(self.kernel, *(kernel if isinstance(kernel, tuple) else (kernel,)))
            if node.op.startswith("conv") and len(node.inputs) > 1 and node.inputs[1] is not None:
                spatial = [d for d in node.inputs[1].type.shape[2:] if isinstance(d, int)]
                self.kernel = max(self.kernel, *spatial, 0)

    def __str__(self) -> str:
        text = f"{list(self.shape)} (rank {self.rank})" if self.shape or self.rank else "-"
        return text + (f", kernel {self.kernel}" if self.kernel else "")


@dataclass
class RuleCheck:
    """What the harness found for one rule."""

    rule: Rule
    examples: int = 0
    """Drawn examples whose root matched the pattern."""
    guard_hits: int = 0
    fired: int = 0
    rejected: int = 0
    """Draws the generator or the reference run refused (invalid for the ops or dtype)."""
    guard_needed: int = 0
    """Guard-false draws where applying the rewrite anyway broke equivalence."""
    guard_false_sound: int = 0
    """Guard-false draws where the rewrite would still have been sound."""
    counterexample: Counterexample | None = None
    error: str = ""
    """Why the harness could not judge the rule (no valid example, or a bug of the harness itself)."""
    crash: str = ""
    """The worker process running this rule died (a crash inside a kernel): how, and on which instance."""
    assumption_false: int = 0
    """Draws discarded because the data broke one of the rule's `assume` facts."""
    seconds: float = 0.0
    dtypes: set[str] = field(default_factory=set)
    guard_failures: Counter = field(default_factory=Counter)
    """For guard-false draws: how often each `and` conjunct was false (its source text)."""
    scope_fired: int = 0
    """Checks of enumerated instances (each with its own data and with value classes) where the rule fired;
    they count towards ``sound`` like ``fired``, but not in ``examples`` and ``guard_hits``, which
    describe the random draws (the enumeration keeps only guard-true instances)."""
    symbolic_fired: int = 0
    """With ``symbolic=True``: examples whose dynamic-batch variant the rule also rewrote (each then
    checked at several batch sizes)."""
    extent: Extent = field(default_factory=Extent)
    """The largest shape, rank and kernel among the instances checked."""
    scope_instances: int = 0
    """Instances of the small-scope enumeration (gawee.testing.scope) checked."""
    scope_bound: str = ""
    """The highest level of the enumeration covered completely ("" if none)."""
    scope_truncated: bool = False
    """Whether the instance budget cut the enumeration short (``scope_bound`` is then what was covered,
    ``scope_partial`` the level it stopped in)."""
    scope_partial: str = ""
    scope_refuted: bool = False
    """Whether the enumeration found a counterexample (the same on every seed; sampling may then have
    replaced it with a smaller one)."""
    value_classes: set[str] = field(default_factory=set)
    """The boundary classes of values (gawee.testing.values) some instance was checked with."""
    proof: RuleProof | None = None
    """What the SMT solver decided over the rule's instances (None: not run)."""

    @property
    def scope(self) -> str:
        """The enumeration's coverage in words: complete levels, and the level cut short."""
        if not self.scope_instances and not self.scope_bound:
            return "-"
        text = self.scope_bound or "no level complete"
        return text + (f"; part of {self.scope_partial}" if self.scope_truncated else "")

    @property
    def verdict(self) -> str:
        if self.counterexample is not None:
            return "UNSOUND"
        if self.crash:
            return "crashed"
        if self.error:
            return "error"
        if self.proof is not None and self.proof.complete and self.fired + self.scope_fired:
            return "proven"  # a rule proven by definition that never fired is still a finding: untested
        if self.fired + self.scope_fired == 0:
            return "untested"
        if self.fired + self.scope_fired < MIN_FIRED:
            return "weak"
        return "sound"

    @property
    def tier(self) -> str:
        """proven (every instance of the small scope, by the solver), refuted (a counterexample) or
        tested (sampling only); "" where the rule could not be judged (crashed, error, untested)."""
        v = self.verdict
        return {"proven": "proven", "UNSOUND": "refuted", "sound": "tested", "weak": "tested"}.get(v, "")

    @property
    def proof_note(self) -> str:
        """The bound of a proof, or what kept the rule from *proven*."""
        if self.rule.approximate:
            return APPROXIMATE_NOTE
        if self.proof is None:
            return "solver not run"
        return self.proof.summary()

    @property
    def guard_verdict(self) -> str:
        if self.rule.guard is None:
            return "no guard"
        if self.guard_needed:
            return "needed"
        if self.guard_false_sound:
            return "possibly vacuous"
        return "always true" if self.examples else "-"

    @property
    def hit_rate(self) -> float:
        return self.guard_hits / self.examples if self.examples else 0.0

    @property
    def ok(self) -> bool:
        return self.verdict in ("proven", "sound", "weak")


class _Unsound(Exception):
    def __init__(self, cx: Counterexample):
        super().__init__(cx.reason)
        self.cx = cx


SHRINK_SECONDS = 10
"""How long a counterexample is shrunk at most. Hypothesis shrinks for up to 5 minutes by default, and
a many-node example (an attention pattern) took 150 s on 2 cores; after this budget hypothesis reports
the smallest counterexample so far (same verdict, the instance may be a little larger)."""


@contextlib.contextmanager
def _shrink_budget(seconds: float):
    """Hypothesis's shrink time limit set to ``seconds`` meanwhile. It is a module constant of
    hypothesis's engine, not a setting: where a hypothesis release lacks it, its default stands."""
    from hypothesis.internal.conjecture import engine

    before = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if before is None:
        yield
        return
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = before


@contextlib.contextmanager
def _no_source_constants():
    """Hypothesis's draws meanwhile made from the seed alone. Hypothesis (6.131 on) mixes the literals
    of every imported *local* module (an editable gawee, the user's helpers) into its integer and float
    draws, so one seed drew other instances after a capture had imported gawee's frontend: a rule's
    guard-hit rate then depended on what the process had run before (49% after the test suite's
    capture tests, 56% alone). Its pool of those constants is emptied meanwhile (a module function of
    hypothesis, not a setting: where a release lacks it, there is no such pool to empty)."""
    try:
        from hypothesis.internal.conjecture import providers

        get, cache, empty = providers._get_local_constants, providers.CONSTANTS_CACHE.cache, providers.Constants()
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.clear()  # filtered pools of earlier draws
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.clear()


# -- numeric comparison ----------------------------------------------------------------
def _wiggle(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``t`` with every float element moved by one relative unit roundoff, up or down at random."""
    if not t.is_floating_point():
        return t
    sign = torch.randint(0, 2, t.shape, generator=gen).to(t.dtype) * 2 - 1
    return t + t * sign * torch.finfo(t.dtype).eps


def own_rounding(
    graph: Graph, xs: list[torch.Tensor], ref: list[torch.Tensor], trials: int = 2, constants: bool = True
) -> list[float]:
    """Per output, how far the original moves when its inputs (and its constants, with ``constants``)
    move by one unit roundoff.

    This is the original's conditioning made visible: a forward error is about the condition number
    times the unit roundoff. An instance whose output swings by ``x`` under such a wiggle cannot tell
    two computations apart to better than ``x``. Where no wider type gives the truth (float64
    instances) it stands for the original's own rounding error. Elsewhere the truth says how far the
    original happened to land, not how far an equally faithful computation in another order lands
    where the inputs (activations, which carry their producers' rounding) are ill-conditioned: a
    float32 softmax of logits near 1e9 from inputs near 1e5. Constants are exact there (a model states
    them), so a rewrite that cancels them in another order is still judged against the truth. The
    largest swing over ``trials`` random wiggles (0 where none runs)."""
    gen = torch.Generator().manual_seed(0)
    swing = [0.0] * len(ref)
    for _ in range(trials):
        g = _recast(graph, "_wiggled", lambda t: t, (lambda d: _wiggle(d, gen)) if constants else (lambda d: d))
        if g is None:
            return swing
        try:
            out = run(g, *[_wiggle(x, gen) for x in xs])
        except GaweeError:
            return swing
        for i, (r, o) in enumerate(zip(ref, out)):
            e = output_error(r, o) if r.is_floating_point() and r.shape == o.shape else 0.0
            swing[i] = max(swing[i], 0.0 if e == float("inf") else e)
    return swing


def _describe(ex: Example, xs: list[torch.Tensor]) -> list[tuple[str, str, str]]:
    rows = [(v.name, str(v.type), small(x)) for v, x in zip(ex.graph.inputs, xs)]
    rows += [(v.name, str(v.type), small(v.data)) for v in ex.graph.constants()]
    return rows


def _compare(
    rule: Rule, ex: Example, after: Graph, xs: list[torch.Tensor], use_guard: bool = True
) -> Counterexample | None:
    """None if ``after`` agrees with the example's graph on inputs ``xs``; a Counterexample if not.
    An approximate rule's ``after`` must be within its declared bound (``_exceeds_bound``; ``use_guard``: whether
    the rule fired with its guard, which decides the match its bound is evaluated on).

    Raises S.Reject when the original graph itself cannot run (e.g. an op lacks this dtype).
    """
    try:
        ref = run(ex.graph, *xs)
    except GaweeError as e:
        raise S.Reject(f"reference does not run: {e}") from None

    def cx(reason, err=0.0, allowed=0.0):
        assumed = [a.text for a in rule.assumptions]
        return Counterexample(rule.name, reason, str(ex.graph), str(after), _describe(ex, xs), err, allowed, assumed)

    for i, (v_b, v_a) in enumerate(zip(ex.graph.outputs, after.outputs)):
        if not v_b.type.same_shape_dtype(v_a.type):
            return cx(f"output {i} changed type: {v_b.type} -> {v_a.type}")
    try:
        got = run(after, *xs)
    except GaweeError as e:
        return cx(f"the rewritten graph fails to run: {e.message}")
    truth_graph = upcast(ex.graph)
    truth = None
    if truth_graph is not None:
        try:
            truth = run(truth_graph, *[x.double() if x.is_floating_point() else x for x in xs])
        except GaweeError:
            truth = None
    if rule.approximate:
        return _exceeds_bound(rule, ex, xs, ref, got, truth, use_guard, cx)
    swing = None  # the original's own rounding where float64 is its truth: computed on demand
    magnitude = None  # bounds of the original's partial sums: computed on demand
    for i, (r, g) in enumerate(zip(ref, got)):
        err = output_error(r, g)
        dtype = DType.from_torch(r.dtype)
        tol = TOLERANCE.get(dtype, 0.0)
        own = 0.0
        scale_src = r
        if truth is not None and r.is_floating_point():
            t = truth[i]
            own = output_error(t, r.double()) if t.shape == r.shape else 0.0
            own = 0.0 if own == float("inf") else own
            scale_src = t
        finite = scale_src[torch.isfinite(scale_src)] if scale_src.is_floating_point() else scale_src
        scale = max(1.0, finite.abs().max().item()) if finite.numel() and scale_src.dtype != torch.bool else 1.0
        allowed = tol * scale + 2 * own
        if err > allowed and r.is_floating_point():
            wide = r.dtype == torch.float64
            swing = own_rounding(ex.graph, xs, ref, constants=wide) if swing is None else swing
            if wide or swing[i] > tol * scale:  # below float64, only an instance ill-conditioned past the tolerance
                allowed += 4 * swing[i]
        if err > allowed and r.is_floating_point() and r.shape == g.shape:
            if magnitude is None:
                magnitude = partial_sum_bounds(ex.graph, xs)
            keep = _orderless(r, magnitude[i] if magnitude is not None else None)
            if keep is not None:
                err = output_error(r[keep], g[keep]) if keep.any() else 0.0
        if err > allowed and not _no_worse(r, g, truth[i] if truth is not None else None, tol * scale):
            return cx(f"output {i} differs", err, allowed)
    return None


def _exceeds_bound(rule: Rule, ex: Example, xs, ref, got, truth, use_guard: bool, cx) -> Counterexample | None:
    """An approximate rule's comparison: every element of each output agrees with the original, or is within
    the rule's declared bound (evaluated in float64 on this instance) plus the original's own error of the
    float64 truth (the original itself where float64 gives nan and it does not: torch's kernels differ on
    0 * nan); where the bound is nan, the rewrite need only be finite where the original is, and where it is inf,
    nothing (a nan result included). Elements whose partial sums pass the dtype's range are not compared
    (``_orderless``). The counterexample names the element that exceeds the bound most."""
    try:
        bounds = match_bounds(rule, ex, xs, [tuple(r.shape) for r in ref], use_guard)
    except RewriteError as e:
        return cx(e.message)
    magnitude = None
    for i, (r, g, b) in enumerate(zip(ref, got, bounds)):
        if r.shape != g.shape:
            return cx(f"output {i} changed shape: {list(r.shape)} -> {list(g.shape)}")
        rr, gg = _wide(r), _wide(g)
        t = _wide(truth[i]) if truth is not None and truth[i].shape == r.shape else rr
        t = torch.where(torch.isnan(t) & ~torch.isnan(rr), rr, t)  # kernels differ on 0 * nan (a padded window)
        own = (rr - t).abs()
        err = (gg - t).abs()
        allowed = b + torch.where(torch.isnan(own), 0.0, own)
        same_finiteness = torch.isfinite(gg) == torch.isfinite(rr)
        # a nan bound (computed from a nan operand) states nothing but where the results are finite; an inf bound
        # claims nothing at all (a nan result included)
        ok = (
            (rr == gg)
            | (torch.isnan(rr) & torch.isnan(gg))
            | (err <= allowed)
            | (torch.isnan(b) & same_finiteness)
            | torch.isposinf(b)
        )
        if not bool(ok.all()) and r.is_floating_point():
            magnitude = partial_sum_bounds(ex.graph, xs) if magnitude is None else magnitude
            keep = _orderless(r, magnitude[i] if magnitude is not None else None)
            if keep is not None:
                ok |= ~keep
        if bool(ok.all()):
            continue
        excess = torch.where(ok, -math.inf, (err - allowed).nan_to_num(nan=math.inf))
        k = int(excess.reshape(-1).argmax())
        at = [int(j) for j in torch.unravel_index(torch.tensor(k), r.shape)] if r.dim() else []
        e_k, b_k, own_k = err.reshape(-1)[k].item(), b.reshape(-1)[k].item(), own.reshape(-1)[k].item()
        return cx(
            f"output {i} exceeds its declared bound at element {at}: the rewrite gives "
            f"{format_error(gg.reshape(-1)[k].item())}, the original in float64 {format_error(t.reshape(-1)[k].item())}"
            f" (error {format_error(e_k)}), the bound `{rule.bound_text}` is {format_error(b_k)} "
            f"and the original's own error {format_error(own_k)}",
            e_k,
            allowed.reshape(-1)[k].item(),
        )
    return None


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64 (complex128 for complex), to compare element by element."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def match_bounds(
    rule: Rule, ex: Example, xs: list[torch.Tensor], shapes: list[tuple[int, ...]], use_guard: bool = True
) -> list[torch.Tensor]:
    """An approximate rule's declared bound on an instance, broadcast to each of ``shapes``: evaluated on the
    match the rewriter takes at the example's root (the first whose guard holds; with ``use_guard`` False, the
    first), each matched tensor's data being the original run in float64 on inputs ``xs``. Raises RewriteError
    where no match is found, or the bound cannot be evaluated or broadcast."""
    env = _match(rule, ex, use_guard)
    if env is None:
        raise RewriteError(f"rule {rule.name} does not match at %{ex.root.name}: its bound has no bindings")
    counterpart: dict[int, Value] = {}
    wide = upcast(ex.graph, values=counterpart)
    if wide is None:
        raise RewriteError("the original does not run in float64: the bound cannot be evaluated")
    try:
        _, seen = run_observed(
            wide, [x.double() if x.is_floating_point() else x for x in xs], list(counterpart.values())
        )
    except GaweeError as e:
        raise RewriteError(
            f"the original does not run in float64 ({e.message}): the bound cannot be evaluated"
        ) from None

    def data_of(v: Value) -> torch.Tensor | None:
        w = counterpart.get(id(v))
        return None if w is None else seen.get(w, w.data)

    return evaluate_bound(rule, env, data_of, shapes)


def _match(rule: Rule, ex: Example, use_guard: bool) -> dict | None:
    """The bindings of the match the rewriter takes at the example's root: the first one whose guard holds
    (any first one without ``use_guard``); None where there is none."""
    env: dict = {}
    for roots in match_roots(rule, ex.root, env, MatchContext()):
        if use_guard and rule.guard is not None:
            try:
                if not rule.guard(RewriteContext(ex.graph, rule, roots, env)):
                    continue
            except (GaweeError, GuardFailed):
                continue
        return dict(env)
    return None


def partial_sum_bounds(graph: Graph, xs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The original run in float64 on the magnitudes of its inputs and constants: per output element, a
    bound on the partial sums a convolution, product or reduction forms on the way to it (exact for sums
    of products; an estimate through other ops). None where the graph does not run so."""
    g = upcast(graph, magnitudes=True)
    if g is None:
        return None
    try:
        return run(g, *[x.double().abs() if x.is_floating_point() else x for x in xs])
    except GaweeError:
        return None


def _orderless(ref: torch.Tensor, magnitude: torch.Tensor | None) -> torch.Tensor | None:
    """The elements of an output whose value does not depend on the order of its sums: a partial sum past
    the dtype's largest finite number overflows in some orders and not in others, and neither side fixes
    the order (a convolution's is its kernel's: channels-last and NCHW kernels sum a window differently).
    Elements whose bound is itself inf or nan (an inf operand, not a large sum) count. None where every
    element counts."""
    if magnitude is None or magnitude.shape != ref.shape or not magnitude.is_floating_point():
        return None
    past = (magnitude > torch.finfo(ref.dtype).max) & torch.isfinite(magnitude)  # an inf or nan operand is no sum's
    return ~past if past.any() else None


def _no_worse(ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor | None, allowed: float) -> bool:
    """Element by element, the rewrite either agrees with the original or is no farther from the
    float64 truth than the original was: a rewrite that avoids an overflow of the original (inf where
    float64 is finite), in some elements while others overflow in both, is not wrong."""
    if truth is None or not got.is_floating_point() or got.shape != truth.shape or ref.shape != got.shape:
        return False
    return no_farther(ref, got, truth, allowed)


def facts_hold(rule: Rule, ex: Example, xs: list[torch.Tensor]) -> bool:
    """Whether the rule's `assume` facts hold for the example run on inputs ``xs`` (True when the
    original does not run: the draw is refused where the reference run fails)."""
    if not rule.assumptions:
        return True
    watched = {a.var: ex.bindings.get(a.var) for a in rule.assumptions}
    try:
        _, seen = run_observed(ex.graph, xs, [v for v in watched.values() if v is not None])
    except GaweeError:
        return True
    return all(watched[a.var] is None or bool(a.fact.holds(seen[watched[a.var]]).all()) for a in rule.assumptions)


def _inputs(rule: Rule, ex: Example) -> list[torch.Tensor] | None:
    """The example's input data, satisfying the rule's `assume` facts; None if no draw does.

    The usual draw (awkward values include inf and nan) is kept when the facts hold for it;
    else the draw without non-finite inputs; else the example is discarded. Only data that
    breaks a stated fact is ever set aside, so a counterexample on such data is never hidden.
    """
    xs = ex.inputs()
    if not rule.assumptions:
        return xs
    for data in (xs, ex.inputs(nonfinite=False)):
        if facts_hold(rule, ex, data):  # (a draw the reference cannot run is refused later)
            return data
    return None


SYMBOLIC_SIZES = 3
"""How many values of the size symbol a symbolic variant is checked at."""


def symbolic_variant(ex: Example) -> tuple[Example, Sym] | None:
    """The example with dimension 0 of its inputs made one size symbol ``n`` (range ``1..2d``, example
    ``d``, where ``d`` is the first input's dimension 0; inputs of another first size stay static), or
    None when the graph's ops do not admit it (a reshape to a constant shape, a broadcast against a
    constant of that size...)."""
    first = next((v for v in ex.graph.inputs if v.type.rank >= 1), None)
    if first is None or first.type.shape[0] < 1:
        return None
    d = first.type.shape[0]
    n = Sym("n", 1, max(2 * d, 4), d)

    def retype(t: TensorType) -> TensorType:
        return TensorType((n, *t.shape[1:]), t.dtype, t.layout) if t.rank >= 1 and t.shape[0] == d else t

    g = _recast(ex.graph, "_dynamic", retype, lambda x: x)
    if g is None or not any(v.type.symbolic for v in g.outputs):
        return None
    root = next(node for node in g if node.name == ex.root.name)
    styles = {id(leaf.value): leaf.style for leaf in ex.leaves}
    leaves = [Leaf(a.name, b, styles[id(a)]) for a, b in zip(ex.graph.inputs, g.inputs) if id(a) in styles]
    return Example(g, root, leaves, ex.data_seed, ex.dtype, {}), n


def _check_symbolic(rule: Rule, ex: Example) -> tuple[bool, Counterexample | None]:
    """Rewrite the example's dynamic-batch variant (guard included, decided over the whole range) and
    compare it with the original at SYMBOLIC_SIZES sizes. (fired, counterexample)."""
    variant = symbolic_variant(ex)
    if variant is None:
        return False, None
    sym_ex, n = variant
    after = _apply(rule, sym_ex, use_guard=True)
    if after is None:
        return False, None
    for values in draw_values([n], SYMBOLIC_SIZES):
        gen = torch.Generator().manual_seed(ex.data_seed + values[n])
        styles = {id(leaf.value): leaf.style for leaf in sym_ex.leaves}
        xs = [fill(v.type.at(values), styles.get(id(v), "normal"), gen) for v in sym_ex.graph.inputs]
        try:
            found = _compare(rule, sym_ex, after, xs)
        except S.Reject:
            continue
        if found is not None:
            found.reason = f"with the batch dimension symbolic, at n = {values[n]}: {found.reason}"
            return True, found
    return True, None


# -- the solver tier -------------------------------------------------------------------
def _prove(rule: Rule, result: RuleCheck, scoped: list[tuple[Example, Graph]], drawn: list[tuple[Example, Graph]]):
    """First the rule's two sides as terms (gawee.testing.unfold): where they are one computation, the rule is
    proven for every shape and no instance is needed. Else the solver over the rule's instances: the
    small-scope enumeration's where it gave any (the bound is its highest complete level: every instance of it
    is among them), else up to SOLVER_DRAWS distinct drawn ones (no bound: a rule is *proven* only over a
    whole level of the small scope)."""
    definition = unfold.prove(rule)
    if isinstance(definition, unfold.Definition):
        return RuleProof(result.scope_bound or None, definition=definition.reason)
    if scoped:
        instances, bound = scoped, result.scope_bound or None
    else:
        seen: set[str] = set()
        instances, bound = [], None
        for ex, after in drawn:
            key = str(ex.graph)
            if key not in seen and len(instances) < SOLVER_DRAWS:
                seen.add(key)
                instances.append((ex, after))
    with torch_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prove_rule(rule, instances, bound)


# -- the property -----------------------------------------------------------------------
def _apply(rule: Rule, ex: Example, use_guard: bool) -> Graph | None:
    after = ex.graph.clone()
    root = next(n for n in after if n.name == ex.root.name)
    return after if fire(after, rule, root, use_guard=use_guard) else None


SCOPE_BUDGET = BUDGET
"""Instances of the small-scope enumeration per rule (see gawee.testing.scope.BUDGET)."""

CLASSES_PER_INSTANCE = 2
"""Boundary classes of values each enumerated instance is also checked with (the classes least used so
far for its dtype: over a rule's instances every class meets every dtype that has enough of them)."""


def _check_scope(
    rule: Rule,
    result: RuleCheck,
    on_example: Callable[[Example, list[torch.Tensor]], None] | None,
    budget: int,
    fired: list[tuple[Example, Graph]] | None = None,
    whole: int = COMPLETE,
) -> None:
    """Check every instance of the small-scope enumeration, with its own data and with boundary classes
    of values; raises _Unsound with the first counterexample (its ``found_by`` names the level). Each
    instance where the rule fired is appended to ``fired`` with its rewritten graph (the solver's)."""

    def accept(ex: Example) -> bool:  # an instance counts if its guard holds and the original runs
        if on_example is not None:
            on_example(ex, ex.inputs())
        if guard_verdict(rule, ex)[0] is not True:
            return False
        try:
            run(ex.graph, *ex.inputs())
        except GaweeError:
            return False
        return runs_nonempty(ex.graph)

    scope = Scope(budget=budget, complete=whole, accept=accept)
    used: Counter = Counter()
    tally = RuleCheck(rule)  # the enumeration's own counts: examples and guard hits describe the random draws
    try:
        for inst in enumerate_scope(rule, scope):
            result.scope_instances += 1
            level = LEVELS[inst.level]
            fills: list[tuple[str | None, Example]] = [(None, inst.example)]
            classes = classes_for(rule, inst.example.graph)
            dtype = inst.example.dtype
            for c in sorted(classes, key=lambda c: (used[dtype, c], classes.index(c)))[:CLASSES_PER_INSTANCE]:
                used[dtype, c] += 1
                try:
                    fills.append((c, build(rule, inst, c)))
                except (S.Reject, GaweeError):
                    continue
            for c, ex in fills:
                try:
                    judged = _judge(rule, ex, tally, on_example, symbolic=False, fired=fired if c is None else None)
                except _Unsound as e:
                    e.cx.found_by = f"the small-scope enumeration ({level})" + (f", values: {c}" if c else "")
                    raise
                if judged and c is not None:
                    result.value_classes.add(c)
    finally:
        result.scope_fired = tally.fired
        result.dtypes |= tally.dtypes
        result.extent = tally.extent
        rep = scope.report
        result.scope_bound = str(rep.covered) if rep.covered is not None else ""
        result.scope_truncated = rep.truncated
        result.scope_partial = str(rep.partial) if rep.partial is not None else ""


def _smaller(a: Counterexample, b: Counterexample) -> bool:
    """Whether counterexample ``a`` shows fewer values than ``b`` (a shrunk draw against an enumerated one)."""
    return sum(len(d) for _, _, d in a.values) < sum(len(d) for _, _, d in b.values)


def runs_nonempty(graph: Graph) -> bool:
    """Whether ``graph`` also runs with every size-0 dim of its leaves made 1 (when it cannot be rebuilt so:
    True for float leaves only). torch lets some ops through on an empty tensor of a dtype they have no kernel for
    (softmax of an empty int8 tensor): such an instance is not one a model can hold."""
    leaves = [*graph.inputs, *graph.constants()]
    if not any(0 in v.type.shape for v in leaves):
        return True

    def grow(t: TensorType) -> TensorType:
        return TensorType(tuple(1 if d == 0 else d for d in t.shape), t.dtype, t.layout)

    def grow_data(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(tuple(1 if d == 0 else d for d in x.shape), dtype=x.dtype) if 0 in x.shape else x

    probe = _recast(graph, "_nonempty", grow, grow_data)
    if probe is None:  # cannot tell: an integer instance is set aside (where the empty-tensor leniency bites)
        return all(v.type.dtype.is_float for v in leaves)
    try:
        run(probe, *[torch.zeros(v.type.shape, dtype=v.type.dtype.torch) for v in probe.inputs])
    except GaweeError:
        return False
    return True


def _judge(
    rule: Rule,
    ex: Example,
    result: RuleCheck,
    on_example: Callable[[Example, list[torch.Tensor]], None] | None,
    symbolic: bool,
    xs: list[torch.Tensor] | None = None,
    fired: list[tuple[Example, Graph]] | None = None,
) -> bool:
    """Check one instance: apply the rule where its guard holds (and anyway where it does not, to see
    whether the guard is needed) and compare. False if the instance is invalid (it does not match, its
    data breaks an `assume` fact, the original does not run); raises _Unsound with a counterexample.
    ``xs``: the input data (default: the example's own draw). ``fired``: where the rule fired and agreed,
    (instance, rewritten graph) is appended to it (the solver's instances)."""
    if on_example is not None:
        on_example(ex, ex.inputs() if xs is None else xs)
    holds, failed_part = guard_verdict(rule, ex)
    if holds is None:
        result.rejected += 1
        return False
    xs = _inputs(rule, ex) if xs is None else xs
    if xs is None:
        result.rejected += 1
        result.assumption_false += 1
        return False
    if on_example is not None and rule.assumptions:
        on_example(ex, xs)
    try:
        run(ex.graph, *xs)  # ops without a kernel for this dtype make the draw invalid
    except GaweeError:
        result.rejected += 1
        return False
    result.examples += 1
    result.dtypes.add(ex.dtype.value)
    result.extent.note(ex.graph)
    if holds:
        result.guard_hits += 1
        try:
            after = _apply(rule, ex, use_guard=True)
        except RewriteError as e:
            raise _Unsound(
                Counterexample(rule.name, e.message, str(ex.graph), "(no graph: the rule failed)", _describe(ex, xs))
            ) from None
        if after is None:
            return True
        result.fired += 1
        found = _compare(rule, ex, after, xs)
        if found is not None:
            raise _Unsound(found)
        if fired is not None:
            fired.append((ex, after))
        if symbolic:
            fired, found = _check_symbolic(rule, ex)
            result.symbolic_fired += fired
            if found is not None:
                raise _Unsound(found)
        return True
    result.guard_failures.update(failed_part)
    try:
        after = _apply(rule, ex, use_guard=False)
    except (RewriteError, S.Reject):
        result.guard_needed += 1
        return True
    if after is None:
        return True
    try:
        bad = _compare(rule, ex, after, xs, use_guard=False)
    except S.Reject:
        return True
    if bad is not None:
        result.guard_needed += 1
    else:
        result.guard_false_sound += 1
    return True


def check_rule(
    rule: Rule,
    examples: int = 200,
    seed: int | None = None,
    on_example: Callable[[Example, list[torch.Tensor]], None] | None = None,
    symbolic: bool = False,
    scope_budget: int = SCOPE_BUDGET,
    solver: bool = True,
    scope_complete: int = COMPLETE,
) -> RuleCheck:
    """Run the harness on one rule: first the small-scope enumeration (gawee.testing.scope, at most
    ``scope_budget`` instances, 0 skips it, and each level of at most ``scope_complete`` instances whole; the
    same on every seed), each instance also filled with
    boundary classes of values (gawee.testing.values), then ``examples`` valid random draws
    (reproducible for a given seed).

    ``solver``: also decide the rule's instances with the SMT solver (``gawee.testing.smt``): the small
    scope's (every instance of a complete level proven: the verdict is *proven*, with that level as its
    bound), else up to SOLVER_DRAWS distinct drawn instances; a counterexample it finds is replayed through
    the same comparison and reported like any other.

    ``symbolic``: where the rule fires, also rewrite the example with its batch dimension a size
    symbol (``symbolic_variant``) — the guard then decides over the symbol's whole range — and check
    the result at several sizes (``RuleCheck.symbolic_fired`` counts them).

    ``on_example(ex, inputs)`` is called before each drawn instance runs (the isolated runner
    keeps the last one, to show which instance crashed a kernel). An exception inside the
    harness becomes the rule's ``error`` verdict, naming the exception and where it was raised.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    result = RuleCheck(rule)
    solver = solver and not rule.approximate  # the solver proves equality: an approximate rule is not one
    hints = hints_of(rule)
    t0 = time.perf_counter()
    scoped: list[tuple[Example, Graph]] = []
    drawn: list[tuple[Example, Graph]] = []

    def prop(data):
        try:
            ex = generate(rule, data, hints)
        except S.Reject:
            result.rejected += 1
            reject()
        if not _judge(rule, ex, result, on_example, symbolic, fired=drawn if solver else None):
            reject()

    def enumerate_instances() -> None:
        if scope_budget:
            _check_scope(rule, result, on_example, scope_budget, scoped if solver else None, scope_complete)

    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=seed is None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
        phases=[Phase.generate, Phase.shrink],
    )(given(st.data())(prop))
    if seed is not None:
        test = hseed(seed)(test)
    try:
        # tiny examples: one thread, no pool
        with torch_threads(1), _shrink_budget(SHRINK_SECONDS), _no_source_constants(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's numeric warnings on random draws say nothing here
            try:
                enumerate_instances()
            except _Unsound as e:  # found every time; sampling may still shrink it further
                result.counterexample, result.scope_refuted = e.cx, True
            test()
    except _Unsound as e:
        if result.counterexample is None or _smaller(e.cx, result.counterexample):
            result.counterexample = e.cx
    except Unsatisfiable:
        result.error = "no valid example could be generated for this pattern"
    except Exception as e:  # a bug of the harness or of an op's sampler: a verdict for this rule, not a crash
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
        ours = Path(frame.filename).resolve().is_relative_to(Path(__file__).resolve().parents[1])
        blame = "a bug of gawee's harness: please report it" if ours else "raised outside gawee (a helper?)"
        result.error = f"checking this rule raised {type(e).__name__}: {e} (at {where}; {blame})"
    if solver and result.counterexample is None and not result.error:
        result.proof = _prove(rule, result, scoped, drawn)
        if result.proof.counterexample is not None:
            result.counterexample = result.proof.counterexample
    result.seconds = time.perf_counter() - t0
    return result


def check_rules(
    rules: RuleSet | list[Rule],
    examples: int = 200,
    seed: int | None = None,
    progress: Callable[[Rule, RuleCheck], None] | None = None,
    *,
    isolate: bool = True,
    jobs: int = 1,
    timeout: float | None = None,
) -> list[RuleCheck]:
    """check_rule for every rule of the set; results in rule order, ``progress`` called after each.

    With ``isolate`` (the default where the platform can fork), each rule runs in a worker
    process (gawee.testing.isolate): a crash inside a kernel, or a rule that outlives
    ``timeout`` seconds, is that rule's ``crashed`` verdict and the other rules are still judged;
    ``jobs`` workers run at once.
    """
    from gawee.testing.isolate import can_isolate, check_isolated

    rule_list = rules.rules if isinstance(rules, RuleSet) else list(rules)
    if isolate and can_isolate():
        return check_isolated(rule_list, examples, seed, jobs=jobs, timeout=timeout, progress=progress)
    out = []
    for rule in rule_list:
        res = check_rule(rule, examples, seed)
        out.append(res)
        if progress is not None:
            progress(rule, res)
    return out
