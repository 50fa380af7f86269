"""Equivalence checking: do two graphs compute the same thing (shapes, dtypes and numbers)?"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gawee.errors import EquivalenceError, GaweeError
from gawee.interp import run, run_observed
from gawee.ir.core import Graph
from gawee.ir.symbolic import draw_values, symbols_of
from gawee.ir.types import DType, TensorType
from gawee.numerics import TOLERANCE, fill, format_error, no_farther, output_error, upcast


def random_inputs(
    types: Sequence[TensorType], seed: int = 0, sizes: dict | None = None, device: torch.device | str | None = None
) -> list[torch.Tensor]:
    """Inputs of the given types: normal floats, small non-negative integers, random bools. Symbolic
    dimensions take the values in ``sizes`` (``Sym -> int``), else their examples. Drawn on the CPU (the same
    values for a seed on every device), then put on ``device`` (None: left on the CPU; a graph's runs on
    ``Graph.device``)."""
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        return [x.to(device) for x in random_inputs(types, seed, sizes)]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in types:
        t = t.at(sizes or {})
        if t.dtype is DType.bool:
            out.append(torch.rand(t.shape, generator=gen) > 0.5)
        elif t.dtype.is_float or t.dtype.is_complex:
            out.append(torch.randn(t.shape, generator=gen, dtype=t.dtype.torch))
        else:
            out.append(torch.randint(0, 4, t.shape, generator=gen, dtype=t.dtype.torch))
    return out


@dataclass
class OutputCheck:
    index: int
    before: TensorType
    after: TensorType
    max_error: float
    tolerance: float
    scale: float
    """max(1, max|reference|): errors are compared against tolerance x scale."""
    forgiven: bool = False
    """The error exceeds tolerance x scale but the output is no farther from the original evaluated in
    float64 than the original is (verify_rewrite only: reassociated math, an overflow avoided)."""
    approximate: bool = False
    """The error exceeds tolerance x scale, and approximate rules made the output or a value it is computed from
    (gawee.compile with a precision phase): their declared bounds, not the tolerance, say how far it may be."""

    @property
    def ok(self) -> bool:
        return self.before.same_shape_dtype(self.after) and (
            self.forgiven or self.approximate or self.max_error <= self.tolerance * self.scale
        )


@dataclass
class EquivalenceReport:
    outputs: list[OutputCheck] = field(default_factory=list)
    problem: str = ""
    """Why the graphs could not even be compared (different signatures), else ""."""

    @property
    def ok(self) -> bool:
        return not self.problem and all(o.ok for o in self.outputs)

    @property
    def max_error(self) -> float:
        return max((o.max_error for o in self.outputs), default=0.0)

    def short(self) -> str:
        """One cell's worth: "ok, max error 2.4e-06"."""
        if self.problem:
            return f"FAILED: {self.problem}"
        return f"{'ok' if self.ok else 'FAILED'}, max error {self.max_error:.2g}{self._approximate_note()}"

    def _approximate_note(self) -> str:
        past = sum(o.approximate for o in self.outputs)
        return f" ({past} outputs of approximate rules past the tolerance)" if past else ""

    def __str__(self) -> str:
        if self.problem:
            return f"not equivalent: {self.problem}"
        worst = max(self.outputs, key=lambda o: o.max_error / (o.tolerance * o.scale or 1), default=None)
        status = "equivalent" if self.ok else "NOT equivalent"
        if worst is None:
            return status
        return (
            f"{status}: max abs error {worst.max_error:.3g} (tolerance {worst.tolerance:g} x "
            f"{worst.scale:.3g}) over {len(self.outputs)} output(s){self._approximate_note()}"
        )


def signature_problem(before: Graph, after: Graph) -> str:
    """Why the two graphs cannot be compared at all (different inputs or output count, no weights), else ""."""
    in_b, in_a = [v.type for v in before.inputs], [v.type for v in after.inputs]
    if len(in_b) != len(in_a) or any(not x.same_shape_dtype(y) for x, y in zip(in_b, in_a)):
        return f"inputs differ: {[str(t) for t in in_b]} vs {[str(t) for t in in_a]}"
    if len(before.outputs) != len(after.outputs):
        return f"{len(before.outputs)} outputs vs {len(after.outputs)}"
    if any(v.data is not None and not v.has_known_data for g in (before, after) for v in g.constants()):
        return "a graph holds meta-device constants (no values): capture with real weights to compare"
    return ""


def verify_equivalent(
    before: Graph, after: Graph, inputs: Sequence[torch.Tensor] | None = None, *, seed: int = 0, trials: int = 1
) -> EquivalenceReport:
    """Run both graphs on the same inputs (given, or ``trials`` random draws) and compare outputs.

    Shapes and dtypes must be equal; numbers must agree within the per-dtype
    tolerance (TOLERANCE). Graphs with meta-device constants cannot be compared.
    """
    report = EquivalenceReport()
    report.problem = signature_problem(before, after)
    if report.problem:
        return report
    in_b = [v.type for v in before.inputs]
    sizes = draw_values(symbols_of(in_b), trials)  # symbolic inputs: each trial at other sizes
    device = before.device
    draws = (
        [list(inputs)]
        if inputs is not None
        else [random_inputs(in_b, seed + k, sizes[k], device) for k in range(trials)]
    )
    checks: dict[int, OutputCheck] = {}
    for xs in draws:
        ref = run(before, *xs)
        got = run(after, *xs)
        for i, (r, g) in enumerate(zip(ref, got)):
            tb, ta = TensorType.of(r), TensorType.of(g)
            err = output_error(r, g) if tb.same_shape_dtype(ta) else float("inf")
            finite = r[torch.isfinite(r)] if r.dtype.is_floating_point else r
            scale = max(1.0, finite.abs().max().item()) if finite.numel() and r.dtype != torch.bool else 1.0
            check = OutputCheck(i, tb, ta, err, TOLERANCE.get(tb.dtype, 0.0), scale)
            if i not in checks or not check.ok or check.max_error > checks[i].max_error:
                checks[i] = check
    report.outputs = [checks[i] for i in sorted(checks)]
    return report


def assert_equivalent(before: Graph, after: Graph, inputs: Sequence[torch.Tensor] | None = None, **kw) -> None:
    """verify_equivalent, raising EquivalenceError if the graphs differ."""
    report = verify_equivalent(before, after, inputs, **kw)
    if not report.ok:
        raise EquivalenceError(str(report))


# -- verifying a rewrite: several input distributions, intermediate values, blame ---------------
DISTRIBUTIONS = ("normal", "x10", "x100", "awkward")
"""The input sets ``verify_rewrite`` tries, in order: unit normal, normal x10, normal x100, and the
soundness harness's awkward values (huge, tiny, zero, signed zeros; ``gawee.numerics.AWKWARD``).
Integer and bool inputs are drawn as ``random_inputs`` does in every set (they may be indices)."""

_SCALES = {"normal": 1.0, "x10": 10.0, "x100": 100.0}


def distribution_inputs(
    types: Sequence[TensorType],
    distribution: str,
    seed: int = 0,
    sizes: dict | None = None,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """Inputs of the given types drawn from one of DISTRIBUTIONS (``normal`` is ``random_inputs``);
    symbolic dimensions at ``sizes`` (else their examples); on ``device`` as ``random_inputs``."""
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        return [x.to(device) for x in distribution_inputs(types, distribution, seed, sizes)]
    xs = random_inputs(types, seed, sizes)
    if distribution in _SCALES:
        return [x * _SCALES[distribution] if x.is_floating_point() or x.is_complex() else x for x in xs]
    if distribution != "awkward":
        raise EquivalenceError(
            f"unknown input distribution {distribution!r}", hint=f"one of {', '.join(DISTRIBUTIONS)}"
        )
    gen = torch.Generator().manual_seed(seed)
    return [
        fill(t.at(sizes or {}), "awkward", gen) if t.dtype.is_float or t.dtype.is_complex else x
        for t, x in zip(types, xs)
    ]


@dataclass
class ValueCheck:
    """A value of the rewritten graph compared with the value of the original it stands for."""

    value: str
    original: str
    firings: tuple[int, ...]
    """Indices into the trace of the replacements from ``original`` to ``value`` (empty: the same value)."""
    rules: tuple[str, ...]
    max_error: float
    allowed: float
    ok: bool
    output: int | None = None
    """The graph output index, when the value is one."""
    inherited: bool = False
    """It differs, but only through its inputs: recomputed from the original's values it agrees."""
    approximate: bool = False
    """It differs past the tolerance, and an approximate rule made it or a value it is computed from: its rule is
    held to its declared bound by `gawee-rewrite check`, not to the tolerance here."""

    def describe(self) -> str:
        via = f" (made by {' then '.join(dict.fromkeys(self.rules))})" if self.rules else ""
        what = f"output {self.output} " if self.output is not None else ""
        return f"{what}%{self.value}{via} vs %{self.original} of the original"


@dataclass
class Trial:
    """One input distribution: graph outputs and every corresponding intermediate value compared."""

    distribution: str
    outputs: list[OutputCheck] = field(default_factory=list)
    values: int = 0
    """Pairs of corresponding values compared (graph outputs included)."""
    first_divergence: ValueCheck | None = None
    """The first value, in the rewritten graph's order, that differs from the one it stands for."""
    problem: str = ""
    """The rewritten graph failed to run on these inputs (a failure)."""
    skipped: str = ""
    """The original graph failed to run on these inputs (no verdict)."""
    max_rel_error: float = 0.0
    """Over all compared values: max error / (tolerance x scale); <= 1 passes."""
    approximate: int = 0
    """Values past the tolerance accepted because approximate rules made them (``ValueCheck.approximate``)."""

    @property
    def ok(self) -> bool:
        return not self.problem and self.first_divergence is None and all(o.ok for o in self.outputs)

    @property
    def max_error(self) -> float:
        return max((o.max_error for o in self.outputs), default=0.0)

    def as_dict(self) -> dict:
        return {
            "distribution": self.distribution,
            "ok": self.ok,
            "skipped": self.skipped or None,
            "max_error": self.max_error,
            "max_error_over_allowed": self.max_rel_error,
            "values_compared": self.values,
            "approximate_values": self.approximate,
            "first_divergence": None if self.first_divergence is None else self.first_divergence.__dict__,
            "problem": self.problem or None,
        }


@dataclass
class Blame:
    """The rule held responsible for a failed verification."""

    rule: str
    location: str
    firing: int
    """Index into the rewrite's trace of the firing blamed."""
    root: str
    """The node that firing was rooted at."""
    distribution: str
    value: str
    original: str
    method: str
    """"provenance": the diverging value's replacements and the nodes between it and the last values
    that agree were all made by this one rule; "replay": several rules were involved, and replaying the
    rewrite up to each of their firings found the first after which the value differs; "failed node":
    the rewritten graph failed to run at a node this rule made; "ambiguous": no rule set to replay with."""
    candidates: tuple[str, ...] = ()
    """Every rule involved in making the diverging value."""

    def __str__(self) -> str:
        others = [c for c in self.candidates if c != self.rule]
        among = f"; also involved: {', '.join(others)}" if others else ""
        return f"rule {self.rule} ({self.location}), firing #{self.firing} at node {self.root} [{self.method}{among}]"


@dataclass
class RewriteVerification:
    """The result of ``verify_rewrite``: one Trial per distribution and, on failure, the rule blamed."""

    trials: list[Trial] = field(default_factory=list)
    blame: Blame | None = None
    problem: str = ""
    """Why the graphs could not even be compared, else ""."""
    seconds: float = 0.0
    firings: list[FiringCheck] = field(default_factory=list)
    """Each distinct firing on its own (:func:`check_firings`): its matched nodes against its replacement, on
    operands drawn from every distribution."""

    @property
    def ok(self) -> bool:
        return not self.problem and all(t.ok for t in self.trials) and all(f.ok for f in self.firings)

    @property
    def failed_firing(self) -> FiringCheck | None:
        return next((f for f in self.firings if not f.ok), None)

    @property
    def max_error(self) -> float:
        """Max output error on the first (unit normal) input set, as verify_equivalent reports it."""
        return self.trials[0].max_error if self.trials else 0.0

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.trials if not t.ok]

    def short(self) -> str:
        """One cell's worth: "ok, max error 2.4e-06" or "FAILED: relu6_is_relu (x10)"."""
        if self.problem:
            return f"FAILED: {self.problem}"
        if self.ok:
            approximate = max((t.approximate for t in self.trials), default=0)
            past = f" ({approximate} values of approximate rules past the tolerance)" if approximate else ""
            return f"ok, max error {self.max_error:.2g}{past}"
        where = ", ".join(t.distribution for t in self.failed)
        if not where and self.failed_firing is not None:
            where = f"alone on {self.failed_firing.distribution} operands"
        return f"FAILED: {self.blame.rule} ({where})" if self.blame else f"FAILED ({where})"

    def __str__(self) -> str:
        if self.problem:
            return f"not equivalent: {self.problem}"
        sets = ", ".join(
            f"{t.distribution} {'skipped' if t.skipped else 'ok' if t.ok else 'FAILED'}" for t in self.trials
        )
        checked = f"; {len(self.firings)} firings checked alone" if self.firings else ""
        if self.ok:
            return f"equivalent on {len(self.trials)} input sets ({sets}){checked}, max error {self.max_error:.3g}"
        lines = [f"NOT equivalent ({sets}{checked})"]
        first = self.failed[0] if self.failed else None
        if first is None:
            lines.append(f"  {self.failed_firing}")
        elif first.problem:
            lines.append(f"  on {first.distribution} inputs: {first.problem}")
        elif first.first_divergence is not None:
            d = first.first_divergence
            lines.append(
                f"  on {first.distribution} inputs, first difference: {d.describe()}: "
                f"max error {format_error(d.max_error)} > allowed {format_error(d.allowed)}"
            )
        if self.blame is not None:
            lines.append(f"  blamed: {self.blame}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "max_error": self.max_error,
            "problem": self.problem or None,
            "trials": [t.as_dict() for t in self.trials],
            "blame": None if self.blame is None else self.blame.__dict__,
            "firings_checked": len(self.firings),
            "failed_firing": None if self.failed_firing is None else self.failed_firing.__dict__,
            "seconds": self.seconds,
            "detail": str(self),
        }


def verify_rewrite(
    before: Graph,
    after: Graph,
    trace: Sequence,
    *,
    rules=None,
    distributions: Sequence[str] = DISTRIBUTIONS,
    seed: int = 0,
) -> RewriteVerification:
    """Verify that ``after`` (the result of rewriting ``before``, with ``trace`` its firings) computes
    what ``before`` does, on several input distributions, value by value, and name the rule to blame.

    For each distribution, both graphs run on the same inputs; every graph output and every value of
    ``after`` that stands for a value of ``before`` (``gawee.rewrite.driver.provenance``) is compared
    with the per-dtype tolerance scaled by the reference's magnitude (as ``verify_equivalent``; inf
    and nan must sit at the same positions). A comparison that fails is judged again against the
    original evaluated in float64 (when every op runs in float64): a rewritten value within a few
    times the original's own rounding error of it (OWN_ERROR_FACTOR), or element by element no farther
    from the truth than the original, is not a difference (reassociated float math on huge inputs, an
    overflow avoided). The first value, in ``after``'s order, that differs localizes the
    fault; the rule blamed is the one that made it, or, when several rules made the nodes between it
    and the last values that agree, found by replaying the rewrite (``rules``, deterministic) up to each
    of their firings and comparing the value again.

    Values that approximate rules made (firings with a ``bound``), and every value computed from them, are
    compared but not held to the tolerance: each such rule is held to its own declared bound by the soundness
    harness, and how far its error travels through the rest of the model is not bounded here. They are
    counted (``Trial.approximate``), and their firings are not checked alone.
    """
    from gawee.rewrite.driver import provenance

    t0 = time.perf_counter()
    out = RewriteVerification(problem=signature_problem(before, after))
    if out.problem:
        return out
    trace = list(trace)
    b_values = _values_by_name(before)
    a_values = _values_by_name(after)
    pairs = _pairs(before, after, provenance(trace, set(b_values)), b_values, a_values, trace)
    approximate = approximate_values(after, trace)
    b_probe = _probe(before, [p.original for p in pairs])
    a_probe = _probe(after, [p.value for p in pairs])
    types = [v.type for v in before.inputs]
    sizes = draw_values(symbols_of(types), len(distributions))  # symbolic inputs: each trial at other sizes
    failing: tuple[Trial, list[torch.Tensor], tuple] | None = None
    """The first failed trial, its inputs and the original's values on them."""
    for k, dist in enumerate(distributions):
        xs = distribution_inputs(types, dist, seed + k, sizes[k], before.device)
        trial = Trial(dist)
        out.trials.append(trial)
        try:
            ref = run(b_probe, *xs)
        except GaweeError as e:
            trial.skipped = f"the original graph fails on these inputs: {e.message}"
            continue
        try:
            got = run(a_probe, *xs)
        except GaweeError as e:
            trial.problem = f"the rewritten graph fails to run: {e.message}"
            if failing is None:
                failing = (trial, xs, ref)
                out.blame = _blame_failed_node(e, trace, dist)
            continue
        n = len(before.outputs)
        checks = [_judge(p, ref[n + i], got[n + i], None) for i, p in enumerate(pairs)]
        for c in checks:
            if not c.ok and c.value in approximate:
                c.ok, c.approximate = True, True
                trial.approximate += 1
        _confirm(before, after, pairs, checks, xs, ref[n:], got[n:])
        for c in checks:
            c.rules = tuple(trace[i].rule for i in c.firings)
        trial.values = len(checks)
        trial.max_rel_error = max((_ratio(c.max_error, c.allowed) for c in checks if not c.approximate), default=0.0)
        trial.first_divergence = next((c for c in checks if not c.ok), None)
        for i, (r, g) in enumerate(zip(ref[:n], got[:n])):
            tb, ta = TensorType.of(r), TensorType.of(g)
            c = next((c for c in checks if c.output == i), None)
            err = c.max_error if c is not None else output_error(r, g)
            tol = TOLERANCE.get(tb.dtype, 0.0)
            check = OutputCheck(i, tb, ta, err, tol, _scale(r))
            check.forgiven = c is not None and c.ok and not check.ok  # judged against the float64 truth
            trial.outputs.append(check)
        if not trial.ok and failing is None:
            failing = (trial, xs, ref)
    if failing is not None and out.blame is None and failing[0].first_divergence is not None:
        trial, xs, ref = failing
        out.blame = _localize(before, after, trace, rules, trial, xs, ref, pairs, b_values)
    out.firings = check_firings(trace, distributions, seed)
    bad = out.failed_firing
    if out.blame is None and bad is not None:
        f = trace[bad.firing]
        out.blame = Blame(f.rule, f.location, bad.firing, f.root, bad.distribution, bad.value, bad.original, "alone")
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class FiringCheck:
    """One firing run on its own (``Firing.instance``): the values it replaced against their replacements."""

    firing: int
    """Index into the trace."""
    rule: str
    location: str
    root: str
    distribution: str
    """The input set of the worst comparison (the failing one, if any)."""
    value: str = ""
    """The replacement compared worst."""
    original: str = ""
    max_error: float = 0.0
    allowed: float = 0.0
    ok: bool = True
    skipped: tuple[str, ...] = ()
    """Input sets left out: the instance's original failed to run on them, or they broke an `assume`."""
    problem: str = ""
    """The replacement failed to run where the matched nodes ran (a failure), else ""."""

    def __str__(self) -> str:
        where = f"firing #{self.firing} of {self.rule} ({self.location}) at node {self.root}"
        where += f", alone on {self.distribution} operands"
        if self.problem:
            return f"{where}: FAILED, {self.problem}"
        return (
            f"{where}: {'ok' if self.ok else 'FAILED'}, %{self.value} vs %{self.original}: "
            f"max error {self.max_error:.3g}, allowed {self.allowed:.3g}"
        )


def check_firings(trace: Sequence, distributions: Sequence[str] = DISTRIBUTIONS, seed: int = 0) -> list[FiringCheck]:
    """Each firing of ``trace`` that carries its instance (``Firing.instance``: one per rule and operand types)
    run on its own, on operands drawn from each of ``distributions``: the nodes the rule matched and the nodes it
    built read the same operands, and each replacement must agree with the value it replaced as in
    :func:`verify_rewrite` (the per-dtype tolerance, then the original in float64). Inside a model the values that
    reach a rewritten node may stay where an unsound rewrite agrees (a layer norm keeps a GELU's input small
    however large the model's inputs); here they span the ranges where rewrites differ. Input sets that break
    an ``assume`` of the rule, or on which the original itself fails, are left out. Firings of approximate rules
    (with a ``bound``) are left out too: `gawee-rewrite check` holds such a rule to its declared bound."""
    checks = []
    for i, f in enumerate(trace):
        instance = getattr(f, "instance", None)
        if instance is not None and not getattr(f, "bound", ""):
            checks.append(_check_instance(i, f, instance, distributions, seed))
    return checks


def approximate_values(after: Graph, trace: Sequence) -> set[str]:
    """The names of the values of ``after`` that approximate rules made (firings with a ``bound``), or that are
    computed from them: through the dataflow of ``after``, and through later firings that matched a node an
    approximate one made (a fusion that folds a bf16 weight into a new node)."""
    made: set[str] = set()
    for f in trace:
        matched = {m.partition(":")[0] for m in f.matched}
        if getattr(f, "bound", "") or matched & made:
            made |= {c.partition(":")[0] for c in f.created}
    if not made:
        return set()
    tainted: set[str] = set()
    for node in after:
        if node.name in made or any(v is not None and v.name in tainted for v in node.inputs):
            tainted |= {v.name for v in node.outputs}
    return tainted


@dataclass(frozen=True)
class FiringError:
    """How far a value an approximate rule made is from the value it stands for, on one set of inputs."""

    firing: int
    """Index into the trace of the approximate firing (the last one, where a value's making involved several)."""
    rule: str
    location: str
    root: str
    bound: str
    """The rule's declared bound (its `within` text)."""
    value: str
    """The value of the rewritten graph compared."""
    original: str
    """The value of the original graph it stands for."""
    max_error: float
    """max |value - original| (upstream approximations included: the value is computed from approximate inputs)."""
    scale: float
    """max(1, max |original|)."""

    @property
    def relative(self) -> float:
        return self.max_error / self.scale

    def __str__(self) -> str:
        return (
            f"{self.rule} at {self.root}: {format_error(self.max_error)} of scale {self.scale:.3g} "
            f"(%{self.value} for %{self.original}; declared within {self.bound})"
        )


def firing_errors(before: Graph, after: Graph, trace: Sequence, inputs: Sequence[torch.Tensor]) -> list[FiringError]:
    """Where the error of a reduced-precision rewrite comes from: every value of ``after`` that an approximate
    rule's firing made (a firing of ``trace`` with a ``bound``; through later exact firings too, by provenance),
    run on ``inputs`` against the value of ``before`` it stands for, worst relative error first. An error includes
    what reaches the value from earlier approximate rewrites: the first entries in dataflow order with a large
    error are the ones that made it."""
    from gawee.rewrite.driver import provenance

    approximate = {i for i, f in enumerate(trace) if getattr(f, "bound", "")}
    if not approximate:
        return []
    b_values, a_values = _values_by_name(before), _values_by_name(after)
    wanted: list[tuple[int, str, str]] = []
    for name, sources in provenance(list(trace), set(b_values)).items():
        if name not in a_values or a_values[name].data is not None:
            continue
        for original, chain in sources.items():
            made = [i for i in chain if i in approximate]
            if made and original in b_values and b_values[original].data is None:
                wanted.append((made[-1], name, original))
    if not wanted:
        return []
    ref = run(_probe(before, [o for _, _, o in wanted]), *inputs)[len(before.outputs) :]
    got = run(_probe(after, [v for _, v, _ in wanted]), *inputs)[len(after.outputs) :]
    out = []
    for (i, value, original), r, g in zip(wanted, ref, got):
        f = trace[i]
        if not r.is_floating_point() or r.shape != g.shape:
            continue
        error = output_error(r.double(), g.double())
        out.append(FiringError(i, f.rule, f.location, f.root, f.bound, value, original, error, _scale(r)))
    return sorted(out, key=lambda e: (-e.relative, e.firing))


def _check_instance(index: int, f, instance, distributions: Sequence[str], seed: int) -> FiringCheck:
    g, n = instance.graph, instance.replaced
    worst = FiringCheck(index, f.rule, f.location, f.root, distributions[0] if distributions else "")
    skipped = []
    types = [v.type for v in g.inputs]
    for k, dist in enumerate(distributions):
        xs = distribution_inputs(types, dist, seed + k, device=g.device)
        if any(not bool(a.holds(xs[i]).all()) for i, a in instance.assumed):
            skipped.append(dist)
            continue
        try:
            outs = run(g, *xs)
        except GaweeError as e:
            try:
                run(_prune(g, [v.name for v in g.outputs[:n]]), *xs)
            except GaweeError:  # the matched nodes themselves fail on these operands: no verdict
                skipped.append(dist)
                continue
            worst.distribution, worst.max_error, worst.ok = dist, math.inf, False
            worst.problem, worst.skipped = f"the replacement fails to run: {e.message}", tuple(skipped)
            return worst
        for j in range(n):
            original, value = g.outputs[j].name, g.outputs[n + j].name
            pair = _Pair(value, original, (), -1)
            check = _judge(pair, outs[j], outs[n + j], None)
            if not check.ok:
                truth = _truth(g, [original], xs)
                check = _judge(pair, outs[j], outs[n + j], None if truth is None else truth[0])
            worse = _ratio(check.max_error, check.allowed) > _ratio(worst.max_error, worst.allowed)
            if not check.ok or worse or not worst.value:
                worst.distribution, worst.value, worst.original = dist, value, original
                worst.max_error, worst.allowed, worst.ok = check.max_error, check.allowed, check.ok
            if not check.ok:
                worst.skipped = tuple(skipped)
                return worst
    worst.skipped = tuple(skipped)
    return worst


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed else (0.0 if error == 0 else float("inf"))


@dataclass
class _Pair:
    value: str
    original: str
    firings: tuple[int, ...]
    position: int
    output: int | None = None


def _values_by_name(graph: Graph) -> dict[str, object]:
    named: dict[str, object] = {v.name: v for v in graph.inputs}
    for node in graph:
        for v in node.inputs:
            if v is not None and v.data is not None:
                named.setdefault(v.name, v)
        for v in node.outputs:
            named[v.name] = v
    for v in graph.outputs:
        named.setdefault(v.name, v)
    return named


def _pairs(before, after, links, b_values, a_values, trace) -> list[_Pair]:
    """(after value, original value) pairs to compare, in after's order: every replacement that is
    still in ``after`` with each value it stands for, and the graph outputs."""
    position = {v.name: i for i, node in enumerate(after) for v in node.outputs}
    pairs: dict[tuple[str, str], _Pair] = {}
    for name, sources in links.items():
        if name not in a_values:
            continue
        for original, chain in sources.items():
            if original in b_values:
                pairs[name, original] = _Pair(name, original, chain, position.get(name, -1))
    for i, (vb, va) in enumerate(zip(before.outputs, after.outputs)):
        chain = links.get(va.name, {}).get(vb.name, ())
        p = pairs.setdefault((va.name, vb.name), _Pair(va.name, vb.name, chain, position.get(va.name, -1)))
        if p.output is None:
            p.output = i
    return sorted(pairs.values(), key=lambda p: (p.position, p.output is None, p.output or 0))


def _probe(graph: Graph, names: Sequence[str]) -> Graph:
    """A copy of ``graph`` that also returns the named values (after its own outputs)."""
    g = graph.clone()
    named = _values_by_name(g)
    g.set_outputs([*g.outputs, *(named[n] for n in names)])
    return g


def _fast_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    """``output_error`` in three passes when both are finite (the common case): max|ref - got|
    computed in the tensors' own dtype (float32 for 16-bit floats); exactly as output_error otherwise."""
    if ref.is_floating_point() and ref.numel():
        a, b = (ref.float(), got.float()) if ref.element_size() < 4 else (ref, got)
        err = (a - b).abs().max().item()
        if math.isfinite(err):
            return err
    return output_error(ref, got)


def _scale(ref: torch.Tensor) -> float:
    """max(1, max|ref|) over the finite elements of ``ref``."""
    if ref.dtype == torch.bool or not ref.numel():
        return 1.0
    if ref.is_floating_point():
        m = ref.abs().max().item()
        if math.isfinite(m):
            return max(1.0, m)
    finite = ref[torch.isfinite(ref)] if ref.dtype.is_floating_point or ref.is_complex() else ref
    return max(1.0, finite.abs().max().item()) if finite.numel() else 1.0


OWN_ERROR_FACTOR = 4
"""A value that fails the plain tolerance passes if it differs from the original's by at most
tol x scale + OWN_ERROR_FACTOR x max|original - float64 truth|: both are float roundings of one
exact value, and a changed evaluation order (a folded batch norm on inputs of 1e4) may round a few
times differently; the soundness harness, which checks one rule on small graphs, allows 2."""


def _judge(p: _Pair, ref: torch.Tensor, got: torch.Tensor, truth: torch.Tensor | None) -> ValueCheck:
    """Compare one pair: within tol x scale; with the float64 ``truth``, also forgiven when no worse
    than the original's own rounding (tol x scale + OWN_ERROR_FACTOR x max|ref - truth|, or element by
    element no farther from the truth than the original)."""
    dtype = DType.from_torch(ref.dtype)
    tol = TOLERANCE.get(dtype, 0.0)
    same_type = ref.shape == got.shape and ref.dtype == got.dtype
    err = _fast_error(ref, got) if same_type else float("inf")
    allowed = tol * _scale(ref)
    ok = same_type and err <= allowed
    if not ok and same_type and truth is not None and ref.is_floating_point() and truth.shape == ref.shape:
        own = output_error(truth, ref.double())
        own = 0.0 if own == float("inf") else own
        allowed = tol * _scale(truth) + OWN_ERROR_FACTOR * own
        ok = err <= allowed or no_farther(ref, got, truth, tol * _scale(truth))
    return ValueCheck(p.value, p.original, p.firings, (), err, allowed, ok, p.output)


def _confirm(before: Graph, after: Graph, pairs: list[_Pair], checks: list[ValueCheck], xs, ref, got) -> None:
    """Judge the failed checks again, in order, until one is confirmed: against the float64 truth,
    then locally (``_inherited``).

    The first is judged against the truth of just the value it compares (a pruned graph: cheap when it
    comes early); if that one is forgiven, the rest against one float64 run of the whole original.
    Checks after the first confirmed one are left as they are (the trial has failed already)."""
    failed = [i for i, c in enumerate(checks) if not c.ok]
    full = None
    for k, i in enumerate(failed):
        if k == 0:
            truth = _truth(before, [pairs[i].original], xs)
            truth = None if truth is None else truth[0]
        else:
            if full is None:
                full = _truth(before, [p.original for p in pairs], xs) or []
            truth = full[i] if full else None
        if truth is not None:
            checks[i] = _judge(pairs[i], ref[i], got[i], truth)
        if not checks[i].ok and _inherited(before, after, pairs, i, xs, ref[i]):
            checks[i].ok, checks[i].inherited = True, True
        if not checks[i].ok:
            return


def _inherited(before: Graph, after: Graph, pairs: list[_Pair], i: int, xs, reference: torch.Tensor) -> bool:
    """Whether the difference at ``pairs[i]`` comes from upstream, not from a rewrite here: the nodes
    of ``after`` that compute the value from the nearest values the original also has (same name, or
    a replacement standing for one), run on the original's values of those, reproduce the original's
    value within tolerance. Rounding differences of sound rewrites compound through deep chaotic
    layers (softmax over awkward inputs); a rewrite that is wrong for the values that actually reach
    it (relu for relu6 on x10 inputs) differs right where it fired."""
    b_values = _values_by_name(before)
    stands_for = {p.value: p.original for p in pairs}
    g = after.clone()
    named = _values_by_name(g)
    target = named[pairs[i].value]
    frontier: dict[str, object] = {}
    stack, seen = [target], set()
    while stack:
        v = stack.pop()
        node = v.producer
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        for u in node.inputs:
            if u is None or u.data is not None:
                continue
            if u.name in stands_for or (u.name in b_values and u is not target):
                frontier[u.name] = u
            elif u.producer is not None:
                stack.append(u)
    if not seen:
        return False
    originals = [stands_for.get(name, name) for name in frontier]
    try:
        _, known = run_observed(before, xs, [b_values[o] for o in originals])
    except (GaweeError, KeyError):
        return False
    feed = []
    for (name, v), o in zip(frontier.items(), originals):
        x = g.add_input(v.type, f"{name}.local")
        g.replace_all_uses_with(v, x)
        feed.append(known[b_values[o]])
    g.set_outputs([target])
    for node in reversed(g.nodes):
        if all(v.num_uses == 0 for v in node.outputs):
            g.erase_node(node)
    try:
        (local,) = run(g, *xs, *feed)
    except GaweeError:
        return False
    return _judge(pairs[i], reference, local, None).ok


def _prune(graph: Graph, names: Sequence[str]) -> Graph:
    """A copy of ``graph`` returning just the named values, without the nodes they do not need."""
    g = graph.clone()
    named = _values_by_name(g)
    g.set_outputs([named[n] for n in names])
    for node in reversed(g.nodes):
        if all(v.num_uses == 0 for v in node.outputs):
            g.erase_node(node)
    return g


def _truth(graph: Graph, names: Sequence[str], xs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The named values of ``graph`` computed in float64, or None if an op refuses float64."""
    g = upcast(_prune(graph, names))
    if g is None:
        return None
    try:
        return list(run(g, *[x.double() if x.is_floating_point() else x for x in xs]))
    except GaweeError:
        return None


def _blame_failed_node(e: GaweeError, trace: Sequence, dist: str) -> Blame | None:
    """The rewritten graph failed at a node: blame the rule written on it (its ``source``)."""
    where = getattr(e, "where", None) or ""
    for i, f in enumerate(trace):
        if where == f"{f.rule} ({f.location})":
            return Blame(f.rule, f.location, i, f.root, dist, "", "", "failed node", (f.rule,))
    return None


def _localize(before, after, trace, rules, trial: Trial, xs, ref, pairs, b_values) -> Blame | None:
    """Blame a rule for the trial's first diverging value: the one rule that made it and the nodes
    between it and the values that agree, else the first of those firings found by replay."""
    d = trial.first_divergence
    made_by = {}
    for i, f in enumerate(trace):
        for c in f.created:
            made_by[c.rpartition(":")[0]] = i
    # the cone: nodes of `after` that compute d.value from values compared (and agreeing), inputs and constants
    compared = {p.value for p in pairs}
    a_values = _values_by_name(after)
    firings = set(d.firings)
    stack, seen = [a_values[d.value]], set()
    while stack:
        v = stack.pop()
        node = getattr(v, "producer", None)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.name in made_by:
            firings.add(made_by[node.name])
        for u in node.inputs:
            if u is not None and u.producer is not None and u.name not in compared and u.name not in b_values:
                stack.append(u)
    if not firings:
        return None
    order = sorted(firings)
    candidates = tuple(dict.fromkeys(trace[i].rule for i in order))
    blamed, method = order[-1], "provenance"
    if len(candidates) > 1:
        if rules is None:
            method = "ambiguous"
        else:
            blamed, method = _replay(before, trace, rules, order, d.original, xs, ref, pairs, b_values), "replay"
    f = trace[blamed]
    return Blame(f.rule, f.location, blamed, f.root, trial.distribution, d.value, d.original, method, candidates)


def _replay(before, trace, rules, order: list[int], original: str, xs, ref, pairs, b_values) -> int:
    """The first firing in ``order`` after which the value standing for ``original`` differs from it,
    by replaying the (deterministic) rewrite up to each candidate firing: a binary search, assuming
    that once the value differs, later rewrites do not repair it. The last candidate if none does."""
    from gawee.rewrite.driver import provenance, rewrite

    n = len(before.outputs)
    index = next(i for i, p in enumerate(pairs) if p.original == original)
    reference = ref[n + index]
    pair = pairs[index]

    def differs(k: int) -> bool:
        partial, report = rewrite(before, rules, trace=True, max_firings=k + 1)
        if len(report.trace) != k + 1 or report.trace[k].root != trace[k].root:
            return False  # the replay took another path: no evidence
        links = provenance(report.trace, set(b_values))
        named = _values_by_name(partial)
        now = [name for name, src in links.items() if original in src and name in named]
        name = now[-1] if now else original if original in named else None
        if name is None:
            return False
        (got,) = run(_prune(partial, [name]), *xs)
        check = _judge(pair, reference, got, None)
        if not check.ok:
            truth = _truth(before, [original], xs)
            check = _judge(pair, reference, got, None if truth is None else truth[0])
        return not check.ok

    lo, hi = 0, len(order) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if differs(order[mid]):
            hi = mid
        else:
            lo = mid + 1
    return order[lo]
