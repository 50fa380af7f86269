"""The torchvision model zoo through gawee: capture, check, optimize, verify — one row per model.

    python benchmarks/zoo.py                      # all 80 classifiers, table into benchmarks/README.md
    python benchmarks/zoo.py --models resnet18,vit_b_16 --jobs 1 --no-readme

For every model (random weights, batch 1, 3x224x224, 299 for inception_v3) in its own
subprocess: eager reference, capture (export / functionalize / gawee's conversion timed
apart), the reference interpreter against eager, re-inferred types against the recorded
ones, the cost report, the default rewrite and ``verify_equivalent``. The parent schedules
the subprocesses under a memory budget (the largest models need several GB), shows
progress, prints a summary, and writes the table into the ``## Model zoo`` section of
benchmarks/README.md (other sections are left as they are). Exit status 1 if any model fails.
"""

from __future__ import annotations

import argparse
import datetime
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
    gawee.verify_equivalent(graph, gawee.rewrite(graph, rules)[0])
    return rules


def measure(name: str) -> dict:
    """Everything the table says about one model. Never raises: a failure is recorded with its stage."""
    import torch

    import gawee
    from gawee.frontend.models import resolve

    row: dict = {"model": name, "status": "ok", "stage": "", "message": ""}
    stage = "warm-up"
    t_start = time.perf_counter()
    try:
        rules = warm_up()
        stage = "resolve"
        src = resolve(name)
        inputs = src.example_inputs

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
        optimized, report = gawee.rewrite(graph, rules)
        row["rewrite_ms"] = (time.perf_counter() - t0) * 1e3
        after = gawee.cost(optimized)
        row.update(
            nodes_after=len(optimized),
            flops_after=after.flops,
            bytes_written_after=after.bytes_written,
            peak_after=after.peak_memory,
            firings=dict(report.firings),
        )

        stage = "verify"
        with torch.no_grad():
            eq = gawee.verify_equivalent(graph, optimized)
        row["verify_error"] = max((o.max_error / o.scale for o in eq.outputs), default=0.0)
        row["verify_abs_error"] = eq.max_error

        problems = []
        if row["capture_error"] > CAPTURE_TOLERANCE:
            problems.append(f"interpreter differs from eager: error {row['capture_error']:.3g}")
        if mismatches:
            m = mismatches[0]
            problems.append(f"{len(mismatches)} inferred type(s) differ from the recorded ones, first: {m}")
        if not eq.ok:
            problems.append(f"verification failed: {eq}")
        if problems:
            row.update(status="FAIL", stage="check", message="; ".join(problems))
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


def worker_main(name: str, out_path: str, threads: int) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(threads)
    row = measure(name)
    Path(out_path).write_text(json.dumps(row))
    return 0


# ---------------------------------------------------------------------------------------
# parent: scheduling, progress, table, README
# ---------------------------------------------------------------------------------------


def model_names() -> list[str]:
    from gawee.frontend.models import torchvision_names

    return torchvision_names()


def param_counts(names: list[str]) -> dict[str, int]:
    """Parameter counts from torchvision's weight metadata (no model is built, nothing is downloaded)."""
    import torchvision

    counts = {}
    for n in names:
        try:
            counts[n] = max(w.meta["num_params"] for w in torchvision.models.get_model_weights(n))
        except Exception:  # a model without weight metadata: assume it is large
            counts[n] = 300_000_000
    return counts


def memory_estimate_mb(params: int) -> float:
    """Peak RSS of one worker: ~1 GB of torch + 2.5 copies of the float32 weights (the module's,
    shared with the captured graph, and the folded constants of the rewritten graph). Measured:
    regnet_y_128gf (645 M parameters) 5.5 GiB, vit_h_14 (633 M, little to fold) 3.1 GiB."""
    return 1000 + 2.5 * params * 4 / 2**20


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


def run_one(name: str, threads: int, timeout: float) -> dict:
    row, why, wall = run_worker(
        Path(__file__).resolve(),
        ["--worker", name, "--threads", str(threads)],
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


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        cap = "—" if "export_s" not in r else f"{r['export_s']:.2f} / {r['functionalize_s']:.2f} / {r['gawee_s']:.3f}"
        status = "ok" if r["status"] == "ok" else f"FAIL ({r['stage']})"
        out.append(
            [
                r["model"],
                fmt_pair(r.get("nodes_before"), r.get("nodes_after"), lambda x: "—" if x is None else str(x)),
                str(r.get("distinct_ops", "—")),
                fmt_opaque(r.get("opaque")),
                fmt_pair(r.get("flops_before"), r.get("flops_after"), fmt_si),
                fmt_pair(r.get("bytes_written_before"), r.get("bytes_written_after"), fmt_bytes),
                fmt_pair(r.get("peak_before"), r.get("peak_after"), fmt_bytes),
                cap,
                "—" if "rewrite_ms" not in r else f"{r['rewrite_ms']:.0f}",
                fmt_err(r.get("capture_error")),
                fmt_err(r.get("verify_error")),
                status,
            ]
        )
    return out


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
    "status",
]


def summary(rows: list[dict], wall: float) -> list[str]:
    n = len(rows)
    captured = [r for r in rows if "gawee_s" in r]
    verified = [r for r in rows if r.get("verify_error") is not None and r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    export = sum(r["export_s"] for r in captured)
    func = sum(r["functionalize_s"] for r in captured)
    conv = sum(r["gawee_s"] for r in captured)
    total_cap = export + func + conv
    share = 100 * conv / total_cap if total_cap else 0.0
    rew = sum(r.get("rewrite_ms", 0.0) for r in rows) / 1e3
    lines = [
        f"{len(captured)}/{n} captured, {len(verified)}/{n} passed every check "
        f"(interpreter vs eager ≤ {CAPTURE_TOLERANCE:g}, inferred types = recorded, optimized graph verified)"
        + (f"; failed: {', '.join(r['model'] for r in failed)}" if failed else "")
        + ".",
        f"Capture time {total_cap:.1f} s in all: torch.export {export:.1f} s, functionalization {func:.1f} s, "
        f"gawee's conversion {conv:.1f} s — gawee's share is {share:.1f}%.",
        f"Rewriting with the default rules took {rew:.1f} s in all; the whole run took {wall / 60:.1f} min "
        f"of wall time.",
    ]
    if rows and any("max_rss_mb" in r for r in rows):
        big = max((r for r in rows if "max_rss_mb" in r), key=lambda r: r["max_rss_mb"])
        lines.append(f"Largest worker: {big['model']} at {big['max_rss_mb'] / 1024:.1f} GiB peak RSS.")
    return lines


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def readme_body(rows: list[dict], wall: float, command: str, jobs: int, threads: int) -> str:
    import torch
    import torchvision

    failed = [r for r in rows if r["status"] != "ok"]
    parts = [
        "Every torchvision classifier (`torchvision.models.list_models(module=torchvision.models)`), random "
        "weights, batch 1, 3×224×224 (299 for inception_v3), each in its own process: capture, the reference "
        "interpreter against eager PyTorch, inferred types against the recorded ones, the cost report, "
        "`gawee.rewrite` with the default rules and `gawee.verify_equivalent`.",
        f"```sh\n{command}\n```",
        f"Run {datetime.date.today().isoformat()} · {source_version()} · torch {torch.__version__} · torchvision "
        f"{torchvision.__version__} · {machine()}.",
        "\n".join(f"* {s}" for s in summary(rows, wall)),
        "Columns: nodes, FLOPs, bytes written and peak activation memory are *before → after* the default "
        "rewrite (conventions in `gawee/analysis/cost.py`: FLOPs are 2×MACs for conv/linear/matmul/attention; "
        "peak memory is live activations by liveness). Capture seconds are torch.export / functionalization "
        "(`run_decompositions({})`) / gawee's own conversion. Rewrite ms is the wall time of `gawee.rewrite` "
        "(graph copy included; the rule set is loaded beforehand). Errors are max|out − ref| / max(1, max|ref|): "
        "*capture error* is the interpreter against eager PyTorch, *verify error* the optimized graph against the "
        "captured one. Each worker first captures and rewrites a tiny model, so one-time costs (torch.export's "
        f"imports and caches) are not charged to the first model. {jobs} model(s) ran at once with {threads} torch "
        "thread(s) each, so a model's times include contention with its neighbour (the largest models ran "
        "together first); `engine_speed.py` has the isolated rewrite timings.",
        markdown_table(HEADERS, table_rows(rows)),
    ]
    if failed:
        parts.append(
            "Failures:\n\n"
            + "\n".join(f"* **{r['model']}** ({r['stage']}): {r['message'].replace(chr(10), ' ')}" for r in failed)
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated torchvision names (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="models run at once (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: cores / jobs)")
    ap.add_argument(
        "--memory-gb", type=float, default=20.0, help="memory budget for the workers running at once (default 20)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model (default 1800)")
    ap.add_argument("--json", type=Path, help="also write every row (all fields) to this JSON file")
    ap.add_argument("--no-readme", action="store_true", help="do not write benchmarks/README.md")
    ap.add_argument("--readme", type=Path, default=README, help="the markdown file to write (default: %(default)s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    cores = os.cpu_count() or 1
    if args.worker:
        return worker_main(args.worker, args.out, args.threads or cores)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    all_names = model_names()
    if args.models:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in all_names]
        if unknown:
            print(f"error: not torchvision classifiers: {', '.join(unknown)}", file=sys.stderr)
            return 2
    else:
        names = all_names
    jobs = max(1, args.jobs)
    threads = args.threads or max(1, cores // jobs)
    counts = param_counts(names)
    need = {n: memory_estimate_mb(counts[n]) for n in names}
    gate = MemoryGate(args.memory_gb * 1024)
    # largest first, so the memory-heavy models don't end up alone at the tail of the run
    order = sorted(names, key=lambda n: -need[n])

    console = Console()
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
                row = run_one(name, threads, args.timeout)
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
                    f"{row.get('total_s', 0):.0f} s"
                )
                if row["status"] != "ok":
                    line += f"\n    {row['message']}"
                progress.console.print(line, highlight=False)
            return row

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(job, order))
    wall = time.perf_counter() - t0
    rows = [results[n] for n in names]

    # the terminal gets the narrow columns; the README gets all of them
    keep = [0, 1, 3, 7, 8, 9, 10, 11]
    table = Table(*[HEADERS[i] for i in keep], title="gawee model zoo (full table: benchmarks/README.md)")
    for r in table_rows(rows):
        table.add_row(*[r[i] for i in keep])
    console.print(table)
    for line in summary(rows, wall):
        console.print(line, highlight=False)

    given = sys.argv[1:] if argv is None else argv
    command = (
        "make zoo   # = .venv/bin/python benchmarks/zoo.py"
        if not given
        else "python benchmarks/zoo.py " + " ".join(given)
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not args.no_readme:
        replace_section(SECTION, readme_body(rows, wall, command, jobs, threads), args.readme)
        console.print(f"wrote the {SECTION!r} section of {args.readme}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
