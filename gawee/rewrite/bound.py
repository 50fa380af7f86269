"""The declared error bound of an approximate rule (`within expr`), evaluated in float64 on one match.

A bound is written in the expression language of replacements, over the names the rule's pattern bound,
but it is never built into a graph: every op it calls is run at once, by the op's reference semantics, on
the float64 values of the matched tensors on one instance (a float input or constant of the match is
its float64 value, an intermediate value of the pattern is the original recomputed in float64, an integer
tensor is converted to float64). Numbers become float64 scalars. Fields (`x.shape`, `x.dtype`) and guards'
builtins read the matched Values themselves, so `roundoff(x.dtype)` is the dtype the model computes in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gawee.dsl.library import GuardFailed
from gawee.errors import GaweeError, RewriteError
from gawee.ir.core import Value
from gawee.ir.types import TensorType
from gawee.ops import OpDef, get_op
from gawee.rewrite.context import detached_constant

if TYPE_CHECKING:
    from gawee.dsl.compiler import Rule


class BoundContext:
    """What an error bound's compiled expression sees: the match's bindings, and ops run on float64 data."""

    on_host = False
    """A replacement's compiled constant subexpressions (gawee.dsl.const_fold) fold the graph's constants in their
    own dtypes: a bound evaluates the `with` bindings it shares with the replacement in float64, through
    :meth:`emit_op`, instead."""

    def __init__(self, rule: Rule, env: dict[str, Any], data_of: Callable[[Value], torch.Tensor | None]):
        self.rule = rule
        self.env = env
        self.with_cache: list[Any] = []
        self.with_fns: list[Any] = []
        self._data_of = data_of

    def error(self, message: str, hint: str | None = None) -> RewriteError:
        return RewriteError(f"rule {self.rule.name} ({self.rule.location}): its bound: {message}", hint=hint)

    def data(self, v: Value | None) -> torch.Tensor | None:
        """A value's data in float64: the instance's, for a value of the matched graph; its own, for a value this
        bound computed. Integers become float64 too (a bound is a magnitude: abs(x) of an i8 -128 is 128);
        bools stay bools."""
        if v is None:
            return None
        known = self._data_of(v)
        if known is None:
            if v.data is None:
                raise self.error(f"%{v.name} has no value on this instance")
            known = v.data
        return known if known.dtype in (torch.bool, torch.float64) or known.is_complex() else known.double()

    def tensor(self, x: Any, like: Value | None = None) -> Value:
        """A number as a 0-d float64 tensor (bools stay bool): a bound is computed in float64 throughout."""
        if isinstance(x, Value):
            return x
        if isinstance(x, (list, tuple)):
            raise self.error(f"a list {x!r} cannot be used as a tensor")
        return detached_constant(torch.tensor(x, dtype=torch.bool if isinstance(x, bool) else torch.float64))

    def emit(
        self, op: str, inputs: list[Value | None], attrs: dict[str, Any], multi: bool = False
    ) -> Value | tuple[Value, ...]:
        """``op`` run now on the float64 data of its operands."""
        return self.emit_op(get_op(op), inputs, attrs, multi)

    def emit_op(
        self,
        opdef: OpDef,
        inputs: list[Value | None],
        attrs: dict[str, Any],
        multi: bool = False,
        prepared: dict[str, Any] | None = None,
    ) -> Value | tuple[Value, ...]:
        """:meth:`emit` of the op ``opdef`` (as a replacement's calls give it; ``prepared``: its attributes as the
        replacement prepared them when it was compiled, which read no operand type)."""
        op = opdef.name
        missing = opdef.missing_operand(inputs)
        if missing is not None:
            raise self.error(f"cannot compute {op}: its operand {missing} is absent (use default(b, 0))")
        data = [self.data(v) for v in inputs]
        try:
            if prepared is not None:
                attrs = prepared
            else:
                attrs = opdef.prepare_attrs(attrs, [None if d is None else TensorType.of(d) for d in data], where=op)
            out = opdef.run(data, attrs)
        except GaweeError as e:
            raise self.error(f"cannot compute {op}: {e.message}") from None
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise self.error(f"computing {op} failed: {str(e).splitlines()[0]}") from None
        if len(out) != 1 and not multi:
            raise self.error(f"{op} has {len(out)} outputs: pick one with `[i]`")
        values = tuple(detached_constant(t) for t in out)
        return values if multi else values[0]


def evaluate_bound(
    rule: Rule, env: dict[str, Any], data_of: Callable[[Value], torch.Tensor | None], shapes: list[tuple[int, ...]]
) -> list[torch.Tensor]:
    """``rule``'s declared bound on one match (``env``: its bindings; ``data_of``: the float64 data of a matched
    value on the instance, None for other values), broadcast to each result's shape: the absolute error allowed
    per element, in float64. Raises RewriteError where the bound cannot be computed or does not broadcast."""
    if rule.bound is None:
        raise ValueError(f"rule {rule.name} is exact: it declares no bound")
    ctx = BoundContext(rule, env, data_of)
    try:
        value = rule.bound(ctx)
    except GuardFailed as e:
        raise ctx.error(f"`{rule.bound_text}` cannot be evaluated: {e}") from None
    if isinstance(value, Value):
        bound = ctx.data(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        bound = torch.tensor(float(value), dtype=torch.float64)
    else:
        raise ctx.error(f"`{rule.bound_text}` is {value!r}, not a number or a tensor")
    if bound is None:
        raise ctx.error(f"`{rule.bound_text}` uses an absent operand (use default(b, 0))")
    out = []
    for shape in shapes:
        try:
            out.append(torch.broadcast_to(bound.double(), shape))
        except RuntimeError:
            raise ctx.error(
                f"`{rule.bound_text}` has shape {list(bound.shape)}, which does not broadcast to a result's "
                f"{list(shape)}"
            ) from None
    return out
