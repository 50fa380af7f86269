"""Runtime measurement: how long a module takes on this machine, and where the time of a compiled graph goes.

``time_call`` times any callable (median and spread over repeats, after warm-up). ``profile``
runs a module built by :func:`gawee.to_torch` with a timestamp taken after each of its kernels:
the generated code itself runs (no interpreter in between), so the per-node times add up to the
module's own time but for the cost of the timestamps. Each kernel's time goes to the gawee node
it was lowered from; nodes are grouped by op, and their FLOPs (from the cost model) are set
against the machine's peak as measured here by a large matrix multiply.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from gawee.analysis.cost import node_cost
from gawee.backend.allocator import keep_freed_memory
from gawee.backend.torch_backend import NODE_META
from gawee.ir.core import Graph
from gawee.ir.symbolic import at_example
from gawee.machine import Timing, cpu_info, cpu_name, time_call  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from gawee.backend.compile_report import BackendChoice


def peak_flops(n: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 FLOP/s as the fastest large matrix multiply gawee can call reaches it (torch's
    current threads): torch's own (MKL's sgemm) and the prepacked ones of MKL and oneDNN
    (:func:`gawee.backend.kernels.gemm_flops_per_s`). MKL alone takes a slower path on AMD CPUs, where torch's
    matmul measured about half of what oneDNN's convolutions ran at, which put them at "210% of peak"."""
    from gawee.backend.kernels import gemm_flops_per_s

    return max(gemm_flops_per_s(n, repeats).values())


@dataclass
class NodeTime:
    node: str
    op: str
    seconds: float
    """Median over the profiled calls."""
    flops: int | None

    @property
    def flops_per_s(self) -> float | None:
        return None if self.flops is None or self.seconds <= 0 else self.flops / self.seconds


@dataclass
class Profile:
    """Where a compiled module's time goes, per gawee node and per op."""

    nodes: list[NodeTime]
    """Every node that ran a kernel, in graph order."""
    total: Timing
    """The instrumented module's own time per call (the per-node times add up to it)."""
    peak_flops: float
    other_s: float = 0.0
    """Time of kernels that belong to no node (layout conversions at the inputs, contiguous outputs)."""
    by_op: dict[str, float] = field(default_factory=dict)

    @property
    def node_sum(self) -> float:
        return sum(n.seconds for n in self.nodes) + self.other_s

    def top(self, k: int = 10) -> list[NodeTime]:
        return sorted(self.nodes, key=lambda n: -n.seconds)[:k]

    def as_dict(self, k: int = 10) -> dict:
        return {
            "total": self.total.as_dict(),
            "node_sum_s": self.node_sum,
            "peak_flops_per_s": self.peak_flops,
            "by_op_s": dict(sorted(self.by_op.items(), key=lambda kv: -kv[1])),
            "top_nodes": [
                {"node": n.node, "op": n.op, "seconds": n.seconds, "flops": n.flops, "flops_per_s": n.flops_per_s}
                for n in self.top(k)
            ],
        }


class _Stamps:
    """Timestamps written by the instrumented module: slot i after kernel i."""

    def __init__(self, n: int, clock: Callable[[], float]):
        self.times = [0.0] * (n + 1)
        self.clock = clock

    def __call__(self, i: int, *_after) -> None:
        self.times[i] = self.clock()


def profile(
    module: torch.fx.GraphModule,
    graph: Graph,
    inputs: Sequence[torch.Tensor],
    *,
    repeats: int = 10,
    clock: Callable[[], float] = time.perf_counter,
) -> Profile:
    """Per-node times of ``module`` (built from ``graph`` by gawee.to_torch) on ``inputs``. The nodes are those of
    the graph the module was lowered from (``module.gawee_graph``): ``graph`` itself, or its rewrite by the layout
    phase, whose convolutions and conversions are other nodes.

    Each call is stamped by ``clock`` (seconds) before its first kernel and after each kernel; a kernel's time is
    the median over the calls of the difference of its two stamps, and ``total`` holds each call's first-to-last
    difference. Every figure comes from those same stamps, so the per-node times and ``other_s`` add up to the
    total whenever the calls are alike; the tests pass a deterministic clock to check that arithmetic."""
    lowered = getattr(module, "gawee_graph", None)
    graph = graph if lowered is None else lowered
    fx = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    owners: list[str | None] = []
    """The gawee node of each kernel, in execution order."""
    for n in module.graph.nodes:
        env[n] = fx.node_copy(n, lambda a: env[a])
        if n.op in ("call_function", "call_method", "call_module"):
            owners.append(n.meta.get(NODE_META))
            fx.call_function(_stamp, (len(owners), env[n]))  # after the kernel: it takes its result
    stamps = _Stamps(len(owners), clock)
    _STAMPS.append(stamps)
    try:
        instrumented = torch.fx.GraphModule(module, fx)

        def call():
            stamps.times[0] = clock()
            instrumented(*inputs)

        runs: list[list[float]] = []
        totals: list[float] = []
        with torch.no_grad():
            for _ in range(3):
                call()
            for _ in range(repeats):
                call()
                t = stamps.times
                runs.append([t[i + 1] - t[i] for i in range(len(owners))])
                totals.append(t[-1] - t[0])
    finally:
        _STAMPS.remove(stamps)
    per_kernel = [statistics.median(r[i] for r in runs) for i in range(len(owners))]
    ops = {node.name: node for node in graph}
    seconds: dict[str, float] = defaultdict(float)
    other = 0.0
    for owner, s in zip(owners, per_kernel):
        if owner in ops:
            seconds[owner] += s
        else:
            other += s
    nodes = [
        NodeTime(name, ops[name].op, seconds[name], at_example(node_cost(ops[name]).flops))
        for name in ops
        if name in seconds
    ]
    by_op: dict[str, float] = defaultdict(float)
    for n in nodes:
        by_op[n.op] += n.seconds
    return Profile(nodes, Timing(totals), peak_flops(), other, dict(by_op))


_STAMPS: list[_Stamps] = []
"""The profiles being recorded (the instrumented code calls the innermost one)."""


def _stamp(i: int, *_after) -> None:
    _STAMPS[-1](i)


@dataclass
class RuntimeReport:
    """The model before (eager PyTorch, or the captured graph when there is no model) and compiled."""

    baseline: str
    """"eager" or "captured graph"."""
    before: Timing
    after: Timing
    profile: Profile
    cpu: str
    threads: int
    layout: str = ""
    """The activation layout the compiled module's convolutions run in and what it was chosen over
    (``gawee.backend.layout.LayoutChoice``; empty without convolutions)."""
    allocator: str = ""
    """What was done to the process's allocator before timing (``gawee.backend.allocator``), as gawee.compile does."""
    backend: BackendChoice | None = None
    """The runtime timed as "compiled": the torch lowering or oneDNN Graph's, as gawee.compile chooses, with what
    each measured (the profile is the torch lowering's)."""

    @property
    def speedup(self) -> float:
        return self.before.median / self.after.median

    @property
    def other_runtime(self) -> str | None:
        """The runtime timed as "compiled" when it is not the profiled torch lowering (oneDNN Graph's, or oneDNN's
        primitives')."""
        return None if self.backend is None or self.backend.chosen == "torch" else self.backend.chosen

    def summary(self) -> str:
        on = f" ({self.other_runtime})" if self.other_runtime else ""
        return f"{self.after.median * 1e3:.2f} ms{on}, {self.speedup:.2f}x vs {self.baseline}"

    def lines(self, k: int = 8) -> list[str]:
        """The report as text lines: both timings, then where the compiled module's time goes."""
        p = self.profile
        peak = p.peak_flops
        out = [
            f"runtime on {self.cpu}, {self.threads} thread(s): {self.baseline} {self.before}; "
            f"compiled {self.after}; {self.speedup:.2f}x",
            f"profile{' of the torch lowering' if self.other_runtime else ''}: {p.node_sum * 1e3:.2f} ms in "
            f"{len(p.nodes)} nodes "
            f"(measured peak {peak / 1e9:.1f} GFLOP/s)",
        ]
        if self.backend is not None:
            out.insert(1, f"runtime compiled: {self.backend}")
        if self.layout:
            out.insert(1, f"layout: {self.layout}")
        if self.allocator:
            out.insert(1, f"allocator: {self.allocator}")
        total = p.node_sum or 1.0
        out.append(
            "  by op: "
            + ", ".join(
                f"{op} {s * 1e3:.2f} ms ({s / total:.0%})"
                for op, s in sorted(p.by_op.items(), key=lambda kv: -kv[1])[:k]
            )
        )
        for n in p.top(k):
            rate = n.flops_per_s
            speed = "" if rate is None else f", {rate / 1e9:.1f} GFLOP/s ({rate / peak:.0%} of peak)"
            out.append(f"  {n.node} ({n.op}): {n.seconds * 1e3:.3f} ms{speed}")
        return out

    def as_dict(self) -> dict:
        choice = self.backend
        return {
            "cpu": self.cpu,
            "threads": self.threads,
            "baseline": self.baseline,
            "before": self.before.as_dict(),
            "after": self.after.as_dict(),
            "speedup": self.speedup,
            "layout": self.layout,
            "allocator": self.allocator,
            "backend": None
            if choice is None
            else {"chosen": choice.chosen, "seconds": choice.seconds, "not_measured": choice.not_candidates},
            "profile": self.profile.as_dict(),
        }


def measure(
    optimized: Graph,
    inputs: Sequence[torch.Tensor],
    baseline: Callable[[], object],
    baseline_name: str = "eager",
    *,
    repeats: int = 20,
) -> RuntimeReport:
    """Time ``baseline()`` and what gawee.compile makes of the ``optimized`` graph on ``inputs`` — its torch
    lowering, or a whole-graph runtime where that computes ``baseline``'s outputs and measures faster
    (:func:`gawee.backend.compiler.whole_graph_choice`, which times the lowering's layouts beside the runtimes, as
    gawee.compile does) — and profile the torch lowering."""
    from torch.utils import _pytree as pytree

    from gawee.backend import runtime
    from gawee.backend.compiler import lowering_as_measured, whole_graph_choice

    allocator = keep_freed_memory()  # both timed with what gawee.compile does to the allocator
    xs = list(inputs)
    alternatives = runtime.baseline().alternatives(optimized, xs)
    with torch.no_grad():
        expected = [x for x in pytree.tree_leaves(baseline()) if isinstance(x, torch.Tensor)]
    compiled, choice, _ = whole_graph_choice(optimized, alternatives, None, xs, expected)
    module = lowering_as_measured(alternatives, compiled, choice, xs)
    before = time_call(baseline, repeats=repeats)
    after = time_call(lambda: compiled(*inputs), repeats=repeats)
    prof = profile(module, optimized, inputs, repeats=max(5, repeats // 2))
    layout = str(module.gawee_layout or "")
    threads = torch.get_num_threads()
    return RuntimeReport(baseline_name, before, after, prof, cpu_name(), threads, layout, allocator, choice)
