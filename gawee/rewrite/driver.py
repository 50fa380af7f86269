"""The worklist rewriter (no e-graph): rules applied to a fixpoint, in the spirit of MLIR's greedy driver.

Per phase: seed every node (but those no rule of the phase is ever tried at, unless dead); pop one; try
the rules indexed by its op (priority, then file order); the first rule whose pattern matches and whose
guard holds builds its replacement, which must have the root's exact shape and dtype; all uses are
replaced; the new nodes, the users of the new value and the producers that lost a use are re-queued;
dead nodes are erased at once. A rewrite budget proportional to the graph turns a non-terminating rule
set into an error naming the rules that keep firing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

try:
    import cython
except ImportError:  # Cython is optional (the accel extra): the declarations below then do nothing
    from gawee import cython_shim as cython

from gawee.dsl.codegen import match_functions
from gawee.dsl.compiler import Rule
from gawee.dsl.library import NODE_CHECKS, GuardFailed
from gawee.dsl.matcher import MatchContext, OpM
from gawee.errors import RewriteError
from gawee.ir.core import Graph, Node, Value
from gawee.ops import get_op
from gawee.rewrite.calibration import Calibration, calibrate, reads_calibration
from gawee.rewrite.context import RewriteContext
from gawee.rewrite.instances import Instance, extract, instance_key
from gawee.rewrite.ruleset import Phase, RuleSet, default_rules
from gawee.threads import torch_threads

BUDGET_PER_NODE = 16
"""Firings allowed per node of the graph (per phase) before the rule set is declared cyclic."""

_TOKENS = itertools.count(1)
"""The marks rewriters put on the nodes their worklists hold (``Rewriter._token``), one per rewriter."""


@dataclass(frozen=True)
class Firing:
    """One application of a rule, for the trace."""

    rule: str
    location: str
    root: str
    """The node the pattern was rooted at (its output was replaced)."""
    matched: tuple[str, ...]
    """Every node the pattern matched, root first."""
    created: tuple[str, ...]
    replaced_by: str
    phase: str
    replaces: tuple[str, ...] = ()
    """The root's output values this firing replaced (their names), in order."""
    results: tuple[str, ...] = ()
    """The values that replaced them, in the same order: ``results[i]`` now stands for ``replaces[i]``
    (see :func:`provenance`)."""
    bound: str = ""
    """The declared error bound of an approximate rule (its `within` text, `gawee-rewrite check` holds the rule to
    it); "" for an exact rule."""
    instance: Instance | None = field(default=None, repr=False, compare=False)
    """The matched and built nodes cut out as one graph (:mod:`gawee.rewrite.instances`) when tracing: for one
    firing of each rule per operand dtypes and ranks, the one on the fewest elements (None for the others, and
    for ``fold`` and ``cse``, whose results are the matched computation itself)."""

    def as_dict(self) -> dict:
        """The firing as plain data (without its instance)."""
        return {k: v for k, v in self.__dict__.items() if k != "instance"}

    def __str__(self) -> str:
        created = ", ".join(self.created) or "-"
        within = f" within {self.bound}" if self.bound else ""
        return (
            f"{self.rule} ({self.location}): {' + '.join(self.matched)} -> %{self.replaced_by} [new: {created}]{within}"
        )


@dataclass
class RewriteReport:
    firings: Counter = field(default_factory=Counter)
    """Rule name → times fired."""
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    trace: list[Firing] = field(default_factory=list)
    """Every firing, in order (when tracing)."""
    erased: int = 0
    """Dead nodes removed."""
    calibrated: int = 0
    """Values calibration annotated (``rewrite(..., calibration=...)``) before the phases that read them."""

    @property
    def total(self) -> int:
        return sum(self.firings.values())


class Rewriter:
    """Applies one RuleSet to one graph, in place. Use :func:`rewrite` for the non-mutating API."""

    def __init__(
        self,
        graph: Graph,
        rules: RuleSet,
        *,
        trace: bool = False,
        check: bool = False,
        budget_per_node: int = BUDGET_PER_NODE,
        max_firings: int | None = None,
        calibration: Calibration | None = None,
    ):
        self.graph = graph
        self.calibration = calibration
        """Batches on which the values a phase's rules read through ``calibrated`` are measured as it starts."""
        self.rules = rules
        self.report = RewriteReport(nodes_before=len(graph))
        self.trace = trace
        self.check = check
        self.budget_per_node = budget_per_node
        self.max_firings = max_firings
        """Stop after this many firings (replaying a prefix of a deterministic rewrite), or None."""
        self._queue: deque[Node] = deque()
        self._token = next(_TOKENS)
        """What this rewriter marks the nodes its worklist holds with (``Node._queued_in``): a number no other
        rewriter in this process uses, so a mark left by one that stopped early (or raised) means nothing here."""
        self.device = graph.device
        """Where the graph's constants live: folded constants are made there (``RewriteContext.device``)."""
        self._instances: dict[tuple, tuple[int, int, Instance]] = {}
        """Instance key -> (elements read, trace index, instance) of the smallest firing of that key so far."""

    # -- worklist ------------------------------------------------------------------------
    @cython.locals(node=Node)
    def _push(self, node: Node | None) -> None:
        if node is not None and node.graph is self.graph and node._queued_in != self._token:
            node._queued_in = self._token
            self._queue.append(node)

    def run(self) -> RewriteReport:
        t0 = time.perf_counter()
        for phase in self.rules.phases:
            if self._stopped():
                break
            self._run_phase(phase)
        for _, index, instance in self._instances.values():
            self.report.trace[index] = dataclasses.replace(self.report.trace[index], instance=instance)
        self.report.nodes_after = len(self.graph)
        self.report.seconds = time.perf_counter() - t0
        return self.report

    @cython.locals(node=Node)
    def _run_phase(self, phase: Phase) -> None:
        if self.calibration is not None and reads_calibration(phase.rules):
            self.report.calibrated += calibrate(self.graph, self.calibration)
        idle = phase.idle
        for node in self.graph:  # a node no rule is tried at is visited only to be erased, when dead
            if not idle(node.op) or _dead(node):
                self._push(node)
        graph, queue = self.graph, self._queue
        budget = self.budget_per_node * (len(graph) + 8)
        fired = 0
        recent: deque[str] = deque(maxlen=64)
        limited = self.max_firings is not None
        while queue:
            node = queue.popleft()
            node._queued_in = 0
            if node.graph is not graph:
                continue
            if _dead(node):
                self._erase_dead(node)
                continue
            if idle(node.op):
                continue
            rule = self._visit(phase, node)
            if rule is not None:
                fired += 1
                recent.append(rule.name)
                if fired > budget:
                    raise _cycle_error(recent, self.rules, fired)
            if limited and self._stopped():
                queue.clear()  # the marks left on its nodes are this rewriter's, which is done
                return

    @cython.locals(node=Node, at=Node)
    def _visit(self, phase: Phase, node: Node) -> Rule | None:
        """Try the rules :meth:`_ordered` gives for ``node``, in order, until one fires; the rule that fired, or
        None. Without rules above the node (the common case), its own candidates are tried at it directly."""
        ranked = self._ordered(phase, node)
        if ranked is None:
            for rule in phase.candidates(node.op):
                if self._try(rule, node, phase.name):
                    return rule
            return None
        for rule, at in ranked:
            if self._try(rule, at, phase.name):
                return rule
        return None

    @cython.locals(node=Node, v=Value, u=Node, users=dict)
    def _ordered(self, phase: Phase, node: Node) -> list[tuple[Rule, Node]] | None:
        """The rules to try when ``node`` is visited, in order, each with the node it is tried at: its own
        candidates by priority, and before any of them, the rules of higher priority rooted at its users, tried at
        those users. So a larger pattern given a higher priority (add(matmul(x, w), b) -> linear) wins over a
        smaller one (matmul(x, w) -> linear) that would otherwise consume its inside first. None where no user
        has such a rule: the node's own candidates alone, at the node (``phase.candidates``)."""
        above = phase.enclosing_ops(node.op)
        if not above:
            return None
        users: dict[int, Node] = {}
        for v in node.outputs:
            for use in v._uses:
                u = use.node
                if u.op in above and id(u) not in users:
                    users[id(u)] = u
        if not users:
            return None
        own = phase.candidates(node.op)
        lowest = phase.lowest(node.op)
        above = [
            (rule, user)
            for user in sorted(users.values(), key=self.graph.position)
            for rule in phase.enclosing(user.op, lowest)
        ]
        ranked = [(rule, node, 0) for rule in own] + [(rule, user, 1) for rule, user in above]
        ranked.sort(key=lambda t: (-t[0].priority, t[2], t[0].index))
        return [(rule, at) for rule, at, _ in ranked]

    def _stopped(self) -> bool:
        return self.max_firings is not None and self.report.total >= self.max_firings

    # -- one rule on one node ------------------------------------------------------------
    @cython.locals(node=Node)
    def _try(self, rule: Rule, node: Node, phase: str, use_guard: bool = True) -> bool:
        if len(node.outputs) != 1 and rule.whole_node is None and rule.root_output is None:
            return False
        if use_guard:
            for name in rule.root_checks:  # conjuncts of the guard on the root itself: asked before matching
                if not NODE_CHECKS[name](node):
                    return False
        mctx = MatchContext()
        env: dict = {}
        fns, v = first_root(rule, node)
        if v is None:
            return False
        # match_roots' loops without its generator (and loops, not any(...): a C method holds no generator expression)
        for _ in fns[0](v, env, mctx):
            if len(fns) == 1:  # one root: the rule's matcher, iterated here
                if self._fire(rule, [node], env, mctx, phase, use_guard):
                    return True
                continue
            for roots in _later_roots(rule, fns, 0, [node], env, mctx):
                if self._fire(rule, roots, env, mctx, phase, use_guard):
                    return True
        return False

    def _fire(self, rule: Rule, roots: list[Node], env: dict, mctx: MatchContext, phase: str, use_guard: bool) -> bool:
        """One match of ``rule`` at ``roots`` (``env`` bound): its guard, then its replacement, applied; False where
        the guard does not hold or the replacement is abandoned (the next match is tried)."""
        rctx = RewriteContext(self.graph, rule, roots, env, self.device)
        if use_guard and rule.guard is not None:
            try:
                if not rule.guard(rctx):
                    return False
            except GuardFailed:
                return False
        try:
            result = self._build(rule, rctx)
        except GuardFailed:
            rctx.rollback()
            return False
        if result is None:
            rctx.rollback()
            return False
        self._apply(rule, roots, rctx, result, list(mctx.nodes), phase)
        return True

    def _build(self, rule: Rule, rctx: RewriteContext) -> list[Value] | None:
        """The replacement values for the roots' outputs (in order), or None if it would change nothing."""
        if rule.whole_node is not None:
            var = rule.matcher.bind
            target = rctx.env[var].producer
            if rule.whole_node == "fold":
                results = rctx.fold_node(target)
            else:
                dup = rctx.find_duplicate(rctx.env[var])
                if dup is None:
                    return None
                results = list(dup.producer.outputs)
        else:
            results = [rule.build(rctx)] + [build(rctx) for build in rule.extra_builds]
        old_values = replaced_values(rule, rctx.roots)
        for old, new in zip(old_values, results):
            if new is None or not isinstance(new, Value):
                raise rctx.error(f"the replacement is {'absent' if new is None else repr(new)}, not a tensor")
            if not new.type.same_shape_dtype(old.type):
                raise rctx.error(
                    f"the replacement is {new.type} but %{old.name} is {old.type}",
                    hint="a rule must keep the exact shape and dtype; tighten its guard",
                )
        made, same = {id(n) for n in rctx.new_nodes}, {}
        if all(_rebuilds(new, old, made, same) for old, new in zip(old_values, results)):
            return None  # `relu(x) => relu(x)`: firing it would change nothing, forever
        return [rctx.name_result(v) for v in results]

    @cython.locals(n=Node, v=Value)
    def _apply(
        self, rule: Rule, roots: list[Node], rctx: RewriteContext, results: list[Value], matched: list[Node], phase: str
    ) -> None:
        graph = self.graph
        replaced_by = results[0].name
        old_values = replaced_values(rule, roots)
        if self.trace:
            self._instance(rule, rctx, matched, old_values, results)
        for old, new in zip(old_values, results):
            for user in graph.replace_all_uses_with(old, new):
                self._push(user)
        for n in rctx.new_nodes:
            self._push(n)
        for v in results:
            if v.producer is not None:
                self._push(v.producer)
        if self.trace:
            self.report.trace.append(
                Firing(
                    rule.name,
                    rule.location,
                    roots[0].name,
                    tuple(f"{n.name}:{n.op}" for n in matched),
                    tuple(f"{n.name}:{n.op}" for n in rctx.new_nodes if n.graph is graph),
                    replaced_by,
                    phase,
                    tuple(v.name for v in old_values),
                    tuple(v.name for v in results),
                    rule.bound_text,
                )
            )
        self.report.firings[rule.name] += 1
        for n in matched:
            if n.graph is graph and _dead(n):
                self._erase_dead(n)
        if self.check:
            from gawee.ir.verify import verify

            verify(graph)

    def _instance(
        self, rule: Rule, rctx: RewriteContext, matched: list[Node], old_values: list[Value], results: list[Value]
    ) -> None:
        """Cut the firing about to be traced out as a graph (before its uses move) when it is the smallest of its
        key so far (:func:`gawee.rewrite.instances.instance_key`); :meth:`run` hands the kept ones to the trace."""
        if rule.whole_node is not None:
            return
        created = [n for n in rctx.new_nodes if n.graph is self.graph]
        key, size = instance_key(rule.name, [*matched, *created])
        kept = self._instances.get(key)
        if kept is not None and kept[0] <= size:
            return
        assumed = [(rctx.env[a.var], a.fact) for a in rule.assumptions if isinstance(rctx.env.get(a.var), Value)]
        instance = extract(f"{rule.name}@{rctx.root.name}", matched, created, old_values, results, assumed)
        self._instances[key] = (size, len(self.report.trace), instance)

    @cython.locals(node=Node, n=Node, p=Node)
    def _erase_dead(self, node: Node) -> None:
        """Erase a dead node, then any producer it leaves dead; re-queue producers that lost a use."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.graph is not self.graph or not _dead(n):
                continue
            producers = [v.producer for v in n.inputs if v is not None and v.producer is not None]
            self.graph.erase_node(n)
            self.report.erased += 1
            for p in producers:
                if _dead(p):
                    stack.append(p)
                else:
                    self._push(p)


def fire(graph: Graph, rule: Rule, node: Node, *, use_guard: bool = True) -> bool:
    """Apply ``rule`` once, rooted at ``node`` of ``graph`` (in place); True if it fired.

    ``use_guard=False`` builds the replacement even where the guard is false (the
    soundness harness uses this to find out whether a guard is needed).
    """
    rewriter = Rewriter(graph, RuleSet([Phase(rule.phase, [rule])]))
    return rewriter._try(rule, node, rule.phase, use_guard=use_guard)


def match_roots(
    rule: Rule, node: Node, env: dict, mctx: MatchContext, *, interpreted: bool = False
) -> Iterator[list[Node]]:
    """Every match of ``rule`` with its first root at ``node``: yields the root nodes, in pattern order,
    with ``env`` bound (valid until the next item). A rule with several roots finds each later root among
    the users of the values bound so far (roots share operands), in graph order, distinct from every node
    matched already. The rule's generated matchers (gawee.dsl.codegen) do the matching; ``interpreted``
    (or a rule with no generated code) walks its pattern tree instead, as ``explain`` does."""
    fns, v = first_root(rule, node, interpreted)
    if v is None:
        return
    if len(fns) == 1:  # one root, no later roots to look for (read from its matchers: a rule not compiled yet stays so)
        for _ in fns[0](v, env, mctx):
            yield [node]
        return
    for _ in fns[0](v, env, mctx):
        yield from _later_roots(rule, fns, 0, [node], env, mctx)


def first_root(rule: Rule, node: Node, interpreted: bool = False) -> tuple[list, Value | None]:
    """The rule's matchers, one per root (its generated ones, or with ``interpreted`` or no generated code, its
    pattern trees walked), and the value its first is matched against at ``node`` (None: it cannot match there)."""
    fns = [] if interpreted else match_functions(rule)
    if not fns:  # no generated code for this rule: its pattern is interpreted
        fns = [lambda v, env, ctx, m=m: m.match(v, env, ctx, 0) for m in (rule.matcher, *rule.extra_roots)]
    return fns, node.outputs[0] if rule.whole_node is not None else output_value(rule.root_output, node)


def _later_roots(
    rule: Rule, fns: list, k: int, roots: list[Node], env: dict, mctx: MatchContext
) -> Iterator[list[Node]]:
    """:func:`match_roots`' matches of the roots after the first ``k + 1`` (``roots``), each among the users of the
    values bound so far. A function of its own, not a closure that calls itself: such a closure is a reference
    cycle, left for the garbage collector on every attempt (the collector's passes then grow with the graph)."""
    if k == len(rule.extra_roots):
        yield roots
        return
    m = rule.extra_roots[k]
    taken = {id(n) for n in mctx.nodes} | {id(n) for n in roots}
    candidates = {
        id(user): user
        for v in env.values()
        if isinstance(v, Value)
        for user in v.users()
        if id(user) not in taken and (m.op is None or user.op == m.op)
    }
    graph = roots[0].graph
    for user in sorted(candidates.values(), key=graph.position):
        v = root_value(m, user)
        if v is not None:
            for _ in fns[k + 1](v, env, mctx):
                yield from _later_roots(rule, fns, k + 1, [*roots, user], env, mctx)


def root_value(m: OpM, node: Node) -> Value | None:
    """The value a root matcher is matched against at ``node``: its only output, or output ``m.output`` for a
    root like `split(x, ...)[1]`; None where ``node`` has no such output, or where that output has no use (the
    node lives on for its other outputs: replacing this one would change nothing)."""
    return output_value(m.output, node)


@cython.locals(node=Node, v=Value)
def output_value(output: int | None, node: Node) -> Value | None:
    """:func:`root_value` for a root matcher whose ``output`` is given (a rule's ``root_output``): read without
    the matcher, which a rule loaded from a checked file compiles only once its generated matcher matches."""
    n = len(node.outputs)
    if output is None:
        return node.outputs[0] if n == 1 else None
    v = node.outputs[output] if -n <= output < n else None
    return v if v is not None and v.num_uses else None


def replaced_values(rule: Rule, roots: list[Node]) -> list[Value]:
    """The values a firing of ``rule`` at ``roots`` replaces, in the order of its results: each root's outputs,
    or for a root like `split(x, ...)[1]` that one output (the node's other outputs keep their uses)."""
    out: list[Value] = []
    for m, root in zip([rule.matcher, *rule.extra_roots], roots):
        out += list(root.outputs) if m.output is None else [root.outputs[m.output]]
    return out


def _rebuilds(new: Value, old: Value, made: set[int], same: dict[tuple[int, int], bool]) -> bool:
    """Whether ``new`` computes ``old`` the same way: it is ``old``, a constant equal to the constant ``old``
    (type and elements), or the same output of a node made by this firing (``made``: node ids) with ``old``'s
    producer's op, attributes and number of outputs, whose operands rebuild that producer's operands in turn. A
    replacement that only rebuilds what it matched changes nothing, and the rule would match it again and again.
    ``same`` memoizes pairs (a replacement is a DAG)."""
    if new is old:
        return True
    key = (id(new), id(old))
    if key in same:
        return same[key]
    p, q = new.producer, old.producer
    if p is None:
        a, b = new.data, old.data
        found = (
            q is None
            and a is not None
            and b is not None
            and not (a.is_meta or b.is_meta)
            and new.type == old.type
            and torch.equal(a, b)
        )
    else:
        found = (
            q is not None
            and id(p) in made
            and p.op == q.op
            and new.output_index == old.output_index
            and len(p.outputs) == len(q.outputs)
            and len(p.inputs) == len(q.inputs)
            and p.attrs == q.attrs
            and any(
                all(a is b or (a is not None and b is not None and _rebuilds(a, b, made, same)) for a, b in pairs)
                for pairs in _operand_pairings(p, q)
            )
        )
    same[key] = found
    return found


def _operand_pairings(p: Node, q: Node) -> Iterator[list[tuple[Value | None, Value | None]]]:
    """How the operands of ``p`` may stand for those of ``q``: in order, and for a binary commutative op also
    swapped (the matcher takes either order, so `add(x, y) => add(y, x)` would swap forever)."""
    yield list(zip(p.inputs, q.inputs))
    if len(p.inputs) == 2 and get_op(p.op).has_trait("commutative"):
        yield list(zip(p.inputs, reversed(q.inputs)))


@cython.locals(node=Node, v=Value)
def _dead(node: Node) -> bool:
    """Whether ``node`` has outputs and nothing reads any of them (no operand, no graph output): asked of every
    node the worklist visits, so it reads the use lists directly."""
    outputs = node.outputs
    if not outputs:
        return False
    for v in outputs:  # noqa: SIM110 (a loop: no generator made per visit)
        if v._uses or v._output_refs:
            return False
    return True


def _cycle_error(recent, rules: RuleSet, fired: int) -> RewriteError:
    counts = Counter(recent)
    names = [n for n, _ in counts.most_common()]
    located = ", ".join(f"{n} ({rules.rule(n).location})" for n in names)
    return RewriteError(
        f"the rules keep firing without reaching a fixpoint ({fired} rewrites): {located}",
        hint="these rules undo each other or grow the graph; make one of them one-directional (a guard) or drop it",
    )


def provenance(trace: list[Firing], original: set[str]) -> dict[str, dict[str, tuple[int, ...]]]:
    """Which values of the original graph each rewritten value stands for, from a trace.

    A firing replaces its root's outputs (``Firing.replaces``) with ``Firing.results``: from then
    on each result computes what the replaced value computed. Chained through the trace, a value
    named ``v`` stands for ``{o: firings}``: ``o`` is a value of the original graph (named in
    ``original``), ``firings`` the indices into ``trace`` of the replacements that led from ``o``
    to ``v``, in order. Values the rewriter never replaced stand for themselves (not listed).
    Names are never reused within one rewrite, so a name identifies one value.
    """
    links: dict[str, dict[str, tuple[int, ...]]] = {}
    for i, f in enumerate(trace):
        for old, new in zip(f.replaces, f.results):
            if old == new:
                continue
            sources = dict(links.get(old, {}))
            if old in original:
                sources.setdefault(old, ())
            into = links.setdefault(new, {})
            for o, chain in sources.items():
                into.setdefault(o, (*chain, i))
    return links


def rewrite(
    graph: Graph,
    rules: RuleSet | None = None,
    *,
    trace: bool = False,
    check: bool = False,
    max_firings: int | None = None,
    calibration: Calibration | None = None,
) -> tuple[Graph, RewriteReport]:
    """Apply ``rules`` (default: the bundled pipeline) to a copy of ``graph``.

    Returns the rewritten graph and a report (firings per rule, node counts, time,
    and with ``trace`` every firing). The input graph is never modified. ``check``
    runs the IR verifier after every firing (slow; for debugging rules). ``max_firings`` stops
    after that many firings: the rewriter is deterministic, so this replays a prefix of the full
    rewrite (verification uses it to find the firing after which a value first differs).
    ``calibration`` (:class:`gawee.rewrite.calibration.Calibration`): before each phase whose rules match a
    ``calibrated`` node, the ranges the values they would read take on its batches are measured and put into
    the graph (:func:`gawee.rewrite.calibration.calibrate`); without it such rules find nothing to read.
    """
    rules = default_rules() if rules is None else rules
    with torch_threads(1), _collector_off():
        work = graph.clone()
        report = Rewriter(work, rules, trace=trace, check=check, max_firings=max_firings, calibration=calibration).run()
    return work, report


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """The cyclic garbage collector off while a rewrite copies the graph and rewrites the copy, and what exists
    after moved to its oldest generation unscanned (``gc.freeze`` then ``gc.unfreeze``: two list splices).

    A rewrite frees what it drops by reference counting: the bundled rules leave no cyclic garbage
    (tests/rewrite/test_gc_freeze.py), so a collection during a rewrite finds nothing, and walks every object the
    rewrite made so far — on a graph of 100k nodes one young collection walked the copy's and the phases' objects
    for a few hundredths of the rewrite. Moved to the oldest generation, the copy and its rewritten nodes are not
    walked by the caller's next young collection either. CPython does not count objects moved there this way
    towards its next full collection, so :func:`_moved_to_oldest` does: the graphs a caller drops (cyclic, like
    every graph of nodes and values) are collected, not kept. Left as it is when the collector is
    already off; a caller that froze objects itself keeps them frozen (what the rewrite made then stays where it
    is: unfreezing would undo that freeze)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            moved = gc.get_count()[0]  # tracked objects made since the last collection, net: the rewrite's, mostly
            gc.freeze()
            gc.unfreeze()
            _moved_to_oldest(moved)
        gc.enable()


class _Oldest:
    """The objects rewrites moved into the oldest generation since its last full collection, and how many that
    collection left when it was one of :func:`_moved_to_oldest`'s (None: not known)."""

    moved = 0
    survivors: int | None = None
    full_collections = -1


FULL_COLLECTION_FLOOR = 100_000
"""Objects moved into the oldest generation below which no full collection is run (a rewrite moves about five per
node of its graph)."""

FULL_COLLECTION_UNKNOWN = 1_000_000
"""Objects moved before a full collection while the size of what the last one left is not known (counting the
objects alive is itself a walk of them all: done only after a collection, which walks them anyway)."""


def _moved_to_oldest(n: int) -> None:
    """Count ``n`` objects moved into the oldest generation unscanned, and collect that generation once they
    outnumber what its last full collection left: the graphs a loop drops at most double the heap, and each
    collection's walk is paid for by as many new objects. (CPython's own trigger is a quarter; with torch imported
    the heap holds hundreds of thousands of objects, and walking them that often would cost a loop of large
    rewrites as much again as the rewriting.) Any full collection since the last count (the caller's, or CPython's
    own) walked them already."""
    full = gc.get_stats()[-1]["collections"]
    if full != _Oldest.full_collections:
        _Oldest.full_collections, _Oldest.moved, _Oldest.survivors = full, 0, None
    _Oldest.moved += n
    known = _Oldest.survivors
    if _Oldest.moved > (FULL_COLLECTION_UNKNOWN if known is None else max(FULL_COLLECTION_FLOOR, known)):
        gc.collect()
        _Oldest.full_collections, _Oldest.moved = gc.get_stats()[-1]["collections"], 0
        _Oldest.survivors = len(gc.get_objects())
