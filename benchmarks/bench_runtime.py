"""Runtime benchmark: gawee.compile against eager, torch.fx fuse, TorchScript, Inductor, ONNX Runtime and OpenVINO.

For each model and batch size every method is built once (its compile time measured
cold: a fresh Inductor cache directory, one toolchain warm-up on a tiny model first so
that library import costs are nobody's compile time), its output checked against eager,
and then timed: warm-up calls, then ``--reps`` calls split into ``--passes`` passes over
the methods, consecutive calls of one method within a pass; the latency is their median.
A method of ``OWN_PROCESS`` (OpenVINO) is built, checked and timed the same way in a process
of its own, so that its runtime's libraries and thread pools never share a process with the others'.
The machine is shared, so the benchmark measures the CPU time other processes take while
it times a row, waits for a quiet machine and retimes a row that was disturbed; the
table reports that foreign load next to each row.

    python benchmarks/bench_runtime.py                       # all models, batch 1 and 8
    python benchmarks/bench_runtime.py --models resnet18 --batches 1 --reps 30 --readme

Writes benchmarks/runtime.json, runtime.md (the table) and runtime.png (speedup over
eager); with --readme also the ``## Runtime`` section of benchmarks/README.md.
"""

from __future__ import annotations

import os
import tempfile

# Cold compile times: Inductor must not reuse kernels compiled by an earlier run. The directory goes at exit.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", (_INDUCTOR_CACHE := tempfile.TemporaryDirectory(prefix="gawee-bench-inductor-")).name
)

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import math
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torchvision
from readme import cpu_name, replace_section, source_version
from worker import TIMEOUT, run_worker

import gawee

HERE = Path(__file__).resolve().parent
MODELS = [
    "resnet18",
    "resnet50",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "regnet_y_400mf",
    "densenet121",
    "convnext_tiny",
    "vit_b_16",
]
CNN_TARGET_MODELS = MODELS[:6]
"""Issue 12's rows: gawee.compile at least as fast as the faster of ORT all and Inductor (freezing)."""
TRANSFORMER_MODELS = {
    "vit_b_16": "vit_b_16",
    "bert": "hf:bert:layers=12,hidden=768,heads=12,seq=128",
    "gpt2": "hf:gpt2:layers=12,hidden=768,heads=12,seq=128",
    "swin_t": "swin_t",
    "deit_tiny": "timm:deit_tiny_patch16_224",
    "mixer_b16": "timm:mixer_b16_224",
}
"""Row name → model spec (gawee.frontend.models.resolve): BERT-base and GPT-2 (12 layers, 768 wide) at 128 tokens."""
METHODS = {
    "eager": "eager PyTorch",
    "fx_fuse": "torch.fx fuse",
    "jit": "TorchScript freeze + optimize_for_inference",
    "inductor": "torch.compile (Inductor, freezing)",
    "ort_basic": "ONNX Runtime basic, torch.onnx export",
    "ort_all": "ONNX Runtime all optimizations, torch.onnx export",
    "ort_gawee": "ONNX Runtime, no optimizer, gawee graph",
    "ort_all_gawee": "ONNX Runtime all optimizations, gawee graph",
    "gawee": "gawee.compile",
    "gawee_auto": 'gawee.compile(backend="auto")',
    "gawee_onednn_graph": 'gawee.compile(backend="onednn_graph")',
    "gawee_dynamic": "gawee.compile, dynamic batch (one module for every batch size)",
    "gawee_dynamo": 'torch.compile(backend="gawee")',
    "gawee_iree": 'gawee.compile(backend="iree")',
    "iree_turbine": "iree-turbine aot.export → IREE",
    "openvino": "OpenVINO CPU, convert_model, latency hint, f32",
}
OWN_PROCESS = {"openvino": "openvino"}
"""Methods measured in a process of their own (:func:`in_own_process`) → the package each needs. There the
method is built, checked against eager and timed with this process's conventions (toolchain warm-up, warm-up
calls, passes, median, threads, quiet machine); its runtime's libraries and thread pools never share a process
with the other methods'."""
NOT_INSTALLED = "ModuleNotFoundError"
"""How a method's error starts when a package it needs is missing: its cell says "not installed"."""
log = logging.getLogger("bench")
SUITES = {
    "cnn": (MODELS, list(METHODS), "## Runtime", "runtime"),
    "transformers": (
        list(TRANSFORMER_MODELS),
        ["eager", "inductor", "ort_all", "openvino", "gawee", "gawee_auto"],
        "## Runtime: transformers",
        "runtime_transformers",
    ),
}
"""Suite → (models, methods, README section, output file stem)."""


@dataclass
class Result:
    model: str
    batch: int
    method: str
    compile_s: float | None = None
    latency_ms: float | None = None
    latencies_ms: list[float] = field(default_factory=list)
    max_error: float | None = None
    """max |output - eager output| / max |eager output|."""
    ok: bool = False
    """Built, ran, and matched eager within tolerance."""
    error: str = ""
    foreign_load: float | None = None
    """CPU cores that other processes used while this configuration was timed."""
    flops: int | None = None
    """FLOPs of one call (gawee's cost model on the captured graph; gawee rows only)."""
    choice: str = ""
    """The runtime ``backend="auto"`` chose, in the process its compile was timed in (gawee_auto rows only)."""
    ort_graph: str = ""
    """ONNX Runtime rows with all optimizations: :func:`optimized_graph`'s digest of the graph ORT runs."""

    @property
    def label(self) -> str:
        return f"{self.model} b{self.batch}"


# -- building each method: (model, example input) -> (callable, compile seconds) -------------
def build_eager(model, xs):
    return model, 0.0


def build_fx_fuse(model, xs):
    from torch.fx.experimental.optimization import fuse

    return _timed(lambda: fuse(model))


def build_jit(model, xs):
    def make():
        with torch.no_grad():
            return torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model, xs)))

    fn, seconds = _timed(make)
    return fn, seconds + _timed(lambda: _run(fn, xs))[1]  # TorchScript optimizes on the first calls


def build_inductor(model, xs):
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    inductor_config.fx_graph_cache = False
    torch._dynamo.reset()
    compiled = torch.compile(model)
    _, seconds = _timed(lambda: _run(compiled, xs))  # compilation happens on the first call
    return compiled, seconds


def onnx_export(model, xs, path: Path) -> None:
    """torch.onnx's export of ``model`` called with ``xs``, written to ``path``: the file of the ONNX Runtime
    columns on the export (benchmarks/bench_int8.py quantizes the same file)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, xs, str(path), verbose=False)


def _build_ort_export(model, xs, level: str):
    return _build_ort(lambda path: onnx_export(model, xs, path), level)


def _build_ort(export: Callable[[Path], None], level: str):
    """An ONNX Runtime session on what ``export`` writes, and its build time. The callable's
    ``optimized_graph()`` (not timed) names the graph ORT's optimizer made of it: the file stays until the
    callable goes."""
    import onnxruntime as ort

    folder = tempfile.TemporaryDirectory(prefix="gawee-bench-")
    path = Path(folder.name) / "model.onnx"
    level = getattr(ort.GraphOptimizationLevel, level)

    def make():
        export(path)
        return _ort_session(ort, path, level)

    fn, seconds = _timed(make)
    fn.optimized_graph = lambda: (folder, optimized_graph(ort, path, level))[1]
    return fn, seconds


def optimized_graph(ort, path: Path, level) -> str:
    """A digest of the graph ORT runs for the model at ``path``: its optimized model's nodes, each with its
    domain, op, attributes, the shapes of its constant inputs and the nodes its other inputs come from, without
    names or weight values, and without the order in which ORT lists independent nodes. Two models with the same
    digest run the same kernels on operands of the same shapes, fed by the same kernels, so a difference in their
    timings is the machine's or the schedule's, not the graphs'. (``allowzero`` of a Reshape to a constant shape
    without a zero changes nothing and is left out.)"""
    import hashlib

    import numpy
    import onnx
    from onnx import numpy_helper

    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3  # not its warning that NCHWc graphs are for this machine only
    options.optimized_model_filepath = str(path.with_name("optimized.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    source = {x.name: f"input{i}" for i, x in enumerate(graph.input) if x.name not in constants}
    nodes = []
    for node in graph.node:  # ORT lists them in an order it runs them in: each node's producers come first
        shape = constants.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
        attrs = sorted(
            (a.name, str(onnx.helper.get_attribute_value(a)))
            for a in node.attribute
            if not (a.name == "allowzero" and shape is not None and not (numpy.asarray(shape) == 0).any())
        )
        inputs = [
            f"const{list(constants[i].shape)}" if i in constants else source.get(i, "none" if not i else "?")
            for i in node.input
        ]
        # a node's hash covers everything upstream of it: equal multisets of them are equal graphs
        digest = hashlib.sha256(f"{node.domain}:{node.op_type} {attrs} {inputs}".encode()).hexdigest()
        nodes.append(digest)
        source.update({o: f"{digest}.{j}" for j, o in enumerate(node.output)})
    outputs = [source.get(o.name, "?") for o in graph.output]
    return hashlib.sha256("\n".join(sorted(nodes) + outputs).encode()).hexdigest()[:16]


def build_ort_basic(model, xs):
    return _build_ort_export(model, xs, "ORT_ENABLE_BASIC")


def build_ort_all(model, xs):
    """All of ORT's graph optimizations (its transformer fusions included: Attention, SkipLayerNorm,
    BiasGelu, FastGelu, MatMul+Add...), on the same torch.onnx export."""
    return _build_ort_export(model, xs, "ORT_ENABLE_ALL")


def _build_ort_gawee(model, xs, level: str):
    def export(path: Path) -> None:
        graph, _ = gawee.rewrite(gawee.capture(model, xs))
        gawee.to_onnx(graph, path)

    return _build_ort(export, level)


def build_ort_gawee(model, xs):
    """ORT's optimizer off on gawee's rewritten graph: graph optimization compared alone."""
    return _build_ort_gawee(model, xs, "ORT_DISABLE_ALL")


def build_ort_all_gawee(model, xs):
    """ORT with all its optimizations (NCHWc layout transformer, fusions) on gawee's rewritten graph: what a
    user exporting with gawee.to_onnx gets, to compare with ``ort_all`` on torch.onnx's export."""
    return _build_ort_gawee(model, xs, "ORT_ENABLE_ALL")


def build_gawee(model, xs, choice: str | None = None):
    """gawee.compile as a user calls it. ``choice``: the runtime its whole-graph measurement chose in a process of
    its own (:func:`isolated_compile`; ``TorchOptions.whole_graph``), built here without measuring again, like
    :func:`build_gawee_auto`'s."""
    if choice == "onednn_graph" or (choice or "").startswith("onednn:"):  # a layout of oneDNN's primitives
        module, seconds = _timed(lambda: gawee.compile(model, xs, backend=choice))
    else:
        options = gawee.TorchOptions(whole_graph=False) if choice == "torch" else None
        module, seconds = _timed(lambda: gawee.compile(model, xs, options=options))
    log.info("  gawee: %s", module.gawee_report)
    module.flops = gawee.cost(module.gawee_report.graph).flops
    return module, seconds


def build_gawee_auto(model, xs, choice: str | None = None):
    """gawee.compile's measured runtime choice: the torch lowering, oneDNN Graph or ONNX Runtime on gawee's
    ONNX. ``choice``: the runtime auto chose in a process of its own (:func:`isolated_compile`), built here
    without measuring again: in this process the other methods' runtimes skew the measurement."""
    if choice:
        return _timed(lambda: gawee.compile(model, xs, backend=choice))
    module, seconds = _timed(lambda: gawee.compile(model, xs, backend="auto"))
    log.info("  gawee auto: %s", module.gawee_report.backend)
    return module, seconds


def build_gawee_onednn_graph(model, xs):
    """gawee.compile on oneDNN Graph: the rewritten graph traced and compiled into fused partitions."""
    module, seconds = _timed(lambda: gawee.compile(model, xs, backend="onednn_graph"))
    log.info("  gawee oneDNN Graph: %d fused partitions", module.partitions)
    return module, seconds


def build_gawee_dynamic(model, xs):
    """gawee.compile with dimension 0 of every input dynamic (``--dynamic batch``; a batch of 1 is captured
    at 2, which torch.export would otherwise specialize), then run at this row's batch."""
    from gawee.frontend.dynamic import dynamic_spec

    spec, examples = dynamic_spec("batch", model, xs)
    module, seconds = _timed(lambda: gawee.compile(model, examples, dynamic_shapes=spec))
    log.info("  gawee dynamic: %s", module.gawee_report)
    return module, seconds


def build_gawee_dynamo(model, xs):
    compiled = torch.compile(model, backend="gawee")
    _, seconds = _timed(lambda: _run(compiled, xs))  # dynamo captures and calls the backend on the first call
    return compiled, seconds


def build_gawee_iree(model, xs):
    module, seconds = _timed(lambda: gawee.compile(model, xs, backend="iree"))
    log.info("  gawee iree: %s", module.gawee_report)
    return module, seconds


def build_iree_turbine(model, xs):
    """What a PyTorch user would do today to run a model on IREE: iree-turbine's ``aot.export``
    (torch.export, then torch-mlir's torch dialect), compiled with the same iree-compile flags as
    gawee's path (llvm-cpu for the host, gawee.backend.iree.compile_flags) and run by the same runtime
    wrapper (local-task driver): only the MLIR handed to IREE differs."""
    from iree.turbine import aot

    from gawee.backend.iree import IreeModule, compile_iree
    from gawee.ir.types import TensorType

    def make():
        text = str(aot.export(model, args=tuple(xs)).mlir_module)
        with torch.no_grad():
            out = model(*xs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        vmfb = compile_iree(text, input_type="torch")
        return IreeModule(vmfb, [TensorType.of(x) for x in xs], [TensorType.of(o) for o in outs])

    return _timed(make)


def build_openvino(model, xs, precision: str = "f32"):
    """OpenVINO's CPU plugin on ``openvino.convert_model`` of the eager model (traced with the example inputs),
    compiled with the latency hint (one stream) and ``precision`` as its inference precision (float32 here:
    without that hint the plugin runs in bf16 on CPUs that have bf16 instructions; benchmarks/bench_bf16.py asks
    for ``"bf16"``). As many threads as torch's and ONNX Runtime's. The callable takes and returns torch tensors,
    as the ONNX Runtime columns' do (its copies are timed with it)."""
    import openvino as ov

    def make():
        with torch.no_grad():
            converted = ov.convert_model(model, example_input=tuple(xs))
        compiled = ov.Core().compile_model(
            converted,
            "CPU",
            {
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": precision,
                "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            },
        )
        request = compiled.create_infer_request()
        return lambda *args: torch.from_numpy(request.infer([a.numpy() for a in args], share_inputs=True)[0])

    return _timed(make)


BUILDERS: dict[str, Callable] = {
    "eager": build_eager,
    "fx_fuse": build_fx_fuse,
    "jit": build_jit,
    "inductor": build_inductor,
    "ort_basic": build_ort_basic,
    "ort_all": build_ort_all,
    "ort_gawee": build_ort_gawee,
    "ort_all_gawee": build_ort_all_gawee,
    "gawee": build_gawee,
    "gawee_auto": build_gawee_auto,
    "gawee_onednn_graph": build_gawee_onednn_graph,
    "gawee_dynamic": build_gawee_dynamic,
    "gawee_dynamo": build_gawee_dynamo,
    "gawee_iree": build_gawee_iree,
    "iree_turbine": build_iree_turbine,
    "openvino": build_openvino,
}


def _ort_session(ort, path: Path, level):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda *xs: torch.from_numpy(session.run(None, dict(zip(names, (x.numpy() for x in xs))))[0])


def _timed(make):
    t0 = time.perf_counter()
    out = make()
    return out, time.perf_counter() - t0


def _run(fn, xs):
    with torch.no_grad():
        out = fn(*xs)
    return out[0] if isinstance(out, (tuple, list)) else out


# -- the benchmark ------------------------------------------------------------------------
RELATIVE_TOLERANCE = 1e-4
"""Outputs match eager when max |out - eager| <= this x max |eager| (random-weight outputs can be tiny)."""


def make_model(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A model with seeded random weights and its input for ``batch``: a torchvision classifier on a
    224×224 image, or a spec (``TRANSFORMER_MODELS``; gawee.frontend.models.resolve: Hugging Face
    text models get token ids and an attention mask). Weights are made to look trained where
    initialization is degenerate: weight matrices initialized to zero (ViT's head) get small random
    values, so that the output check compares something; biases initialized to zero (squeeze-excitation
    convolutions, Hugging Face's linears) get small random values too; and normalization layers get random
    affine parameters and statistics — at initialization batch norm is the identity. All-zero biases, given or
    left by folding, would be dropped (gawee's zero_bias rules, torch.onnx's optimizer) and make the graphs
    unlike those of trained models."""
    spec = TRANSFORMER_MODELS.get(name, name)
    torch.manual_seed(0)
    if spec.startswith(("hf:", "timm:")):
        from gawee.frontend.models import resolve

        source = resolve(spec, batch=batch, seed=0)
        model, xs = source.module.eval(), tuple(source.example_inputs)
    else:
        model = torchvision.models.get_model(spec, weights=None).eval()
        xs = (torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1)),)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if (p.dim() >= 2 or key.endswith("bias")) and not p.any():
                p.normal_(0, 0.02)
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model, xs


class CpuMeter:
    """How many cores other processes kept busy during a block: /proc/stat busy time minus this process's own."""

    def __init__(self):
        self.foreign = None

    @staticmethod
    def _busy_s() -> float | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    def __enter__(self):
        self._t, self._busy, own = time.perf_counter(), self._busy_s(), os.times()
        self._own = own.user + own.system
        return self

    def __exit__(self, *exc):
        busy, own = self._busy_s(), os.times()
        if busy is not None and self._busy is not None:
            wall = max(time.perf_counter() - self._t, 1e-6)
            self.foreign = max(0.0, (busy - self._busy - (own.user + own.system - self._own)) / wall)


def wait_for_quiet(max_foreign: float, timeout_s: float) -> float | None:
    """Wait (at most ``timeout_s``) until other processes use at most ``max_foreign`` cores; returns their use."""
    deadline = time.monotonic() + timeout_s
    while True:
        with CpuMeter() as meter:
            time.sleep(2.0)
        if meter.foreign is None or meter.foreign <= max_foreign or time.monotonic() > deadline:
            if meter.foreign is not None and meter.foreign > max_foreign:
                log.warning("machine still busy (%.2f cores used by other processes); measuring anyway", meter.foreign)
            return meter.foreign
        log.info("waiting for a quiet machine (%.2f cores busy elsewhere)", meter.foreign)
        time.sleep(8.0)


@dataclass
class Quiet:
    """When to measure: other processes may use at most ``max_foreign`` cores; timings taken under more
    load are repeated up to ``attempts`` times (the quietest attempt is kept)."""

    max_foreign: float = 0.15
    timeout_s: float = 900.0
    attempts: int = 3


def isolated_compile(name: str, batch: int, method: str) -> tuple[float, str | None]:
    """``method``'s compile time on this row measured in a process of its own, after that process warmed
    the method's toolchain up (a fresh Inductor cache), and for ``gawee_auto`` (and ``gawee``, where it measured
    a whole-graph runtime) the runtime it chose there.
    In the benchmark's own process every method is built after the ones before it, whose runtimes, threads
    and memory slow a later compile: gawee's took 2.6 s on BERT b8 after eager alone and 3.8-4.5 s after
    Inductor and ORT were built (0.6-0.8 s more in its kernel measurement and weight packing). They skew
    auto's timing of its candidates too: on mobilenet_v3_large b1 it measured ORT at 2.73 ms per call there,
    against 1.69-1.90 ms in a process of its own (three runs) and 1.82 ms in the table's own ORT column,
    and chose oneDNN Graph. A user compiles one model with one method."""
    with tempfile.TemporaryDirectory(prefix="gawee-bench-inductor-") as cache:
        done = subprocess.run(
            [sys.executable, __file__, "--time-compile", method, "--models", name, "--batches", str(batch)],
            capture_output=True,
            text=True,
            env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache),
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"compiling {method} in its own process failed: {done.stderr.strip()[-300:]}")
    timed = json.loads(lines[-1])
    return timed["compile_s"], timed["choice"]


def fastest_compiles(name: str, batch: int, methods: list[str], runs: int) -> tuple[dict[str, float], dict[str, str]]:
    """Each method's compile seconds on this row, the fastest of ``runs`` fresh processes (:func:`isolated_compile`,
    in rounds over the methods, so a slow stretch of the machine hits them alike), and the runtime each method that
    measures runtimes chose in its fastest one. A method whose compile fails is left out (reported with the
    in-process build's result)."""
    compile_s: dict[str, float] = {}
    choices: dict[str, str] = {}
    for _ in range(runs):
        for method in methods:
            if method == "eager" or (method in OWN_PROCESS and importlib.util.find_spec(OWN_PROCESS[method]) is None):
                continue  # a missing package is said once, by in_own_process
            try:
                seconds, made = isolated_compile(name, batch, method)
            except RuntimeError as e:
                log.warning("%s b%d %s: %s", name, batch, method, e)
                continue
            if seconds < compile_s.get(method, math.inf):
                compile_s[method] = seconds
                choices.pop(method, None)  # the choice of this, the fastest, compile: none if it measured nothing
                if made:
                    choices[method] = made
    return compile_s, choices


def time_compile(method: str, name: str, batch: int) -> dict:
    """``--time-compile``: warm the toolchain up, then build ``method`` on the row's model once; its compile
    seconds and, for ``backend="auto"`` and where the default measured the whole-graph runtimes, the
    runtime it chose."""
    warm_up_toolchains([method])
    model, x = make_model(name, batch)
    _run(model, x)
    module, seconds = BUILDERS[method](model, x)
    choice = getattr(getattr(module, "gawee_report", None), "backend", None)
    measured = choice is not None and (method == "gawee_auto" or bool(choice.seconds))  # auto, or the default timed
    return {"compile_s": seconds, "choice": choice.chosen if measured else None}


def bench_config(
    name: str,
    batch: int,
    methods: list[str],
    reps: int,
    warmup: int,
    passes: int,
    quiet: Quiet,
    isolated: bool = True,
    compile_runs: int = 2,
) -> list[Result]:
    wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
    compile_s: dict[str, float] = {}
    choices: dict[str, str] = {}
    if isolated:  # before this process holds any method's module: the machine is otherwise idle
        compile_s, choices = fastest_compiles(name, batch, methods, compile_runs)
    # likewise the methods measured in a process of their own, one after the other
    own = {m: in_own_process(name, batch, m, reps, warmup, passes, quiet) for m in methods if m in OWN_PROCESS}
    model, x = make_model(name, batch)
    reference = _run(model, x)
    results, runners = [], {}
    for method in methods:
        if method in own:
            results.append(own[method])
            own[method].compile_s = compile_s.get(method, own[method].compile_s)
            continue
        result = Result(name, batch, method)
        results.append(result)
        fn = build_checked(result, model, x, reference, choices.get(method))
        result.compile_s = compile_s.get(method, result.compile_s)
        if fn is not None:
            runners[method] = fn
    foreign, times = time_methods(runners, x, reps, warmup, passes, quiet, f"{name} b{batch}")
    for r in results:
        if r.method not in own:
            record_times(r, foreign, times)
    return results


def build_checked(result: Result, model, x, reference: torch.Tensor, choice: str | None = None):
    """Build ``result.method`` on the model and check its output against eager's ``reference``: the callable, or
    None where it failed (``result`` says why). ``choice``: the runtime gawee or auto chose in a process of its
    own."""
    method = result.method
    log.info("%s: building %s", result.label, method)
    try:
        if method in ("gawee", "gawee_auto") and choice:
            fn, result.compile_s = BUILDERS[method](model, x, choice)
            result.choice = choice
            log.info("  %s, in a process of its own, chose %s", method, choice)
        else:
            fn, result.compile_s = BUILDERS[method](model, x)
        result.flops = getattr(fn, "flops", None)
        out = _run(fn, x)
        result.max_error = (out - reference).abs().max().item() / (reference.abs().max().item() or 1.0)
        result.ok = out.shape == reference.shape and result.max_error <= RELATIVE_TOLERANCE
        if not result.ok:
            result.error = f"output differs from eager by {result.max_error:.3g}"
        if method in ("ort_all", "ort_all_gawee"):
            result.ort_graph = fn.optimized_graph()
        return fn
    except Exception as e:  # a baseline that cannot handle a model is a result, not a crash
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
        log.warning("%s %s failed: %s", result.label, method, result.error)
        return None


def time_methods(
    runners: dict[str, Callable], x, reps: int, warmup: int, passes: int, quiet: Quiet, label: str
) -> tuple[float | None, dict[str, list[float]]]:
    """Time each runner: warm-up calls, then ``reps`` calls in ``passes`` passes over the runners, retimed (up to
    ``quiet.attempts`` times) while other processes use more than ``quiet.max_foreign`` cores. The cores other
    processes used during the quietest attempt, and its milliseconds per call of each runner."""
    best: tuple[float, dict[str, list[float]]] | None = None
    for attempt in range(quiet.attempts):
        if attempt:
            wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
        times: dict[str, list[float]] = {m: [] for m in runners}
        per_pass = -(-reps // passes)
        with CpuMeter() as meter:
            for p in range(passes):  # several passes over the methods: slow drift of the machine hits all
                for method, fn in runners.items():
                    # Consecutive calls of one method: interleaving single calls would let one runtime's
                    # spinning thread pool (OpenMP's, ONNX Runtime's) steal the cores from another's call.
                    time.sleep(0.2)
                    for _ in range(warmup if p == 0 else min(warmup, 2)):
                        _run(fn, x)
                    for _ in range(min(per_pass, reps - len(times[method]))):
                        t0 = time.perf_counter()
                        _run(fn, x)
                        times[method].append((time.perf_counter() - t0) * 1e3)
        foreign = meter.foreign if meter.foreign is not None else 0.0
        if best is None or foreign < best[0]:
            best = (foreign, times)
        if foreign <= quiet.max_foreign:
            break
        log.warning("%s: %.2f cores busy elsewhere while timing; timing again", label, foreign)
    return best if best else (None, {})


def record_times(result: Result, foreign: float | None, times: dict[str, list[float]]) -> None:
    result.foreign_load = foreign
    if times.get(result.method):
        result.latencies_ms = times[result.method]
        result.latency_ms = statistics.median(result.latencies_ms)


def own_process_row(method: str, name: str, batch: int, reps: int, warmup: int, passes: int, quiet: Quiet) -> Result:
    """The job of a process of its own (``--own-process METHOD``, :func:`in_own_process`): warm the method's
    toolchain up, build it on the row's model, check its output against eager's, and time it as
    :func:`bench_config` times the others."""
    warm_up_toolchains([method])
    model, x = make_model(name, batch)
    reference = _run(model, x)
    result = Result(name, batch, method)
    fn = build_checked(result, model, x, reference)
    foreign, times = time_methods({method: fn} if fn else {}, x, reps, warmup, passes, quiet, result.label)
    record_times(result, foreign, times)
    return result


def in_own_process(name: str, batch: int, method: str, reps: int, warmup: int, passes: int, quiet: Quiet) -> Result:
    """``method``'s row measured by :func:`own_process_row` in a fresh process with torch's thread count, or a row
    that says why not: its package is missing, or the process crashed or timed out."""
    package = OWN_PROCESS[method]
    if importlib.util.find_spec(package) is None:
        why = f"{NOT_INSTALLED}: No module named '{package}' (pip install -e '.[bench]', or pip install {package})"
        return Result(name, batch, method, error=why)
    wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
    log.info("%s b%d: %s in a process of its own", name, batch, method)
    args = ["--own-process", method, "--models", name, "--batches", str(batch), "--reps", str(reps)]
    args += ["--warmup", str(warmup), "--passes", str(passes), "--max-foreign-load", str(quiet.max_foreign)]
    args += ["--quiet-timeout", str(quiet.timeout_s)]
    timeout = quiet.attempts * (quiet.timeout_s + 900.0)
    row, why, _ = run_worker(Path(__file__), args, timeout=timeout, threads=torch.get_num_threads())
    if row is None:
        why = f"its process timed out after {timeout:.0f} s" if why == TIMEOUT else f"its process: {why}"
        log.warning("%s b%d %s failed: %s", name, batch, method, why)
        return Result(name, batch, method, error=why)
    return Result(**row)


def warm_up_toolchains(methods: list[str]) -> float:
    """Compile a tiny model with every method once: imports and first-use setup are nobody's compile time."""
    t0 = time.perf_counter()
    tiny = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 2),
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    heads = torch.randn(1, 2, 4, 8)  # attention's first use too: gawee tries oneDNN Graph's fuser once per process
    for method in methods:
        for model, inputs in ((tiny, (x,)), (_TinyAttention().eval(), (heads,))):
            try:
                _run(BUILDERS[method](model, inputs)[0], inputs)
            except Exception as e:  # reported again, per model, if it matters
                log.warning("warm-up of %s failed: %s", method, e)
    return time.perf_counter() - t0


class _TinyAttention(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.scaled_dot_product_attention(x, x * 0.5, x)


# -- reporting ----------------------------------------------------------------------------
def machine() -> dict:
    import onnxruntime

    try:  # its version only: openvino is imported by the processes that run it, not this one
        openvino = importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        openvino = None
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino,
        "load_average": os.getloadavg(),
    }


def markdown(results: list[Result], meta: dict) -> str:
    methods = list(dict.fromkeys(r.method for r in results))
    configs = list(dict.fromkeys((r.model, r.batch) for r in results))
    index = {(r.model, r.batch, r.method): r for r in results}
    lines = [
        "| model | batch | " + " | ".join(METHODS[m] for m in methods) + " | busy elsewhere |",
        "|---|---:|" + "---:|" * len(methods) + "---:|",
    ]
    for model, batch in configs:
        eager = index[(model, batch, "eager")].latency_ms if (model, batch, "eager") in index else None
        # the row's timings are this process's; a method timed in a process of its own says its load where it differs
        here = [m for m in methods if m not in OWN_PROCESS and (model, batch, m) in index] or methods
        foreign = index[(model, batch, here[0])].foreign_load if (model, batch, here[0]) in index else None
        cells = []
        for m in methods:
            r = index.get((model, batch, m))
            if r is None:
                cells.append("–")
                continue
            if r.latency_ms is None:
                cells.append("not installed" if r.error.startswith(NOT_INSTALLED) else "failed")
                continue
            speed = f" ({eager / r.latency_ms:.2f}×)" if eager else ""
            comp = f"<br>compile {r.compile_s:.1f} s" if r.compile_s else ""
            comp += f"<br>chose {r.choice}" if r.choice else ""
            if r.foreign_load is not None and foreign is not None and f"{r.foreign_load:.2f}" != f"{foreign:.2f}":
                comp += f"<br>timed with {r.foreign_load:.2f} cores busy elsewhere"
            flag = "" if r.ok else " ⚠"
            cells.append(f"{r.latency_ms:.1f} ms{speed}{comp}{flag}")
        lines.append(
            f"| {model} | {batch} | "
            + " | ".join(cells)
            + (f" | {foreign:.2f} cores |" if foreign is not None else " | ? |")
        )
    notes = [f"- ⚠ {r.label} {METHODS[r.method]}: {r.error}" for r in results if r.error]
    head = (
        f"Median latency of {meta['reps']} runs in {meta.get('passes', 1)} passes over the methods, after "
        f"{meta['warmup']} warm-up calls (speedup over "
        f"eager), compile time below"
        + (", each method's measured in a fresh process of its own" if meta.get("compile") == "own process" else "")
        + (
            f" (the fastest of {meta['compile_runs']}, in rounds over the methods)"
            if meta.get("compile") == "own process" and meta.get("compile_runs", 1) > 1
            else ""
        )
        + f". Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['torch_threads']} torch threads; torch {meta['machine']['torch']}, onnxruntime "
        f"{meta['machine']['onnxruntime']}"
        + (f", openvino {meta['machine']['openvino']}" if meta["machine"].get("openvino") else "")
        + ". *busy elsewhere*: CPU cores other processes used while the row "
        f"was timed (timings wait for, and are retaken above, {meta['max_foreign']:.2f} cores)."
    )
    if meta.get("gawee"):
        start, end = meta["machine"].get("load_average"), meta.get("load_average_end")
        load = f" · load average {start[0]:.2f} at the start" if start else ""
        load += f", {end[0]:.2f} at the end" if end else ""
        head = f"Run {meta['date']} · {meta['gawee']}{load}. " + head
    return "\n".join([head, "", *lines, "", *notes]).rstrip() + "\n"


def targets(results: list[Result]) -> str:
    """Issue 5's targets, checked against these figures (met or not, with the numbers)."""
    index = {(r.model, r.batch, r.method): r for r in results}

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    lines = []
    eager, fast, inductor = (index.get(("resnet18", 1, m)) for m in ("eager", "gawee", "inductor"))
    if eager and fast and eager.latency_ms and fast.latency_ms:
        speedup = eager.latency_ms / fast.latency_ms
        lines.append(
            f"- ResNet-18, batch 1, gawee.compile at least 4× faster than eager: {speedup:.2f}× "
            f"({eager.latency_ms:.1f} → {fast.latency_ms:.1f} ms) — {verdict(speedup >= 4)}."
        )
        if inductor and inductor.latency_ms:
            ratio = inductor.latency_ms / fast.latency_ms
            lines.append(
                f"- … at least as fast as Inductor with freezing: {fast.latency_ms:.2f} ms vs "
                f"{inductor.latency_ms:.2f} ms ({ratio:.3f}×) — {verdict(ratio >= 1)}."
            )
        if fast.compile_s is not None:
            other = f" (Inductor: {inductor.compile_s:.1f} s)" if inductor and inductor.compile_s else ""
            lines.append(
                f"- … compile time at most 2 s: {fast.compile_s:.2f} s{other} — {verdict(fast.compile_s <= 2)}."
            )
        if fast.flops:
            lines.append(
                f"- (ResNet-18 is {fast.flops / 1e9:.2f} GFLOP per image: gawee's module runs at "
                f"{fast.flops / fast.latency_ms / 1e6:.0f} GFLOP/s, eager at "
                f"{fast.flops / eager.latency_ms / 1e6:.0f} GFLOP/s.)"
            )
    pairs = [(index.get((r.model, r.batch, "eager")), r) for r in results if r.method == "gawee" and r.latency_ms]
    slower = [
        f"{r.label} ({e.latency_ms / r.latency_ms:.2f}×)"
        for e, r in pairs
        if e and e.latency_ms and r.latency_ms > e.latency_ms
    ]
    worst = min((e.latency_ms / r.latency_ms for e, r in pairs if e and e.latency_ms), default=None)
    if worst is not None:
        lines.append(
            f"- gawee.compile never slower than eager: slowest ratio {worst:.2f}× — "
            f"{verdict(not slower)}" + (f" (slower on {', '.join(slower)})." if slower else ".")
        )
    dynamic = dynamic_targets(results)
    if dynamic:
        lines.append(dynamic)
    gawee_rows = [r for r in results if r.method == "gawee"]
    if gawee_rows:
        worst_error = max((r.max_error for r in gawee_rows if r.max_error is not None), default=float("nan"))
        lines.append(
            f"- gawee.compile's outputs match eager: largest relative difference {worst_error:.1e} — "
            f"{verdict(all(r.ok for r in gawee_rows))}."
        )
    ort = [(index.get((r.model, r.batch, "ort_basic")), r) for r in results if r.method == "ort_gawee"]
    ort = [(b, g) for b, g in ort if b and b.latency_ms and g.latency_ms]
    if ort:
        ratios = [b.latency_ms / g.latency_ms for b, g in ort]
        behind = [f"{g.label} ({b.latency_ms / g.latency_ms:.3f}×)" for b, g in ort if g.latency_ms > b.latency_ms]
        lines.append(
            f"- ONNX Runtime with its optimizer off on gawee's graph at least as fast as ORT basic on "
            f"the plain export: {sum(r >= 1 for r in ratios)} of {len(ratios)} rows, ratios "
            f"{min(ratios):.3f}–{max(ratios):.3f}× — {verdict(not behind)}"
            + (f" (behind on {', '.join(behind)})." if behind else ".")
        )
    text = "\n".join(lines) + "\n" if lines else ""
    rivals = rival_targets(results, CNN_TARGET_MODELS)
    if rivals:
        text += (
            "\ngawee.compile at least as fast as the faster of ONNX Runtime (all optimizations) and Inductor "
            f"(freezing), per row:\n\n{rivals}"
        )
    ort_all = ort_export_targets(results)
    return text + ("\n" + ort_all if text and ort_all else ort_all)


def dynamic_targets(results: list[Result]) -> str:
    """Issue 13's target: the dynamic-batch module within 5% of the static one, per row (batch 1 and 8)."""
    index = {(r.model, r.batch, r.method): r for r in results}
    rows = [
        (r.label, index[(r.model, r.batch, "gawee")].latency_ms / r.latency_ms)
        for r in results
        if r.method == "gawee_dynamic" and r.latency_ms and (r.model, r.batch, "gawee") in index
        if index[(r.model, r.batch, "gawee")].latency_ms
    ]
    if not rows:
        return ""
    behind = [f"{label} ({ratio:.3f}×)" for label, ratio in rows if ratio < 1 / 1.05]
    cells = ", ".join(f"{label} {ratio:.3f}×" for label, ratio in rows)
    met = "**met**" if not behind else "**not met**"
    return f"- gawee.compile with a dynamic batch within 5% of the static module (static / dynamic): {cells} — {met}."


def rival_targets(results: list[Result], models: list[str] | None = None, compile_ratio: float | None = None) -> str:
    """Per row: gawee.compile at least as fast as the faster of Inductor (freezing) and ONNX Runtime (all
    optimizations), outputs equal to eager and, with ``compile_ratio``, compile time at most that fraction
    of Inductor's. ``models``: the rows to check (default: all)."""
    methods = [m for m in ("gawee", "gawee_onednn_graph", "gawee_auto") if any(r.method == m for r in results)]
    return "".join(_rival_targets(results, m, models, compile_ratio) for m in methods)


def _rival_targets(results: list[Result], method: str, models: list[str] | None, compile_ratio: float | None) -> str:
    index = {(r.model, r.batch, r.method): r for r in results}
    lines = []
    met = total = 0
    for model, batch in dict.fromkeys((r.model, r.batch) for r in results):
        if models is not None and model not in models:
            continue
        fast = index.get((model, batch, method))
        rivals = [index.get((model, batch, m)) for m in ("inductor", "ort_all")]
        rivals = [r for r in rivals if r and r.ok and r.latency_ms]
        if not fast or not fast.latency_ms or not rivals:
            continue
        best = min(rivals, key=lambda r: r.latency_ms)
        ratio = best.latency_ms / fast.latency_ms
        inductor = index.get((model, batch, "inductor"))
        compile_ok = (
            compile_ratio is None
            or inductor is None
            or not inductor.compile_s
            or (fast.compile_s or 0) <= inductor.compile_s * compile_ratio
        )
        ok = ratio >= 1 and fast.ok and compile_ok
        total += 1
        met += ok
        comp = ""
        if compile_ratio is not None:
            comp = (
                f", compile {fast.compile_s:.1f} s vs Inductor's {inductor.compile_s:.1f} s"
                if inductor and inductor.compile_s
                else f", compile {fast.compile_s:.1f} s"
            )
        lines.append(
            f"- {model} b{batch}: {METHODS[method]} {fast.latency_ms:.1f} ms vs {METHODS[best.method]} "
            f"{best.latency_ms:.1f} ms ({ratio:.3f}×){'' if fast.ok else ', outputs differ'}{comp} — "
            f"{'**met**' if ok else '**not met**'}."
        )
    if total:
        what = "all three targets" if compile_ratio is not None else "the target"
        lines.insert(0, f"- {METHODS[method]}: rows meeting {what}: {met} of {total}.")
    return "\n".join(lines) + "\n" if lines else ""


def transformer_targets(results: list[Result]) -> str:
    """Issue 11's targets, per row: gawee.compile at least as fast as the faster of Inductor (freezing) and
    ONNX Runtime (all optimizations), outputs equal to eager, compile time at most a third of Inductor's."""
    return rival_targets(results, compile_ratio=1 / 3)


def ort_export_targets(results: list[Result]) -> str:
    """Issue 12: ORT (all optimizations) on gawee.to_onnx's graph at least as fast as on torch.onnx's export.
    A row is met where it measured so, or where ORT's optimizer made the same graph of both files
    (:func:`optimized_graph`): then the two sessions run the same kernels, and the ratio is this machine's noise."""
    index = {(r.model, r.batch, r.method): r for r in results}
    pairs = [(index.get((r.model, r.batch, "ort_all")), r) for r in results if r.method == "ort_all_gawee"]
    pairs = [(t, g) for t, g in pairs if t and t.latency_ms and g.latency_ms]
    if not pairs:
        return ""
    ratios = [t.latency_ms / g.latency_ms for t, g in pairs]
    same = [bool(t.ort_graph) and t.ort_graph == g.ort_graph for t, g in pairs]
    behind = [
        f"{g.label} ({ratio:.3f}×)" for (t, g), ratio, equal in zip(pairs, ratios, same) if ratio < 1 and not equal
    ]
    return (
        f"- ONNX Runtime (all optimizations) on gawee.to_onnx's graph at least as fast as on torch.onnx's "
        f"export: measured on {sum(r >= 1 for r in ratios)} of {len(ratios)} rows, ratios {min(ratios):.3f}–"
        f"{max(ratios):.3f}×; ORT's optimizer made the same graph of both on {sum(same)} of {len(same)} rows "
        f"(the same kernels on operands of the same shapes: there the ratio is the machine's noise) — "
        f"{'**not met**' if behind else '**met**'}" + (f" (behind on {', '.join(behind)}).\n" if behind else ".\n")
    )


def transformers_section(table: str, checks: str, command: str) -> str:
    return (
        "Produced by `make bench` (its transformers suite), i.e.\n\n"
        f"```sh\n{command}\n```\n\n"
        "Random weights; BERT-base and GPT-2 are 12 layers, 768 wide, 12 heads, 128 tokens (token ids and an "
        "attention mask whose last quarter is padding, `hf:bert:layers=12,hidden=768,heads=12,seq=128`); "
        "vit_b_16 and swin_t from torchvision, deit_tiny_patch16_224 and mixer_b16_224 from timm, 224×224 "
        "images. Columns: **eager PyTorch**; **Inductor**: `torch.compile(model)` with "
        "`torch._inductor.config.freezing = True`, fresh cache; **ONNX Runtime all optimizations**: "
        "`torch.onnx.export(model)` run with `ORT_ENABLE_ALL` (its transformer fusions included); "
        "**OpenVINO**: `openvino.convert_model(model, example_input=x)` compiled for the CPU plugin with "
        "`PERFORMANCE_HINT=LATENCY` and `INFERENCE_PRECISION_HINT=f32` (without it OpenVINO runs in bf16 on "
        "CPUs that have bf16 instructions), as many threads as torch, built, checked and timed in a process "
        "of its own (`in_own_process`); install it with `pip install -e '.[bench]'` (what `make bench` runs) "
        'or `pip install openvino`, else its cells say "not installed"; '
        "**gawee.compile**: capture, bundled rules (Q/K/V fused into one linear, GELU/SiLU recognized, "
        "activations fused into the linear before them), verification, `to_torch`, where each linear shape "
        "runs on the kernel measured fastest at compile time (torch's GEMM, MKL's packed sgemm or oneDNN's "
        "prepacked linear with the activation as a post-op; `gawee.backend.kernels`) and each attention on "
        "aten's fused kernel or oneDNN Graph's attention partition, whichever measured faster "
        "(`gawee.backend.attention`); where measuring it costs at most as long as the compile took so far "
        "(about 16 calls of the model; at most 3.5 s always), the whole-graph runtimes of the same graph "
        "(oneDNN Graph's partitions, oneDNN's primitives in each layout: `gawee.backend.dnnl`) are built and "
        "timed against that module too, and the fastest kept where it measures more than 5% faster "
        "(`TorchOptions.whole_graph`; the cell says which ran); "
        '**gawee.compile(backend="onednn_graph")**: the rewritten graph traced '
        "into TorchScript and compiled by oneDNN Graph into fused partitions. Compile time is wall "
        "time from the model to a callable, first call included for Inductor, each method's measured in a "
        "fresh process after a warm-up of its toolchain (`isolated_compile`: a tiny CNN and a tiny attention "
        "built with the method first).\n\n"
        f"{table}\n![speedup over eager](runtime.png)\n\n"
        f"### Targets (computed from the table)\n\n{checks}"
    )


def chart(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in dict.fromkeys(r.method for r in results) if m != "eager"]
    configs = list(dict.fromkeys((r.model, r.batch) for r in results))
    index = {(r.model, r.batch, r.method): r for r in results}
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(configs)), 4.5))
    for k, m in enumerate(methods):
        speedups = []
        for model, batch in configs:
            eager, r = index.get((model, batch, "eager")), index.get((model, batch, m))
            ok = eager and r and eager.latency_ms and r.latency_ms
            speedups.append(eager.latency_ms / r.latency_ms if ok else 0.0)
        ax.bar(
            [i + (k - (len(methods) - 1) / 2) * width for i in range(len(configs))], speedups, width, label=METHODS[m]
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(configs)), [f"{m}\nbatch {b}" for m, b in configs], fontsize=8)
    ax.set_ylabel("speedup over eager PyTorch")
    ax.set_title("Inference latency on CPU, speedup over eager (higher is better)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def readme_section(table: str, checks: str, command: str) -> str:
    return (
        "Produced by `make bench`, i.e.\n\n"
        f"```sh\n{command}\n```\n\n"
        "What each column runs, on the same randomly initialized torchvision model and input (biases and "
        "batch-norm parameters that initialization leaves zero or the identity given random values, as trained "
        "ones have: `make_model`):\n\n"
        "- **eager PyTorch**: `model(x)` under `torch.no_grad()`.\n"
        "- **torch.fx fuse**: `torch.fx.experimental.optimization.fuse` (conv/bn folding).\n"
        "- **TorchScript**: `torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model)))`.\n"
        "- **Inductor**: `torch.compile(model)` with `torch._inductor.config.freezing = True`, fresh cache.\n"
        "- **ONNX Runtime basic**: `torch.onnx.export(model)` run with `ORT_ENABLE_BASIC`.\n"
        "- **ONNX Runtime all optimizations**: `torch.onnx.export(model)` run with `ORT_ENABLE_ALL` (its "
        "fusions and NCHWc layout transformer included).\n"
        "- **ONNX Runtime, gawee graph**: `gawee.to_onnx` of the rewritten graph run with `ORT_DISABLE_ALL` "
        "(graph optimization compared alone: same kernels, ORT's optimizer off). ONNX has no fused "
        "convolution, so gawee's fused convs are exported as Conv (with its bias) + activation.\n"
        "- **ONNX Runtime all optimizations, gawee graph**: `gawee.to_onnx` of the rewritten graph run with "
        "`ORT_ENABLE_ALL` (what a user exporting with gawee gets). The targets also compare the graphs ORT's "
        "optimizer makes of the two files (`optimized_graph`: kernels, operand shapes and producers).\n"
        "- **OpenVINO**: `openvino.convert_model(model, example_input=x)` compiled for the CPU plugin with "
        "`PERFORMANCE_HINT=LATENCY` and `INFERENCE_PRECISION_HINT=f32` (without it OpenVINO runs in bf16 on "
        "CPUs that have bf16 instructions), as many threads as torch, built, checked and timed in a process "
        "of its own (`in_own_process`); install it with `pip install -e '.[bench]'` (what `make bench` runs) "
        'or `pip install openvino`, else its cells say "not installed".\n'
        "- **gawee.compile**: capture, bundled rules, verification, `to_torch` (oneDNN fused convolutions "
        "with weights prepacked for the input size, activations NCHW or channels-last as measured faster "
        "at compile time); where measuring it costs at most as long as the compile took so far (about 16 "
        "calls of the model; at most 3.5 s always), the whole-graph runtimes of the same graph — oneDNN "
        "Graph's compiled partitions, and oneDNN's primitives created once with activations blocked "
        "(`onednn:blocked`), channels-last (`onednn:channels_last`) or in each convolution's layout as timed "
        "at compile time (`onednn:per_conv`; `gawee.backend.dnnl`; in each, a 3×3 stride-1 convolution also races "
        "gawee's Winograd F(4×4, 3×3) kernel, `gawee.backend.winograd`, a convolution of 8 channels per group "
        "gawee's grouped kernel, `gawee.backend.grouped`, and a batch norm that alone reads a "
        "concatenation runs in one pass with it, `gawee.backend.affine_cat`) — are built "
        "and timed against that module too, and the fastest kept where it measures more than 5% faster "
        "(`TorchOptions.whole_graph`; the cell says which ran). Before it measures anything, it sets glibc's "
        "allocator to keep the memory a call frees for the next call (`TorchOptions.keep_freed_memory`). The "
        "setting is process-wide, so every column is timed with it: this process builds gawee.compile before "
        "it times any method.\n"
        '- **gawee.compile(backend="auto")**: the same, then oneDNN Graph on the traced rewritten graph, '
        "oneDNN's primitives in each layout and ONNX Runtime (all optimizations) on `gawee.to_onnx` of it are "
        "built too, all are timed at compile "
        "time, and the module keeps the torch lowering unless another measures more than 5% faster "
        "(`gawee.backend.onednn_graph`, `gawee.backend.ort`). The choice is made where its compile time is "
        "measured, in a process of its own as a user's would be (the cell says which); the row then times "
        "that runtime, built in the benchmark's process without measuring again (there, the other methods' "
        "runtimes skew the candidates' timings).\n"
        '- **gawee.compile(backend="onednn_graph")**: the rewritten graph traced into TorchScript, frozen, and '
        "compiled by oneDNN Graph into fused partitions (`gawee.backend.onednn_graph`).\n"
        '- **torch.compile(backend="gawee")**: the same pipeline behind dynamo (parameters frozen, the '
        "graph re-exported with torch.export).\n"
        "- **gawee.compile, dynamic batch**: the same, captured with dimension 0 dynamic "
        "(`dynamic_shapes`, `--dynamic batch`): one module for every batch size, timed at this row's.\n\n"
        "Compile time is wall time from the model to a callable (for Inductor and TorchScript, including "
        "the first call, where they compile), each method's measured in a fresh process after a warm-up of its "
        "toolchain (`isolated_compile`: built after other methods in one process, a compile runs up to 1.7x "
        "slower). Outputs of every method are compared with eager "
        "(⚠ marks a mismatch or a failure).\n\n"
        f"{table}\n![speedup over eager](runtime.png)\n\n"
        f"### Targets (computed from the table)\n\n{checks}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--suite",
        choices=[*SUITES, "all"],
        default="all",
        help="cnn: torchvision CNNs and ViT, every method (## Runtime); transformers: "
        + ", ".join(TRANSFORMER_MODELS)
        + " against Inductor and ONNX Runtime (## Runtime: transformers); all: both, one after the other",
    )
    p.add_argument(
        "--models",
        help="comma-separated torchvision names, row names of the transformers suite or model specs "
        "(hf:..., timm:...); default: the suite's",
    )
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    p.add_argument("--methods", help="comma-separated, from: " + ", ".join(METHODS) + "; default: the suite's")
    p.add_argument("--reps", type=int, default=20, help="timed runs per method (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per method before timing")
    p.add_argument(
        "--passes",
        type=int,
        default=4,
        help="split the timed runs into this many passes over the methods (2 more warm-up calls each)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of the suite's saved JSON (written after every row) and measure only the missing ones",
    )
    p.add_argument("--out", type=Path, default=HERE, help="directory for runtime.{json,md,png}")
    p.add_argument("--readme", action="store_true", help="update the ## Runtime section of benchmarks/README.md")
    p.add_argument(
        "--max-foreign-load",
        type=float,
        default=Quiet.max_foreign,
        help="measure only while other processes use at most this many cores (waits, then retimes)",
    )
    p.add_argument(
        "--quiet-timeout",
        type=float,
        default=Quiet.timeout_s,
        help="seconds to wait for a quiet machine before measuring anyway",
    )
    p.add_argument(
        "--compile-in-process",
        action="store_true",
        help="time each method's compile in the benchmark's process (after the methods before it) instead of "
        "in a fresh process of its own",
    )
    p.add_argument(
        "--compile-runs",
        type=int,
        default=2,
        help="time each method's compile in this many fresh processes (rounds over the methods) and keep the "
        "fastest: one compile is one sample, and this VM's compile times move by 10-30%% between runs",
    )
    p.add_argument("--time-compile", metavar="METHOD", help=argparse.SUPPRESS)  # the fresh process's job
    p.add_argument("--own-process", metavar="METHOD", help=argparse.SUPPRESS)  # in_own_process's job: --out is a file
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="RUNTIME_JSON",
        help="measure nothing: render the table, chart and README section of a saved run",
    )
    args = p.parse_args(argv)
    if args.time_compile:
        print(json.dumps(time_compile(args.time_compile, args.models, int(args.batches))))
        return 0
    quiet = Quiet(args.max_foreign_load, args.quiet_timeout)
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices
    if args.own_process:
        row = own_process_row(
            args.own_process, args.models, int(args.batches), args.reps, args.warmup, args.passes, quiet
        )
        args.out.write_text(json.dumps(asdict(row)))
        return 0
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    if len(suites) > 1 and (args.models or args.methods or args.from_json):
        p.error("--models, --methods and --from-json apply to one suite: add --suite cnn or --suite transformers")
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_runtime.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for suite in suites:
        models, methods, heading, stem = SUITES[suite]
        models = args.models.split(",") if args.models else models
        methods = [m for m in args.methods.split(",") if m] if args.methods else list(methods)
        if "eager" not in methods:
            methods.insert(0, "eager")
        unknown = set(methods) - set(METHODS)
        if unknown:
            p.error(f"unknown methods {sorted(unknown)}")
        run_suite(suite, models, methods, heading, stem, args, quiet, command.strip())
    return 0


def run_suite(suite, models, methods, heading, stem, args, quiet, command) -> None:
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        meta, results = saved["meta"], [Result(**r) for r in saved["results"]]
    else:
        meta = {
            "suite": suite,
            "reps": args.reps,
            "warmup": args.warmup,
            "passes": args.passes,
            "machine": machine(),
            "max_foreign": quiet.max_foreign,
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "gawee": source_version(),
            "compile": "in process" if args.compile_in_process else "own process",
            "compile_runs": 1 if args.compile_in_process else args.compile_runs,
        }
        saved = args.out / f"{stem}.json"
        results = []
        if args.resume and saved.exists():
            results = [Result(**r) for r in json.loads(saved.read_text())["results"]]
        done = {(r.model, r.batch) for r in results}
        meta["warm_up_s"] = warm_up_toolchains([m for m in methods if m not in OWN_PROCESS])  # theirs: own_process_row
        for name in models:
            for batch in (int(b) for b in args.batches.split(",")):
                if (name, batch) in done:
                    continue
                results += bench_config(
                    name,
                    batch,
                    methods,
                    args.reps,
                    args.warmup,
                    args.passes,
                    quiet,
                    not args.compile_in_process,
                    args.compile_runs,
                )
                saved.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1))
                for r in results[-len(methods) :]:
                    log.info(
                        "  %-10s %8s ms  compile %6s s  %s",
                        r.method,
                        f"{r.latency_ms:.2f}" if r.latency_ms else "-",
                        f"{r.compile_s:.2f}" if r.compile_s is not None else "-",
                        r.error,
                    )
        meta["load_average_end"] = os.getloadavg()
        (args.out / f"{stem}.json").write_text(
            json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1)
        )
    transformers = meta.get("suite") == "transformers"
    table = markdown(results, meta)
    checks = transformer_targets(results) if transformers else targets(results)
    (args.out / f"{stem}.md").write_text(f"# {heading[3:]}\n\n" + table + "\n## Targets\n\n" + checks)
    try:
        chart(results, args.out / f"{stem}.png")
    except ModuleNotFoundError as e:  # matplotlib comes with the bench extra
        log.warning("no chart: %s (pip install -e '.[bench]')", e)
    if args.readme:
        command = meta.get("command", "python benchmarks/bench_runtime.py --readme")
        section = (transformers_section if transformers else readme_section)(table, checks, command)
        replace_section(heading, section.replace("runtime.png", f"{stem}.png"))
    print(table)
    print(checks)


if __name__ == "__main__":
    sys.exit(main())
