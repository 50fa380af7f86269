"""The activation layout a graph's convolutions run in: a rules phase, applied when it measures faster here.

The layout decision itself is written as rules: ``rules/layout/channels_last.rules`` (not a default
phase) converts each 4-D convolution's input to channels-last (NHWC) and its output back with
``to_layout`` nodes, sinks the conversions through ops that do not care about layout and cancels
them, so only the graph's edges convert; the soundness harness checks it like any other rules.
Whether it pays depends on the CPU and on the model: oneDNN's fused convolution
(``mkldnn._convolution_pointwise``) reorders NCHW activations into its blocked layout inside every
call and runs NHWC ones directly; convolutions timed alone on one AMD EPYC ran up to 2× faster
channels-last, yet whole mobilenet_v3_large took the same time either way. So :func:`choose`
lowers the graph without and with the phase, times the two modules in alternation on random inputs
of the graph's input types within a small budget (:func:`gawee.backend.measure.fastest`), and keeps
the phase only when it wins by more than :data:`MARGIN` — a noisy tie keeps NCHW. The
:class:`LayoutChoice` (both timings) is listed in the compile report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gawee.backend.measure import fastest
from gawee.ir.core import Graph
from gawee.rewrite.ruleset import RULES_DIR, RuleSet, load_rules

PHASE = RULES_DIR / "layout" / "channels_last.rules"
"""The bundled layout phase (``gawee-rewrite optimize --rules rules/ --rules rules/layout/`` applies it)."""

MARGIN = 0.05
"""Channels-last must be this much faster (a fraction of NCHW's time) to be chosen."""


@dataclass(frozen=True)
class LayoutChoice:
    """The activation layout picked for a graph and what each candidate measured (median seconds per call)."""

    layout: str
    """``"contiguous"`` (NCHW) or ``"channels_last"``."""
    contiguous_s: float
    channels_last_s: float
    convolutions: int
    """4-D convolutions in the graph (the kernels the choice is about)."""

    def __str__(self) -> str:
        return (
            f"activations {self.layout} for {self.convolutions} convolutions "
            f"(NCHW {self.contiguous_s * 1e3:.2f} ms, channels-last {self.channels_last_s * 1e3:.2f} ms per call)"
        )


def convolutions(graph: Graph) -> int:
    """The 4-D float convolutions of ``graph``: the nodes whose kernel depends on the activation layout."""
    return sum(
        1
        for n in graph
        if n.op == "conv2d" and n.inputs[0] is not None and n.inputs[0].type.rank == 4 and n.inputs[0].dtype.is_float
    )


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


def choose(graph: Graph, build: Callable[[Graph], torch.nn.Module]) -> tuple[torch.nn.Module, LayoutChoice | None]:
    """The faster of ``build(graph)`` and ``build(channels_last(graph))``, and the measurement;
    ``(build(graph), None)`` when the graph has no 4-D float convolution."""
    count = convolutions(graph)
    nchw = build(graph)
    if not count:
        return nchw, None
    from gawee.equivalence import random_inputs

    nhwc = build(channels_last(graph))
    xs = random_inputs([v.type for v in graph.inputs], seed=0)
    timed = fastest({"contiguous": nchw, "channels_last": nhwc}, xs, margin=MARGIN)
    choice = LayoutChoice(timed.chosen, timed.seconds["contiguous"], timed.seconds["channels_last"], count)
    return (nhwc if timed.chosen == "channels_last" else nchw), choice
