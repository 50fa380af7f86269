"""One interface for the runtimes :func:`gawee.compile` hands a rewritten graph to, and their registry.

A :class:`Runtime` says why it cannot run on this machine (:meth:`Runtime.unavailable`), why it cannot run a given
graph (:meth:`Runtime.cannot_run`), and builds a module of a graph that takes and returns torch tensors
(:meth:`Runtime.build`). Its adapter lives in its own backend module (``RUNTIME`` there); the registry holds one
record per runtime — its name and that module, loaded on first use — in the order ``backend="auto"`` tries them.
``gawee.compile`` selects through this module only: adding a runtime is its module plus one line of
:data:`BUILTIN` (or one :func:`register` call from outside gawee), and its target rule phase
(:attr:`Runtime.rules`: the fusions it executes as one step, as rules under ``rules/targets/<name>/``).
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gawee.errors import GaweeError
from gawee.ir.core import Graph
from gawee.rewrite.driver import RewriteReport, rewrite
from gawee.rewrite.ruleset import RuleSet, target_rules, variant_rules


@dataclass(frozen=True)
class Alternatives:
    """The modules a runtime's :meth:`Runtime.build` would time against each other and choose from (the torch
    lowering's activation layouts), built and left unmeasured for a caller that times them beside other candidates
    anyway (the default compile's whole-graph choice): one measurement instead of two."""

    modules: dict[str, Callable]
    """Name → module; the first is the default, kept unless another measures faster."""
    chosen: Callable[[str, dict[str, float]], Callable]
    """``chosen(name, seconds)``: the module named, with the runtime's record of the choice made from each
    alternative's median seconds per call (``seconds``, by name)."""
    settle: Callable[[Sequence[torch.Tensor]], tuple[str, Callable]]
    """``settle(example_inputs)``: the alternatives timed against each other the runtime's own way, as
    :meth:`Runtime.build` would; the name and module chosen."""


class Runtime(ABC):
    """A runtime of rewritten graphs: what it is called, where it can run, and how its module is built."""

    name: str = ""
    """``gawee.compile(backend=name)``, and its key in reports (``BackendChoice``)."""
    title: str = ""
    """What messages call it (``"oneDNN's primitives"``)."""
    cpu_only: bool = True
    """It runs on the CPU only: refused for a model on another device (``auto`` says why it left it out)."""
    variants: tuple[str, ...] = ()
    """Ways to build it that are measured against each other (``backend="name:variant"`` fixes one; by its name
    alone the fastest is kept, the first unless another is more than 5% faster)."""
    isolated: bool = False
    """It runs native code on the graph that could abort the process: it is built and first run in a child process
    (:mod:`gawee.backend.isolation`), and here only once that child survived."""
    auto: bool = True
    """``backend="auto"`` measures it against the torch lowering."""
    whole_graph: bool = False
    """The default compile measures it against the torch lowering too (``TorchOptions.whole_graph``: it shares
    torch's threads, so no pause is needed between them)."""
    options: tuple[str, ...] = ()
    """The keyword options of ``gawee.compile`` that :meth:`build` takes (``mlir_path`` for IREE)."""
    mismatch_hint: str = 'compile with backend="torch", and report the model'
    """The hint of the error raised when its outputs differ from the model's."""
    target: str | None = None
    """The name of its bundled target phase (``rules/targets/<target>/``), or None: :attr:`rules`."""

    @property
    def rules(self) -> RuleSet | None:
        """Its target phase: the fusions it executes as one step, written as rules that produce its target ops
        (:mod:`gawee.ops.targets`), checked by the harness like any others. ``gawee.compile`` runs it on the
        rewritten graph before :meth:`build` (:meth:`lower`). A runtime may return its own RuleSet."""
        return None if self.target is None else target_rules(self.target)

    def variant_rules(self, variant: str) -> RuleSet | None:
        """The phase that makes its ``variant`` (one of :attr:`variants`) from the graph after its target phase:
        that variant's decisions written as rules (``rules/targets/<target>/variants/<variant>.rules``: oneDNN's
        activation layouts), or None where the variant has none. The whole-graph choice times the variants' modules
        against each other, and the report names the rules of the one that won (``BackendChoice.target_rules``)."""
        return None if self.target is None else variant_rules(self.target, variant)

    def lower(self, graph: Graph, variant: str = "") -> tuple[Graph, RewriteReport | None]:
        """``graph`` with :attr:`rules` applied (a new graph; ``graph`` itself unchanged) and the rewrite's report;
        ``graph`` itself and None where there is no target phase. With ``variant``: ``graph`` (already through the
        target phase) with that variant's phase applied instead (:meth:`variant_rules`)."""
        rules = self.variant_rules(variant) if variant else self.rules
        if rules is None:
            return graph, None
        return rewrite(graph, rules)

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why it cannot run on this machine (not installed, a CPU feature missing), or None."""

    def cannot_run(self, graph: Graph) -> str | None:
        """Why it cannot run ``graph`` (an op it lacks, symbolic shapes, a dtype), or None. Not asked when
        :meth:`unavailable` gave a reason; the device is checked apart (:attr:`cpu_only`)."""
        return None

    def unpromising(self, graph: Graph) -> str | None:
        """Why a measured choice need not build it for ``graph`` (after its target phase: :meth:`lower`), which it
        could run (it would hand most of the work back to torch), or None."""
        return None

    @abstractmethod
    def build(
        self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, output_structure: Any = None, **options
    ) -> Callable:
        """A module computing ``graph``: called with its inputs (by position or by name), it returns its outputs
        (a tuple, or nested as ``output_structure``). ``options``: ``variant`` (one of :attr:`variants`) and those
        of :attr:`options`. Raises GaweeError (or the runtime's own error) when it cannot build one."""

    def alternatives(self, graph: Graph, example_inputs: Sequence[torch.Tensor], **options) -> Alternatives | None:
        """The modules :meth:`build` (with the same arguments) would measure and choose between, built, unmeasured;
        None where it measures nothing (then :meth:`build` it)."""
        return None

    def builds(
        self, graph: Graph, example_inputs: Sequence[torch.Tensor], *, shared: dict | None = None, **options
    ) -> tuple[Callable[[], Callable], Callable[[], Callable]]:
        """How to build the module here and in a trial process (:attr:`isolated`): by default both
        :meth:`build`. A runtime whose build does work once that both can share (a compile) does it here.
        ``shared``: a dict the builds of this runtime's variants in one selection are given alike, where a build
        may keep work another can reuse (ignored by default)."""
        build = functools.partial(self.build, graph, example_inputs, **options)
        return build, build

    def unavailable_error(self, why: str) -> Exception:
        """The error ``gawee.compile`` raises when it is asked for by name and :meth:`unavailable` says ``why``."""
        return GaweeError(f"{self.title or self.name} cannot run on this machine: {why}", hint='use backend="torch"')

    def __repr__(self) -> str:
        return f"<runtime {self.name}>"


BUILTIN: tuple[tuple[str, str], ...] = (
    ("torch", "gawee.backend.torch_backend"),
    ("onednn", "gawee.backend.dnnl"),
    ("onednn_graph", "gawee.backend.onednn_graph"),
    ("onnxruntime", "gawee.backend.ort"),
    ("iree", "gawee.backend.iree"),
)
"""gawee's runtimes, in the order ``auto`` tries them: each its name and the module whose ``RUNTIME`` it is. The
first is the baseline: what ``auto`` keeps unless another measures faster."""

_records: dict[str, Runtime | str] = dict(BUILTIN)
"""The registry: name → the runtime, or the module that holds it (loaded on first use)."""


def register(runtime: Runtime) -> None:
    """Register ``runtime`` after the others (``auto`` tries it last); GaweeError if its name is taken or has a
    colon (which separates a variant)."""
    if not runtime.name or ":" in runtime.name or runtime.name == "auto":
        raise GaweeError(f"a runtime cannot be named {runtime.name!r}", hint="set Runtime.name to a word")
    if runtime.name in _records:
        raise GaweeError(f"a runtime named {runtime.name!r} is registered already", hint="pick another name")
    _records[runtime.name] = runtime


def unregister(name: str) -> None:
    """Take the runtime ``name`` out of the registry (a built-in one too)."""
    _records.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered runtimes' names, in the order ``auto`` tries them (nothing is loaded)."""
    return tuple(_records)


def get(name: str) -> Runtime | None:
    """The runtime ``name``, loaded; None when none is registered so."""
    record = _records.get(name)
    if isinstance(record, str):
        record = importlib.import_module(record).RUNTIME
        if record.name != name:
            raise GaweeError(f"{_records[name]}.RUNTIME is named {record.name!r}, registered as {name!r}")
        _records[name] = record
    return record


def runtimes() -> list[Runtime]:
    """Every registered runtime, loaded, in the order ``auto`` tries them."""
    return [get(name) for name in names()]


def baseline() -> Runtime:
    """The first runtime: the one ``auto`` and the default compile keep unless another measures faster."""
    return get(names()[0])
