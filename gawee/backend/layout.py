"""The activation layout a graph's convolutions run in: a rules phase, applied when it measures faster here.

The layout decision itself is written as rules: ``rules/layout/channels_last.rules`` (not a default
phase) converts each 4-D convolution's input to channels-last (NHWC) and its output back with
``to_layout`` nodes, sinks the conversions through ops that do not care about layout and cancels
them, so only the graph's edges convert; the soundness harness checks it like any other rules.
Whether it pays depends on the CPU and on the model: oneDNN's fused convolution
(``mkldnn._convolution_pointwise``) reorders NCHW activations into its blocked layout inside every
call and runs NHWC ones directly; convolutions timed alone ran up to twice as fast channels-last,
yet whole mobilenet_v3_large took the same time either way. So :func:`choose`
lowers the graph without and with the phase, times the two modules in alternation on random inputs
of the graph's input types within a small budget (:func:`gawee.backend.measure.fastest`), and keeps
the phase only when it wins by more than :data:`MARGIN` — a noisy tie keeps NCHW. Where the
convolutions are under :data:`CONV_SHARE` of the graph's FLOPs (a vision transformer's patch
embedding) nothing is measured and NCHW kept. The :class:`LayoutChoice` (both timings, or why none)
is listed in the compile report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gawee.analysis.cost import node_cost
from gawee.backend.measure import fastest
from gawee.ir.core import Graph, Node
from gawee.rewrite.ruleset import RULES_DIR, RuleSet, load_rules

PHASE = RULES_DIR / "layout" / "channels_last.rules"
"""The bundled layout phase (``gawee-rewrite optimize --rules rules/ --rules rules/layout/`` applies it)."""

MARGIN = 0.05
"""Channels-last must be this much faster (a fraction of NCHW's time) to be chosen."""


CONV_SHARE = 0.01
"""Below this share of the graph's FLOPs in 4-D convolutions the layout is not measured: NCHW is kept.
Channels-last changes only the convolutions' kernels (and adds conversions), so to win by MARGIN they
would have to run MARGIN / CONV_SHARE = 5x slower per FLOP than the rest of the model. A vision
transformer's patch embedding is under 1% of vit_b_16's FLOPs, and building and timing the two whole-model
candidates for it was more than half of vit_b_16's compile."""


@dataclass(frozen=True)
class LayoutChoice:
    """The activation layout picked for a graph and what each candidate measured (median seconds per call)."""

    layout: str
    """``"contiguous"`` (NCHW) or ``"channels_last"``."""
    contiguous_s: float | None
    channels_last_s: float | None
    """Median seconds per call of each candidate; None when the choice was not measured (``conv_share``)."""
    convolutions: int
    """4-D convolutions in the graph (the kernels the choice is about)."""
    conv_share: float | None = None
    """Their share of the graph's FLOPs (None where a FLOP count is symbolic or missing)."""

    def __str__(self) -> str:
        if self.contiguous_s is None or self.channels_last_s is None:
            return (
                f"activations {self.layout} for {self.convolutions} convolutions (not measured: "
                f"{self.conv_share:.2%} of the FLOPs, under {CONV_SHARE:.0%})"
            )
        return (
            f"activations {self.layout} for {self.convolutions} convolutions "
            f"(NCHW {self.contiguous_s * 1e3:.2f} ms, channels-last {self.channels_last_s * 1e3:.2f} ms per call)"
        )


CONVOLUTIONS = frozenset({"conv2d", "conv2d_int8_static"})
"""The ops whose kernel depends on the activation layout (the layout phase converts their inputs)."""


def _is_convolution(n: Node) -> bool:
    x = n.inputs[0] if n.op in CONVOLUTIONS else None
    return x is not None and x.type.rank == 4 and x.dtype.is_float


def convolutions(graph: Graph) -> int:
    """The 4-D float convolutions of ``graph``: the nodes whose kernel depends on the activation layout."""
    return sum(1 for n in graph if _is_convolution(n))


def conv_share(graph: Graph) -> float | None:
    """The 4-D float convolutions' share of ``graph``'s FLOPs; None when a count is symbolic or the graph has none."""
    conv = total = 0
    for n in graph:
        flops = node_cost(n).flops
        if flops is None:
            continue
        if not isinstance(flops, int):
            return None
        total += flops
        conv += flops if _is_convolution(n) else 0
    return conv / total if total else None


def phase() -> RuleSet:
    """The layout phase's rules, compiled once per process (again only if the file changed)."""
    return _phase(PHASE.stat().st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _phase(stamp: int) -> RuleSet:
    return load_rules(PHASE)


def channels_last(graph: Graph) -> Graph:
    """``graph`` with the layout phase applied: its convolutions on channels-last activations."""
    from gawee.rewrite.driver import rewrite

    return rewrite(graph, phase())[0]


@dataclass
class Candidates:
    """The lowerings of a graph in the layouts left to measure, not yet measured (:func:`candidates`): NCHW alone
    (nothing to measure: no 4-D float convolution, or under :data:`CONV_SHARE` of the FLOPs), or NCHW and
    channels-last. :meth:`settle` times them against each other; a caller that times them beside other candidates
    anyway (``gawee.compile``'s whole-graph choice) says which won with :meth:`chosen`, one measurement instead of
    two."""

    modules: dict[str, torch.nn.Module]
    """``"contiguous"`` (the default, first), and ``"channels_last"`` when the choice is measured."""
    convolutions: int
    conv_share: float | None = None
    unmeasured: LayoutChoice | None = None
    """The choice when there is nothing to measure (None: no convolution)."""

    @property
    def measured(self) -> bool:
        """Whether there are two layouts to time."""
        return len(self.modules) > 1

    def chosen(self, layout: str, seconds: dict[str, float]) -> tuple[torch.nn.Module, LayoutChoice | None]:
        """The module in ``layout`` and the choice, from the median ``seconds`` per call of both layouts (by layout
        name) measured elsewhere; the NCHW module and its unmeasured choice where nothing was to be measured."""
        if not self.measured:
            return self.modules["contiguous"], self.unmeasured
        choice = LayoutChoice(
            layout, seconds["contiguous"], seconds["channels_last"], self.convolutions, self.conv_share
        )
        return self.modules[layout], choice

    def settle(self, xs: list[torch.Tensor]) -> tuple[torch.nn.Module, LayoutChoice | None]:
        """The faster of the two on the inputs ``xs`` (channels-last only when faster by :data:`MARGIN`)."""
        if not self.measured:
            return self.chosen("contiguous", {})
        timed = fastest(self.modules, xs, margin=MARGIN)
        return self.chosen(timed.chosen, timed.seconds)


def candidates(graph: Graph, build: Callable[[Graph], torch.nn.Module]) -> Candidates:
    """``build(graph)``, and ``build(channels_last(graph))`` where the choice is to be measured (see
    :class:`Candidates`)."""
    count = convolutions(graph)
    nchw = build(graph)
    if not count:
        return Candidates({"contiguous": nchw}, 0)
    share = conv_share(graph)
    if share is not None and share < CONV_SHARE:
        return Candidates({"contiguous": nchw}, count, share, LayoutChoice("contiguous", None, None, count, share))
    return Candidates({"contiguous": nchw, "channels_last": build(channels_last(graph))}, count, share)


def choose(graph: Graph, build: Callable[[Graph], torch.nn.Module]) -> tuple[torch.nn.Module, LayoutChoice | None]:
    """The faster of ``build(graph)`` and ``build(channels_last(graph))`` on random inputs of the graph's input
    types, and the measurement; ``(build(graph), None)`` when the graph has no 4-D float convolution,
    ``build(graph)`` unmeasured when they are under CONV_SHARE of its FLOPs."""
    found = candidates(graph, build)
    if not found.measured:
        return found.settle([])
    from gawee.equivalence import random_inputs

    return found.settle(random_inputs([v.type for v in graph.inputs], seed=0))
