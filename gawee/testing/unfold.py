"""Proof by definition: a rule whose two sides are one computation is sound for every shape.

The small scope and the solver prove a rule instance by instance, up to a bound. Many rules need no
instance at all: once each side is written as a term over the pattern's names and the definitions of
gawee's own ops are unfolded, the two terms are the same — the same torch calls on the same tensors,
so the same values for every shape, dtype and input. ``conv2d(x, w, b, act=none, ...attrs) |> relu()
=> conv2d(x, w, b, act="relu", ...attrs)`` is such a rule: a fused activation *is* the standalone op
applied to the convolution's result (``gawee.ops.nn.apply_act`` runs that op), and everything else the
convolution takes comes from the same ``...attrs``. TASO verifies graph substitutions from operator
axioms the same way; here the axioms are the definitions below, each of which restates what an op's
reference semantics in ``gawee.ops`` does (tests/testing/test_unfold.py checks them against it).

Terms are nested tuples, compared by equality:

  ("var", name)                     a tensor or attribute the pattern binds
  ("rest", name, slot)              one operand or attribute a pattern's ``...name`` left free
  ("lit", type, value)              a literal attribute value (its Python type kept: 1 and 1.0 differ
                                    where an attribute is a scalar that takes part in type promotion)
  ("list", (term, ...))             a list attribute
  ("app", op, ((slot, term), ...), tag)
                                    an op applied: every operand and attribute of its registry record,
                                    defaults filled in; ``tag`` is "" for a pure op, and unique per
                                    application otherwise (two draws of a random op differ)
  ("out", app, k)                   output k of a multi-output application
  ("node", name)                    the node an any-op pattern ``name: _(...)`` matched
  ("view", term, shape)             a result holding ``term``'s elements in row-major order, in ``shape``
  ("free", k)                       something the pattern leaves unconstrained: equal to nothing else

The definitions unfolded:
  * ``alias(x)`` is ``x`` (a view of the same tensor), and so is ``dropout(x)`` when it does not train or
    ``p`` is 0 (``F.dropout`` returns its input then); ``clone(x)`` and a one-operand ``cat(x)`` hold ``x``'s
    values in a tensor of their own: equal to ``x`` as a result, not as the operand of another op;
  * a target op (``gawee.ops.targets``) without its epilogue is the core op its ``OpDef.core`` names, on the
    operands and attributes of the same names, its input first through its prologue activation (``act_in``);
  * an op with a fused epilogue (the ``act`` and ``act_params`` attributes, and a ``residual`` operand):
    the op without it, then ``add`` of the residual where the guard says ``same_type`` of the two (the
    reference adds with ``+`` only tensors of one shape and dtype), then the activation as its standalone
    op; an op whose ``act`` is none carries no ``act_params`` (its canonicalization drops them);
  * ``hardtanh`` of a floating-point tensor (the guard says the tensor, or what a convolution or linear
    computes it from, is float) is ``clamp`` with the same bounds: gawee's hardtanh is defined so;
  * the two operands of add, mul, a comparison or a logical op in one order (they commute bit for bit;
    maximum and minimum do not: their zero for (+0, -0) depends on the order);
  * a ``reshape`` result is the elements of what it reshapes, in row-major order, in its shape; through
    ``reshape``, ``flatten``, ``squeeze`` and ``unsqueeze`` (which keep that order) — as a result, not as an
    operand (its layout may differ);
  * ``fold(y)`` is ``y`` where the guard says ``foldable(y)`` (the rewriter evaluates the node with the
    reference semantics it would run with); ``original(y)`` is ``y`` where the guard says
    ``duplicate(y)`` (an earlier node of the same pure op on the same operands and attributes).

A rule the terms do not decide (other library functions, arithmetic with numbers, shape expressions) is
left to the small scope and the solver; ``prove(rule)`` then says what stopped it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from gawee.dsl import ast as A
from gawee.dsl.compiler import Rule, _alternatives, _desugar
from gawee.ops import ACTIVATIONS, REQUIRED, get_op, has_op
from gawee.ops.nn import act_as_op

Term = tuple

NONE: Term = ("lit", "NoneType", None)

FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})

ROW_MAJOR = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})
"""Ops whose result holds their first operand's elements in row-major order (only the shape differs)."""

COMMUTE = frozenset(
    {"add", "mul", "eq", "ne", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"}
)
"""Ops whose two operands commute bit for bit (IEEE sums and products, comparisons, logic): not maximum and
minimum, whose zero for (+0, -0) depends on the order."""

MAX_CASES = 64
"""The most combinations of ops that any-op nodes are unfolded as, one proof each (``op(y) in {...}``)."""

_ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
"""Tensor arithmetic in a replacement and the op it builds (see docs/rules.md, Replacements)."""


class _Undecided(Exception):
    """The terms cannot decide this rule; the message says what stopped them."""


@dataclass
class Definition:
    """A rule proven for every shape: ``reason`` says why in one line."""

    reason: str


def lit(value: Any) -> Term:
    """A literal attribute value as a term."""
    if isinstance(value, (list, tuple)):
        return ("list", tuple(lit(v) for v in value))
    return ("lit", type(value).__name__, value)


class _Terms:
    """Both sides of one rule variant as terms."""

    def __init__(self, rule: Rule, patterns: list[A.Pattern]):
        self.rule = rule
        self.names: dict[str, Term] = {}
        """Pattern names -> their terms (tensors, attributes, bound nodes)."""
        self.tensors: set[str] = set()
        """The names bound to tensors (a positional replacement argument that names one fills an operand)."""
        self.rests: dict[str, tuple[set[str], set[str]]] = {}
        """``...name`` -> (operand slots, attributes) it carries."""
        self.subst: dict[Term, Term] = {}
        self.node_operands: dict[Term, list[Term]] = {}
        """The positional operands an any-op pattern names (``_(x, ...)``: its first operand is x)."""
        self._fresh = itertools.count()
        self.roots = [self.pattern(p, tensor=True) for p in patterns]
        self.facts = self._facts()
        self.withs: dict[str, A.Expr] = {b.name: b.value for b in rule.ast.withs}

    # -- the left side --------------------------------------------------------------------------
    def pattern(self, p: A.Pattern | None, tensor: bool) -> Term:
        if p is None or isinstance(p, A.PAny):
            return ("free", next(self._fresh))
        if isinstance(p, A.PSingleUse):  # how often a value is used does not change it
            return self.pattern(p.pattern, tensor)
        if isinstance(p, A.PVar):
            if tensor:
                self.tensors.add(p.name)
            return self.names.setdefault(p.name, ("var", p.name))
        if isinstance(p, A.PBind):
            inner = self.pattern(p.pattern, tensor)
            self.names[p.name] = inner
            self.tensors.add(p.name)
            return inner
        if isinstance(p, A.PLit):
            if tensor and p.value is not None:
                raise _Undecided("a literal operand (a constant of any shape)")
            return lit(p.value)
        if isinstance(p, A.PList):
            return ("list", tuple(self.pattern(x, False) for x in p.items))
        if isinstance(p, A.POutput):
            return ("out", self.pattern(p.pattern, True), p.index)
        if isinstance(p, A.POp):
            return self.op_pattern(p)
        raise _Undecided(f"a pattern of the form {type(p).__name__}")

    def op_pattern(self, p: A.POp) -> Term:
        if p.op is None:  # `y: _(x, ...)`: the node itself (fold and original name it); x binds its operand
            node = ("node", next(self._fresh))
            self.node_operands[node] = [self.pattern(a.pattern, True) for a in p.args if not a.rest and not a.keyword]
            return node
        opdef = get_op(p.op)
        names = [o.name for o in opdef.operands]
        variadic = opdef.variadic
        operands: dict[str, Term] = {}
        listed: list[Term] = []
        attrs: dict[str, Term] = {}
        rest: str | bool = False
        for arg in p.args:
            if arg.rest:
                rest = arg.keyword or True
            elif arg.keyword is None:
                if variadic:
                    listed.append(self.pattern(arg.pattern, True))
                else:
                    operands[names[len(operands)]] = self.pattern(arg.pattern, True)
            elif arg.keyword in names:
                operands[arg.keyword] = self.pattern(arg.pattern, True)
            else:
                attrs[arg.keyword] = self.pattern(arg.pattern, False)
        if variadic:
            if rest is not False:
                raise _Undecided(f"`...` over {p.op}'s variadic operands")
            operands[names[-1]] = ("list", tuple(listed))
        free_ops = [n for n in names if n not in operands]
        free_attrs = [a.name for a in opdef.attrs if a.name not in attrs]
        if isinstance(rest, str):
            self.rests[rest] = (set(free_ops), set(free_attrs))
        for n in free_ops:
            operands[n] = ("rest", rest, n) if isinstance(rest, str) else ("free", next(self._fresh))
        for a in opdef.attrs:
            if a.name in attrs:
                continue
            if isinstance(rest, str):
                attrs[a.name] = ("rest", rest, a.name)
            elif rest is True or a.default is REQUIRED:
                attrs[a.name] = ("free", next(self._fresh))
            else:
                attrs[a.name] = lit(a.default)  # a pattern without `...` matches the default
        act = attrs.get("act")
        parameterless = act == NONE or (act is not None and act[0] == "lit" and ACTIVATIONS.get(act[2]) == 0)
        if isinstance(rest, str) and parameterless and "act_params" in free_attrs:
            # no activation, no parameters (canonical); an activation of none has none (any other cannot run)
            self.subst[("rest", rest, "act_params")] = lit(())
        return self.app(p.op, operands, attrs, "lhs")

    def app(self, op: str, operands: dict[str, Term], attrs: dict[str, Term], side: str) -> Term:
        opdef = get_op(op)
        slots = tuple(
            [(o.name, operands[o.name]) for o in opdef.operands] + [(a.name, attrs[a.name]) for a in opdef.attrs]
        )
        tag = "" if opdef.has_trait("pure") else f"{side}{next(self._fresh)}"
        return ("app", op, slots, tag)

    def _facts(self) -> set[tuple]:
        """The guard's conjuncts the definitions use: ("same_type", {a, b}), ("foldable", y), ("duplicate", y)."""
        out: set[tuple] = set()
        guard = self.rule.ast.guard
        parts = A.chain_terms(guard, "and") if guard is not None else []
        for part in parts:
            if not (isinstance(part, A.ECall) and all(isinstance(a.value, A.EName) for a in part.args)):
                continue
            args = [a.value.name for a in part.args]
            if any(n not in self.names for n in args):
                continue
            if part.func == "same_type" and len(args) == 2:
                out.add(("same_type", frozenset(self.names[n] for n in args)))
            elif part.func in ("foldable", "duplicate") and len(args) == 1:
                out.add((part.func, self.names[args[0]]))
        for part in parts:  # x.dtype in {f16, ...} / is_float(x)
            if (
                isinstance(part, A.EIn)
                and not part.negate
                and isinstance(part.item, A.EAttr)
                and part.item.name == "dtype"
                and isinstance(part.item.obj, A.EName)
                and part.item.obj.name in self.names
                and all(_name_of(c) in FLOAT_DTYPES for c in part.choices.items)
            ):
                out.add(("float", self.names[part.item.obj.name]))
            elif (
                isinstance(part, A.ECall)
                and part.func == "is_float"
                and len(part.args) == 1
                and isinstance(part.args[0].value, A.EName)
                and part.args[0].value.name in self.names
            ):
                out.add(("float", self.names[part.args[0].value.name]))
        for part in parts:  # op(y) in {"reshape", ...}
            if (
                isinstance(part, A.EIn)
                and not part.negate
                and isinstance(part.item, A.ECall)
                and part.item.func == "op"
                and len(part.item.args) == 1
                and isinstance(part.item.args[0].value, A.EName)
                and part.item.args[0].value.name in self.names
                and all(isinstance(c, A.ELit) and isinstance(c.value, str) for c in part.choices.items)
            ):
                ops = frozenset(c.value for c in part.choices.items)
                out.add(("op_in", self.names[part.item.args[0].value.name], ops))
        return out

    # -- the right side -------------------------------------------------------------------------
    def expr(self, e: A.Expr) -> Term:
        if isinstance(e, A.EName):
            if e.name in self.names:
                return self.names[e.name]
            if e.name in self.withs:
                return self.expr(self.withs[e.name])
            raise _Undecided(f"the name {e.name}")
        if isinstance(e, A.ELit):
            return lit(e.value)
        if isinstance(e, A.EList):
            return ("list", tuple(self.expr(x) for x in e.items))
        if isinstance(e, A.EIndex) and isinstance(e.index, A.ELit) and isinstance(e.index.value, int):
            return ("out", self.expr(e.obj), e.index.value)
        if isinstance(e, A.EBin) and e.op in _ARITH and self._is_tensor(e.left) and self._is_tensor(e.right):
            return self.app(
                _ARITH[e.op],
                {"self": self.expr(e.left), "other": self.expr(e.right)},
                self._defaults(_ARITH[e.op]),
                "rhs",
            )
        if isinstance(e, A.ENeg) and self._is_tensor(e.operand):
            return self.app("neg", {"self": self.expr(e.operand)}, self._defaults("neg"), "rhs")
        if isinstance(e, A.ECall) and e.func in ("fold", "original") and len(e.args) == 1:
            y = self.expr(e.args[0].value)
            fact = "foldable" if e.func == "fold" else "duplicate"
            if (fact, y) not in self.facts:
                raise _Undecided(f"{e.func}() without `{fact}` of its operand in the guard")
            return y
        if isinstance(e, A.ECall) and e.func == "op" and len(e.args) == 1:  # the op of a node the pattern names
            t = self.expr(e.args[0].value)
            t = self.subst.get(t, t)
            if t[0] == "app":
                return lit(t[1])
            raise _Undecided(f"`{e.text}` of a node of any op")
        if isinstance(e, A.ECall) and has_op(e.func):
            return self.op_call(e)
        raise _Undecided(f"`{e.text}`")

    def _is_tensor(self, e: A.Expr) -> bool:
        if isinstance(e, A.EName):
            return e.name in self.tensors or (e.name in self.withs and self._is_tensor(self.withs[e.name]))
        return isinstance(e, (A.ECall, A.EBin, A.ENeg, A.EIndex))

    def _defaults(self, op: str) -> dict[str, Term]:
        out = {}
        for a in get_op(op).attrs:
            if a.default is REQUIRED:
                raise _Undecided(f"{op} needs attribute {a.name}")
            out[a.name] = lit(a.default)
        return out

    def op_call(self, e: A.ECall) -> Term:
        opdef = get_op(e.func)
        names = [o.name for o in opdef.operands]
        attr_order = [a.name for a in opdef.attrs]
        operands: dict[str, Term] = {}
        listed: list[Term] = []
        attrs: dict[str, Term] = {}
        spliced: dict[str, Term] = {}
        for a in e.args:
            if a.rest:
                if a.rest not in self.rests:
                    raise _Undecided(f"`...{a.rest}` of a pattern the terms do not describe")
                ops, ats = self.rests[a.rest]
                for slot in ops | ats:
                    spliced[slot] = ("rest", a.rest, slot)
                continue
            if a.keyword is None:
                tensor = self._is_tensor(a.value) or (isinstance(a.value, A.ELit) and a.value.value is None)
                if tensor and not attrs and (opdef.variadic or len(operands) < len(names)):
                    if opdef.variadic:
                        listed.append(self.expr(a.value))
                    else:
                        operands[names[len(operands)]] = self.expr(a.value)
                    continue
                if isinstance(a.value, A.ELit) and isinstance(a.value.value, (int, float)) and not attrs:
                    raise _Undecided("a number in an operand slot (a new constant)")
                name = next((n for n in attr_order if n not in attrs), None)
                if name is None:
                    raise _Undecided(f"a positional argument {e.func} has no attribute for")
                attrs[name] = self.expr(a.value)
            elif a.keyword in names:
                operands[a.keyword] = self.expr(a.value)
            else:
                attrs[a.keyword] = self.expr(a.value)
        if opdef.variadic:
            if any(s == names[-1] for s in spliced):
                raise _Undecided(f"`...` over {e.func}'s variadic operands")
            operands[names[-1]] = ("list", tuple(listed))
        for o in opdef.operands:
            if o.name not in operands:
                if o.name in spliced:
                    operands[o.name] = spliced[o.name]
                elif o.optional:
                    operands[o.name] = NONE
                else:
                    raise _Undecided(f"{e.func} without its operand {o.name}")
        for a in opdef.attrs:
            if a.name not in attrs:
                attrs[a.name] = spliced[a.name] if a.name in spliced else self._defaults_one(e.func, a)
        return self.app(e.func, operands, attrs, "rhs")

    def _defaults_one(self, op: str, a) -> Term:
        if a.default is REQUIRED:
            raise _Undecided(f"{op} needs attribute {a.name}")
        return lit(a.default)

    # -- definitions ----------------------------------------------------------------------------
    def value(self, t: Term) -> Term:
        """``t`` unfolded, then a copy stripped: a clone or a one-operand cat holds its operand's values, but
        in a layout of its own, and an elementwise op that reads it may then run another loop (torch's vector
        and scalar loops may round a transcendental differently), so a copy is its operand only as a result."""
        t = self.unfold(t)
        while t[0] == "app" and t[1] in ("clone", "cat"):
            s = dict(t[2])
            if t[1] == "clone":
                t = s["self"]
            elif len(s["tensors"][1]) == 1:
                t = s["tensors"][1][0]
            else:
                break
        if t[0] == "app" and t[1] == "reshape":  # the elements of what it views, in row-major order, in its shape
            s = dict(t[2])
            return ("view", self._viewed(s["self"]), s["shape"])
        return t

    def _viewed(self, t: Term) -> Term:
        """What ``t`` lays out in row-major order: through reshape, flatten, squeeze and unsqueeze (also an any-op
        node the guard says is one of them), each of which keeps its operand's elements in row-major order."""
        while True:
            if t[0] == "app" and t[1] in ROW_MAJOR:
                t = t[2][0][1]
            elif t[0] == "node" and self.node_operands.get(t) and self._op_among(t, ROW_MAJOR):
                t = self.unfold(self.node_operands[t][0])
            else:
                return t

    def _float(self, t: Term) -> bool:
        """Whether ``t`` is a floating-point tensor: the guard says so, or a convolution or linear of one (their
        result has their input's dtype), or a sum of one with a tensor of its type."""
        if ("float", t) in self.facts or (t[0] == "var" and ("float", t) in self._unfolded_facts()):
            return True
        if t[0] == "app" and t[1] in ("conv1d", "conv2d", "conv3d", "linear"):
            return self._float(t[2][0][1])
        if t[0] == "app" and t[1] == "add":
            a, b = t[2][0][1], t[2][1][1]
            pair = ("same_type", frozenset((a, b)))
            return pair in self._unfolded_facts() and (self._float(a) or self._float(b))
        return False

    def _op_among(self, node: Term, ops: frozenset[str]) -> bool:
        return any(f[0] == "op_in" and f[1] == node and f[2] <= ops for f in self.facts)

    def unfold(self, t: Term) -> Term:
        t = self.subst.get(t, t)
        kind = t[0]
        if kind == "list":
            return ("list", tuple(self.unfold(x) for x in t[1]))
        if kind == "out":
            return ("out", self.unfold(t[1]), t[2])
        if kind != "app":
            return t
        _, op, slots, tag = t
        s = {k: self.unfold(v) for k, v in slots}
        if op == "alias":  # a view of the same tensor
            return s["self"]
        if op == "dropout" and (s["train"] == lit(False) or s["p"] in (lit(0), lit(0.0))):
            return s["input"]
        opdef = get_op(op)
        if opdef.attr("act") is not None and opdef.attr("act_params") is not None:
            return self.epilogue(op, s, tag)
        if op == "hardtanh" and self._float(s["self"]):  # gawee's hardtanh of a float tensor is clamp
            return ("app", "clamp", (("self", s["self"]), ("min", s["min_val"]), ("max", s["max_val"])), tag)
        if op in COMMUTE and opdef.has_trait("commutative"):
            a, b = (o.name for o in opdef.operands)
            if repr(s[b]) < repr(s[a]):
                s[a], s[b] = s[b], s[a]
        return ("app", op, tuple((k, s[k]) for k, _ in slots), tag)

    def epilogue(self, op: str, s: dict[str, Term], tag: str) -> Term:
        """An op with a fused residual and activation: the op without them, + residual, activation."""
        act, params = s["act"], s["act_params"]
        residual = s.get("residual", NONE)
        if act == NONE:
            params = lit(())  # apply_act ignores the parameters of no activation
        if act == NONE and residual == NONE:
            bare = {k: params if k == "act_params" else v for k, v in s.items()}
            return self.as_core(op, bare) or ("app", op, tuple(bare.items()), tag)
        bare = {k: _bare(k, v) for k, v in s.items()}
        core = self.as_core(op, bare) or ("app", op, tuple(bare.items()), tag)
        y = core
        if residual != NONE:
            if ("same_type", frozenset((core, residual))) not in self._unfolded_facts():
                y = ("residual", core, residual)
            else:
                y = self.unfold(self.app("add", {"self": core, "other": residual}, self._defaults("add"), "rhs"))
        if act == NONE:
            return y
        if act[0] != "lit" or params[0] != "list" or any(p[0] not in ("lit", "var", "rest") for p in params[1]):
            return ("act", act, params, y)
        name = act[2]
        if ACTIVATIONS.get(name) != len(params[1]):
            raise _Undecided(f"activation {name} with {len(params[1])} parameters")
        standalone, act_attrs = act_as_op(name, params[1])
        opdef = get_op(standalone)
        attrs = {a.name: _term(act_attrs[a.name]) if a.name in act_attrs else lit(a.default) for a in opdef.attrs}
        return self.unfold(self.app(standalone, {opdef.operands[0].name: y}, attrs, "rhs"))

    def op_cases(self) -> list[dict[Term, str]]:
        """The ops each any-op node may be, one case per combination: the guard's ``op(y) in {...}`` for the
        node ``y: _(...)``; ``[{}]`` where no such node has one (at most :data:`MAX_CASES` cases)."""
        choices = [(f[1], sorted(f[2])) for f in sorted(self.facts, key=repr) if f[0] == "op_in" and f[1][0] == "node"]
        if math.prod(len(ops) for _, ops in choices) > MAX_CASES:
            raise _Undecided(f"more than {MAX_CASES} combinations of the ops of any-op nodes")
        return [dict(zip((n for n, _ in choices), ops)) for ops in itertools.product(*(o for _, o in choices))]

    def case(self, ops: dict[Term, str]) -> None:
        """Take each any-op node of ``ops`` to be an application of its op there: its positional operands those
        the pattern names, the rest (and every attribute) left free by its ``...``. Undecided where the op is
        variadic or takes fewer operands than the pattern names."""
        for node, op in ops.items():
            opdef = get_op(op)
            named = self.node_operands[node]
            if len(named) > len(opdef.operands) or opdef.variadic:
                raise _Undecided(f"{op} as a node of any op with {len(named)} operands named")
            operands = {
                o.name: named[i] if i < len(named) else ("free", next(self._fresh))
                for i, o in enumerate(opdef.operands)
            }
            attrs = {a.name: ("free", next(self._fresh)) for a in opdef.attrs}
            self.subst[node] = self.app(op, operands, attrs, "lhs")

    def as_core(self, op: str, s: dict[str, Term]) -> Term | None:
        """A target op without its epilogue as the core op it is defined as (``OpDef.core``), unfolded; None for
        another op, or where the attribute that names the core op is not a literal."""
        core = get_op(op).core
        if core is None:
            return None
        if core.startswith("attr:"):
            named = s[core.removeprefix("attr:")]
            if named[0] != "lit" or not isinstance(named[2], str) or not has_op(named[2]):
                return None
            core = named[2]
        opdef = get_op(core)
        attrs = {a.name: s[a.name] if a.name in s else lit(a.default) for a in opdef.attrs}
        if any(a == lit(REQUIRED) for a in attrs.values()):
            return None
        operands = {o.name: s[o.name] for o in opdef.operands}
        act_in = s.get("act_in", NONE)
        if act_in != NONE and act_in[0] != "lit":  # a prologue carried over unread (`...attrs`): the same on both sides
            operands["input"] = ("act", act_in, lit(()), operands["input"])
        elif act_in != NONE:  # the prologue: the activation applied to the input first
            if ACTIVATIONS.get(act_in[2]) != 0:
                return None
            standalone = get_op(act_in[2])
            defaults = {a.name: lit(a.default) for a in standalone.attrs}
            operands["input"] = self.unfold(self.app(act_in[2], {"self": operands["input"]}, defaults, "rhs"))
        return self.unfold(self.app(core, operands, attrs, "rhs"))

    def _unfolded_facts(self) -> set[tuple]:
        return {  # `op_in` facts name nodes, which are not unfolded (a node taken as its op reads them again)
            (f, frozenset(self.unfold(x) for x in arg) if isinstance(arg, frozenset) else self.unfold(arg))
            for f, arg, *more in self.facts
            if not more
        }


def _name_of(e: A.Expr) -> str | None:
    """A set item of a guard as a name: a dtype is written bare (``{f16, f32}``)."""
    if isinstance(e, A.EName):
        return e.name
    return e.value if isinstance(e, A.ELit) and isinstance(e.value, str) else None


def _bare(slot: str, term: Term) -> Term:
    """A fused op's slot once its epilogue is taken off: no residual, no activation, no parameters."""
    if slot in ("act", "residual"):
        return NONE
    return lit(()) if slot == "act_params" else term


def _term(v: Any) -> Term:
    """An attribute of ``act_as_op``: a term already (an activation parameter) or a plain value."""
    return v if isinstance(v, tuple) and v and v[0] in ("lit", "var", "rest", "list", "free") else lit(v)


def _variant_patterns(rule: Rule) -> list[A.Pattern]:
    """The patterns of ``rule``'s own spelling (its alternatives resolved as compile_rule resolves them)."""
    ast = rule.ast
    choices = [_alternatives(_desugar(p)) for p in [ast.pattern, *ast.extra_roots]]
    return list(list(itertools.product(*choices))[rule.variant[0] - 1])


def prove(rule: Rule) -> Definition | str:
    """A Definition if ``rule``'s two sides are one computation once definitions are unfolded, else
    what the terms could not decide (a reason for the report)."""
    if rule.ast is None:
        return "no rule text"
    try:
        patterns = _variant_patterns(rule)
        terms = _Terms(rule, patterns)
        for ops in terms.op_cases():
            terms.case(ops)
            results = [terms.expr(e) for e in [rule.ast.replacement, *rule.ast.extra_results]]
            for k, (lhs, rhs) in enumerate(zip(terms.roots, results)):
                if terms.value(lhs) != terms.value(rhs):
                    which = f"result {k}" if len(results) > 1 else "the replacement"
                    where = f" (where {', '.join(sorted(ops.values()))})" if ops else ""
                    return f"{which} is not the matched computation once definitions are unfolded{where}"
    except _Undecided as e:
        return f"the terms do not decide {e}"
    return Definition("both sides are one computation once gawee's op definitions are unfolded")
