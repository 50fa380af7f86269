"""Explain mode: for one node, why each candidate rule did (or did not) match."""

from __future__ import annotations

from dataclasses import dataclass

from gawee.dsl.library import GuardFailed
from gawee.dsl.matcher import MatchContext
from gawee.errors import GaweeError
from gawee.ir.core import Graph, Node
from gawee.rewrite.context import RewriteContext
from gawee.rewrite.driver import root_value
from gawee.rewrite.ruleset import RuleSet


@dataclass(frozen=True)
class Explanation:
    rule: str
    location: str
    outcome: str
    """"matches", "pattern" (the pattern failed) or "guard" (a guard conjunct was false)."""
    reason: str

    def __str__(self) -> str:
        return f"{self.rule} ({self.location}): {self.outcome}: {self.reason}"


def find_node(graph: Graph, name: str) -> Node:
    """The node called ``name`` (or producing the value called ``name``); GaweeError with suggestions."""
    for node in graph:
        if node.name == name or any(v.name == name for v in node.outputs):
            return node
    import difflib

    close = difflib.get_close_matches(name, [n.name for n in graph], n=3)
    raise GaweeError(
        f"no node named {name!r} in {graph.name}",
        hint=f"did you mean {' or '.join(close)}?" if close else "`gawee-rewrite show MODEL --graph` lists the nodes",
    )


def explain(graph: Graph, node: Node | str, rules: RuleSet) -> list[Explanation]:
    """Why each candidate rule did or did not rewrite ``node``: the deepest point its pattern
    reached and the sub-pattern or guard conjunct that failed — or that it matches.

    Candidates are the rules rooted at the node's op, and the rules rooted at one of its
    users whose pattern mentions the node's op below the root (``conv2d |> relu`` is
    explained for a conv2d through its relu user).
    """
    if isinstance(node, str):
        node = find_node(graph, node)
    out = []
    for phase in rules.phases:
        for rule in phase.candidates(node.op):
            out.append(_explain_one(graph, node, rule))
    users = {id(u.node): u.node for v in node.outputs for u in v.uses}
    for user in users.values():
        for phase in rules.phases:
            for rule in phase.candidates(user.op):
                if rule.root_op is not None and node.op in _inner_ops(rule.matcher):
                    e = _explain_one(graph, user, rule)
                    out.append(Explanation(e.rule, e.location, e.outcome, f"via its user {user.name}: {e.reason}"))
    return out


def _inner_ops(m) -> set[str]:
    """Ops mentioned below the root of a compiled pattern."""
    found: set[str] = set()
    for sub in getattr(m, "operands", []):
        if sub is not None and getattr(sub, "op", None) is not None:
            found.add(sub.op)
        if sub is not None:
            found |= _inner_ops(sub)
    return found


def _symbols(env: dict) -> set:
    from gawee.ir.symbolic import symbols_of

    return symbols_of([v.type for v in env.values() if hasattr(v, "type")])


def _explain_one(graph: Graph, node: Node, rule) -> Explanation:
    value = node.outputs[0] if rule.whole_node is not None else root_value(rule.matcher, node)
    if value is None:
        if rule.root_output is None:
            why = f"{node.name} has {len(node.outputs)} outputs"
        else:
            why = f"{node.name} has no used output {rule.root_output} (it has {len(node.outputs)}): nothing to replace"
        return Explanation(rule.name, rule.location, "pattern", why)
    mctx = MatchContext(explain=True)
    env: dict = {}
    guard_reason = None
    for _ in rule.matcher.match(value, env, mctx, 0):
        rctx = RewriteContext(graph, rule, node, env)
        failed = None
        for text, part in rule.guard_parts:
            try:
                ok = part(rctx)
                if ok is None:  # three-valued: true for some sizes in range, not for all
                    syms = ", ".join(f"{s.name} in {s.range_text}" for s in sorted(_symbols(env), key=str))
                    text = f"{text} (not provable for every size: {syms})"
                ok = bool(ok)
            except GuardFailed as e:
                ok, text = False, f"{text} (cannot be evaluated: {e})"
            except GaweeError as e:
                ok, text = False, f"{text} ({e.message})"
            if not ok:
                failed = text
                break
        if failed is None:
            bound = ", ".join(f"{k}=%{v.name}" for k, v in env.items() if hasattr(v, "name") and v is not None)
            within = f"; approximate, within {rule.bound_text}" if rule.approximate else ""
            return Explanation(rule.name, rule.location, "matches", f"pattern and guard hold ({bound}){within}")
        guard_reason = guard_reason or f"guard `{failed}` is false"
    if guard_reason:
        return Explanation(rule.name, rule.location, "guard", guard_reason)
    return Explanation(rule.name, rule.location, "pattern", mctx.best_reason or "the pattern does not match")
