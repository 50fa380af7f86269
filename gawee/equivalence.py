"""Equivalence checking: do two graphs compute the same thing (shapes, dtypes and numbers)?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gawee.errors import EquivalenceError
from gawee.interp import run
from gawee.ir.core import Graph
from gawee.ir.types import DType, TensorType

TOLERANCE = {DType.f64: 1e-9, DType.f32: 1e-4, DType.f16: 1e-2, DType.bf16: 4e-2, DType.c64: 1e-4, DType.c128: 1e-9}
"""Per-dtype tolerance: outputs agree when max|a - b| <= tol * max(1, max|reference|).
Integer and bool outputs must be identical."""


def random_inputs(types: Sequence[TensorType], seed: int = 0) -> list[torch.Tensor]:
    """Inputs of the given types: normal floats, small non-negative integers, random bools."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in types:
        if t.dtype is DType.bool:
            out.append(torch.rand(t.shape, generator=gen) > 0.5)
        elif t.dtype.is_float or t.dtype.is_complex:
            out.append(torch.randn(t.shape, generator=gen, dtype=t.dtype.torch))
        else:
            out.append(torch.randint(0, 4, t.shape, generator=gen, dtype=t.dtype.torch))
    return out


def output_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    """max|ref - got| with NaN/inf compared by position (a mismatch is inf)."""
    if ref.numel() == 0:
        return 0.0
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        return 0.0 if torch.equal(ref, got) else float("inf")
    a, b = ref.double() if not ref.is_complex() else ref, got.double() if not got.is_complex() else got
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return float("inf")
    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
        return float("inf")
    finite = ~(nan_a | inf_a)
    if not finite.any():
        return 0.0
    return (a[finite] - b[finite]).abs().max().item()


@dataclass
class OutputCheck:
    index: int
    before: TensorType
    after: TensorType
    max_error: float
    tolerance: float
    scale: float
    """max(1, max|reference|): errors are compared against tolerance x scale."""

    @property
    def ok(self) -> bool:
        return self.before.same_shape_dtype(self.after) and self.max_error <= self.tolerance * self.scale


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
        return f"{'ok' if self.ok else 'FAILED'}, max error {self.max_error:.2g}"

    def __str__(self) -> str:
        if self.problem:
            return f"not equivalent: {self.problem}"
        worst = max(self.outputs, key=lambda o: o.max_error / (o.tolerance * o.scale or 1), default=None)
        status = "equivalent" if self.ok else "NOT equivalent"
        if worst is None:
            return status
        return (
            f"{status}: max abs error {worst.max_error:.3g} (tolerance {worst.tolerance:g} x "
            f"{worst.scale:.3g}) over {len(self.outputs)} output(s)"
        )


def verify_equivalent(
    before: Graph, after: Graph, inputs: Sequence[torch.Tensor] | None = None, *, seed: int = 0, trials: int = 1
) -> EquivalenceReport:
    """Run both graphs on the same inputs (given, or ``trials`` random draws) and compare outputs.

    Shapes and dtypes must be equal; numbers must agree within the per-dtype
    tolerance (TOLERANCE). Graphs with meta-device constants cannot be compared.
    """
    report = EquivalenceReport()
    in_b, in_a = [v.type for v in before.inputs], [v.type for v in after.inputs]
    if len(in_b) != len(in_a) or any(not x.same_shape_dtype(y) for x, y in zip(in_b, in_a)):
        report.problem = f"inputs differ: {[str(t) for t in in_b]} vs {[str(t) for t in in_a]}"
        return report
    if len(before.outputs) != len(after.outputs):
        report.problem = f"{len(before.outputs)} outputs vs {len(after.outputs)}"
        return report
    if any(v.data is not None and not v.has_known_data for g in (before, after) for v in g.constants()):
        report.problem = "a graph holds meta-device constants (no values): capture with real weights to compare"
        return report
    draws = [list(inputs)] if inputs is not None else [random_inputs(in_b, seed + k) for k in range(trials)]
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
