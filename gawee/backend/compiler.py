"""gawee.compile: a model and example inputs become an equivalent, faster module (capture, rewrite, verify, lower)."""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from gawee.accuracy import Accuracy, compare_outputs
from gawee.backend import isolation, runtime
from gawee.backend.allocator import keep_freed_memory
from gawee.backend.compile_report import BackendChoice, CompileReport
from gawee.backend.host import OutputStructure
from gawee.backend.isolation import Tried
from gawee.backend.runtime import Alternatives, Runtime
from gawee.backend.torch_backend import TorchOptions
from gawee.equivalence import (
    TOLERANCE,
    EquivalenceReport,
    OutputCheck,
    approximate_values,
    firing_errors,
    output_error,
    random_inputs,
    verify_equivalent,
)
from gawee.errors import EquivalenceError, GaweeError, first_line
from gawee.frontend.capture import capture, example_args
from gawee.ir.core import Graph
from gawee.ir.symbolic import draw_values, example_values, symbols_of
from gawee.ir.types import DType, TensorType
from gawee.machine import no_bf16
from gawee.rewrite.calibration import Calibration
from gawee.rewrite.driver import RewriteReport, rewrite
from gawee.rewrite.ruleset import RuleSet, with_precision

logger = logging.getLogger(__name__)


def compile(
    model: torch.nn.Module,
    example_inputs: torch.Tensor | Sequence | Mapping[str, Any],
    rules: RuleSet | None = None,
    *,
    options: TorchOptions | None = None,
    backend: str = "torch",
    mlir_path: str | os.PathLike | None = None,
    vmfb_path: str | os.PathLike | None = None,
    dynamic_shapes=None,
    precision: str | None = None,
    calibration: Iterable | None = None,
):
    """``model`` captured on ``example_inputs`` (a tensor, a tuple or list of the model's positional inputs, or a dict
    of its keyword inputs: :func:`gawee.capture`), rewritten by ``rules`` (default: the bundled ones),
    checked, and lowered by :func:`gawee.to_torch`: an inference module for inputs of these shapes and dtypes.
    The whole-graph runtimes of the same graph — oneDNN Graph's compiled partitions, and oneDNN's primitives
    created once in each activation layout (:mod:`gawee.backend.dnnl`) — are built and timed against the lowered
    module too, where measuring them costs at most as long as the compile took so far
    (:data:`WHOLE_GRAPH_SHARE`), and the fastest is returned instead where it computes the model's outputs and
    measures more than 5% faster (``TorchOptions.whole_graph``; the measurement is ``module.gawee_report.backend``).
    Before anything is measured, the process's allocator is set to keep the memory a call frees for the next call
    (``TorchOptions.keep_freed_memory``, :mod:`gawee.backend.allocator`: process-wide, so the next call's writes do
    not fault fresh pages in).

    ``backend="onnxruntime"`` runs the rewritten graph, exported by :func:`gawee.to_onnx`, on an ONNX
    Runtime session with all of ORT's optimizations (:class:`gawee.backend.ort.OrtModule`; static
    shapes). ``backend="onednn_graph"`` traces the rewritten graph and lets oneDNN Graph compile it into
    fused partitions (:class:`gawee.backend.onednn_graph.OneDNNGraphModule`; static float32 shapes).
    ``backend="onednn"`` plans it into oneDNN's primitives (:class:`gawee.backend.dnnl.DnnlModule`; static shapes,
    float32, bf16 and int8 convolutions), with the activation layout measured (``"onednn:blocked"``,
    ``"onednn:channels_last"`` or ``"onednn:per_conv"`` fixes it).
    ``backend="auto"`` builds the torch lowering and, where they are available and can run the graph,
    those three as well, times them on this machine and keeps the torch lowering unless another is more
    than 5% faster (the measurement is ``module.gawee_report.backend``): which kernels win depends on the
    CPU (:mod:`gawee.backend.ort`, :mod:`gawee.backend.onednn_graph`, :mod:`gawee.backend.dnnl`).
    Every backend is a runtime of the registry (:mod:`gawee.backend.runtime`), selected through its interface:
    ``auto`` measures those registered as its candidates (:attr:`Runtime.auto`), in the registry's order.

    ``backend="iree"`` lowers the rewritten graph to StableHLO instead (:func:`gawee.to_mlir`) and
    compiles it with IREE for the host CPU: the result is a :class:`gawee.backend.iree.IreeModule`,
    a callable taking and returning torch tensors. ``mlir_path`` and ``vmfb_path`` (iree only) also
    write the module's text and the compiled flatbuffer, each atomically. IREE is an optional extra:
    without it this raises ModuleNotFoundError saying how to install it (``pip install 'gawee[iree]'``).

    One check runs on the example inputs: the module (the rewritten graph, lowered) against the model
    itself, within the per-dtype tolerance. Only when it fails are the captured and rewritten graphs
    interpreted (:func:`gawee.verify_equivalent`), to say whether the rewrite or the lowering is at
    fault; ``gawee-rewrite optimize`` checks each rewrite more thoroughly (:func:`gawee.verify_rewrite`).
    Whichever runtime it is, the module takes the model's inputs by position or by name, checks them on every
    call (:class:`gawee.backend.host.InputSignature`: InputError or ShapeOutOfRange naming the input), returns
    what the model returns (:class:`gawee.backend.host.OutputStructure`: same nesting, same classes) and
    carries a :class:`CompileReport` as ``module.gawee_report``. The model is put in eval
    mode and its weights are frozen into the module: later edits to them are not seen.
    The runtimes that run native code a crash of which would take the process down (:attr:`Runtime.isolated`) are built
    and run in a child process first, and built here only once it survived: a runtime whose child died is no
    candidate (the report says why), one asked for by name raises GaweeError.
    Raises CaptureError when torch.export cannot capture the model (or ``example_inputs`` is not a tensor, a tuple
    or list, or a dict) and EquivalenceError when a check fails.

    ``dynamic_shapes`` (torch.export's spec, e.g. ``{"x": {0: torch.export.Dim("batch", max=64)}}``)
    makes the marked dimensions symbolic: the module then runs every size in their ranges without
    capturing again, and raises ``ShapeOutOfRange`` for a size outside them. The rewritten graph is
    also checked at the two smallest sizes in range other than the example's.

    ``precision`` (``"bf16"``, ``"int8"``: :data:`gawee.rewrite.ruleset.PRECISIONS`) runs that bundled precision
    phase after ``rules``: approximate rules, each with its declared error bound, that compute in lower precision
    (int8 linear layers run torch's dynamic quantized kernel). bf16 runs only on a device with bf16 arithmetic
    (:func:`gawee.machine.no_bf16`: AVX512-BF16 or AMX on x86): elsewhere the model stays in float32 and the report
    says why (``CompileReport.precision_skipped``). The outputs they reach are not held to the
    tolerance by the check (they are counted in its report), and the report says how far the module's outputs
    are from the model's on the example inputs (``CompileReport.accuracy``). Where they reach an output, another
    runtime of the same graph (the whole-graph runtimes: oneDNN's primitives run bf16 and int8 convolutions) is a
    candidate only where its outputs are as close to the model's as the torch lowering's are, within
    :data:`APPROXIMATE_SLACK` (:func:`_approximate_bounds`), and, with symbolic shapes, the rewritten graph is not
    checked at other sizes (that check holds every output to the tolerance).
    int8 also quantizes convolutions statically, with each input's scale fixed from the range it takes on
    ``calibration`` (an iterable of batches, each given as ``example_inputs`` is; default: the example inputs
    alone, which the report says): :mod:`gawee.rewrite.calibration`. With calibration data, the report also
    compares the module with the model on it (``CompileReport.calibration_accuracy``).
    """
    name, _, variant = backend.partition(":")
    chosen = runtime.baseline() if name == "auto" else runtime.get(name)
    if chosen is None or (variant and (name == "auto" or variant not in chosen.variants)):
        known = [*runtime.names(), "auto", *(f"{r.name}:{v}" for r in runtime.runtimes() for v in r.variants)]
        hint = "backend is one of " + ", ".join(map(repr, known))
        if chosen is runtime.baseline() and name != "auto":  # a name the whole-graph choice reports (its alternatives)
            hint = (
                f'{name} takes no variant: "{backend}" in a report names one of the modules it measures itself; '
                f"TorchOptions(channels_last=True or False) fixes its layout. Else {hint}"
            )
        raise GaweeError(f"unknown backend {backend!r}", hint=hint)
    options = options or TorchOptions()
    if options.whole_graph not in ("measure", False):
        raise GaweeError(
            f"TorchOptions.whole_graph is {options.whole_graph!r}",
            hint='pass "measure" or False (backend="onednn_graph" runs oneDNN Graph\'s runtime always)',
        )
    given = {"options": options, "mlir_path": mlir_path, "vmfb_path": vmfb_path}
    foreign = [k for k, v in given.items() if v is not None and k not in chosen.options and k != "options"]
    if foreign:
        takers = [r.name for r in runtime.runtimes() if set(foreign) <= set(r.options)]
        raise GaweeError(
            f"{' and '.join(foreign)} {'is an option' if len(foreign) == 1 else 'are options'} of backend "
            f"{' or '.join(map(repr, takers)) or 'none'}, not of {backend!r}",
            hint=f'pass backend="{takers[0]}"' if takers else None,
        )
    why = chosen.unavailable()
    if why is not None:  # fail before the capture when the runtime cannot run here
        raise chosen.unavailable_error(why)
    if options.precision not in ("measure", "always"):
        raise GaweeError(f"TorchOptions.precision is {options.precision!r}", hint='pass "measure" or "always"')
    if calibration is not None and precision != "int8":
        raise GaweeError("calibration data is read by precision int8 only", hint='pass precision="int8"')
    unprecise = rules
    if precision is not None:
        rules = with_precision(rules, precision)  # an unknown name fails before the capture
    allocator = keep_freed_memory() if options.keep_freed_memory else ""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    args, kwargs = example_args(example_inputs)
    graph = capture(model, example_inputs, dynamic_shapes=dynamic_shapes)
    xs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]  # the graph's inputs
    seconds["capture"] = time.perf_counter() - t0

    if chosen.cpu_only and graph.device.type != "cpu":
        raise GaweeError(
            f"backend {name!r} runs on the CPU only; the model is on {graph.device}",
            hint='use backend="torch" (it runs on the model\'s device), or move the model and inputs to the CPU',
        )

    precision_skipped = ""
    why = no_bf16(graph.device) if precision == "bf16" else None
    if why is not None:  # its kernels would convert to float32 and back around every op: slower, and less exact
        precision_skipped = f"{precision} not applied: {why}, so the model stays in float32"
        logger.warning("%s: %s", graph.name, precision_skipped)
        rules, precision = unprecise, None

    batches = None
    if precision == "int8":
        batches = _calibration(calibration, xs)
    t0 = time.perf_counter()
    optimized, rewrite_report = rewrite(graph, rules, trace=precision is not None, calibration=batches)
    approximate = _approximate_outputs(optimized, rewrite_report)
    seconds["rewrite"] = time.perf_counter() - t0
    why = chosen.cannot_run(optimized)
    if why is not None:
        raise GaweeError(f"{graph.name} cannot run on {chosen.title}: {why}", hint='use backend="torch"')

    t0 = time.perf_counter()
    with torch.no_grad():
        expected = model(*args, **kwargs)
    seconds["verify"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    structure = OutputStructure.of(expected)  # every runtime returns what the model returns, classes included
    flat_expected = [x for x in pytree.tree_leaves(expected) if isinstance(x, torch.Tensor)]
    if structure.tensors != len(optimized.outputs):  # tensors pytree cannot see: give back the graph's outputs
        logger.warning(
            "%s returns %d tensors that torch's pytree sees, its graph %d outputs: the module returns them as a tuple",
            graph.name,
            structure.tensors,
            len(optimized.outputs),
        )
        structure = None
    whole_graph = name != "auto" and chosen is runtime.baseline() and options.whole_graph == "measure"
    whole_graph = whole_graph and options.fused_kernels
    choice, alternatives = None, None
    if chosen.variants:
        module, choice = _variants(chosen, optimized, structure, xs, flat_expected, variant, given, approximate)
    else:
        lowered, target = chosen.lower(optimized)
        if whole_graph:  # what the build would measure (the layouts) is timed with the whole-graph runtimes
            alternatives = chosen.alternatives(lowered, xs, output_structure=structure, **_options(chosen, given))
        if alternatives is not None:
            module = next(iter(alternatives.modules.values()))
        else:
            here, trial = _builds(chosen, lowered, xs, structure, "", given, {})
            module = _built_apart(chosen.name, lowered, here, xs, trial) if chosen.isolated else here()
        if target is not None and target.firings:
            choice = BackendChoice(chosen.name, {}, {}, dict(target.firings))
    if name == "auto":
        module, choice = _choose_runtime(optimized, module, structure, xs, flat_expected, given, approximate)
    seconds["lower"] = time.perf_counter() - t0

    # One end-to-end check on the example inputs: the compiled rewritten graph against the model itself.
    # The captured and rewritten graphs are interpreted only to say which step is at fault when it fails,
    # and (symbolic shapes) to check the rewrite at sizes other than the example's.
    t0 = time.perf_counter()
    with torch.no_grad():
        got = module(*xs)
    first_call_s = time.perf_counter() - t0
    try:
        ran = runtime.get((choice.chosen if choice else chosen.name).partition(":")[0])
        checks = _check_backend(graph.name, flat_expected, pytree.tree_leaves(got), ran.mismatch_hint, approximate)
        checked = {}
        for key, other in (alternatives.modules if alternatives is not None else {}).items():  # each as the first
            if other is not module:
                with torch.no_grad():
                    got_other = pytree.tree_leaves(other(*xs))
                checked[key] = _check_backend(graph.name, flat_expected, got_other, ran.mismatch_hint, approximate)
            else:
                checked[key] = checks
    except EquivalenceError:
        _check_rewrite(graph, optimized, xs)
        raise
    equivalence = EquivalenceReport(checks)
    errors = firing_errors(graph, optimized, rewrite_report.trace, xs) if precision is not None else []
    if any(v.type.symbolic for v in graph.inputs) and not approximate:
        equivalence = _check_rewrite(graph, optimized, None)
    seconds["verify"] += time.perf_counter() - t0

    if whole_graph:
        t0 = time.perf_counter()
        lowering = module
        module, choice, whole_checks = _whole_graph(
            optimized,
            alternatives or module,
            structure,
            xs,
            flat_expected,
            first_call_s,
            sum(seconds.values()),
            checked,
            _approximate_bounds(checks, approximate),
        )
        checks = whole_checks or checks
        if module is not lowering:  # the report's accuracy is the module's it returns
            with torch.no_grad():
                got = module(*xs)
        seconds["lower"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    accuracy = compare_outputs(flat_expected, pytree.tree_leaves(got)) if precision is not None else None
    calibrated = calibration_accuracy = None
    if batches is not None and rewrite_report.calibrated:
        calibrated = f"calibrated {rewrite_report.calibrated} values on {batches.source}"
    if calibration is not None and batches is not None:
        calibration_accuracy = _accuracy_on(model, module, batches.batches[:CALIBRATION_ACCURACY_BATCHES])
    seconds["verify"] += time.perf_counter() - t0
    backend_error = max((c.max_error for c in checks), default=0.0)
    kernels = list(getattr(module, "gawee_kernels", []))

    module.gawee_report = CompileReport(
        graph,
        optimized,
        rewrite_report,
        equivalence,
        backend_error,
        seconds,
        kernels,
        getattr(module, "gawee_layout", None),
        getattr(module, "gawee_kernel_seconds", 0.0),
        choice,
        allocator,
        precision,
        accuracy,
        errors,
        precision_skipped,
        calibrated or "",
        calibration_accuracy,
    )
    if precision is not None and (name == "auto" or chosen is runtime.baseline()) and options.precision == "measure":
        given_float = {"options": options, "backend": backend, "dynamic_shapes": dynamic_shapes}
        return _precision_or_float(module, lambda: compile(model, example_inputs, unprecise, **given_float), xs)
    return module


def _precision_or_float(module, build_float: Callable, xs: list):
    """``module`` (with a precision phase) or the float32 module ``build_float()`` compiles, whichever measures
    faster here (:func:`gawee.backend.measure.fastest`: the precision module unless float32 is more than 5%
    faster): reduced precision is not always faster — int8 convolutions through torch's per-call overheads on a
    network of small ones, against a float32 module a whole-graph runtime runs — and what a user asks of it is
    speed. The kept module's report says what both measured; float32 kept says why the precision was not
    applied (``precision_skipped``)."""
    from gawee.backend.measure import fastest

    report = module.gawee_report
    t0 = time.perf_counter()
    plain = build_float()
    timed = fastest({report.precision: module, "float32": plain}, xs)
    timing = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in timed.seconds.items())
    spent = time.perf_counter() - t0
    if timed.chosen != "float32":
        report.precision_timing = f"measured against float32 ({timing} per call): {report.precision} kept"
        report.seconds["precision choice"] = spent
        return module
    why = f"{report.precision} not applied: float32 measured faster here ({timing} per call)"
    logger.warning("%s: %s", report.graph.name, why)
    plain.gawee_report.precision_skipped = why
    plain.gawee_report.seconds["precision choice"] = spent
    return plain


CALIBRATION_ACCURACY_BATCHES = 8
"""How many calibration batches the compile report's accuracy on the calibration data reads."""


def _calibration(given: Iterable | None, xs: list[torch.Tensor]) -> Calibration:
    """The batches int8's calibration runs on: each of ``given`` flattened as the example inputs are (the graph's
    inputs in order), or the example inputs alone."""
    if given is None:
        return Calibration.of([tuple(xs)], "the example inputs (no calibration data given)")
    batches = []
    for batch in given:
        args, kwargs = example_args(batch)
        batches.append(tuple(x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)))
    return Calibration.of(batches, f"{len(batches)} calibration batch{'es' if len(batches) != 1 else ''}")


def _accuracy_on(model, module, batches) -> Accuracy:
    """The module's outputs against the model's over ``batches`` (graph inputs in order), all outputs together."""
    expected, got = [], []
    with torch.no_grad():
        for batch in batches:
            expected += [x for x in pytree.tree_leaves(model(*batch)) if isinstance(x, torch.Tensor)]
            got += [x for x in pytree.tree_leaves(module(*batch)) if isinstance(x, torch.Tensor)]
    return compare_outputs(expected, got)


Lowered = dict[str, tuple[Graph, dict[str, int]]]
"""Runtime name (``name:variant`` for a variant's phase after it) → ``graph`` after its target phase and the rules
that fired there (:meth:`Runtime.lower`): each runtime's phase runs once per measured choice, for its promise and
its builds alike."""


def _lowered(
    rt: Runtime, graph: Graph, lowered: Lowered, spent: dict[str, float], variant: str = ""
) -> tuple[Graph, dict[str, int]]:
    """``graph`` after ``rt``'s target phase (then ``variant``'s phase, where it has one: :meth:`Runtime.lower`), and
    the rules that fired there; from ``lowered`` or run now (its seconds added to ``spent``) and kept there. All of a
    runtime's variants share its target phase's run."""
    key = f"{rt.name}:{variant}" if variant else rt.name
    if key not in lowered:
        base, fired = _lowered(rt, graph, lowered, spent) if variant else (graph, {})
        t0 = time.perf_counter()
        result, report = rt.lower(base, variant)
        _spend(spent, "target phases", t0)
        lowered[key] = result, dict(Counter(fired) + (report.firings if report is not None else Counter()))
    return lowered[key]


def _measured(
    graph: Graph, which: Callable[[Runtime], bool], lowered: Lowered, spent: dict[str, float]
) -> tuple[list[str], dict[str, str]]:
    """The candidates of a measured choice for ``graph`` among the registered runtimes ``which`` takes, in the
    registry's order (a runtime with variants: each, as ``name:variant``), leaving out those that need not be built
    for it (:meth:`Runtime.unpromising` of the graph after its target phase: oneDNN's primitives where torch steps
    would compute most of its FLOPs, as a transformer's batched matmuls); and why those were left out."""
    names, skipped = [], {}
    for rt in runtime.runtimes():
        if not which(rt):
            continue
        why = rt.unpromising(_lowered(rt, graph, lowered, spent)[0])
        if why is not None:
            skipped[rt.name] = why
        else:
            names += [f"{rt.name}:{v}" for v in rt.variants] or [rt.name]
    return names, skipped


def _whole_graph_runtimes(graph: Graph, lowered: Lowered, spent: dict[str, float]) -> tuple[list[str], dict[str, str]]:
    """The runtimes the default compile measures against the torch lowering (:attr:`Runtime.whole_graph`: oneDNN's
    primitives in each layout, oneDNN Graph's), and why some were left out (:func:`_measured`)."""
    return _measured(graph, lambda rt: rt.whole_graph, lowered, spent)


def _options(rt: Runtime, given: dict | None) -> dict[str, Any]:
    """The compile's options ``given`` that ``rt`` takes (:attr:`Runtime.options`)."""
    return {k: v for k, v in (given or {}).items() if k in rt.options}


def _builds(rt: Runtime, graph: Graph, xs: list, structure, variant: str, given: dict | None, shared: dict):
    """``rt``'s builds of ``graph`` (after its target phase: :meth:`Runtime.lower`) here and in a trial process
    (:meth:`Runtime.builds`), with the compile's options ``given`` that it takes, ``variant`` (if any) and the
    ``shared`` dict of its variants in this selection."""
    kwargs = _options(rt, given)
    if variant:
        kwargs["variant"] = variant
    return rt.builds(graph, xs, output_structure=structure, shared=shared, **kwargs)


def _runtimes(
    graph: Graph,
    structure,
    xs: list,
    expected: list,
    names: Sequence[str],
    given: dict | None = None,
    spent: dict[str, float] | None = None,
    lowered: Lowered | None = None,
    bounds: Mapping[int, float] | None = None,
) -> tuple[dict[str, object], dict[str, list[OutputCheck]], dict[str, str], dict[str, dict[str, int]]]:
    """The runtimes ``names`` (registered names, or ``name:variant``) of ``graph`` that can be built, run the
    example inputs ``xs`` and compute the model's outputs (``expected``, :func:`_candidate`), with their checks;
    why the others are no candidates; and the rules of each one's target phase that fired (each runtime's phase
    runs once, for all its variants: :meth:`Runtime.lower`). The :attr:`Runtime.isolated` ones are first built,
    run and checked in child processes: one whose child died, or that failed or computed other outputs there, is
    no candidate and never built in this process. ``spent`` gets the seconds of each of those steps added;
    ``lowered`` holds the target phases already run; ``bounds`` how far each approximate output may be from the
    model's (:func:`_check_backend`)."""
    spent = {} if spent is None else spent
    lowered = {} if lowered is None else lowered

    def why_not(rt: Runtime) -> str | None:
        if rt.cpu_only and graph.device.type != "cpu":
            return f"runs on the CPU only; the model is on {graph.device}"
        return rt.unavailable() or rt.cannot_run(graph)

    modules, checks, not_candidates, whys = {}, {}, {}, {}
    for name in names:
        key = name.partition(":")[0]
        if key not in whys:  # asked once for all of a runtime's variants
            whys[key] = why_not(runtime.get(key))
        if whys[key] is not None:  # the runtime cannot run this graph at all: said once
            not_candidates[key] = whys[key]
    names = [name for name in names if whys[name.partition(":")[0]] is None]
    builds, hints, fired, shared = {}, {}, {}, {}
    for name in names:
        key, _, variant = name.partition(":")
        rt = runtime.get(key)
        target, fired[name] = _lowered(rt, graph, lowered, spent, variant)
        builds[name] = _builds(rt, target, xs, structure, variant, given, shared.setdefault(key, {}))
        hints[name] = rt.mismatch_hint
    # A runtime that could crash the process is built, run and checked in a child first; only those that survive
    # with the model's outputs are built here. Each runtime's first variant is tried (all runtimes' at once) and
    # built here before its other variants are tried: they are built sharing its work (``shared``: oneDNN's
    # fixed layouts race kernels per_conv raced here, which their trials then need not run).
    first: dict[str, str] = {}
    for name in names:
        first.setdefault(name.partition(":")[0], name)
    leading = list(first.values())
    for stage in (leading, [name for name in names if name not in leading]):
        risky = [name for name in stage if runtime.get(name.partition(":")[0]).isolated]
        t0 = time.perf_counter()
        trials = _apart(
            {
                name: functools.partial(_candidate_why, graph.name, builds[name][1], expected, xs, hints[name], bounds)
                for name in risky
            }
        )
        _spend(spent, "trials", t0)
        t0 = time.perf_counter()
        for name in stage:
            trial = trials.get(name)
            if trial is not None and (trial.died or trial.error or trial.answer):
                not_candidates[name] = _trial_why(trial)
                continue
            module, checks[name], why = _candidate(graph.name, builds[name][0], expected, xs, hints[name], bounds)
            if why is None:
                modules[name] = module
            else:
                not_candidates[name] = why
        _spend(spent, "builds", t0)
    for work in shared.values():  # what the builds shared (the kernels' times, the scratch memory of their races)
        work.clear()  # is not needed by the modules built, and would be held through the timing
    order = {name: i for i, name in enumerate(names)}
    modules = dict(sorted(modules.items(), key=lambda item: order[item[0]]))
    return modules, checks, not_candidates, fired


def _spend(spent: dict[str, float], step: str, since: float) -> None:
    """Add the seconds since ``since`` to ``spent[step]`` (where a measured choice's time went)."""
    spent[step] = spent.get(step, 0.0) + time.perf_counter() - since


def _apart(work: dict[str, Callable[[], str | None]]) -> dict[str, Tried]:
    """Each of ``work`` tried in a child process (:func:`gawee.backend.isolation.tried`; where the OS has no
    ``fork``, each is said to have died untried: a runtime that could crash the process is then never built)."""
    if not work:
        return {}
    tried = isolation.tried(work)
    for name, trial in tried.items():
        if trial.died:
            logger.info("%s died in its trial process and is not built: %s", name, trial.died)
    return tried


def _trial_why(trial: Tried) -> str:
    """Why a runtime's trial (:func:`_apart`) drops it: the child died, or the runtime failed or computed other
    outputs there."""
    if trial.died:
        return f"{trial.why}, so it was not built in this process"
    return trial.error or trial.answer or ""


def _candidate_why(name: str, build, expected: list, xs: list, hint: str, bounds=None) -> str | None:
    """In a trial process: why the runtime ``build()`` builds is no candidate (:func:`_candidate`), or None."""
    return _candidate(name, build, expected, xs, hint, bounds)[2]


def _built_apart(name: str, graph: Graph, build, xs: list, trial_build=None):
    """``build()``, the module of ``graph`` of the runtime ``name`` asked for by name, once a child built it
    (``trial_build()``, if given) and ran it on ``xs`` (:attr:`Runtime.isolated`); GaweeError when that child died.
    A failure there that raises is left to the build here, which raises it with its own type."""
    trial = _apart({name: functools.partial(_runs, trial_build or build, xs)})[name]
    if trial.died:
        raise GaweeError(
            f"the {name} runtime cannot run {graph.name}: {_trial_why(trial)}",
            hint='use backend="torch" (or "auto", which drops a runtime that crashes), and report the model',
        )
    return build()


def _runs(build, xs: list) -> None:
    """``build()`` called once on ``xs``: a trial of a runtime's module (:func:`_built_apart`)."""
    with torch.no_grad():
        build()(*xs)


def _variants(
    rt: Runtime,
    graph: Graph,
    structure,
    xs: list,
    expected: list,
    variant: str,
    given: dict,
    approximate: frozenset[int] = frozenset(),
) -> tuple[object, BackendChoice]:
    """A runtime with variants asked for by name (``backend="onednn"``): its module in ``variant``, or in the
    fastest variant as measured here (the first, unless another is more than 5% faster). The outputs
    ``approximate`` rules made are reported, not judged (no bound), as the compile's own check of the module does."""
    from gawee.backend.measure import fastest

    names = [f"{rt.name}:{variant}"] if variant else [f"{rt.name}:{v}" for v in rt.variants]
    spent: dict[str, float] = {}
    unbounded = dict.fromkeys(approximate, math.inf)
    modules, _, not_candidates, fired = _runtimes(graph, structure, xs, expected, names, given, spent, bounds=unbounded)
    if not modules:
        why = "; ".join(f"{k}: {v}" for k, v in not_candidates.items())
        raise GaweeError(f"{graph.name} cannot run on {rt.title}: {why}", hint='use backend="torch"')
    if len(modules) == 1:
        ((name, module),) = modules.items()
        return module, BackendChoice(name, {}, not_candidates, fired[name], spent)
    t0 = time.perf_counter()
    timed = fastest(modules, xs, warm=True)  # each ran once, checked
    _spend(spent, "timing", t0)
    choice = BackendChoice(timed.chosen, timed.seconds, not_candidates, fired[timed.chosen], spent)
    return modules[timed.chosen], choice


def _choose_runtime(
    graph: Graph,
    torch_module,
    structure,
    xs: list,
    expected: list,
    given: dict,
    approximate: frozenset[int] = frozenset(),
) -> tuple[object, BackendChoice]:
    """``backend="auto"``: the fastest of the torch lowering and the registry's other candidates of ``auto``
    (:attr:`Runtime.auto`: oneDNN's primitives in each activation layout, where they, not torch steps, compute most
    of its FLOPs, oneDNN Graph's compiled partitions, ONNX Runtime) on the same graph, each where it is installed,
    can run the graph and computes the model's outputs (``expected``, :func:`_candidate`); another runtime wins only
    when it measures more than 5% faster here (:func:`gawee.backend.measure.fastest`). All are compared and timed on
    the example inputs ``xs``: inputs in the model's domain (random ones need not be: an attention mask of 0-3
    with fully masked rows made GPT-2's outputs undefined). The outputs ``approximate`` rules made may be as far
    from the model's in another runtime as :func:`_approximate_bounds` allows beside the torch lowering's."""
    from gawee.backend.measure import SETTLE_S, fastest

    baseline = runtime.baseline()
    lowered: Lowered = {}
    spent: dict[str, float] = {}
    names, skipped = _measured(graph, lambda rt: rt.auto and rt is not baseline, lowered, spent)
    bounds = None
    if approximate and names:  # the torch lowering's own error sets the others' bounds
        with torch.no_grad():
            got = pytree.tree_leaves(torch_module(*xs))
        bounds = _approximate_bounds(_check_backend(graph.name, expected, got, None, approximate), approximate)
    modules, _, not_candidates, fired = _runtimes(graph, structure, xs, expected, names, given, spent, lowered, bounds)
    not_candidates.update(skipped)
    if not modules:
        return torch_module, BackendChoice(baseline.name, {}, not_candidates, {}, spent)
    candidates = {baseline.name: torch_module, **modules}
    t0 = time.perf_counter()
    timed = fastest(candidates, xs, settle_s=SETTLE_S)
    _spend(spent, "timing", t0)
    target = fired.get(timed.chosen, {})
    return candidates[timed.chosen], BackendChoice(timed.chosen, timed.seconds, not_candidates, target, spent)


WHOLE_GRAPH_CALLS = 16
"""What measuring the whole-graph runtimes against the torch lowering costs, in calls of the model: building oneDNN
Graph's runs the model about four times (three profiling calls, one check) and timing takes a dozen calls more.
The figure was set with oneDNN Graph as the only candidate; each layout of oneDNN's primitives adds one check call
and its share of the timing rounds, which the measurement's time budget bounds on short calls
(:data:`gawee.backend.measure.BUDGET_S`) but not on long ones (three rounds at least). Not counted either: building
``onednn:per_conv`` races every kernel of each convolution (about one call of each candidate kernel where calls are
long), nor the rounds the close candidates get past the budget (:data:`gawee.backend.measure.FINAL_ROUNDS`, at most
:data:`gawee.backend.measure.FINAL_BUDGET_S` more), nor the trial of each runtime in a child process first
(:attr:`Runtime.isolated`: one more build and call, on one thread). With all of it but the trials, resnet50's compile at
batch 8 spent more than half its time measuring (benchmarks/README.md, "Runtime" → "Figures behind the code")."""

WHOLE_GRAPH_SHARE = 1.0
"""``TorchOptions.whole_graph="measure"`` measures when that cost (:data:`WHOLE_GRAPH_CALLS` times the lowering's first
call on the example inputs) is at most this share of the time the compile has taken so far, or at most
:data:`WHOLE_GRAPH_MIN_BUDGET_S`. The estimate leaves out tracing and compiling the partitions, so with the whole
compile time as the budget a transformer at batch 1 still more than doubled its compile by measuring (and kept the
lowering). A smaller share left long CNN calls unmeasured that oneDNN's primitives ran faster than the lowering
(resnet50 and densenet121 at batch 8): which runtime wins is not a matter of call length. On short calls the torch
lowering's costs around each op are a large share, which oneDNN Graph's runtime does not pay for the same
primitives (``ONEDNN_VERBOSE``); on long calls of CNNs whose normalizations cannot be folded, the fused partitions
save passes over memory; where a call is long beside the compile (a transformer at batch 8), its time is in GEMMs
both runtimes run alike. ``backend="auto"`` measures every runtime whatever it costs. The figures behind this are
in benchmarks/README.md, "Runtime" → "Figures behind the code"."""

WHOLE_GRAPH_MIN_BUDGET_S = 3.5
"""Measuring is always worth this much: a model whose call takes up to this budget over :data:`WHOLE_GRAPH_CALLS`
(about a fifth of a second) is always measured. The share of the compile so far alone shrinks as the compile gets
faster: resnet18 and resnet50 at batch 8, whose torch lowerings are built in a second or two, went unmeasured and
kept calls much slower than the oneDNN runtimes' (benchmarks/README.md, "Runtime: the oneDNN fusions as a target
phase"); a transformer at batch 8, whose call is longer, is still measured only where the compile so far allows."""


def _whole_graph(
    graph: Graph,
    torch_lowering,
    structure,
    xs: list,
    expected: list,
    first_call_s: float,
    compile_s: float,
    torch_checks: dict[str, list[OutputCheck]] | None = None,
    bounds: Mapping[int, float] | None = None,
) -> tuple[object, BackendChoice, list[OutputCheck] | None]:
    """``TorchOptions.whole_graph="measure"``: :func:`whole_graph_choice`, measured only when that costs at most a
    share (:data:`WHOLE_GRAPH_SHARE`) of the ``compile_s`` seconds the compile has taken so far, or
    :data:`WHOLE_GRAPH_MIN_BUDGET_S` (the cost is :data:`WHOLE_GRAPH_CALLS` times the lowering's first call,
    ``first_call_s``); else the torch lowering, its alternatives timed alone. ``bounds``: how far each approximate
    output of another runtime may be from the model's (:func:`_approximate_bounds`)."""
    cost_s, budget_s = WHOLE_GRAPH_CALLS * first_call_s, max(WHOLE_GRAPH_MIN_BUDGET_S, WHOLE_GRAPH_SHARE * compile_s)
    if cost_s > budget_s:  # too long a call is not measured, whatever the fuser can do
        why = (
            f"a call takes {first_call_s * 1e3:.0f} ms: measuring would cost about {cost_s:.1f} s, over the budget "
            f'of {budget_s:.1f} s (the compile so far; backend="auto" measures every runtime anyway)'
        )
        skipped = {rt.name: why for rt in runtime.runtimes() if rt.whole_graph}
        module, checks = _settled(torch_lowering, xs, torch_checks)
        return module, BackendChoice(runtime.baseline().name, {}, skipped), checks
    return whole_graph_choice(graph, torch_lowering, structure, xs, expected, torch_checks, bounds)


def _settled(torch_lowering, xs: list, torch_checks: dict | None) -> tuple[object, list[OutputCheck] | None]:
    """The torch lowering: its :class:`Alternatives` timed alone (:attr:`Alternatives.settle`), with the checks of
    the one chosen; a module as it is."""
    if not isinstance(torch_lowering, Alternatives):
        return torch_lowering, None
    key, module = torch_lowering.settle(xs)
    return module, (torch_checks or {}).get(key)


def _named(base: str, alternatives: Alternatives) -> dict[str, str]:
    """Each alternative's name among the candidates → its own: the first is ``base`` (the runtime's name), the
    others ``base:name`` (``torch:channels_last``)."""
    return {base if i == 0 else f"{base}:{key}": key for i, key in enumerate(alternatives.modules)}


def lowering_as_measured(alternatives: Alternatives, compiled, choice: BackendChoice, xs: list):
    """The torch lowering's module as :func:`whole_graph_choice` left it (``compiled``, ``choice``), for a caller
    that reads the lowering whichever runtime won (``optimize --bench`` profiles it): ``compiled`` where it is one
    of ``alternatives``; else the alternative that measured fastest beside the runtimes, with its record of that
    measurement; timed alone only where they were not all measured there."""
    if any(m is compiled for m in alternatives.modules.values()):
        return compiled
    own = _named(runtime.baseline().name, alternatives)
    if not all(name in choice.seconds for name in own):
        return alternatives.settle(xs)[1]
    best = min(own, key=choice.seconds.__getitem__)
    return alternatives.chosen(own[best], {key: choice.seconds[name] for name, key in own.items()})


def whole_graph_choice(
    graph: Graph,
    torch_lowering,
    structure,
    xs: list,
    expected: list,
    torch_checks: dict | None = None,
    bounds: Mapping[int, float] | None = None,
) -> tuple[object, BackendChoice, list[OutputCheck] | None]:
    """The torch lowering of ``graph``, or a whole-graph runtime of the same graph — oneDNN Graph's compiled
    partitions, oneDNN's primitives in each activation layout (:mod:`gawee.backend.dnnl`) — where it can run it,
    computes the model's outputs (``expected``) on the example inputs ``xs`` within the tolerance and measures more
    than 5% faster (:func:`gawee.backend.measure.fastest`; all share torch's OpenMP threads, so no pause between
    them): what gawee.compile returns by default (``TorchOptions.whole_graph``). With the choice and its checks
    against the model (None for a module given as ``torch_lowering``).

    ``torch_lowering`` is the torch lowering's module, or the :class:`Alternatives` its build would measure (the
    layouts, :meth:`Runtime.alternatives`; their checks by name in ``torch_checks``): those are timed here beside
    the runtimes (``torch``, ``torch:channels_last``), so one measurement settles the layout and the runtime.
    ``bounds``: how far each output approximate rules made may be from the model's in another runtime
    (:func:`_approximate_bounds`)."""
    from gawee.backend.measure import fastest

    lowered: Lowered = {}
    spent: dict[str, float] = {}
    names, skipped = _whole_graph_runtimes(graph, lowered, spent)
    modules, checks, not_candidates, fired = _runtimes(
        graph, structure, xs, expected, names, spent=spent, lowered=lowered, bounds=bounds
    )
    not_candidates.update(skipped)
    base = runtime.baseline().name
    if not modules:
        t0 = time.perf_counter()
        module, checks = _settled(torch_lowering, xs, torch_checks)
        _spend(spent, "timing", t0)
        return module, BackendChoice(base, {}, not_candidates, {}, spent), checks
    if isinstance(torch_lowering, Alternatives):
        own = _named(base, torch_lowering)
        candidates = {name: torch_lowering.modules[key] for name, key in own.items()}
    else:
        own, candidates = {}, {base: torch_lowering}
    candidates.update(modules)
    t0 = time.perf_counter()
    timed = fastest(candidates, xs, warm=True)  # each ran once, checked (the lowering's layouts too)
    _spend(spent, "timing", t0)
    choice = BackendChoice(timed.chosen, timed.seconds, not_candidates, fired.get(timed.chosen, {}), spent)
    if timed.chosen not in own:
        return candidates[timed.chosen], choice, checks.get(timed.chosen)
    key = own[timed.chosen]
    module = torch_lowering.chosen(key, {k: timed.seconds[name] for name, k in own.items()})
    return module, choice, (torch_checks or {}).get(key)


def _candidate(
    name: str, build, expected: list, xs: list, hint: str, bounds: Mapping[int, float] | None = None
) -> tuple[object, list[OutputCheck], str | None]:
    """A runtime's module from ``build()`` with its outputs' checks against the model's (``expected``) on the
    example inputs ``xs``; or why it is no candidate: it cannot be built (an op without an ONNX lowering, a trace
    TorchScript refuses), fails to run ``xs``, or computes other outputs (beyond the dtype's tolerance, or an
    approximate output beyond its ``bounds``)."""
    try:
        module = build()
    except Exception as e:  # the runtimes' errors have their own types
        return None, [], e.message if isinstance(e, GaweeError) else first_line(e)
    with torch.no_grad():
        try:
            got = pytree.tree_leaves(module(*xs))
        except Exception as e:
            return None, [], f"it fails to run it: {first_line(e)}"
    try:
        return module, _check_backend(name, expected, got, hint, bounds=bounds), None
    except EquivalenceError as e:
        return None, [], f"its outputs differ from the model's: {e.message}"


def _check_rewrite(graph: Graph, optimized: Graph, inputs: list | None) -> EquivalenceReport:
    """The captured and rewritten graphs interpreted on ``inputs`` (None: random draws at the two smallest
    sizes of the symbolic dimensions other than the example's — cheap, and a rewrite specialized to the
    example size fails there); EquivalenceError naming the rewrite if they differ."""
    if inputs is not None:
        equivalence = verify_equivalent(graph, optimized, inputs)
    else:
        types = [v.type for v in graph.inputs]
        syms = symbols_of(types)
        others = sorted((d for d in draw_values(syms, 5) if d != example_values(syms)), key=lambda d: sum(d.values()))
        equivalence = EquivalenceReport()
        for k, sizes in enumerate(others[:2]):
            equivalence = verify_equivalent(graph, optimized, random_inputs(types, k, sizes, graph.device))
            if not equivalence.ok:
                break
    if not equivalence.ok:
        raise EquivalenceError(
            f"the rewritten graph of {graph.name} differs from the captured one: {equivalence}",
            hint="run `gawee-rewrite optimize` with --trace to find the rule at fault",
        )
    return equivalence


APPROXIMATE_SLACK = 2.0
"""Another runtime of a graph with approximate outputs (a bf16 precision phase's) computes the same rewrites with its
own kernels: the same roundings to bf16, the float32 sums in another order, and a residual added before its
rounding (oneDNN's post-op) where torch rounds twice. Where a rounding falls the other way the two differ by an
ulp, and the layers after it carry that on, so the other runtime's outputs are not within the float tolerance of
the torch lowering's, and need not be closer to the model's: each such output may be up to this many times as far
from the model's as the torch lowering's is (what a kernel computing something else, say with the wrong weights or
layout, is not: its error is of the output's own size)."""


def _approximate_bounds(checks: Sequence[OutputCheck], approximate: frozenset[int]) -> dict[int, float]:
    """How far each output approximate rules made (the indices ``approximate``) may be from the model's in another
    runtime of the same graph: :data:`APPROXIMATE_SLACK` times the torch lowering's error there (``checks``: its
    module's), or the float tolerance where that is larger (:func:`_check_backend`)."""
    return {c.index: APPROXIMATE_SLACK * c.max_error for c in checks if c.index in approximate}


def _approximate_outputs(optimized: Graph, report: RewriteReport) -> frozenset[int]:
    """The indices of ``optimized``'s outputs that approximate rules made or that are computed from their values
    (from the rewrite's trace; none without one)."""
    made = approximate_values(optimized, report.trace)
    return frozenset(i for i, v in enumerate(optimized.outputs) if v.name in made)


def _check_backend(
    name: str,
    expected: Sequence[torch.Tensor],
    got: Sequence[torch.Tensor],
    hint: str | None = None,
    approximate: frozenset[int] = frozenset(),
    bounds: Mapping[int, float] | None = None,
) -> list[OutputCheck]:
    """Each output's difference from the model's; EquivalenceError (with ``hint``, the runtime's
    :attr:`Runtime.mismatch_hint`) if one exceeds its dtype's tolerance, except
    the outputs in ``approximate`` (made by approximate rules: their error is their rules' and is reported, not
    judged against the tolerance; their shape and dtype still must match) and those in ``bounds``, each held to its
    bound there instead (another runtime of a graph with approximate outputs: :func:`_approximate_bounds`)."""
    checks, bounds = [], bounds or {}
    for i, (ref, out) in enumerate(zip(expected, got)):
        if ref.shape != out.shape or ref.dtype != out.dtype:
            raise EquivalenceError(
                f"output {i} of the compiled {name} is {out.dtype}{list(out.shape)}, "
                f"the model's is {ref.dtype}{list(ref.shape)}"
            )
        err = output_error(ref, out)
        finite = ref[torch.isfinite(ref)] if ref.dtype.is_floating_point else ref
        scale = max(1.0, finite.abs().max().item()) if finite.numel() and ref.dtype.is_floating_point else 1.0
        tol = TOLERANCE.get(DType.from_torch(ref.dtype), 0.0)
        if i in bounds and err > max(bounds[i], tol * scale):
            raise EquivalenceError(
                f"output {i} of the compiled {name} differs from the model's by {err:.3g}, more than "
                f"{APPROXIMATE_SLACK:g} times the torch lowering's {bounds[i] / APPROXIMATE_SLACK:.3g} "
                "(approximate rules made it: both compute their rewrites)",
                hint=hint,
            )
        if err > tol * scale and i not in approximate and i not in bounds:
            raise EquivalenceError(
                f"output {i} of the compiled {name} differs from the model's by {err:.3g} "
                f"(tolerance {tol:g} x {scale:.3g})",
                hint=hint,
            )
        t = TensorType.of(ref)
        loose = (i in approximate or i in bounds) and err > tol * scale
        checks.append(OutputCheck(i, t, t, err, tol, scale, approximate=loose))
    return checks
