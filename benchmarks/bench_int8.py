"""Int8 benchmark: gawee.compile(precision="int8") against ONNX Runtime's quantize_dynamic, BERT-base and GPT-2.

Columns, each built, checked and timed in a process of its own (worker.run_worker), all with the same thread
count: eager float32 PyTorch; gawee.compile float32; gawee.compile(precision="int8") (per-channel dynamic int8
linears, rules/precision/int8.rules); ONNX Runtime float32 with all optimizations on torch.onnx's export; and
ONNX Runtime with all optimizations on ``quantize_dynamic`` of that same export (per-channel symmetric int8
weights, ``QuantType.QInt8``). Each process builds the same seeded model and inputs (bench_runtime.make_model),
runs eager float32 for the reference, builds its method and compares the method's output (the last hidden
state) with the reference (gawee.accuracy.compare_outputs: max and mean absolute error, cosine similarity),
then times it as bench_runtime does: warm-up calls, ``--reps`` calls in ``--passes`` passes, the median, on a
quiet machine (retimed when other processes were busy).

    python benchmarks/bench_int8.py                          # BERT-base and GPT-2, seq 128, batch 1
    python benchmarks/bench_int8.py --tiny --models bert --reps 3 --warmup 1 --passes 1   # a smoke run
    python benchmarks/bench_int8.py --readme                 # the ## Int8 section of benchmarks/README.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from bench_runtime import (
    TRANSFORMER_MODELS,
    CpuMeter,
    Quiet,
    _build_ort,
    _run,
    _timed,
    build_eager,
    build_gawee,
    build_ort_all,
    make_model,
    onnx_export,
    time_methods,
    wait_for_quiet,
)
from readme import machine, replace_section, source_version
from worker import TIMEOUT, run_worker

import gawee
from gawee.accuracy import compare_outputs

HERE = Path(__file__).resolve().parent
HEADING = "## Int8: gawee against ONNX Runtime's quantize_dynamic"
MODELS = {"bert": TRANSFORMER_MODELS["bert"], "gpt2": TRANSFORMER_MODELS["gpt2"]}
"""Row name → model spec (gawee.frontend.models.resolve): BERT-base and GPT-2, 12 layers, 768 wide, 128 tokens."""
TINY = {
    "bert": "hf:bert:layers=2,hidden=128,heads=4,seq=128",
    "gpt2": "hf:gpt2:layers=2,hidden=128,heads=4,seq=128",
}
"""``--tiny``: the same families with 2 layers, 128 wide (smoke runs and the test)."""
METHODS = {
    "eager": "eager PyTorch f32",
    "gawee": "gawee.compile f32",
    "gawee_int8": 'gawee.compile(precision="int8")',
    "ort_all": "ONNX Runtime f32 (all optimizations)",
    "ort_int8": "ONNX Runtime quantize_dynamic int8 (all optimizations)",
}
INT8 = ("gawee_int8", "ort_int8")
QUANTIZE_RECIPE = "quantize_dynamic(fp32, int8, per_channel=True, weight_type=QuantType.QInt8)"
"""ORT's dynamic quantization as run on the export; :func:`quantize` says where it had to fall back."""
log = logging.getLogger("bench_int8")


@dataclass
class Row:
    model: str
    method: str
    spec: str = ""
    latency_ms: float | None = None
    latencies_ms: list[float] | None = None
    compile_s: float | None = None
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    cosine: float | None = None
    """Agreement of the method's output with eager float32's on the same inputs (gawee.accuracy.compare_outputs)."""
    foreign_load: float | None = None
    """CPU cores other processes used while the method was timed."""
    threads: int | None = None
    recipe: str = ""
    """ort_int8 only: the quantize_dynamic call that made the model it ran."""
    note: str = ""
    """What the method's build said of its own run (a precision it did not apply), shown under the table."""
    error: str = ""
    rounds_ms: list[float] | None = None
    """With ``--rounds``: the median of each round's process; ``latency_ms`` is their median."""


# -- the int8 builders (the float32 ones are bench_runtime's) ------------------------------
def build_gawee_int8(model, xs):
    """gawee.compile with the int8 precision phase: per-channel dynamic int8 linears (per shape the faster of
    torch's dynamic quantized kernel and oneDNN's u8 matmul, on prepacked weights)."""
    module, seconds = _timed(lambda: gawee.compile(model, xs, precision="int8"))
    log.info("  gawee int8: %s", module.gawee_report)
    module.note = module.gawee_report.precision_skipped  # float32 where it measured faster
    return module, seconds


def quantize(fp32: Path, int8: Path) -> str:
    """ONNX Runtime's ``quantize_dynamic`` of ``fp32`` into ``int8``, per channel with int8 weights; where ORT
    refuses per-channel quantization it is redone per tensor, as ORT's documentation suggests for ops without
    per-channel support. Returns the recipe that ran."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        quantize_dynamic(str(fp32), str(int8), per_channel=True, weight_type=QuantType.QInt8)
        return QUANTIZE_RECIPE
    except Exception as e:  # an op without per-channel support: ORT's fallback is per-tensor weights
        log.warning("per-channel quantize_dynamic failed (%s: %s); per tensor instead", type(e).__name__, e)
        quantize_dynamic(str(fp32), str(int8), per_channel=False, weight_type=QuantType.QInt8)
        return QUANTIZE_RECIPE.replace("per_channel=True", "per_channel=False")


def build_ort_int8(model, xs):
    """ONNX Runtime, all optimizations, on :func:`quantize` of torch.onnx's export (the ort_all column's file).
    The build time includes the export and the quantization."""
    recipe = []

    def export(path: Path) -> None:
        fp32 = path.with_name("fp32.onnx")
        onnx_export(model, xs, fp32)
        recipe.append(quantize(fp32, path))

    fn, seconds = _build_ort(export, "ORT_ENABLE_ALL")
    fn.recipe = recipe[0]
    return fn, seconds


BUILDERS: dict[str, Callable] = {
    "eager": build_eager,
    "gawee": build_gawee,
    "gawee_int8": build_gawee_int8,
    "ort_all": build_ort_all,
    "ort_int8": build_ort_int8,
}


# -- one column: in a process of its own --------------------------------------------------
def measure(
    method: str,
    name: str,
    spec: str,
    reps: int,
    warmup: int,
    passes: int,
    quiet: Quiet,
    builders: dict[str, Callable] | None = None,
) -> Row:
    """Build ``method`` (one of ``builders``, default this benchmark's) on ``spec``'s seeded model, compare its
    output with eager float32's on the same inputs, and time it (bench_runtime.time_methods: warm-up, ``reps``
    calls in ``passes`` passes, median). The job of a worker process (``--worker``); called directly it measures
    in this process."""
    row, fn, xs = build_checked(method, name, spec, builders)
    if fn is None:
        return row
    row.foreign_load, times = time_methods({method: fn}, xs, reps, warmup, passes, quiet, f"{name} {method}")
    if times.get(method):
        row.latencies_ms = times[method]
        row.latency_ms = statistics.median(row.latencies_ms)
    return row


def build_checked(method: str, name: str, spec: str, builders: dict[str, Callable] | None = None):
    """``method`` built on ``spec``'s seeded model and its output compared with eager float32's: the row so far,
    the callable (None where it failed to build: the row says why) and the inputs."""
    row = Row(name, method, spec, threads=torch.get_num_threads())
    model, xs = make_model(spec, 1)
    reference = _run(model, xs)
    try:
        fn, row.compile_s = (builders or BUILDERS)[method](model, xs)
        row.recipe, row.note = getattr(fn, "recipe", ""), getattr(fn, "note", "")
        out = _run(fn, xs)
        accuracy = compare_outputs([reference], [out])
        row.max_abs_error, row.mean_abs_error, row.cosine = (
            accuracy.max_abs_error,
            accuracy.mean_abs_error,
            accuracy.cosine,
        )
    except Exception as e:  # a method that cannot build the model is a row, not a crash
        row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        log.warning("%s %s failed: %s", name, method, row.error)
        return row, None, xs
    return row, fn, xs


def serve(method: str, name: str, spec: str, builders: dict[str, Callable] | None = None) -> None:
    """The job of a serving worker (``--worker METHOD --serve``, :class:`Served`): build and check ``method``,
    say so on stdout, then time passes as stdin asks — a JSON line ``{"calls": n, "warmup": w}`` is answered
    with the pass's milliseconds per call and the cores other processes used meanwhile, ``{"quit": true}`` with
    the row. Everything else the process prints goes to stderr, so stdout carries the answers only."""
    answers = sys.stdout
    sys.stdout = sys.stderr
    row, fn, xs = build_checked(method, name, spec, builders)

    def say(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    say({"ready": fn is not None})
    times: list[float] = []
    busy_s = wall_s = 0.0  # other processes' core-seconds, and the wall time, over the timed passes
    for line in sys.stdin:
        ask = json.loads(line)
        if ask.get("quit"):
            if times:
                row.latencies_ms, row.latency_ms = times, statistics.median(times)
                row.foreign_load = busy_s / wall_s if wall_s else None
            say(asdict(row))
            return
        for _ in range(ask.get("warmup", 0)):
            _run(fn, xs)
        this_pass = []
        start = time.perf_counter()
        with CpuMeter() as meter:
            for _ in range(ask["calls"]):
                t0 = time.perf_counter()
                _run(fn, xs)
                this_pass.append((time.perf_counter() - t0) * 1e3)
        wall = time.perf_counter() - start
        times += this_pass
        busy_s, wall_s = busy_s + (meter.foreign or 0.0) * wall, wall_s + wall
        say({"ms": this_pass, "foreign": meter.foreign})


class Served:
    """A column's serving worker (:func:`serve`): its process, built and checked, times a pass when asked."""

    TIMEOUT_S = 900.0
    """How long a build or a pass may take: a process silent for longer is killed, its column failed."""

    def __init__(self, script: Path, method: str, name: str, spec: str, threads: int):
        self.method, self.name, self.spec, self.threads = method, name, spec, threads
        args = [sys.executable, str(script), "--worker", method, "--serve", "--models", name, "--spec", spec]
        args += ["--threads", str(threads)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        answer = self._answer()
        self.ready = bool(answer and answer.get("ready"))
        self._signal(signal.SIGSTOP)

    def _signal(self, sig: int) -> None:
        """Stop the process between its passes (an idle runtime's threads may still spin or poll; a stopped
        process uses no CPU at all), or let it go on."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def _answer(self) -> dict | None:
        """The process's next line, or None where it ended or kept silent past :data:`TIMEOUT_S` (killed)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], self.TIMEOUT_S)
        if not ready:
            self.proc.kill()
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def _ask(self, message: dict) -> dict | None:
        """``message`` sent to the process, let run until it answers; its answer, or None where it is gone."""
        self._signal(signal.SIGCONT)
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            return self._answer()
        except OSError:  # the process is gone
            return None

    def time_pass(self, calls: int, warmup: int) -> dict | None:
        try:
            return self._ask({"calls": calls, "warmup": warmup})
        finally:
            self._signal(signal.SIGSTOP)

    def finish(self) -> Row:
        row = self._ask({"quit": True})
        self.proc.wait()
        if row is None:
            why = f"its process ended with exit status {self.proc.returncode}"
            return Row(self.name, self.method, self.spec, threads=self.threads, error=why)
        return Row(**row)


def interleaved(
    methods: list[str],
    name: str,
    spec: str,
    reps: int,
    warmup: int,
    passes: int,
    quiet: Quiet,
    threads: int,
    script: Path,
) -> list[Row]:
    """Every method of ``name`` built in a process of its own, one after the other, then timed pass by pass in
    turn while all are alive (``passes`` passes of ``reps / passes`` calls each, after ``warmup`` calls in the
    first and two in the others): a drift of the machine's speed hits every column alike. Each process is stopped
    (SIGSTOP) but while it builds or times a pass."""
    servers = []
    for method in methods:
        wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
        log.info("%s: %s in a process of its own", name, method)
        servers.append(Served(script, method, name, spec, threads))
    wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
    per_pass = -(-reps // passes)
    for p in range(passes):
        for server in servers:
            if server.ready:
                time.sleep(0.2)  # a pause between columns, as time_methods makes
                server.ready = server.time_pass(per_pass, warmup if p == 0 else min(warmup, 2)) is not None
    rows = [server.finish() for server in servers]
    for r in rows:
        log.info("  %-10s %8s ms  %s", r.method, _num(r.latency_ms, ".2f"), r.error or f"cosine {r.cosine}")
    return rows


def in_own_process(
    method: str,
    name: str,
    spec: str,
    reps: int,
    warmup: int,
    passes: int,
    quiet: Quiet,
    threads: int,
    script: Path = Path(__file__),
) -> Row:
    """:func:`measure` in a fresh process with ``threads`` threads (``script --worker``: this benchmark's, or
    another built on it), or a row that says why it gave none."""
    wait_for_quiet(quiet.max_foreign, quiet.timeout_s)
    log.info("%s: %s in a process of its own", name, method)
    args = ["--worker", method, "--models", name, "--spec", spec, "--reps", str(reps), "--warmup", str(warmup)]
    args += ["--passes", str(passes), "--threads", str(threads), "--max-foreign-load", str(quiet.max_foreign)]
    args += ["--quiet-timeout", str(quiet.timeout_s), "--attempts", str(quiet.attempts)]
    timeout = quiet.attempts * (quiet.timeout_s + 900.0)
    row, why, _ = run_worker(script, args, timeout=timeout, threads=threads)
    if row is None:
        why = f"its process timed out after {timeout:.0f} s" if why == TIMEOUT else f"its process: {why}"
        log.warning("%s %s failed: %s", name, method, why)
        return Row(name, method, spec, threads=threads, error=why)
    return Row(**row)


# -- reporting ----------------------------------------------------------------------------
def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def markdown(rows: list[Row], methods: dict[str, str] | None = None) -> str:
    """One line per model and method (named as ``methods``, default this benchmark's, names them): median latency
    (speedup over eager), compile time, and the output's agreement with eager float32; then a note per failed
    method."""
    methods = methods or METHODS
    index = {(r.model, r.method): r for r in rows}
    lines = [
        "| model | method | median latency | compile | max abs error | mean abs error | cosine | busy elsewhere |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        eager = index.get((r.model, "eager"))
        if r.latency_ms is None:
            latency = "failed"
        else:
            speed = f" ({eager.latency_ms / r.latency_ms:.2f}×)" if eager and eager.latency_ms else ""
            latency = f"{r.latency_ms:.2f} ms{speed}"
        agreement = (
            ["(reference)"] * 3
            if r.method == "eager"
            else [_num(r.max_abs_error, ".3g"), _num(r.mean_abs_error, ".3g"), _num(r.cosine, ".6f")]
        )
        compile_s = "–" if not r.compile_s else f"{r.compile_s:.1f} s"
        load = "?" if r.foreign_load is None else f"{r.foreign_load:.2f} cores"
        lines.append(
            f"| {r.model} | {methods[r.method]} | {latency} | {compile_s} | " + " | ".join(agreement) + f" | {load} |"
        )
    notes = [f"- ⚠ {r.model} {methods[r.method]}: {r.error}" for r in rows if r.error]
    notes += [f"- {r.model} {methods[r.method]}: {r.note}" for r in rows if r.note]
    recipes = sorted({r.recipe for r in rows if r.recipe and r.recipe != QUANTIZE_RECIPE})
    notes += [f"- ONNX Runtime's model made with `{recipe}` (per-channel quantization failed)" for recipe in recipes]
    return "\n".join([*lines, "", *notes]).rstrip() + "\n"


def against(model: str, ours: Row, ours_label: str, theirs: Row, theirs_label: str) -> str:
    """A verdict line's start: ``ours`` at least as fast as ``theirs`` on ``model``, the two agreements side by
    side (the precision benchmarks' shared phrasing; each ends the line its own way)."""
    fast = ours.latency_ms <= theirs.latency_ms
    per_round = ""
    if ours.rounds_ms and theirs.rounds_ms and len(ours.rounds_ms) == len(theirs.rounds_ms):
        ratios = ", ".join(f"{t / o:.3f}" for o, t in zip(ours.rounds_ms, theirs.rounds_ms))
        per_round = f"; per round {ratios}"
    return (
        f"- {model}: {ours_label} {ours.latency_ms:.2f} ms vs {theirs_label} {theirs.latency_ms:.2f} ms "
        f"({theirs.latency_ms / ours.latency_ms:.3f}×{per_round}) — at least as fast: **{'yes' if fast else 'no'}**; "
        f"cosine {_num(ours.cosine, '.6f')} vs {_num(theirs.cosine, '.6f')}, max abs error "
        f"{_num(ours.max_abs_error, '.3g')} vs {_num(theirs.max_abs_error, '.3g')}"
    )


def verdicts(rows: list[Row]) -> str:
    """Per model: gawee int8 at least as fast as ORT int8, and its agreement with eager float32 (cosine, max abs
    error) at least as good."""
    index = {(r.model, r.method): r for r in rows}
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        ours, theirs = index.get((model, "gawee_int8")), index.get((model, "ort_int8"))
        if not ours or not theirs or ours.latency_ms is None or theirs.latency_ms is None:
            lines.append(f"- {model}: gawee int8 or ORT int8 gave no latency — not compared.")
            continue
        close = (
            ours.cosine is not None
            and theirs.cosine is not None
            and ours.cosine >= theirs.cosine
            and ours.max_abs_error <= theirs.max_abs_error
        )
        line = against(model, ours, "gawee int8", theirs, "ORT int8")
        lines.append(f"{line} — agreement at least as good: **{'yes' if close else 'no'}**.")
    return "\n".join(lines) + "\n"


def rounds_said(meta: dict) -> str:
    """The README's words for ``--interleave`` and ``--rounds`` (nothing for one round one process after the
    other)."""
    said = ""
    if meta.get("interleave"):
        said += "; the columns' processes alive together, timed pass by pass in turn"
    rounds = meta.get("rounds", 1)
    if rounds > 1:
        said += f"; then the median of {rounds} rounds, each column in a fresh process per round"
    return said


def readme_section(table: str, checks: str, command: str, meta: dict) -> str:
    return (
        "Produced by `make bench-int8`, i.e.\n\n"
        f"```sh\n{command}\n```\n\n"
        f"Run {meta['date']} · {meta['gawee']}. Machine: {meta['machine']}; {meta['threads']} threads for every "
        f"column; torch {meta['torch']}, onnxruntime {meta['onnxruntime']}.\n\n"
        "Random weights (seeded; zero-initialized biases and LayerNorm parameters given random values: "
        "`bench_runtime.make_model`); BERT-base and GPT-2 are 12 layers, 768 wide, 12 heads, batch 1, 128 tokens "
        "(token ids and an attention mask whose last quarter is padding, "
        "`hf:bert:layers=12,hidden=768,heads=12,seq=128`), the output compared is the last hidden state. Each "
        "column is built, checked and timed in a process of its own (`benchmarks/worker.py`), with the same "
        "thread count: **eager PyTorch f32**: `model(*xs)` under `torch.no_grad()`; **gawee.compile f32**: "
        '`gawee.compile(model, xs)`; **gawee.compile(precision="int8")**: the int8 precision phase '
        "(`rules/precision/int8.rules`: per-output-channel symmetric int8 weights, the input quantized per tensor "
        "at run time; per shape, whichever measures faster of torch's `quantized::linear_dynamic` and oneDNN's "
        "`qlinear_pointwise` on gawee's quantizer's codes, the weights prepacked); **ONNX Runtime f32**: "
        "`torch.onnx.export(model)` run with `ORT_ENABLE_ALL`; **ONNX Runtime quantize_dynamic int8**: "
        "`onnxruntime.quantization.quantize_dynamic(fp32_model, int8_model, per_channel=True, "
        "weight_type=QuantType.QInt8)` of that same export (defaults otherwise: no pre-processing, activations "
        "uint8, and ORT's default op types, which turn the linears into `MatMulInteger` and also store the "
        "embedding tables in int8 — a `Gather` of int8 rows, then `DequantizeLinear` —, where gawee's phase "
        "quantizes only the linears), run with `ORT_ENABLE_ALL`. Latency: median of the timed calls after "
        "warm-up calls "
        f"({meta['reps']} calls in {meta['passes']} passes after {meta['warmup']} warm-up calls{rounds_said(meta)}), "
        "speedup over "
        "eager in brackets; compile: wall time from the model to a callable (for ORT int8 the export and the "
        "quantization included). Errors and cosine similarity: the column's output against eager float32's on the "
        "same inputs (`gawee.accuracy.compare_outputs`). *busy elsewhere*: CPU cores other processes used while "
        f"the column was timed.\n\n{table}\n### gawee int8 against ORT int8 (computed from the table)\n\n{checks}"
    )


def arguments(doc: str, models: dict, methods: dict, heading: str) -> argparse.ArgumentParser:
    """The command line of a precision benchmark built on this one (``doc``'s first line its description)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--models", default=",".join(models), help="comma-separated, from: " + ", ".join(models))
    p.add_argument("--methods", default=",".join(methods), help="comma-separated, from: " + ", ".join(methods))
    p.add_argument("--tiny", action="store_true", help="small models of the same families: smoke runs")
    p.add_argument("--reps", type=int, default=20, help="timed calls per method (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per method before timing")
    p.add_argument("--passes", type=int, default=4, help="split the timed calls into this many passes")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every column this many times, each time in a fresh process, the columns in turn; report "
        "the median of the rounds (the machine's speed can drift between processes a few seconds apart)",
    )
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads of every column")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="keep every column of a model alive in its own process and time them pass by pass in turn (a drift "
        "of the machine's speed then hits them alike), instead of one process after the other",
    )
    p.add_argument(
        "--max-foreign-load",
        type=float,
        default=Quiet.max_foreign,
        help="measure only while other processes use at most this many cores (waits, then retimes)",
    )
    p.add_argument("--quiet-timeout", type=float, default=Quiet.timeout_s, help="seconds to wait for a quiet machine")
    p.add_argument("--attempts", type=int, default=Quiet.attempts, help="timings retaken under load at most")
    p.add_argument("--json", type=Path, help="also write the rows and the run's facts to this file")
    p.add_argument("--readme", action="store_true", help=f"write the '{heading}' section of benchmarks/README.md")
    p.add_argument("--worker", metavar="METHOD", help=argparse.SUPPRESS)  # in_own_process's job
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # interleaved's worker
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)  # the worker's row
    return p


def run(
    p: argparse.ArgumentParser,
    argv: list[str] | None,
    suite: dict,
    script: Path,
) -> tuple[argparse.Namespace, list[Row] | None]:
    """Parse ``argv``; in a worker, measure its one column and write its row (returns no rows); else measure every
    model × method of ``suite`` (``models``, ``tiny`` specs, ``methods``, ``builders``), each in a process of its
    own running ``script``, eager float32 first."""
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    quiet = Quiet(args.max_foreign_load, args.quiet_timeout, args.attempts)
    if args.worker and args.serve:
        serve(args.worker, args.models, args.spec, suite["builders"])
        return args, None
    if args.worker:
        builders = suite["builders"]
        row = measure(args.worker, args.models, args.spec, args.reps, args.warmup, args.passes, quiet, builders)
        args.out.write_text(json.dumps(asdict(row)))
        return args, None
    models = [m for m in args.models.split(",") if m]
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(models) - set(suite["models"])) + sorted(set(methods) - set(suite["methods"]))
    if unknown:
        p.error(f"unknown models or methods {unknown}")
    if args.readme and args.tiny:
        p.error("--readme records the full-size models: drop --tiny")
    if "eager" not in methods:
        methods.insert(0, "eager")
    specs = suite["tiny"] if args.tiny else suite["models"]
    rounds: list[list[Row]] = []
    for k in range(max(1, args.rounds)):
        if args.rounds > 1:
            log.info("round %d of %d", k + 1, args.rounds)
        rows = []
        for name in models:
            timing = (args.reps, args.warmup, args.passes, quiet, args.threads, script)
            if args.interleave:
                rows += interleaved(methods, name, specs[name], *timing)
                continue
            for method in methods:
                rows.append(in_own_process(method, name, specs[name], *timing))
                r = rows[-1]
                log.info("  %-10s %8s ms  %s", method, _num(r.latency_ms, ".2f"), r.error or f"cosine {r.cosine}")
        rounds.append(rows)
    return args, rounds[0] if len(rounds) == 1 else merge_rounds(rounds)


def merge_rounds(rounds: list[list[Row]]) -> list[Row]:
    """One row per column of several rounds: the first round's (its build and agreement), its latency the median
    of the rounds' medians (``rounds_ms`` holds them); a column that failed in any round keeps that round's error."""
    merged = []
    for i, first in enumerate(rounds[0]):
        column = [rows[i] for rows in rounds]
        failed = next((r for r in column if r.latency_ms is None), None)
        if failed is not None:
            merged.append(failed)
            continue
        medians = [r.latency_ms for r in column]
        merged.append(replace(first, latency_ms=statistics.median(medians), rounds_ms=medians))
    return merged


def meta_of(args: argparse.Namespace, command: str, **versions: str) -> dict:
    """The facts a README section states about the run: command, date, gawee's version, the machine, threads,
    the timing's counts and the peers' ``versions``."""
    return {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "gawee": source_version(),
        "machine": machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        **versions,
        "reps": args.reps,
        "warmup": args.warmup,
        "passes": args.passes,
        "rounds": args.rounds,
        "interleave": args.interleave,
        "tiny": args.tiny,
    }


def main(argv: list[str] | None = None) -> int:
    suite = {"models": MODELS, "tiny": TINY, "methods": METHODS, "builders": BUILDERS}
    args, rows = run(arguments(__doc__, MODELS, METHODS, HEADING), argv, suite, Path(__file__))
    if rows is None:
        return 0
    table, checks = markdown(rows), verdicts(rows)
    command = "python benchmarks/bench_int8.py " + " ".join(argv if argv is not None else sys.argv[1:])
    import onnxruntime

    meta = meta_of(args, command, onnxruntime=onnxruntime.__version__)
    return publish(args, rows, meta, table, checks, HEADING, readme_section)


def publish(args, rows: list[Row], meta: dict, table: str, checks: str, heading: str, section: Callable) -> int:
    """Print the table and its verdicts; with ``--json`` write the rows and the run's facts, with ``--readme`` the
    ``heading`` section of benchmarks/README.md (``section(table, checks, command, meta)``)."""
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    if args.readme:
        replace_section(heading, section(table, checks, meta["command"], meta))
    print(table)
    print(checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
