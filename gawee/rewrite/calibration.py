"""Calibration: the range each convolution input takes on example batches, put into the graph as
``calibrated(x, low=..., high=...)`` nodes for the rules that choose a fixed quantization scale
(rules/precision/int8.rules).

A measurement, not a rewrite: the reference interpreter runs the graph as it stands when a phase that reads
``calibrated`` begins (:func:`gawee.rewrite.driver.rewrite` with ``calibration=``), so the ranges are those of
the values the phase's rules see. The annotation is the identity, and the rules that read it are sound for any
range (their bounds hold where the data leaves it): calibration decides how accurate the result is, never
whether a bound holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from gawee.errors import EvaluationError, GaweeError
from gawee.interp import run_observed
from gawee.ir.core import Graph, Node, Value
from gawee.ir.types import DType

READS = {"conv2d": ((0, 3), 4)}
"""The ops whose float32 operands (by index) of one rank calibration annotates: a 4-D convolution's input and the
residual it adds. The int8 rules quantize an input with its range, and requantize a convolution whose result is read
only through the annotation — as the next one's input or residual — to that range's grid."""

CLASSIFIER = {"linear": ((0,), 2)}
"""Operands annotated as READS's are, in a graph where READS annotates some: a linear layer's 2-D input, a CNN's
classifier, which the int8 rules then quantize statically as its convolutions (NNCF's int8 models do). Elsewhere (an
MLP, a transformer) linear layers keep the dynamic quantization of ONNX Runtime's ``quantize_dynamic``."""


@dataclass(frozen=True)
class Calibration:
    """Batches of a graph's inputs to calibrate on, and where they came from (for reports)."""

    batches: tuple[tuple[torch.Tensor, ...], ...]
    source: str
    """What the batches are, e.g. "4 calibration batches" or "the example inputs (no calibration data given)"."""

    @classmethod
    def of(cls, batches: Iterable, source: str) -> Calibration:
        """From an iterable of batches, each a tensor or a sequence of tensors (the graph's inputs in order);
        GaweeError for an empty iterable or a batch of something else."""
        kept = []
        for i, batch in enumerate(batches):
            items = (
                (batch,) if isinstance(batch, torch.Tensor) else tuple(batch) if isinstance(batch, Sequence) else None
            )
            if items is None or not all(isinstance(t, torch.Tensor) for t in items):
                raise GaweeError(
                    f"calibration batch {i} is a {type(batch).__name__}",
                    hint="pass an iterable of batches, each a tensor or a tuple of tensors (the model's inputs)",
                )
            kept.append(tuple(t.detach() for t in items))
        if not kept:
            raise GaweeError("the calibration data has no batches", hint="pass at least one batch of inputs")
        return cls(tuple(kept), source)

    def ranges(self, graph: Graph, values: Sequence[Value]) -> dict[Value, tuple[float, float]]:
        """[min, max] of each of ``values`` over every batch (0 included), for the values whose every element
        was finite on every batch; EvaluationError (naming the batch and what failed) where a batch does not run."""
        lows: dict[Value, float] = {}
        highs: dict[Value, float] = {}
        skip: set[Value] = set()
        for i, batch in enumerate(self.batches):
            try:
                _, seen = run_observed(graph, batch, values)
            except EvaluationError as e:
                raise EvaluationError(
                    f"calibration ({self.source}), batch {i}: {e.message}",
                    hint="each calibration batch gives the model's inputs as the example inputs do, with the "
                    "same dtypes and shapes (but for dimensions marked dynamic)",
                ) from e
            for v, t in seen.items():
                if v in skip or t.numel() == 0:
                    continue
                lo, hi = float(t.min()), float(t.max())
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    skip.add(v)
                    continue
                lows[v] = min(lows.get(v, 0.0), lo)
                highs[v] = max(highs.get(v, 0.0), hi)
        return {v: (lows[v], highs[v]) for v in values if v in lows and v not in skip}


def calibrate(graph: Graph, calibration: Calibration) -> int:
    """Put a ``calibrated`` node in ``graph`` (in place) before the first reader of each float32 value that an op
    of READS (and, where there is one, of CLASSIFIER) reads at an annotated operand, and make those readers read it
    there; returns how many were put in.
    Values already read through a ``calibrated`` node, constants, and values that were empty or not finite on a
    batch are left as they are."""
    readers = _readers(graph, READS)
    if not readers:
        return 0
    for v, nodes in _readers(graph, CLASSIFIER).items():
        readers.setdefault(v, []).extend(nodes)
    ranges = calibration.ranges(graph, list(readers))
    for v, nodes in readers.items():
        if v not in ranges:
            continue
        low, high = ranges[v]
        mark = graph.create_node(
            "calibrated",
            [v],
            {"low": low, "high": high},
            name=f"{v.name}.calibrated",
            source="calibration",
            before=min((node for node, _ in nodes), key=graph.position),
        )
        for node, slot in nodes:
            node.set_input(slot, mark.output)
    return len(ranges)


def _readers(graph: Graph, reads: dict[str, tuple[tuple[int, ...], int]]) -> dict[Value, list[tuple[Node, int]]]:
    """Each float32 value not annotated yet that an op of ``reads`` reads at one of its slots with its rank ->
    (reader, slot) in graph order."""
    readers: dict[Value, list[tuple[Node, int]]] = {}
    for node in graph:
        slots, rank = reads.get(node.op, ((), 0))
        for slot in slots:
            v = node.inputs[slot] if slot < len(node.inputs) else None
            if v is None or v.is_const or v.dtype is not DType.f32 or v.type.rank != rank:
                continue
            if v.producer is not None and v.producer.op == "calibrated":
                continue
            readers.setdefault(v, []).append((node, slot))
    return readers


def reads_calibration(rules: Iterable) -> bool:
    """Whether any of ``rules`` (compiled rules) matches a ``calibrated`` node in one of its patterns (kept rules
    whose text does not name it stay uncompiled: :meth:`gawee.dsl.check_cache.LazyRule.names_op`)."""
    return any(rule.names_op("calibrated") for rule in rules)
