"""torch.export capture: an nn.Module and example inputs → a gawee Graph."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import operator
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from gawee.errors import CaptureError
from gawee.frontend.aten import NodeConverter, binding_table, is_check, recorded_types, target_name, written_operands
from gawee.ir.core import Graph
from gawee.ir.symbolic import Sym
from gawee.ops import OPAQUE


@dataclass
class CaptureStats:
    """Where capture time went, and what could not be mapped onto the registry."""

    export_s: float = 0.0
    """torch.export.export."""
    decompose_s: float = 0.0
    """run_decompositions: functionalization, and the decomposition of ops the registry lacks
    (:func:`unbound_decompositions`); 0 when the exported program needed neither
    (:func:`functional_without_retrace`)."""
    convert_s: float = 0.0
    """gawee's own conversion of the exported graph."""
    opaque_ops: dict[str, int] = field(default_factory=dict)
    dropped_checks: dict[str, int] = field(default_factory=dict)
    """No-result runtime checks export emitted (``aten._assert_tensor_metadata``...), dropped."""
    warnings: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.export_s + self.decompose_s + self.convert_s

    def seconds(self) -> dict[str, float]:
        """The timings, rounded for reports (``{}`` when nothing was captured, e.g. a graph loaded from a file)."""
        if not self.total_s:
            return {}
        return {k: round(getattr(self, k), 4) for k in ("export_s", "decompose_s", "convert_s")}


def example_args(example_inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """``example_inputs`` as torch.export's ``args`` and ``kwargs``: a tensor is the model's one input, a tuple or
    list holds its positional inputs, a mapping (a dict, a tokenizer's ``BatchEncoding``) its keyword inputs.
    Raises CaptureError for anything else, saying what ``example_inputs`` must be."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, Mapping) and all(isinstance(k, str) for k in example_inputs):
        return (), dict(example_inputs)
    if isinstance(example_inputs, Mapping):
        got = "a mapping whose keys are not all strings"
    else:
        got = f"a {type(example_inputs).__name__}"
    raise CaptureError(
        f"example_inputs is {got}",
        hint="pass the model's inputs as a tensor (its one input), a tuple or list (its positional inputs: "
        "(x,) or (ids, mask)) or a dict of its keyword inputs ({'input_ids': ids}, as torch.export's kwargs)",
    )


def export_program(
    model: torch.nn.Module, example_inputs: Any, dynamic_shapes=None
) -> tuple[ExportedProgram, float, float]:
    """torch.export in eval mode, then functionalize. ``example_inputs`` is read by :func:`example_args`. Raises
    CaptureError saying why and where.

    Whatever torch prints meanwhile (its logging, warnings, the partial-graph dump of a failed
    export) goes to a log file instead of the terminal: deleted after a success, named in the
    error (with torch's full message and traceback appended) after a failure.
    """
    model = model.eval()
    return _logged(lambda log: _export_logged(model, example_inputs, log, dynamic_shapes))


def _logged(fn: Callable[[Path], Any]) -> Any:
    """``fn(log)`` with a fresh log file for torch's output: deleted after a success, kept after a failure (the
    CaptureError names it)."""
    fd, log_name = tempfile.mkstemp(prefix="gawee-export-", suffix=".log")
    log = Path(log_name)
    os.close(fd)
    try:
        result = fn(log)
    except CaptureError:
        raise  # the message names the log: keep it
    except BaseException:
        log.unlink(missing_ok=True)  # interrupted (KeyboardInterrupt...): nobody is told of the log
        raise
    log.unlink(missing_ok=True)
    return result


def _export_logged(model: torch.nn.Module, example_inputs: Any, log: Path, dynamic_shapes=None):
    args, kwargs = example_args(example_inputs)
    t0 = time.perf_counter()
    try:
        with _torch_output_to(log):
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch.export raises many unrelated types; all mean "cannot capture"
        raise _capture_error(e, model, log, "torch.export could not capture the model") from e
    t1 = time.perf_counter()
    if functional_without_retrace(ep):
        ep.graph.eliminate_dead_code()  # as functionalization would (export keeps e.g. BERT's unused pooler)
        return ep, t1 - t0, 0.0
    ep = _decompose_logged(ep, unbound_decompositions(ep), model, log, "functionalization failed")
    for _ in range(DECOMPOSE_ROUNDS - 1):  # a decomposition may emit ops the registry lacks in turn
        table = unbound_decompositions(ep)
        if not table:
            break
        ep = _decompose_logged(ep, table, model, log, "decomposition failed")
    return ep, t1 - t0, time.perf_counter() - t1


def _decompose_logged(ep: ExportedProgram, table: dict, model: torch.nn.Module, log: Path, what: str):
    """``ep.run_decompositions(table)`` (functionalization, and the decompositions in ``table``)."""
    try:
        with _torch_output_to(log):
            return ep.run_decompositions(table)
    except Exception as e:  # same: any failure here is a capture failure of this model
        raise _capture_error(e, model, log, what) from e


DECOMPOSE_ROUNDS = 3
"""Re-traces at most that decompose ops the registry lacks (each round those the previous one emitted)."""


def _unbound_ops(ep: ExportedProgram) -> list[torch.fx.Node]:
    """The call nodes whose target has no registry binding (checks and size computations aside): they
    would become opaque ``aten`` nodes."""
    table = binding_table()
    unbound = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or is_check(node.target):
            continue
        if isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat)):
            continue  # a size computation: converted to an expression
        if not isinstance(node.target, torch._ops.OpOverload) or target_name(node.target) not in table:
            unbound.append(node)
    return unbound


@functools.cache
def _torch_decompositions() -> dict:
    """torch.export's default table: every composite (CompositeImplicitAutograd) op's own decomposition, and
    the core ATen decompositions."""
    return dict(torch.export.default_decompositions().items())


def unbound_decompositions(ep: ExportedProgram) -> dict:
    """The decomposition table for ``run_decompositions``: torch's decomposition of each op in ``ep`` that the
    registry lacks and torch can decompose (``type_as``, ``multiply``, ``repeat_interleave``: composites that
    ``run_decompositions({})`` keeps as they are), so that op reaches the registry as ops it binds rather than as
    an opaque node. Ops the registry binds are kept whole (``linear``, ``layer_norm``: one OpDef each)."""
    return _decompositions_of({n.target for n in _unbound_ops(ep)})


def _decompositions_of(targets: set) -> dict:
    """torch's decomposition of each of ``targets`` that has one (a table for ``run_decompositions``)."""
    if not targets:
        return {}
    torch_table = _torch_decompositions()
    return {t: torch_table[t] for t in sorted(targets, key=str) if t in torch_table}


def _opaque_decompositions(ep: ExportedProgram, opaque: dict[str, int]) -> dict:
    """torch's decomposition of each op that stayed opaque and has one: ops whose binding refused the call as
    made (``softmax`` with a ``dtype``, which its OpDef does not take) reach the registry as ``_softmax`` and a
    cast instead."""
    return _decompositions_of(
        {
            n.target
            for n in ep.graph.nodes
            if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload)
            and target_name(n.target) in opaque
        }
    )


def functional_without_retrace(ep: ExportedProgram) -> bool:
    """Make export's program functional in place (:func:`_in_place_to_functional`) when that can be done
    without re-tracing it through ``run_decompositions({})`` (0.6-1 s on a transformer). True when it then
    mutates nothing and every op binds to the registry as exported: functionalization would not change
    what it computes, and a composite op it would decompose (``reshape``, ``dropout``, ``to``) has an
    OpDef of its own. False when the program must still be functionalized (an op the registry lacks may
    then be spelled in ones it has); the in-place rewrites made so far keep it equivalent."""
    if any(s.kind != OutputKind.USER_OUTPUT for s in ep.graph_signature.output_specs):
        return False
    if not _in_place_to_functional(ep.graph):
        return False
    return not _unbound_ops(ep)


def _in_place_to_functional(graph: torch.fx.Graph) -> bool:
    """Each in-place op (``relu_``, ``add_``...) becomes its functional overload where no one can observe
    the write: it writes its first operand only, and that operand is a fresh result of an earlier op (no
    input, no view) that nothing else reads. False, with every op rewritten so far still equivalent, when
    some mutation is not of that kind."""
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        written = written_operands(target)
        if not written:
            continue
        functional = _functional_overload(target)
        if functional is not None and _writes_nothing(node):
            node.target = functional
            continue
        base = node.args[0] if node.args else None
        if functional is None or written != [0] or not isinstance(base, torch.fx.Node) or not _fresh(base):
            return False
        if [u for u in base.users if not is_check(u.target)] != [node]:
            return False
        node.target = functional
    return True


EVAL_IDENTITIES = frozenset(
    {"aten::dropout_", "aten::feature_dropout_", "aten::alpha_dropout_", "aten::feature_alpha_dropout_"}
)
"""In-place ops that write nothing when their ``train`` argument is False (EfficientNet's classifier runs
``Dropout(inplace=True)`` on a flatten view)."""


def _writes_nothing(node: torch.fx.Node) -> bool:
    """An in-place op that leaves its operand as it is here: an eval-mode in-place dropout."""
    if node.target._schema.name not in EVAL_IDENTITIES:
        return False
    train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else None)
    return train is False


def _functional_overload(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add.Tensor`` for ``aten.add_.Tensor``: same overload, same arguments, no write (else None)."""
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, target.namespace), name[:-1], None)
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None:
        return None
    ins, outs = target._schema.arguments, functional._schema.arguments
    if len(ins) != len(outs) or any(a.type != b.type for a, b in zip(ins, outs)):
        return None
    return functional


FRESH_COMPOSITES = frozenset(
    {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear", "aten::batch_norm", "aten::layer_norm"}
)
"""Composite ops (CompositeImplicitAutograd) whose result is always new memory. A composite's schema does not
promise that: eval ``dropout``, ``type_as`` and ``einsum("ij->ij", x)`` return their input or a view of it."""


def _fresh(node: torch.fx.Node) -> bool:
    """A result of an op that returns new memory: an op with a kernel of its own, whose returns carry no alias
    annotation (kernels keep their schema's), or one of FRESH_COMPOSITES."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if any(r.alias_info is not None for r in target._schema.returns):
        return False
    name = target._schema.name
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")
    return not composite or name in FRESH_COMPOSITES


def capture(
    model: torch.nn.Module,
    example_inputs: torch.Tensor | tuple | list | Mapping[str, Any],
    *,
    name: str | None = None,
    stats: CaptureStats | None = None,
    dynamic_shapes=None,
) -> Graph:
    """Capture ``model`` (put in eval mode) on ``example_inputs`` into a Graph: a tensor (the model's one input), a
    tuple or list of its positional inputs, or a dict of its keyword inputs (torch.export's ``kwargs``); the graph's
    inputs are their tensors in that order (CaptureError for another form, :func:`example_args`).

    Parameters and buffers become constant Values (meta-device models give meta
    constants: structure and cost work, numbers do not). ATen ops without an OpDef
    become opaque ``aten`` nodes. Raises CaptureError when torch.export fails.

    ``dynamic_shapes`` is torch.export's own spec (``{"x": {0: torch.export.Dim("batch")}}``,
    or see ``gawee.frontend.dynamic.dynamic_spec`` for the CLI's short form): the dimensions
    it marks become symbols (``s0``...) with the ranges export reports, and the graph serves
    every shape in range.
    """
    stats = stats if stats is not None else CaptureStats()
    ep, stats.export_s, stats.decompose_s = export_program(model, example_inputs, dynamic_shapes)
    t0 = time.perf_counter()
    graph = from_exported_program(ep, name or type(model).__name__, stats)
    stats.convert_s = time.perf_counter() - t0
    table = _opaque_decompositions(ep, stats.opaque_ops)
    if table:  # ops bound only as other calls spell them (softmax with a dtype): decomposed, converted again
        t1 = time.perf_counter()
        ep = _logged(lambda log: _decompose_logged(ep, table, model, log, "decomposition failed"))
        t2 = time.perf_counter()
        stats.decompose_s += t2 - t1
        stats.opaque_ops.clear()
        stats.dropped_checks.clear()
        stats.warnings.clear()
        graph = from_exported_program(ep, name or type(model).__name__, stats)
        stats.convert_s += time.perf_counter() - t2
    # Timings go to ``stats`` (the CLI reports them), never into the graph: a saved graph is a pure function
    # of the model (and rules), byte for byte.
    return graph


def from_exported_program(ep: ExportedProgram, name: str = "graph", stats: CaptureStats | None = None) -> Graph:
    """Convert a (functionalized) ExportedProgram into a Graph."""
    stats = stats if stats is not None else CaptureStats()
    graph = Graph(name)
    env: dict[torch.fx.Node, object] = {}
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    state = dict(ep.state_dict)
    state.update(ep.constants)
    symbols = size_symbols(ep)
    examples = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]  # weights', then inputs'
    device = next(
        (
            t.device
            for t in [*state.values(), *examples]
            if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")
        ),
        None,
    )
    converter = NodeConverter(graph, env, stats.warnings, stats.dropped_checks, symbols, device)
    for fx_node in ep.graph.nodes:
        if fx_node.op == "placeholder":
            spec = specs.get(fx_node.name)
            if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                data = state[spec.target]
                if isinstance(data, torch.nn.Parameter):
                    data = data.detach()
                env[fx_node] = graph.constant(data, spec.target)
            elif spec is None or spec.kind == InputKind.USER_INPUT:
                (t,) = recorded_types(fx_node, symbols)
                if t is None:
                    raise CaptureError(
                        f"input {fx_node.name} is not a tensor",
                        hint="pass tensors as example inputs; other values are baked in by export",
                    )
                env[fx_node] = graph.add_input(t, fx_node.name)
            else:
                raise CaptureError(f"unsupported input kind {spec.kind.name} for {fx_node.name}")
        elif fx_node.op == "call_function":
            converter.convert(fx_node)
        elif fx_node.op == "output":
            outs = []
            for spec, arg in zip(sig.output_specs, fx_node.args[0]):
                if spec.kind == OutputKind.USER_OUTPUT:
                    if not isinstance(arg, torch.fx.Node):
                        raise CaptureError(f"output {arg!r} is not a tensor", hint="return tensors from forward()")
                    outs.append(env[arg])
                else:
                    stats.warnings.append(f"ignored {spec.kind.name} output {spec.target}: gawee graphs are pure")
            graph.set_outputs(outs)
        else:
            raise CaptureError(
                f"unsupported exported node {fx_node.op} {fx_node.target}",
                hint="control flow (torch.cond, while_loop) is not supported yet",
            )
    for node in graph:
        if node.op == OPAQUE:
            t = node.attrs["target"]
            stats.opaque_ops[t] = stats.opaque_ops.get(t, 0) + 1
    return graph


def size_symbols(ep: ExportedProgram) -> dict:
    """torch.export's size symbols -> gawee ``Sym``s carrying export's range and the example value."""
    hints: dict = {}
    for fx_node in ep.graph.nodes:
        val = fx_node.meta.get("val") if fx_node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            for d in val.shape:
                if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                    hints.setdefault(d.node.expr, d.node.hint)
    out = {}
    for sym, vr in ep.range_constraints.items():
        if not isinstance(sym, sympy.Symbol) or sym not in hints:  # data-dependent (unbacked) values are no sizes
            continue
        lo = int(vr.lower) if vr.lower.is_Integer else 0
        hi = int(vr.upper) if vr.upper.is_Integer else None  # torch's int_oo: unbounded
        hint = hints.get(sym)
        out[sym] = Sym(sym.name, lo, hi, int(hint) if hint is not None else max(lo, 2))
    return out


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_WHY_CHARS = 240
"""torch's first line is cut here (a symbolic size can run to pages); the log has it whole."""


@contextlib.contextmanager
def _torch_output_to(path: Path):
    """Send everything written to stderr meanwhile — file descriptor 2, ``sys.stderr``, and logging
    handlers bound to it (torch's) — to ``path`` (appended)."""
    with open(path, "a", encoding="utf-8", errors="replace") as f:
        streams = {id(sys.stderr), id(sys.__stderr__)}
        handlers = [h for h in _stream_handlers() if id(h.stream) in streams or _fileno(h.stream) == 2]
        sys.stderr.flush()
        saved_fd = os.dup(2)
        os.dup2(f.fileno(), 2)
        swapped = []
        try:
            for h in handlers:
                swapped.append((h, h.setStream(f)))
            with contextlib.redirect_stderr(f):
                yield
        finally:
            f.flush()
            for h, stream in swapped:
                h.setStream(stream)
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    return [
        h
        for lg in loggers
        for h in lg.handlers
        if isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
        and not isinstance(getattr(type(h), "stream", None), property)  # logging.lastResort: always sys.stderr
    ]


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= _WHY_CHARS else line[: _WHY_CHARS - 3] + "..."


def _capture_error(e: BaseException, model: torch.nn.Module, log: Path, what: str) -> CaptureError:
    """One screen: what failed and why (torch's first line), where in the model's code, a hint for the cause,
    and the log holding torch's output, full message and traceback."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n==== gawee: {what}: torch's error and traceback ====\n")
        f.write("".join(traceback.format_exception(e)))
    where = _user_frame(e) or _forward_of(model)
    message = f"{what}: {type(e).__name__}: {_first_line(e)}\n  torch's output and full error: {log}"
    return CaptureError(message, where=where, hint=_export_hint(e, model))


def _is_library_file(path: str) -> bool:
    """Frames that are not the model's code: torch's, gawee's own, the standard library's, ``<string>``."""
    if path.startswith("<") or not path:
        return True
    p = os.path.abspath(path)
    if p.startswith(_TORCH_ROOT) or p.startswith(_GAWEE_ROOT):
        return True
    return p.startswith(_STDLIB_ROOT) and "-packages" not in p[len(_STDLIB_ROOT) :]


_TORCH_ROOT = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
_GAWEE_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_STDLIB_ROOT = os.path.join(os.path.dirname(os.path.abspath(contextlib.__file__)), "")


def _user_frame(e: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of the model's own code that the failure passed
    through: in torch's message (export quotes the user frames it traced) or in the tracebacks."""
    frames: list[tuple[str, str, str]] = []
    seen: set[int] = set()
    exc: BaseException | None = e
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = [(f.filename, str(f.lineno), f.name) for f in traceback.extract_tb(exc.__traceback__)] + frames
        frames += _USER_FRAME.findall(str(exc))
        exc = exc.__cause__ or exc.__context__
    user = [f for f in frames if not _is_library_file(f[0])]
    if not user:
        return None
    path, line, func = user[-1]
    return f"{path}:{line} in {func}"


def _forward_of(model: torch.nn.Module) -> str | None:
    """Where ``model.forward`` is defined: the place to look when no traced frame points into the model."""
    fn = inspect.unwrap(type(model).forward)
    try:
        path = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return None
    return f"{path}:{line} in {type(model).__name__}.forward" if path else None


def _export_hint(e: BaseException, model: torch.nn.Module | None = None) -> str:
    text = str(e)
    cls = re.search(r"Found <class '([\w.]+)'> in output", text)
    if cls:
        if "Cache" in cls[1].rsplit(".", 1)[-1]:
            return (
                f"forward() returns a {cls[1].rsplit('.', 1)[-1]} (the key/value cache for generation): call the model "
                "with use_cache=False (or set model.config.use_cache = False) so it returns tensors only"
            )
        return (
            f"forward() returns a {cls[1]}, which torch.export cannot flatten: return tensors "
            "(or tuples, lists, dicts of them), or register the class with torch.utils._pytree"
        )
    if "Constraints violated" in text:
        return (
            "a dimension marked dynamic was specialized: the model's code fixes it (a reshape to a constant, "
            "a check against a size), or the example size is 0 or 1 (torch.export specializes those: use 2 or more); "
            "torch's log names the guard"
        )
    data_dependent = "data-dependent" in text or "GuardOnDataDependent" in type(e).__name__
    if data_dependent and _is_detection(model, e):
        return (
            "detection post-processing (score thresholds, NMS, top-k boxes) has data-dependent output sizes: "
            "capture the backbone and heads (e.g. model.backbone) and keep the post-processing in PyTorch"
        )
    if data_dependent:
        return (
            "the model branches on tensor values or sizes a tensor by them; use torch.cond, or make the branch "
            "or the size static"
        )
    if "input" in text.lower() and ("NoneType" in text or "not a tensor" in text):
        return "pass tensors as example inputs; wrap the model to fill in the other arguments"
    return "see https://pytorch.org/docs/stable/export.html for what torch.export supports"


def _is_detection(model: torch.nn.Module | None, e: BaseException) -> bool:
    names = [type(model).__module__] if model is not None else []
    names += [f[0] for f in _USER_FRAME.findall(str(e))]
    return any("detection" in n or "boxes.py" in n or "nms" in n for n in names)
