"""What the rule compiler's parts share: the names a rule binds (their kinds), and op lookups with their
errors."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gawee.dsl import kinds as K
from gawee.dsl.library import Builtin
from gawee.errors import RuleError, SourceSpan
from gawee.ir.types import DType
from gawee.ops import OPAQUE, OpDef, all_ops, get_op, has_op

Fn = Callable[[Any], Any]  # fn(ctx) -> value; ctx.env holds the bindings

DTYPE_NAMES = {d.value for d in DType}


@dataclass
class _Var:
    kind: K.Kind
    op: str | None = None
    """For REST variables: the op whose remaining operands/attributes it holds."""
    span: SourceSpan | None = None
    uses: int = 0
    """Mentions after the binding one (in the pattern, guard, assumptions or replacement)."""


@dataclass
class _Scope:
    vars: dict[str, _Var] = field(default_factory=dict)
    withs: dict[str, tuple[int, K.Kind]] = field(default_factory=dict)
    helpers: dict[str, Builtin] = field(default_factory=dict)


_UNSET = object()


def _multi_output_ops() -> list[str]:
    return sorted(n for n, op in all_ops().items() if op.has_trait("multi_output"))


def _a(kind: K.Kind) -> str:
    text = str(kind)
    return ("an " if text[0] in "aeiou" else "a ") + text


def _unknown_op(name: str, span: SourceSpan) -> RuleError:
    close = difflib.get_close_matches(name, list(all_ops()), n=3)
    return RuleError(
        f"unknown op {name!r}",
        span=span,
        hint=f"did you mean {' or '.join(close)}?" if close else "see docs/ops.md for the op list",
    )


def _lookup_op(name: str, span: SourceSpan) -> OpDef:
    if not has_op(name):
        raise _unknown_op(name, span)
    if name == OPAQUE:
        raise RuleError("opaque `aten` nodes cannot be matched or built by rules", span=span)
    return get_op(name)
