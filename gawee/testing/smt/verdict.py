"""A rule's instances decided by the solver, aggregated into what its verdict can claim.

``prove_rule(rule, instances, bound)`` takes any iterable of instances (the small-scope enumeration
when there is one, else instances the harness drew) and returns a ``RuleProof``: how many were
proven, the first counterexample, and for the rest why not. A rule is *proven* only when the
instances were the whole small scope (``bound`` names it) and every one of them was proven.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gawee.dsl.compiler import Rule
from gawee.ir.core import Graph
from gawee.testing.generate import Example
from gawee.testing.smt.solve import RLIMIT, prove_instance

RULE_RLIMIT = 5 * RLIMIT
"""z3's resource budget for all the queries of one rule (deterministic, like RLIMIT); instances left
when it is spent are not decided, and the rule is not proven."""

NO_SCOPE = "no level of the small scope enumerated completely"


@dataclass
class RuleProof:
    """The solver's findings over a rule's instances."""

    bound: str | None = None
    """The small scope the instances enumerate ("rank <= 4, dims <= 3"); None for drawn instances."""
    definition: str = ""
    """Why the rule holds for every shape without any instance (gawee.testing.unfold), "" if it was not
    proven so: then the instances decide."""
    instances: int = 0
    """Instances decided."""
    proven: int = 0
    unknown: Counter = field(default_factory=Counter)
    """Why instances were not proven (reason -> count)."""
    counterexample: object | None = None
    """The first refuting instance's Counterexample, replayed through the harness's comparison."""
    queries: int = 0
    seconds: float = 0.0
    spent: bool = False
    """The resource budget ran out before every instance was decided."""

    @property
    def complete(self) -> bool:
        """Proven for every shape by definition, or every instance of a whole small scope proven: the rule's
        verdict is *proven*."""
        if self.definition:
            return self.counterexample is None
        return (
            self.bound is not None
            and self.counterexample is None
            and not self.spent
            and self.instances > 0
            and self.proven == self.instances
        )

    @property
    def why_not(self) -> str:
        """What keeps the rule from *proven* ("" when it is)."""
        if self.complete or self.counterexample is not None:
            return ""
        if self.unknown:
            reason, n = self.unknown.most_common(1)[0]
            return f"{reason} ({n} of {self.instances} instances)"
        if self.spent:
            return f"solver budget spent after {self.instances} instances"
        if self.instances == 0:
            return "no instance to prove"
        return f"{NO_SCOPE} (the solver proved all {self.instances} instances it was given)"

    def summary(self) -> str:
        """One cell's worth: "proven within rank <= 1, dims <= 1, 80 instances" or why not."""
        if self.complete and self.definition:
            return f"proven for every shape: {self.definition}"
        if self.complete:
            return f"proven within {self.bound}, {self.instances} instances"
        if self.counterexample is not None:
            return "refuted by the solver"
        return self.why_not


def prove_rule(
    rule: Rule, instances: Iterable[tuple[Example, Graph]], bound: str | None = None, rlimit: int = RULE_RLIMIT
) -> RuleProof:
    """Decide each (example, rewritten graph) of ``instances``; stop at the first counterexample or
    when the resource budget ``rlimit`` is spent."""
    proof = RuleProof(bound)
    known: dict = {}
    t0 = time.perf_counter()
    used = 0
    for ex, after in instances:
        if used >= rlimit:
            proof.spent = True
            break
        try:
            result = prove_instance(rule, ex, after, known=known)
        except Exception as e:  # a bug of the solver layer: this instance unproven, and said why
            frame = traceback.extract_tb(e.__traceback__)[-1]
            proof.instances += 1
            proof.unknown[f"the solver raised {type(e).__name__}: {e} (at {frame.filename}:{frame.lineno})"] += 1
            continue
        proof.instances += 1
        proof.queries += result.queries
        used += result.rlimit
        if result.status == "proven":
            proof.proven += 1
        elif result.status == "refuted":
            proof.counterexample = result.counterexample
            break
        else:
            proof.unknown[result.reason] += 1
    proof.seconds = time.perf_counter() - t0
    return proof
