"""The activation layout a graph's convolutions run in, chosen by measurement on this machine.

oneDNN's fused convolution (``mkldnn._convolution_pointwise``) takes NCHW or channels-last
(NHWC) activations; with NCHW it reorders into its own blocked layout and back inside every
call, with channels-last it runs NHWC kernels directly. Which is faster depends on the CPU
and on the model: convolutions timed alone on one AMD EPYC ran up to 2× faster channels-last,
yet whole mobilenet_v3_large took the same time either way (the SE blocks' reductions and
the layout's effect on the neighbouring kernels eat the gain). So the choice is measured on
the graph itself: :func:`choose` lowers the graph both ways, times the two modules
interleaved on random inputs of the graph's input types within a small budget, and keeps
channels-last only when it wins by more than :data:`MARGIN` — a noisy tie keeps NCHW, the
layout of the model's own inputs and outputs (no conversions at the edges).
The :class:`LayoutChoice` (both timings) is listed in the compile report.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gawee.ir.core import Graph

MARGIN = 0.05
"""Channels-last must be this much faster (a fraction of NCHW's time) to be chosen."""

BUDGET_S = 0.3
"""Time spent timing the two modules (at least :data:`MIN_ROUNDS` and at most :data:`MAX_ROUNDS` rounds)."""

MIN_ROUNDS = 3
MAX_ROUNDS = 25


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


def choose(graph: Graph, build: Callable[[bool], torch.nn.Module]) -> tuple[torch.nn.Module, LayoutChoice | None]:
    """The module ``build(channels_last)`` for the faster layout of ``graph``'s convolutions, and the
    measurement; ``(build(False), None)`` when the graph has no 4-D float convolution."""
    count = convolutions(graph)
    nchw = build(False)
    if not count:
        return nchw, None
    from gawee.equivalence import random_inputs

    nhwc = build(True)
    xs = random_inputs([v.type for v in graph.inputs], seed=0)
    times: dict[bool, list[float]] = {False: [], True: []}
    modules = {False: nchw, True: nhwc}
    with torch.no_grad():
        for m in modules.values():  # first calls: oneDNN's primitive creation is nobody's time
            m(*xs)
            m(*xs)
        start = time.perf_counter()
        rounds = 0
        while rounds < MIN_ROUNDS or time.perf_counter() - start < BUDGET_S:
            for cl, m in modules.items():  # interleaved: drift of a shared machine hits both
                t0 = time.perf_counter()
                m(*xs)
                times[cl].append(time.perf_counter() - t0)
            rounds += 1
            if rounds >= MAX_ROUNDS:
                break
    contiguous_s, channels_last_s = statistics.median(times[False]), statistics.median(times[True])
    wins = channels_last_s < contiguous_s * (1 - MARGIN)
    choice = LayoutChoice("channels_last" if wins else "contiguous", contiguous_s, channels_last_s, count)
    return (nhwc if wins else nchw), choice
