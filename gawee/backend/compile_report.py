"""What :func:`gawee.compile` reports: where its time went, what the rewrite and the checks found, and which runtime
it measured and chose (:class:`BackendChoice`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gawee.accuracy import Accuracy
from gawee.equivalence import EquivalenceReport, FiringError
from gawee.ir.core import Graph
from gawee.rewrite.driver import RewriteReport


@dataclass(frozen=True)
class BackendChoice:
    """The runtime ``backend="auto"`` (or the default compile's whole-graph choice) picked, with each candidate's
    median seconds per call, and why the runtimes that were no candidate were not. In the whole-graph choice the
    torch lowering may be two candidates, ``torch`` (NCHW) and ``torch:channels_last`` (its layout phase applied:
    :mod:`gawee.backend.layout`)."""

    chosen: str
    seconds: dict[str, float]
    not_candidates: dict[str, str] = field(default_factory=dict)
    """Runtime → why it was not measured (not installed, an op it cannot run, outputs that differ)."""
    target_rules: dict[str, int] = field(default_factory=dict)
    """The chosen runtime's target phase (:attr:`Runtime.rules`) and its variant's (:meth:`Runtime.variant_rules`:
    the rules that made the candidate that won): rule → times it fired on the graph built."""
    spent: dict[str, float] = field(default_factory=dict)
    """Where the choice's seconds went: the candidates' target phases, their trial processes, their builds
    (oneDNN's races of each convolution's kernels included) with their checks, and timing them against each other."""

    def __str__(self) -> str:
        times = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in self.seconds.items())
        text = f"{self.chosen} ({times} per call)" if times else self.chosen
        if self.target_rules:
            fired = ", ".join(f"{k} x{v}" for k, v in sorted(self.target_rules.items()))
            text += f"; its target rules fired: {fired}"
        if self.spent:
            text += "; choosing took " + ", ".join(f"{k} {v:.2f}s" for k, v in self.spent.items())
        if self.not_candidates:
            text += "; not measured: " + "; ".join(f"{k}: {v}" for k, v in self.not_candidates.items())
        return text


@dataclass
class CompileReport:
    """What :func:`compile` did and where its time went (seconds per stage)."""

    graph: Graph
    """The captured graph."""
    optimized: Graph
    """The rewritten graph that the module runs."""
    rewrite: RewriteReport
    equivalence: EquivalenceReport
    """The compiled rewritten graph against the model, on the example inputs (symbolic shapes: the captured
    against the rewritten graph at two other sizes)."""
    backend_error: float = 0.0
    """Largest difference between the module's outputs and the model's, on the example inputs."""
    seconds: dict[str, float] = field(default_factory=dict)
    """capture, rewrite, verify (both checks) and lower."""
    kernels: list = field(default_factory=list)
    """The kernel each distinct linear shape runs on and what the candidates measured
    (:class:`gawee.backend.kernels.KernelChoice`; torch backend)."""
    layout: object = None
    """The activation layout chosen for the convolutions and what both layouts measured
    (:class:`gawee.backend.layout.LayoutChoice`; torch backend, graphs with 4-D convolutions)."""
    kernel_seconds: float = 0.0
    """The part of ``lower`` spent timing candidate kernels (a shape measured earlier in the process is
    not measured again)."""
    backend: BackendChoice | None = None
    """What ``backend="auto"`` measured and chose, or for ``backend="torch"`` whether oneDNN Graph's whole-graph
    runtime was measured against the lowering and which ran faster (``TorchOptions.whole_graph``; None when off
    and for the other backends)."""
    allocator: str = ""
    """What was done to the process's memory allocator (``gawee.backend.allocator``; empty when
    ``TorchOptions.keep_freed_memory`` is False)."""
    precision: str | None = None
    """The precision phase that ran after the rules (``compile(precision=...)``), or None."""
    accuracy: Accuracy | None = None
    """With a precision phase: the module's outputs against the model's on the example inputs."""
    firing_errors: list[FiringError] = field(default_factory=list)
    """With a precision phase: the values its approximate rewrites made against the values they stand for on the
    example inputs, worst relative error first (:func:`gawee.equivalence.firing_errors`): which rewrites the
    error comes from."""
    precision_skipped: str = ""
    """Why the precision phase asked for did not run, or empty: bf16 on a device without bf16 arithmetic
    (:func:`gawee.machine.no_bf16`), where it would be slower than float32 as well as less exact."""
    calibration: str = ""
    """With a precision phase that reads calibrated ranges (int8's static convolutions): what it calibrated on and
    how many values; empty otherwise."""
    calibration_accuracy: Accuracy | None = None
    """With calibration data given: the module's outputs against the model's on those batches (the first
    :data:`gawee.backend.compiler.CALIBRATION_ACCURACY_BATCHES`), which the example inputs alone may not represent."""
    precision_timing: str = ""
    """With a precision phase measured against float32 (``TorchOptions.precision="measure"``): what each module
    took per call, and which was kept; empty where it was not measured."""

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def __str__(self) -> str:
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        text = (
            f"{self.graph.name}: {len(self.graph)} -> {len(self.optimized)} nodes, {self.rewrite.total} rewrites; "
            f"{self.equivalence}; backend max error {self.backend_error:.3g}; {stages}"
        )
        if self.kernels:
            text += f"; kernels (chosen in {self.kernel_seconds:.2f}s): " + "; ".join(str(k) for k in self.kernels)
        if self.layout is not None:
            text += f"; layout: {self.layout}"
        if self.backend is not None:
            text += f"; runtime: {self.backend}"
        if self.allocator:
            text += f"; {self.allocator}"
        if self.precision_skipped:
            text += f"; precision {self.precision_skipped}"
        if self.precision is not None:
            text += f"; precision {self.precision}: {self.accuracy}"
            if self.calibration:
                text += f"; {self.calibration}"
            if self.calibration_accuracy is not None:
                text += f"; on the calibration data: {self.calibration_accuracy}"
            if self.precision_timing:
                text += f"; {self.precision_timing}"
            if self.firing_errors:
                worst = "; ".join(str(e) for e in self.firing_errors[:3])
                text += f"; largest errors at approximate rewrites ({len(self.firing_errors)} values): {worst}"
        return text
