"""The model zoo through gawee: capture, check, optimize, verify — one row per model.

    python benchmarks/zoo.py                      # both sections, tables into benchmarks/README.md
    python benchmarks/zoo.py --section transformers
    python benchmarks/zoo.py --models resnet18,hf:bert --jobs 1 --no-readme

Two sections: the 80 torchvision classifiers (random weights, batch 1, 3x224x224, 299 for
inception_v3), and transformers and other families (``TRANSFORMER_MODELS``: the ``hf:`` families
of gawee.frontend.families, a few timm models, torchvision's r3d_18 video model). For every model,
in its own subprocess: eager reference, capture (export / functionalize / gawee's conversion
timed apart), the reference interpreter against eager, re-inferred types against the recorded
ones, the cost report, the default rewrite (traced) and ``verify_rewrite`` — the verification of
``gawee-rewrite optimize``: four input distributions, every rewritten value compared with the
original value it stands for, a failure blamed on a rule. The parent schedules the subprocesses
under a memory budget (the largest models need several GB), shows progress, prints a summary,
and writes each section's table into its own section of benchmarks/README.md (``## Model zoo``,
``## Model zoo: transformers``; other sections are left as they are). Exit status 1 if any model
fails a check.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import resource
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from readme import README, machine, replace_section, source_version
from worker import TIMEOUT, run_worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Model zoo"
TRANSFORMERS_SECTION = "## Model zoo: transformers"
TRANSFORMER_MODELS = [
    "hf:bert",
    "hf:gpt2",
    "hf:t5-encoder",
    "hf:llama",
    "hf:vit",
    "hf:whisper-encoder",
    "hf:mistral",
    "hf:qwen2",
    "hf:gemma2",
    "hf:bloom",
    "hf:bart",
    "hf:roberta",
    "hf:segformer",
    "timm:deit_tiny_patch16_224",
    "timm:mixer_b16_224",
    "timm:levit_128s",
    "timm:convnextv2_atto",
    "timm:coatnet_0_rw_224",
    "r3d_18",
]
"""The second table: the hf: families (small built-in configs, and model types from their default configs with
the same sizes), timm models, a torchvision video model."""
SECTIONS = ("torchvision", "transformers")
CAPTURE_TOLERANCE = 1e-4
"""Interpreter vs eager: max|out - ref| <= tol * max(1, max|ref|)."""


# ---------------------------------------------------------------------------------------
# worker: one model, in its own process
# ---------------------------------------------------------------------------------------


def _flat_tensors(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat_tensors(item)]
    return []


def _rel_error(ref, out) -> float:
    import torch

    worst = 0.0
    for r, o in zip(ref, out):
        if r.shape != o.shape or r.dtype != o.dtype:
            return float("inf")
        if r.numel() == 0:
            continue
        r, o = r.double(), o.double()
        if not torch.isfinite(o).all():
            return float("inf")
        scale = max(1.0, r.abs().max().item())
        worst = max(worst, (o - r).abs().max().item() / scale)
    return worst


def _first_lines(e: BaseException, n: int = 3) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()][:n]
    return f"{type(e).__name__}: " + " | ".join(lines)


def warm_up():
    """Pay the one-time costs (torch.export's imports and caches, loading the rules) on a tiny model,
    so that a model's capture and rewrite times are its own. Returns the default rule set."""
    import torch

    import gawee
    from gawee.equivalence import verify_rewrite

    rules = gawee.default_rules()
    tiny = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 2),
    )
    x = torch.randn(1, 3, 8, 8)
    graph = gawee.capture(tiny, (x,))
    gawee.run(graph, x)
    optimized, report = gawee.rewrite(graph, rules, trace=True)
    verify_rewrite(graph, optimized, report.trace, rules=rules)
    return rules


def verification_fields(v) -> dict:
    """The row fields of a ``RewriteVerification`` (JSON-able)."""
    done = [t for t in v.trials if not t.skipped]
    worst = max(done, key=lambda t: t.max_rel_error, default=None)
    first = v.trials[0] if v.trials else None
    return {
        "verify_ok": v.ok,
        "verify_short": v.short(),
        "verify_detail": str(v),
        "verify_problem": v.problem or None,
        # graph outputs on the unit-normal inputs, max|out - ref| / max(1, max|ref|) (verify_equivalent's figure)
        "verify_error": max((o.max_error / o.scale for o in first.outputs), default=0.0) if first else None,
        "verify_abs_error": v.max_error,
        # over every compared value and every distribution: max error / allowed (<= 1 passes)
        "verify_ratio": worst.max_rel_error if worst else None,
        "verify_worst_distribution": worst.distribution if worst else None,
        "verify_distributions": {
            t.distribution: "skipped" if t.skipped else "ok" if t.ok else "FAILED" for t in v.trials
        },
        "verify_failed": [t.distribution for t in v.failed],
        "verify_skipped": {t.distribution: t.skipped for t in v.trials if t.skipped},
        "verify_values": first.values if first else 0,
        "verify_blame": None if v.blame is None else {k: getattr(v.blame, k) for k in v.blame.__dataclass_fields__},
        "verify_s": v.seconds,
    }


def unlowered_ops(graph) -> dict[str, int]:
    """The graph's ops with no StableHLO lowering (opaque ATen calls by target), with their counts."""
    from gawee.backend.lower_mlir import MLIR
    from gawee.ops import OPAQUE

    missing: dict[str, int] = {}
    for node in graph:
        key = f"aten:{node.attrs['target']}" if node.op == OPAQUE else node.op if node.op not in MLIR else None
        if key is not None:
            missing[key] = missing.get(key, 0) + 1
    return missing


def measure_iree(optimized, inputs, ref) -> dict:
    """The optimized graph through gawee's MLIR path: to_mlir, iree-compile for the host CPU, run on the
    model's inputs, compared with eager at verify_equivalent's tolerance. ``iree_status``: ok, differs
    (wrong numbers), no lowering (the ops are listed), rejected (to_mlir or IREE refused the module)."""
    import gc

    from gawee.backend.iree import IreeModule, compile_iree
    from gawee.backend.stablehlo import LoweringError, lower_mlir
    from gawee.equivalence import TOLERANCE
    from gawee.ir.types import DType

    missing = unlowered_ops(optimized)
    if missing:
        text = ", ".join(f"{k}×{n}" for k, n in sorted(missing.items()))
        return {"iree_status": "no lowering", "iree_missing": missing, "iree_message": f"no lowering: {text}"}
    try:
        t0 = time.perf_counter()
        lowered = lower_mlir(optimized)  # a large model's weights as parameters, out of the text
        t1 = time.perf_counter()
        vmfb = compile_iree(lowered.text)
        t2 = time.perf_counter()
    except LoweringError as e:
        return {"iree_status": "rejected", "iree_message": _first_lines(e)}
    row = {"iree_mlir_s": t1 - t0, "iree_compile_s": t2 - t1, "iree_mlir_mb": len(lowered.text) / 1e6}
    row["iree_parameters"] = len(lowered.parameters)
    lowered.text = ""
    gc.collect()
    module = IreeModule(
        vmfb,
        [v.type for v in optimized.inputs],
        [v.type for v in optimized.outputs],
        parameters=lowered.parameters or None,
    )
    t0 = time.perf_counter()
    out = list(module(*inputs))
    row["iree_run_s"] = time.perf_counter() - t0
    err = _rel_error(ref, out)
    tol = max(TOLERANCE[DType.from_torch(r.dtype)] for r in ref if r.dtype.is_floating_point) if ref else 0.0
    row.update(iree_error=err, iree_tolerance=tol)
    ok = err <= tol
    row.update(iree_status="ok" if ok else "differs", iree_message="" if ok else f"error {err:.3g} > {tol:g}")
    return row


def measure_dynamic(module, inputs, name: str, rules, static_nodes: int) -> dict:
    """Capture again with a dynamic batch (dimension 0 of every input, ``--dynamic batch``), optimize, and
    compare the node count with the static capture's; the optimized graph is run at batch 1 and 3 against
    the model. ``dynamic_status``: "same", "differs" (node counts), "wrong" (numbers) or "fails".

    The dynamic capture's example batch is 2 when the model's is 1 (torch.export specializes a size it
    sees as 1). A static capture at batch 1 may optimize further than any capture valid for every batch
    (``expand`` of a class token to batch 1 is a no-op), so when the counts differ the model is captured
    statically at the dynamic example's batch too and the row compares with that (``dynamic_basis``)."""
    import torch

    import gawee
    from gawee.frontend.dynamic import dynamic_spec

    t0 = time.perf_counter()
    try:
        spec, examples = dynamic_spec("batch", module, inputs)
        graph = gawee.capture(module, examples, name=name, dynamic_shapes=spec)
        optimized, _ = gawee.rewrite(graph, rules)
        out = {"dynamic_nodes": len(optimized), "dynamic_s": time.perf_counter() - t0}
        for n in (1, 3):
            xs = [x[:1].expand(n, *x.shape[1:]).contiguous() if x.dim() else x for x in inputs]
            with torch.no_grad():
                ref = _flat_tensors(module(*xs))
                err = _rel_error(ref, list(gawee.run(optimized, *xs)))
            if err > CAPTURE_TOLERANCE:
                return {**out, "dynamic_status": "wrong", "dynamic_message": f"batch {n}: error {err:.3g}"}
        sized = size_computations(optimized)

        def same(static: int) -> dict | None:  # equal, or more by size computations that a static capture folds
            extra = len(optimized) - static
            if not 0 <= extra <= sized:
                return None
            return {**out, "dynamic_status": "same", **({"dynamic_size_nodes": extra} if extra else {})}

        if row := same(static_nodes):
            return row
        batch = next((x.shape[0] for x in examples if x.dim()), None)
        if all(a is b for a, b in zip(examples, inputs)):  # the static capture was at this size already
            return {**out, "dynamic_status": "differs", "dynamic_message": f"{len(optimized)} vs {static_nodes} nodes"}
        at_batch, _ = gawee.rewrite(gawee.capture(module, examples, name=name), rules)
        out.update(dynamic_basis={"batch": batch, "nodes": len(at_batch), "batch1_nodes": static_nodes})
        out["dynamic_s"] = time.perf_counter() - t0
        if row := same(len(at_batch)):
            return row
        message = f"{len(optimized)} vs {len(at_batch)} nodes (static at batch {batch}; at batch 1: {static_nodes})"
        return {**out, "dynamic_status": "differs", "dynamic_message": message}
    except Exception as e:  # recorded in the row, like every other stage
        return {"dynamic_status": "fails", "dynamic_message": _first_lines(e, 1), "dynamic_s": time.perf_counter() - t0}


def size_computations(graph) -> int:
    """Nodes of ``graph`` that read no graph input: they compute from constants and the symbolic sizes
    alone (``arange(batch)`` of a mask builder, its unsqueezes), so a static capture may fold each into
    a constant (it keeps some: an ``expand`` of a constant is not folded, which would grow it). The
    dynamic column accepts up to these many nodes more than the static count."""
    from_sizes: set[int] = set()
    for node in graph:
        if all(v is None or v.is_const or id(v.producer) in from_sizes for v in node.inputs):
            from_sizes.add(id(node))
    return len(from_sizes)


def fmt_dynamic(r: dict) -> str:
    status = r.get("dynamic_status")
    if status is None:
        return "—"
    if status == "same":
        sized = r.get("dynamic_size_nodes")
        plus = f" + {sized} size computations" if sized else ""
        basis = r.get("dynamic_basis")
        if basis:
            return (
                f"{r['dynamic_nodes']} = static at batch {basis['batch']}{plus} "
                f"(batch 1: {basis['batch1_nodes']}, size-1 specializations)"
            )
        return f"{r['dynamic_nodes']} = static{plus}" if sized else f"same ({r['dynamic_nodes']})"
    return f"{status}: {r.get('dynamic_message', '')}"


def _no_zero_matrices(module) -> None:
    """Weight matrices initialized to zero (torchvision ViT's classifier head) get small seeded random values:
    with them every output is 0 and every error check of the row compares zeros."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def measure(name: str, iree: bool = False) -> dict:
    """Everything the table says about one model (``iree``: and its run through gawee's MLIR path on
    IREE). Never raises: a failure is recorded with its stage."""
    import torch

    import gawee
    from gawee.equivalence import verify_rewrite
    from gawee.frontend.models import resolve

    row: dict = {"model": name, "status": "ok", "stage": "", "message": ""}
    stage = "warm-up"
    t_start = time.perf_counter()
    try:
        rules = warm_up()
        stage = "resolve"
        src = resolve(name)
        inputs = src.example_inputs
        _no_zero_matrices(src.module)

        stage = "eager"
        with torch.no_grad():
            ref = _flat_tensors(src.module(*inputs))

        stage = "capture"
        stats = gawee.CaptureStats()
        graph = gawee.capture(src.module, inputs, name=name, stats=stats)
        row.update(
            export_s=stats.export_s,
            functionalize_s=stats.decompose_s,
            gawee_s=stats.convert_s,
            opaque=dict(stats.opaque_ops),
            capture_warnings=len(stats.warnings),
        )
        before = gawee.cost(graph)
        row.update(
            nodes_before=len(graph),
            distinct_ops=len(before.op_counts),
            flops_before=before.flops,
            bytes_written_before=before.bytes_written,
            peak_before=before.peak_memory,
            uncounted_before=before.uncounted,
        )

        stage = "interpret"
        with torch.no_grad():
            out = gawee.run(graph, *inputs)
        row["capture_error"] = _rel_error(ref, list(out))
        del out

        stage = "infer"
        mismatches = gawee.infer_types(graph)
        row["type_mismatches"] = len(mismatches)

        stage = "rewrite"
        t0 = time.perf_counter()
        optimized, report = gawee.rewrite(graph, rules, trace=True)  # verify_rewrite follows the trace
        row["rewrite_ms"] = (time.perf_counter() - t0) * 1e3
        after = gawee.cost(optimized)
        row.update(
            nodes_after=len(optimized),
            flops_after=after.flops,
            bytes_written_after=after.bytes_written,
            peak_after=after.peak_memory,
            firings=dict(report.firings.most_common()),
        )

        stage = "verify"
        with torch.no_grad():
            v = verify_rewrite(graph, optimized, report.trace, rules=rules)
        row.update(verification_fields(v))
        del graph

        if iree:
            stage = "iree"
            row.update(measure_iree(optimized, inputs, ref))

        stage = "dynamic"
        row.update(measure_dynamic(src.module, inputs, name, rules, len(optimized)))

        problems = []
        if row["capture_error"] > CAPTURE_TOLERANCE:
            problems.append(f"interpreter differs from eager: error {row['capture_error']:.3g}")
        if mismatches:
            m = mismatches[0]
            problems.append(f"{len(mismatches)} inferred type(s) differ from the recorded ones, first: {m}")
        if not v.ok:
            problems.append("verification failed: " + " | ".join(str(v).splitlines()))
        if row.get("dynamic_status") != "same":
            problems.append(f"dynamic batch: {row.get('dynamic_status')} {row.get('dynamic_message', '')}".strip())
        if row.get("iree_status") in ("rejected", "differs"):
            problems.append(f"IREE {row['iree_status']}: {row['iree_message']}")
        if problems:
            only_verify = len(problems) == 1 and not v.ok
            row.update(status="FAIL", stage="verify" if only_verify else "check", message="; ".join(problems))
    except Exception as e:  # a benchmark records every failure and moves on
        row.update(
            status="FAIL",
            stage=stage,
            message=_first_lines(e),
            traceback="".join(traceback.format_exception(e))[-4000:],
        )
    row["total_s"] = time.perf_counter() - t_start
    row["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def worker_main(name: str, out_path: str, threads: int, iree: bool = False) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(threads)
    row = measure(name, iree)
    Path(out_path).write_text(json.dumps(row))
    return 0


# ---------------------------------------------------------------------------------------
# parent: scheduling, progress, table, README
# ---------------------------------------------------------------------------------------


def model_names() -> list[str]:
    from gawee.frontend.models import torchvision_names

    return torchvision_names()


def section_of(name: str, torchvision: list[str]) -> str | None:
    """ "torchvision", "transformers" or None (not a model this benchmark knows how to run)."""
    from gawee.frontend.models import torchvision_video_names

    if name in torchvision:
        return "torchvision"
    if name in TRANSFORMER_MODELS or name.startswith(("hf:", "timm:")) or name in torchvision_video_names():
        return "transformers"
    return None


def missing_optional() -> list[str]:
    """The optional packages the transformers section needs that are not installed."""
    return [m for m in ("transformers", "timm") if importlib.util.find_spec(m) is None]


def param_counts(names: list[str]) -> dict[str, int]:
    """Parameter counts from torchvision's weight metadata (no model is built, nothing is downloaded)."""
    import torchvision

    counts = {}
    for n in names:
        if n.startswith(("hf:", "timm:")):  # hf: built-in configs are tiny; the timm models here < 100 M
            counts[n] = 100_000_000
            continue
        try:
            counts[n] = max(w.meta["num_params"] for w in torchvision.models.get_model_weights(n))
        except Exception:  # a model without weight metadata: assume it is large
            counts[n] = 300_000_000
    return counts


def memory_estimate_mb(params: int, iree: bool = False) -> float:
    """Peak RSS of one worker: ~1 GB of torch + 4.5 copies of the float32 weights (the module's,
    shared with the captured graph; the folded constants of the rewritten graph; and, when
    verify_rewrite judges a value again against the original in float64, a float64 copy of the
    original's weights). Measured with verify_rewrite: regnet_y_128gf (645 M parameters) 11.5 GiB;
    vit_h_14 (633 M, little to fold, no float64 run needed) 4.7 GiB. The IREE column adds the
    module's text (hex: 2 bytes a weight byte), iree-compile's copy of the weights and the .vmfb — or,
    for a model whose weights are IREE parameters (``EXTERNAL_BYTES``), the runtime's own buffers."""
    from gawee.backend.stablehlo import EXTERNAL_BYTES

    text = 0 if not iree else 1 if params * 4 > EXTERNAL_BYTES else 5
    return 1000 + (4.5 + text) * params * 4 / 2**20


class MemoryGate:
    """Admit a job only while the running jobs' estimates fit the budget (a job over budget runs alone)."""

    def __init__(self, budget_mb: float):
        self.budget = budget_mb
        self.used = 0.0
        self.cond = threading.Condition()

    def acquire(self, need: float) -> None:
        with self.cond:
            while self.used > 0 and self.used + need > self.budget:
                self.cond.wait()
            self.used += need

    def release(self, need: float) -> None:
        with self.cond:
            self.used -= need
            self.cond.notify_all()


def run_one(name: str, threads: int, timeout: float, iree: bool = False) -> dict:
    row, why, wall = run_worker(
        Path(__file__).resolve(),
        ["--worker", name, "--threads", str(threads), *(["--iree"] if iree else [])],
        timeout=timeout,
        threads=threads,
        cwd=ROOT,
    )
    if row is not None:
        row["wall_s"] = wall
        return row
    if why == TIMEOUT:
        return {
            "model": name,
            "status": "FAIL",
            "stage": "timeout",
            "message": f"did not finish in {timeout:.0f} s",
            "total_s": timeout,
        }
    return {"model": name, "status": "FAIL", "stage": "crash", "message": f"worker {why}", "total_s": wall}


def fmt_si(x: float | None, unit: str = "", base: float = 1000.0) -> str:
    if x is None:
        return "—"
    prefixes = ["", "K", "M", "G", "T", "P"] if base == 1000.0 else ["", "Ki", "Mi", "Gi", "Ti"]
    i = 0
    while abs(x) >= base and i < len(prefixes) - 1:
        x /= base
        i += 1
    return f"{x:.3g} {prefixes[i]}{unit}".strip() if i or unit else f"{x:.3g}"


def fmt_bytes(x) -> str:
    return fmt_si(x, "B", 1024.0)


def fmt_pair(a, b, f) -> str:
    if a is None and b is None:
        return "—"
    return f"{f(a)} → {f(b)}"


def fmt_err(x) -> str:
    if x is None:
        return "—"
    return "0" if x == 0 else f"{x:.1e}"


def fmt_opaque(d) -> str:
    if d is None:
        return "—"
    if not d:
        return "none"
    return ", ".join(f"{k.removeprefix('aten.')}×{v}" if v > 1 else k.removeprefix("aten.") for k, v in d.items())


def fmt_ratio(r: dict) -> str:
    x = r.get("verify_ratio")
    if x is None:
        return "—"
    return f"{x:.2g} ({r['verify_worst_distribution']})"


def fmt_verification(r: dict) -> str:
    if "verify_ok" not in r:
        return "—"
    if r["verify_ok"]:
        skipped = list(r.get("verify_skipped") or ())
        return "ok" + (f" ({', '.join(skipped)} skipped)" if skipped else "")
    if r.get("verify_problem"):
        return f"FAILED: {r['verify_problem']}"
    blame = r.get("verify_blame")
    where = ", ".join(r.get("verify_failed") or ())
    return f"FAILED {where}: {blame['rule']}" if blame else f"FAILED {where}: no rule blamed"


def fmt_status(r: dict) -> str:
    return "ok" if r["status"] == "ok" else f"FAIL ({r['stage']})"


def fmt_capture_s(r: dict) -> str:
    if "export_s" not in r:
        return "—"
    return f"{r['export_s']:.2f} / {r['functionalize_s']:.2f} / {r['gawee_s']:.3f}"


def fmt_rules(firings: dict | None, n: int = 3) -> str:
    if firings is None:
        return "—"
    if not firings:
        return "none"
    top = sorted(firings.items(), key=lambda kv: -kv[1])[:n]
    more = len(firings) - len(top)
    return ", ".join(f"{k}×{v}" for k, v in top) + (f" (+{more} more)" if more else "")


def fmt_iree(r: dict) -> str:
    """The IREE column: ok with the error against eager and the compile seconds, or why not."""
    status = r.get("iree_status")
    if status is None:
        return "—"
    if status == "ok":
        return f"ok {fmt_err(r['iree_error'])} ({r['iree_compile_s']:.0f} s)"
    return f"{status}: {r['iree_message']}" if status != "no lowering" else r["iree_message"]


def _nodes(r: dict) -> str:
    return fmt_pair(r.get("nodes_before"), r.get("nodes_after"), lambda x: "—" if x is None else str(x))


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [
        [
            r["model"],
            _nodes(r),
            str(r.get("distinct_ops", "—")),
            fmt_opaque(r.get("opaque")),
            fmt_pair(r.get("flops_before"), r.get("flops_after"), fmt_si),
            fmt_pair(r.get("bytes_written_before"), r.get("bytes_written_after"), fmt_bytes),
            fmt_pair(r.get("peak_before"), r.get("peak_after"), fmt_bytes),
            fmt_capture_s(r),
            "—" if "rewrite_ms" not in r else f"{r['rewrite_ms']:.0f}",
            fmt_err(r.get("capture_error")),
            fmt_err(r.get("verify_error")),
            fmt_verification(r),
            fmt_ratio(r),
            "—" if "verify_s" not in r else f"{r['verify_s']:.1f}",
            fmt_iree(r),
            fmt_dynamic(r),
            fmt_status(r),
        ]
        for r in rows
    ]


HEADERS = [
    "model",
    "nodes",
    "distinct ops",
    "opaque ops",
    "FLOPs",
    "bytes written",
    "peak memory",
    "capture s (export / functionalize / gawee)",
    "rewrite ms",
    "capture error",
    "verify error",
    "verification",
    "worst error / allowed",
    "verify s",
    "IREE (error vs eager, compile s)",
    "dynamic batch (nodes after, vs static)",
    "status",
]


def transformer_rows(rows: list[dict]) -> list[list[str]]:
    return [
        [
            r["model"],
            "yes" if "gawee_s" in r else f"no ({r['stage']})",
            _nodes(r),
            fmt_opaque(r.get("opaque")),
            fmt_err(r.get("capture_error")),
            fmt_verification(r),
            fmt_ratio(r),
            fmt_rules(r.get("firings")),
            fmt_iree(r),
            fmt_dynamic(r),
            fmt_status(r),
        ]
        for r in rows
    ]


TRANSFORMER_HEADERS = [
    "model",
    "captured",
    "nodes",
    "opaque ops",
    "capture error",
    "verification",
    "worst error / allowed",
    "rules fired most",
    "IREE (error vs eager, compile s)",
    "dynamic batch (nodes after, vs static)",
    "status",
]


def _failure_text(r: dict) -> str:
    blame = r.get("verify_blame")
    if r["stage"] == "verify" and blame:
        return f"rule {blame['rule']} blamed on {blame['distribution']} inputs — " + r["message"]
    return r["message"]


def summary(rows: list[dict], wall: float, both: bool = False) -> list[str]:
    """Summary lines; ``both``: the run held both sections (``wall`` is the whole run's). Rows marked
    ``reused`` come from an earlier run (``--reuse``)."""
    n = len(rows)
    captured = [r for r in rows if "gawee_s" in r]
    verified = [r for r in rows if r.get("verify_ok")]
    refuted = [r for r in rows if r.get("verify_ok") is False]
    passed = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    export = sum(r["export_s"] for r in captured)
    func = sum(r["functionalize_s"] for r in captured)
    conv = sum(r["gawee_s"] for r in captured)
    total_cap = export + func + conv
    share = 100 * conv / total_cap if total_cap else 0.0
    rew = sum(r.get("rewrite_ms", 0.0) for r in rows) / 1e3
    ver = sum(r.get("verify_s", 0.0) for r in rows)
    lines = [
        f"{len(captured)}/{n} captured; the rewrite verified ok (`verify_rewrite`, 4 input distributions) on "
        f"{len(verified)}/{n}"
        + (
            "; verification failed on "
            + ", ".join(
                f"{r['model']} ({', '.join(r['verify_failed'])}: "
                f"{r['verify_blame']['rule'] if r.get('verify_blame') else 'no rule blamed'})"
                for r in refuted
            )
            if refuted
            else ""
        )
        + ".",
        f"{len(passed)}/{n} passed every check (interpreter vs eager ≤ {CAPTURE_TOLERANCE:g}, inferred types = "
        f"recorded, rewrite verified)" + (f"; failed: {', '.join(r['model'] for r in failed)}" if failed else "") + ".",
    ]
    ratios = [r for r in rows if r.get("verify_ratio") is not None]
    if ratios:
        worst = max(ratios, key=lambda r: r["verify_ratio"])
        ok_ratios = [r for r in ratios if r.get("verify_ok")]
        ok_worst = max(ok_ratios, key=lambda r: r["verify_ratio"]) if ok_ratios else None
        text = (
            f"Worst error / allowed over every compared value: {worst['verify_ratio']:.3g} "
            f"({worst['model']}, {worst['verify_worst_distribution']} inputs)"
        )
        if ok_worst is not None and ok_worst is not worst:
            text += (
                f"; among the models that verify, {ok_worst['verify_ratio']:.3g} "
                f"({ok_worst['model']}, {ok_worst['verify_worst_distribution']})"
            )
        lines.append(text + ".")
    if captured:
        lines.append(
            f"Capture time {total_cap:.1f} s in all: torch.export {export:.1f} s, functionalization {func:.1f} s, "
            f"gawee's conversion {conv:.1f} s — gawee's share is {share:.1f}%."
        )
    lines.append(
        f"Rewriting with the default rules took {rew:.1f} s in all, verifying {ver:.1f} s"
        + (
            f"; the whole run{' (both sections)' if both else ''} took {wall / 60:.1f} min of wall time."
            if not any(r.get("reused") for r in rows)
            else f"; {sum(not r.get('reused') for r in rows)} model(s) re-measured in {wall / 60:.1f} min, the "
            "other rows from an earlier run (`--reuse`)."
        )
    )
    lines += iree_summary(rows)
    if rows and any("max_rss_mb" in r for r in rows):
        big = max((r for r in rows if "max_rss_mb" in r), key=lambda r: r["max_rss_mb"])
        lines.append(f"Largest worker: {big['model']} at {big['max_rss_mb'] / 1024:.1f} GiB peak RSS.")
    return lines


def iree_summary(rows: list[dict]) -> list[str]:
    """One line on the IREE column (none if no row went through IREE)."""
    tried = [r for r in rows if r.get("iree_status")]
    if not tried:
        return []
    ok = [r for r in tried if r["iree_status"] == "ok"]
    text = f"IREE (gawee's StableHLO, iree-compile llvm-cpu for the host): {len(ok)}/{len(tried)} equal to eager"
    if ok:
        worst = max(ok, key=lambda r: r["iree_error"] / r["iree_tolerance"])
        text += f" (worst {worst['iree_error']:.2g} on {worst['model']}, tolerance {worst['iree_tolerance']:g})"
    missing: dict[str, int] = {}
    for r in tried:
        for op in r.get("iree_missing", {}):
            missing[op] = missing.get(op, 0) + 1
    if missing:
        text += "; ops without a lowering: " + ", ".join(f"{k} ({n} models)" for k, n in sorted(missing.items()))
    bad = [r for r in tried if r["iree_status"] in ("differs", "rejected")]
    if bad:
        text += "; failed: " + ", ".join(f"{r['model']} ({r['iree_status']})" for r in bad)
    if len(tried) < len(rows):
        text += f"; {len(rows) - len(tried)} model(s) not run through IREE"
    compile_s = sum(r.get("iree_compile_s", 0.0) for r in tried)
    return [text + f". IREE compile time {compile_s / 60:.1f} min in all."]


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


VERIFICATION_TEXT = (
    "*Verification* is `gawee.equivalence.verify_rewrite`, what `gawee-rewrite optimize` runs: the traced "
    "rewrite's result and the captured graph on four input sets (unit normal, ×10, ×100, and the soundness "
    "harness's awkward values), every rewritten value compared with the original value it stands for "
    "(rewrite provenance) within the dtype tolerance × max(1, max|ref|), a failing comparison judged again "
    "against the original evaluated in float64 and locally (does the difference arise here or upstream?), "
    "and on failure the rule blamed. *worst error / allowed* is the largest ratio over all compared values "
    "and input sets (the input set in parentheses) of the error to the plain tolerance, or to the float64-based "
    "allowance where the value was judged again: ≤ 1 passes outright; above 1 on a model that verifies, the "
    "value was forgiven: recomputed from the original's values of its inputs it reproduces the original "
    "(rounding inherited from upstream), or element by element it is no farther from the float64 truth than "
    "the original is."
)


IREE_TEXT = (
    "*IREE* is the optimized graph through gawee's MLIR path (`gawee.to_mlir`, StableHLO; `iree-compile` "
    "for llvm-cpu tuned to the host, docs/mlir.md) run on the model's input and compared with eager PyTorch "
    "at `verify_equivalent`'s tolerance (1e-4 × max(1, max|ref|) in float32): *ok* with that error and the "
    "iree-compile seconds, *no lowering* with the ops that have none, *differs* or *rejected* (a failure of "
    "the row). — means the run had no IREE column (`--no-iree`, or the iree extra is not installed)."
)


def provenance_line(command: str) -> str:
    import torch

    return (
        f"```sh\n{command}\n```\n\nRun {datetime.date.today().isoformat()} · {source_version()} · "
        f"torch {torch.__version__} · {_versions()}{machine()}."
    )


def _versions() -> str:
    out = []
    for m in ("torchvision", "transformers", "timm"):
        if importlib.util.find_spec(m) is not None:
            out.append(f"{m} {__import__(m).__version__} · ")
    return "".join(out)


def failures_text(rows: list[dict]) -> list[str]:
    failed = [r for r in rows if r["status"] != "ok"]
    if not failed:
        return []
    return [
        "Failures:\n\n"
        + "\n".join(f"* **{r['model']}** ({r['stage']}): {_failure_text(r).replace(chr(10), ' ')}" for r in failed)
    ]


def readme_body(rows: list[dict], wall: float, command: str, jobs: int, threads: int, both: bool = False) -> str:
    parts = [
        "Every torchvision classifier (`torchvision.models.list_models(module=torchvision.models)`), random "
        "weights (weight matrices initialized to zero, ViT's heads, get small random values, else every output "
        "is 0), batch 1, 3×224×224 (299 for inception_v3), each in its own process: capture, the reference "
        "interpreter against eager PyTorch, inferred types against the recorded ones, the cost report, "
        "`gawee.rewrite` with the default rules (traced) and `gawee.equivalence.verify_rewrite`, the "
        "verification of `gawee-rewrite optimize`. Transformers and other families: "
        f"[{TRANSFORMERS_SECTION.removeprefix('## ')}](#model-zoo-transformers).",
        provenance_line(command),
        "\n".join(f"* {s}" for s in summary(rows, wall, both)),
        "Columns: nodes, FLOPs, bytes written and peak activation memory are *before → after* the default "
        "rewrite (conventions in `gawee/analysis/cost.py`: FLOPs are 2×MACs for conv/linear/matmul/attention; "
        "peak memory is live activations by liveness). Capture seconds are torch.export / functionalization "
        "(`run_decompositions({})`) / gawee's own conversion. Rewrite ms is the wall time of `gawee.rewrite` "
        "with `trace=True` (graph copy included; the rule set is loaded beforehand). Errors are "
        "max|out − ref| / max(1, max|ref|): *capture error* is the interpreter against eager PyTorch, "
        "*verify error* the optimized graph's outputs against the captured one's on the unit-normal inputs. "
        + VERIFICATION_TEXT
        + " "
        + IREE_TEXT
        + " Each worker first captures, rewrites and verifies a tiny model, so one-time costs (torch.export's "
        f"imports and caches) are not charged to the first model. {jobs} model(s) ran at once with {threads} "
        "torch thread(s) each, so a model's times include contention with its neighbour (the largest models "
        "ran together first); `engine_speed.py` has the isolated rewrite timings.",
        markdown_table(HEADERS, table_rows(rows)),
        *failures_text(rows),
    ]
    return "\n\n".join(parts)


def transformers_body(rows: list[dict], wall: float, command: str, jobs: int, threads: int, both: bool = False) -> str:
    missing = missing_optional()
    parts = [
        "Transformers and other families through the same worker as the torchvision zoo above: the `hf:` "
        "families of `gawee.frontend.families` (small built-in configs: 2 layers, hidden 64, 16 tokens with an "
        "attention mask padding the last quarter; random weights), timm models at their configured input size, "
        "and torchvision's r3d_18 video classifier (16 frames of 112×112). The verification's integer inputs "
        "(token ids, masks) are drawn the same in every input set; only the float inputs change.",
        provenance_line(command),
    ]
    if missing:
        parts.append(
            f"**{' and '.join(missing)} not installed**: the `hf:` and `timm:` models were not run; "
            "install them with `pip install 'gawee[transformers]'` (or `.venv/bin/pip install transformers timm`) "
            "and rerun `python benchmarks/zoo.py --section transformers`."
        )
    if rows:
        parts += [
            "\n".join(f"* {s}" for s in summary(rows, wall, both)),
            "Columns: *nodes* before → after the default rewrite; *capture error* the interpreter against eager "
            "PyTorch (max|out − ref| / max(1, max|ref|)); *rules fired most* the three rules with the most "
            "firings. "
            + VERIFICATION_TEXT
            + " "
            + IREE_TEXT
            + f" {jobs} model(s) ran at once with {threads} torch thread(s) each.",
            markdown_table(TRANSFORMER_HEADERS, transformer_rows(rows)),
            *failures_text(rows),
        ]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", help="comma-separated models: torchvision names, hf:FAMILY, timm:NAME (default: the section's)"
    )
    ap.add_argument(
        "--section", choices=SECTIONS, help="run only this section: the 80 torchvision classifiers or transformers"
    )
    ap.add_argument("--jobs", type=int, default=2, help="models run at once (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: cores / jobs)")
    ap.add_argument(
        "--memory-gb", type=float, default=20.0, help="memory budget for the workers running at once (default 20)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model (default 1800)")
    ap.add_argument("--json", type=Path, help="also write every row (all fields) to this JSON file")
    ap.add_argument(
        "--reuse",
        type=Path,
        help="an earlier run's --json file: its rows stand for the section's models this run does not measure "
        "(rerun a few with --models, keep the rest of the table)",
    )
    ap.add_argument(
        "--iree",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each optimized graph through gawee's MLIR path on IREE (the IREE column; default: "
        "when the iree extra is installed)",
    )
    ap.add_argument("--no-readme", action="store_true", help="do not write benchmarks/README.md")
    ap.add_argument("--readme", type=Path, default=README, help="the markdown file to write (default: %(default)s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    cores = os.cpu_count() or 1
    if args.worker:
        return worker_main(args.worker, args.out, args.threads or cores, bool(args.iree))

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    tv_names = model_names()
    wanted = [args.section] if args.section else list(SECTIONS)
    if args.models:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        unknown = [n for n in names if section_of(n, tv_names) is None]
        if unknown:
            print(f"error: not torchvision models, hf:FAMILY or timm:NAME: {', '.join(unknown)}", file=sys.stderr)
            return 2
        names = [n for n in names if section_of(n, tv_names) in wanted]
    else:
        names = (tv_names if "torchvision" in wanted else []) + (TRANSFORMER_MODELS if "transformers" in wanted else [])
    missing = missing_optional()
    if missing:
        skip = [n for n in names if n.startswith(("hf:", "timm:"))]
        if skip:
            console.print(
                f"[yellow]{' and '.join(missing)} not installed: skipping {', '.join(skip)}[/] "
                "(pip install 'gawee[transformers]')",
                highlight=False,
            )
        names = [n for n in names if n not in skip]
    iree = args.iree if args.iree is not None else importlib.util.find_spec("iree") is not None
    if args.iree and importlib.util.find_spec("iree") is None:
        print("error: --iree needs the IREE compiler and runtime: pip install 'gawee[iree]'", file=sys.stderr)
        return 2
    section = {n: section_of(n, tv_names) for n in names}
    jobs = max(1, args.jobs)
    threads = args.threads or max(1, cores // jobs)
    counts = param_counts(names)
    need = {n: memory_estimate_mb(counts[n], iree) for n in names}
    gate = MemoryGate(args.memory_gb * 1024)
    # largest first, so the memory-heavy models don't end up alone at the tail of the run
    order = sorted(names, key=lambda n: -need[n])

    results: dict[str, dict] = {}
    t0 = time.perf_counter()
    with Progress(
        TextColumn("[bold]zoo"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
    ) as progress:
        task = progress.add_task("", total=len(names))
        running: set[str] = set()
        lock = threading.Lock()

        def job(name: str) -> dict:
            gate.acquire(need[name])
            with lock:
                running.add(name)
                progress.update(task, description=", ".join(sorted(running)))
            try:
                row = run_one(name, threads, args.timeout, iree)
            finally:
                gate.release(need[name])
            with lock:
                running.discard(name)
                results[name] = row
                progress.update(task, advance=1, description=", ".join(sorted(running)))
                mark = "[green]ok[/]" if row["status"] == "ok" else f"[red]FAIL ({row['stage']})[/]"
                cap = row.get("export_s", 0) + row.get("functionalize_s", 0) + row.get("gawee_s", 0)
                line = (
                    f"{mark} {name}: {row.get('nodes_before', '—')}→{row.get('nodes_after', '—')} nodes, "
                    f"capture {cap:.1f} s, rewrite {row.get('rewrite_ms', 0):.0f} ms, "
                    f"err {fmt_err(row.get('capture_error'))}/{fmt_err(row.get('verify_error'))}, "
                    f"verification {fmt_verification(row)} worst {fmt_ratio(row)} in {row.get('verify_s', 0):.1f} s, "
                    f"{row.get('total_s', 0):.0f} s" + (f", IREE {fmt_iree(row)}" if row.get("iree_status") else "")
                )
                if row["status"] != "ok":
                    line += f"\n    {row['message']}"
                progress.console.print(line, highlight=False)
            return row

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(job, order))
    wall = time.perf_counter() - t0
    rows = [results[n] for n in names]
    kept: list[dict] = []  # the earlier run's rows of the sections not run now: into --json only
    if args.reuse:  # the sections' tables in full: the rows measured now, the others from the earlier run
        earlier = {r["model"]: dict(r, reused=True) for r in json.loads(args.reuse.read_text())}
        full = (tv_names if "torchvision" in wanted else []) + (TRANSFORMER_MODELS if "transformers" in wanted else [])
        full += [n for n in names if n not in full]
        rows = [results[n] if n in results else earlier[n] for n in full if n in results or n in earlier]
        section.update({r["model"]: section_of(r["model"], tv_names) for r in rows})
        have = {r["model"] for r in rows}
        kept = [dict(r, reused=True) for n, r in earlier.items() if n not in have]
    tv_rows = [r for r in rows if section[r["model"]] == "torchvision"]
    tr_rows = [r for r in rows if section[r["model"]] == "transformers"]
    one_section = not (tv_rows and tr_rows)  # else the wall time is the whole run's, both sections

    if args.json:  # first: the rows survive whatever happens below
        args.json.write_text(json.dumps(rows + kept, indent=1))

    # the terminal gets the narrow columns; the README gets all of them
    if tv_rows:
        keep = [0, 1, 3, 8, 9, 11, 12, 14, 15]
        table = Table(
            *[HEADERS[i] for i in keep], title="gawee model zoo: torchvision (full table: benchmarks/README.md)"
        )
        for r in table_rows(tv_rows):
            table.add_row(*[r[i] for i in keep])
        console.print(table)
        for line in summary(tv_rows, wall, not one_section):
            console.print(line, highlight=False)
    if tr_rows:
        table = Table(*TRANSFORMER_HEADERS, title="gawee model zoo: transformers and other families")
        for r in transformer_rows(tr_rows):
            table.add_row(*r)
        console.print(table)
        for line in summary(tr_rows, wall, not one_section):
            console.print(line, highlight=False)

    given = sys.argv[1:] if argv is None else argv
    command = (
        "make zoo   # = .venv/bin/python benchmarks/zoo.py"
        if not given
        else "python benchmarks/zoo.py " + " ".join(given)
    )
    if not args.no_readme:
        if tv_rows:
            replace_section(SECTION, readme_body(tv_rows, wall, command, jobs, threads, not one_section), args.readme)
            console.print(f"wrote the {SECTION!r} section of {args.readme}")
        if tr_rows or ("transformers" in wanted and not args.models):  # --models of one section: the other stays
            body = transformers_body(tr_rows, wall, command, jobs, threads, not one_section)
            replace_section(TRANSFORMERS_SECTION, body, args.readme)
            console.print(f"wrote the {TRANSFORMERS_SECTION!r} section of {args.readme}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
