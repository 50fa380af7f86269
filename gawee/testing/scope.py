"""Small-scope exhaustive enumeration: every instance of a rule up to a bound, found every time.

The generator (gawee.testing.generate) builds an instance from a sequence of choices: the dtype,
each op's operand ranks and sizes, attribute values, absent operands, the ops of a `_(...)`. Here
those choices are enumerated instead of drawn, as a bounded model checker enumerates the states of
a program: the choices form a tree, each walk from the root builds one instance (or is pruned), and
the enumeration ends when every leaf of the tree has been visited. The op samplers' own validity
checks and shape inference prune a subtree as soon as a prefix of choices leaves no valid op, and
the guard's conjuncts over shapes, ranks and attributes are evaluated as soon as the names they read
are built (a prefix that makes `x.rank == 4` false is never extended). Data choices (leaf styles,
constant seeds, float attributes) are not enumerated: they come from a generator seeded per walk.

The bound is a ladder of levels (LEVELS): level k admits ranks up to ``rank`` and sizes, attribute
integers and dim indices up to ``size`` (plus the sizes and ranks the guard names, `x.shape[1] >= 5`
adds 5 and 6), every dtype in DTYPES (or those the guard asks for). Levels are enumerated in order; an
instance seen at a lower level is not enumerated again. Each level may take what is left of the budget
but RESERVE instances for each level after it (a level that needs less leaves the rest to the next); a
level of at most COMPLETE instances is enumerated whole even past its share (while the levels below it
were whole too): the small levels complete, which is what a *proven* verdict needs. Within a level
the tree is walked in a pseudo-random order without replacement (each walk picks among the options whose
subtrees still hold unvisited leaves, the first and last ones likelier: boundary values), so an
enumeration cut short by the instance budget is a spread-out sample of that level, not the corner of it
a depth-first walk would reach. The enumeration depends on the rule alone, never on the harness's seed:
a counterexample within the bound is found on every seed. ``Enumeration.covered`` is the highest level
visited completely; ``truncated`` says whether the budget cut a level short.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gawee.dsl import ast as A
from gawee.dsl.compiler import Rule
from gawee.errors import GaweeError
from gawee.ir.types import DType
from gawee.ops import sampling as S
from gawee.testing.generate import Example, Generator, Hints, hints_of


@dataclass(frozen=True)
class Bound:
    """One level of the scope: ranks up to ``rank``; sizes, attribute integers and dims up to ``size``."""

    rank: int
    size: int

    def __str__(self) -> str:
        return f"rank <= {self.rank}, dims <= {self.size}"


LEVELS = (Bound(1, 1), Bound(2, 2), Bound(4, 3))
"""The ladder of bounds, smallest first; the last is the small scope (ranks 0-4, dims 0-3)."""

DTYPES = (DType.f32, DType.f16, DType.bf16, DType.f64, DType.i32, DType.i64, DType.i8, DType.u8)
"""The example dtypes enumerated (free operands take it; an op that refuses it prunes the walk)."""

BUDGET = 80
"""Instances enumerated per rule at most (a guard-true, runnable instance counts; pruned walks do not)."""

RESERVE = 16
"""Instances of the budget kept for each level above the one being enumerated: a level may take all the
rest (so that the first levels complete, and the solver can prove the rule within them), but a level too
big for the budget does not starve the larger sizes of the next ones (where a window first fits, a sum
first overflows)."""

WORK = 12
"""Walks per instance of the budget at most (pruned walks included): the enumeration of a rule whose
tree is mostly invalid still ends."""

COMPLETE = 600
"""A level with at most this many distinct instances is enumerated whole, beyond the budget: a level that
completes is what a *proven* verdict needs, and the budget's share of a level (80 instances less the reserve)
cuts off levels only a few times larger (a `slice` rule's smallest level has 48 valid instances among
2,600 walks, a reshape chain's 552). The instances past the share are built first and checked only once
the level is known to complete, so a level too large costs its walks, not its checks."""

PROBE_WALKS = 5000
"""Walks a level may take to find out whether it completes within COMPLETE instances (pruned walks included)."""


EDGE_WEIGHT = 3
"""How much likelier a walk takes the first or last option of a choice than one in between: when the budget
cuts a level short, its sample leans to the boundary values (largest padding and dilation, smallest input)."""


@dataclass(frozen=True)
class Instance:
    """One enumerated instance: how to build it again (``path``), at which level it was found."""

    path: tuple[int, ...]
    level: int
    data_seed: int
    example: Example


@dataclass
class Enumeration:
    """What an enumeration of one rule covered (filled while it runs)."""

    instances: int = 0
    walks: int = 0
    covered: Bound | None = None
    """The highest level whose every instance was enumerated (None: not even the first)."""
    partial: Bound | None = None
    """The level the budget cut short (None: the enumeration ended at a complete level)."""
    partial_instances: int = 0
    """Instances enumerated at the partial level."""

    @property
    def truncated(self) -> bool:
        return self.partial is not None

    def describe(self) -> str:
        """The bound as a reader wants it: what was covered completely, what only in part."""
        done = f"complete to {self.covered}" if self.covered is not None else "no level complete"
        if self.partial is not None:
            done += f"; {self.partial_instances} instances of {self.partial} (budget reached)"
        return done


class _Node:
    """A choice point: ``n`` options (None until a walk reaches it), the subtrees walked, whether every
    leaf below it has been visited."""

    __slots__ = ("children", "done", "n")

    def __init__(self):
        self.n: int | None = None
        self.children: dict[int, _Node] = {}
        self.done = False


class _Walk:
    """One walk down the choice tree: replays ``prefix``, then picks unvisited options at random."""

    def __init__(self, root: _Node, rng: random.Random, prefix: Sequence[int] = ()):
        self.node = root
        self.stack: list[_Node] = [root]
        self.rng = rng
        self.prefix = list(prefix)
        self.path: list[int] = []

    def pick(self, n: int) -> int:
        if n <= 0:
            raise S.Reject("nothing to choose from")
        node = self.node
        if node.n != n:  # first visit (or the generator asked differently on the same path: a new point)
            node.n, node.children, node.done = n, {}, False
        k = len(self.path)
        if k < len(self.prefix):
            i = self.prefix[k]
        else:
            open_ = [i for i in range(n) if i not in node.children or not node.children[i].done]
            if not open_:
                i = self.rng.randrange(n)
            else:  # the ends of a range first (the largest padding, the smallest input: where windows misfit)
                weights = [EDGE_WEIGHT if j in (0, n - 1) else 1 for j in open_]
                i = self.rng.choices(open_, weights)[0]
        self.path.append(i)
        self.node = node.children.setdefault(i, _Node())
        self.stack.append(self.node)
        return i

    def finish(self) -> None:
        """Mark the leaf reached visited, and every ancestor whose options are all visited."""
        self.node.done = True
        for node in reversed(self.stack[:-1]):
            if len(node.children) == node.n and all(c.done for c in node.children.values()):
                node.done = True
            else:
                break


class RandomDraw:
    """A Draw from Python's ``random`` (data choices of an enumerated instance: styles, seeds, floats)."""

    def __init__(self, seed: int, dtype: DType):
        self._rng = random.Random(seed)
        self.dtype = dtype
        self.shapes: list[tuple[int, ...]] = []

    def integers(self, lo: int, hi: int) -> int:
        if hi < lo:
            raise S.Reject(f"no integer in [{lo}, {hi}]")
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        if not options:
            raise S.Reject("nothing to choose from")
        return options[self._rng.randrange(len(options))]

    def boolean(self, p: float = 0.5) -> bool:
        return self._rng.random() < p

    def floats(self, lo: float, hi: float) -> float:
        return self.choice([0.0, 1.0, lo, hi, (lo + hi) / 2, lo + (hi - lo) / 3])

    def size(self, lo: int, hi: int) -> int:
        return self.integers(lo, hi)

    def rank(self, lo: int, hi: int) -> int:
        return self.integers(lo, hi)


class ScopeDraw:
    """The Draw that enumerates: every integer, choice and boolean is a choice point of the tree, its
    options clipped to the bound; floats are data (from ``data``)."""

    def __init__(self, walk: _Walk, bound: Bound, dtype: DType, hints: Hints, data: RandomDraw):
        self._walk = walk
        self.bound = bound
        self.dtype = dtype
        self.shapes: list[tuple[int, ...]] = []
        self._data = data
        self._sizes = sorted(hints.sizes)
        self._ranks = sorted(hints.rank_values)

    def _among(self, options: Sequence[Any]) -> Any:
        return options[self._walk.pick(len(options))]

    def integers(self, lo: int, hi: int) -> int:
        if hi < lo:
            raise S.Reject(f"no integer in [{lo}, {hi}]")
        top = max(self.bound.size, self.bound.rank)
        return self._among(range(lo, min(hi, max(lo, top)) + 1))

    def choice(self, options: Sequence[Any]) -> Any:
        options = list(options)
        if not options:
            raise S.Reject("nothing to choose from")
        return self._among(options)

    def boolean(self, p: float = 0.5) -> bool:
        return self._among((False, True))

    def floats(self, lo: float, hi: float) -> float:
        return self._data.floats(lo, hi)

    def size(self, lo: int, hi: int) -> int:
        low = 0 if lo == 1 else lo
        options = list(range(low, max(low, min(hi, self.bound.size)) + 1))
        return self._among(options + [n for n in self._sizes if n > options[-1]])

    def rank(self, lo: int, hi: int) -> int:
        options = list(range(lo, max(lo, min(hi, self.bound.rank)) + 1))
        return self._among(options + [n for n in self._ranks if n > options[-1]])


def instance_key(ex: Example) -> str:
    """What tells two instances apart: the graph's text (ops, canonical attributes, types) and the types
    and layouts of its inputs and constants (not their data)."""
    leaves = [f"{v.name}:{v.type}:{v.type.layout.value}" for v in [*ex.graph.inputs, *ex.graph.constants()]]
    return f"{ex.dtype.value}|{ex.graph}|{' '.join(leaves)}"


def _dtypes(hints: Hints) -> list[DType]:
    wanted = [DType(d) for d in hints.dtypes if d in DType._value2member_map_]
    return wanted or list(DTYPES)


def build(rule: Rule, instance: Instance, value_class: str | None = None) -> Example:
    """``instance`` built again, its leaves filled from ``value_class`` (see gawee.testing.values) when
    given. Raises S.Reject if the rule's guard reads data the class does not give."""
    walk = _Walk(_Node(), random.Random(0), instance.path)
    return _generate(rule, hints_of(rule), walk, LEVELS[instance.level], instance.data_seed, value_class)


def _generate(rule: Rule, hints: Hints, walk: _Walk, bound: Bound, seed: int, value_class: str | None) -> Example:
    dtypes = _dtypes(hints)
    dtype = dtypes[walk.pick(len(dtypes))]
    data = RandomDraw(seed, dtype)
    draw = ScopeDraw(walk, bound, dtype, hints, data)
    gen = Generator(rule, draw, hints, data=data, value_class=value_class)
    gen.partial_guard = _partial_guard(rule)
    return gen.example()


def _partial_guard(rule: Rule) -> list[tuple[frozenset[str], Any]]:
    """The guard's conjuncts that read only shapes, ranks, dtypes and attributes, with the names each
    reads: the generator evaluates each as soon as those names are built (see Generator.prune)."""
    if rule.ast is None or rule.ast.guard is None:
        return []
    parts = A.chain_terms(rule.ast.guard, "and")
    if len(parts) != len(rule.guard_parts):
        return []
    out = []
    for expr, (_, fn) in zip(parts, rule.guard_parts):
        if _structural(expr):
            out.append((frozenset(_names(expr)), fn))
    return out


STRUCTURAL_CALLS = frozenset({"len", "rank", "numel", "broadcastable", "compose", "identity", "min", "max", "abs"})
"""Guard functions that read no data: a conjunct calling only these is decided by the structure alone."""


def _structural(e: Any) -> bool:
    if isinstance(e, A.ECall) and e.func not in STRUCTURAL_CALLS:
        return False
    if isinstance(e, A.EAttr) and e.name not in ("shape", "rank", "dtype", "numel", "layout"):
        return False
    for v in vars(e).values() if hasattr(e, "__dict__") else ():
        for x in v if isinstance(v, list) else (v,):
            if isinstance(x, A.Node) and not _structural(x):
                return False
    return True


def _names(e: Any) -> set[str]:
    out = {e.name} if isinstance(e, A.EName) else set()
    for v in vars(e).values() if hasattr(e, "__dict__") else ():
        for x in v if isinstance(v, list) else (v,):
            if isinstance(x, A.Node):
                out |= _names(x)
    return out


@dataclass
class Scope:
    """How far the enumeration goes: the levels of LEVELS up to ``levels``; ``budget`` instances, and each level
    with at most ``complete`` instances whole."""

    budget: int = BUDGET
    levels: int = len(LEVELS)
    complete: int = COMPLETE
    accept: Any = None
    """``accept(example) -> bool``: whether an instance counts (the harness: its guard holds and it runs);
    a walk whose instance is not accepted is pruned."""
    report: Enumeration = field(default_factory=Enumeration)


def enumerate_scope(rule: Rule, scope: Scope) -> Iterator[Instance]:
    """Every instance of ``rule`` within the scope's levels, smallest level first, distinct, until the
    budget; ``scope.report`` says what was covered. Deterministic: depends on the rule alone."""
    hints = hints_of(rule)
    rep = scope.report
    seen: set[str] = set()
    levels = LEVELS[: scope.levels]
    complete = True
    sampled = probed = 0  # walks within the shares, and past them: each numbers its walks' data seeds
    spent = 0  # instances taken within the shares (those of a whole level past its share are extra)
    for level, bound in enumerate(levels):
        share = scope.budget - spent - RESERVE * (len(levels) - level - 1)
        # a level is probed for completeness only while every lower one was complete: a larger one holds more
        probe = complete and scope.complete > 0
        walks = max(share * WORK, PROBE_WALKS if probe else 0)
        root = _Node()
        rng = random.Random(f"{rule.name}/{level}")
        found = leaves = 0
        pending: list[tuple[tuple[int, ...], int, Example]] = []
        """Instances past the share, built but not checked: checked only if the level turns out complete."""
        while not root.done:
            if walks <= 0 or (found >= share and (not probe or leaves > scope.complete)):
                break
            walks -= 1
            rep.walks += 1
            walk = _Walk(root, rng)
            if found < share:
                sampled += 1
                seed = zlib.crc32(f"{rule.name}/{level}/{sampled}".encode())
            else:
                probed += 1
                seed = zlib.crc32(f"{rule.name}/{level}/probe/{probed}".encode())
            try:
                ex = _generate(rule, hints, walk, bound, seed, None)
            except (S.Reject, GaweeError):
                walk.finish()
                continue
            walk.finish()
            key = instance_key(ex)
            if key in seen:
                continue
            seen.add(key)
            leaves += 1
            if found >= share:
                pending.append((tuple(walk.path), seed, ex))
                continue
            if scope.accept is not None and not scope.accept(ex):
                continue
            rep.instances += 1
            found += 1
            spent += 1
            yield Instance(tuple(walk.path), level, seed, ex)
        if not root.done:
            if rep.partial is None:
                rep.partial, rep.partial_instances = bound, found
            complete = False
            continue
        for path, seed, ex in pending:
            if scope.accept is None or scope.accept(ex):
                rep.instances += 1
                yield Instance(path, level, seed, ex)
        if complete:
            rep.covered = bound
