"""Engine speed of gawee's rewriter (issues 3 and 40), beside onnxscript's rewriter and torch.fx's.

    python benchmarks/engine_speed.py                       # figures into benchmarks/README.md
    python benchmarks/engine_speed.py --sizes 1000,10000 --no-readme

(a) ResNet-18 after capture, rewritten with the default rules: median of warm runs, the previous result
    released before each, freed pages kept by the allocator as gawee.compile sets it (and, apart, the previous
    result kept alive: the folded weights then go to freshly faulted pages); (a') the same
    model exported by torch.onnx, loaded with onnx_ir and rewritten by onnxscript's rewriter with its
    default rules, in the same run; (a'') a fresh process loading the bundled rules and rewriting
    ResNet-18 once (capture excluded), with an empty cache directory and then with the parsed rule
    files kept there.
(b) Synthetic graphs of ~1k, 10k and 100k nodes built with GraphBuilder — blocks of
    conv2d → batch_norm → relu on 1x4x8x8 activations with 4x4x3x3 weights, every 4th
    block ResNet-style conv2d → batch_norm → add(skip) → relu — rewritten with the
    default rules (fold every batch norm, fuse every relu and residual add); beside it, the same rewrite
    with the engine interpreted (``GAWEE_ACCEL=0``) instead of compiled (gawee.accel).
(c) The same Conv+BN folding alone: gawee with only ``fold_conv_bn`` against
    ``torch.fx.subgraph_rewriter.replace_pattern`` on an fx.Graph of the same blocks.

Each measurement runs in a fresh subprocess with a time limit, so one that explodes
is reported as such and the others still run. Only the rewriting is timed (not graph
construction, capture or rule loading, which are reported apart).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from worker import TIMEOUT, run_worker

HERE = Path(__file__).resolve().parent
SECTION = "## Engine speed"
TARGET_RESNET_MS = 20.0
TARGET_COLD_MS = 100.0
TARGET_US_PER_NODE = 30.0
TARGET_RATIO = 11.0
TARGET_100K_S = 3.0
SIZES = (1000, 10_000, 100_000)


# ---------------------------------------------------------------------------------------
# the graphs
# ---------------------------------------------------------------------------------------


def blocks_for(nodes: int) -> int:
    """The fewest blocks whose graph has at least ``nodes`` nodes (3 per block + 1 add per 4 blocks)."""
    b = max(1, (nodes * 4) // 13)
    while 3 * b + b // 4 < nodes:
        b += 1
    return b


def block_params(i: int, gen):
    """Block i's constants: conv weight and bias, batch norm gamma, beta, mean, var."""
    import torch

    return (
        torch.randn(4, 4, 3, 3, generator=gen) * 0.2,
        torch.randn(4, generator=gen) * 0.1,
        torch.rand(4, generator=gen) + 0.5,
        torch.randn(4, generator=gen) * 0.1,
        torch.randn(4, generator=gen) * 0.1,
        torch.rand(4, generator=gen) + 0.5,
    )


def gawee_graph(blocks: int):
    import torch

    from gawee.ir.builder import GraphBuilder

    gen = torch.Generator().manual_seed(0)
    b = GraphBuilder(f"synthetic{blocks}")
    x = skip = b.input("x", "f32[1,4,8,8]")
    for i in range(blocks):
        w, bias, gamma, beta, mean, var = (b.const(t, n) for t, n in zip(block_params(i, gen), NAMES))
        y = b.batch_norm(b.conv2d(x, w, bias, padding=[1, 1]), gamma, beta, mean, var, eps=1e-5)
        if i % 4 == 3:
            y = b.add(y, skip)
        x = b.relu(y)
        if i % 4 == 3:
            skip = x
    return b.output(x)


NAMES = ("w", "b", "gamma", "beta", "mean", "var")


def fx_module(blocks: int):
    """The same blocks as an fx GraphModule (constants are get_attr nodes of the root module)."""
    import torch
    import torch.fx as fx
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    root = torch.nn.Module()
    g = fx.Graph()
    x = skip = g.placeholder("x")
    for i in range(blocks):
        attrs = []
        for t, n in zip(block_params(i, gen), NAMES):
            root.register_buffer(f"{n}{i}", t)
            attrs.append(g.get_attr(f"{n}{i}"))
        w, bias, gamma, beta, mean, var = attrs
        y = g.call_function(torch.conv2d, (x, w, bias, 1, 1))
        # spelled as symbolic tracing spells F.batch_norm, so that the pattern matches it
        y = g.call_function(
            F.batch_norm,
            (y, mean, var),
            {"weight": gamma, "bias": beta, "training": False, "momentum": 0.0, "eps": 1e-5},
        )
        if i % 4 == 3:
            y = g.call_function(torch.add, (y, skip))
        x = g.call_function(torch.relu, (y,))
        if i % 4 == 3:
            skip = x
    g.output(x)
    return fx.GraphModule(root, g)


def fx_pattern(x, w, b, gamma, beta, mean, var):
    import torch
    import torch.nn.functional as F

    return F.batch_norm(
        torch.conv2d(x, w, b, 1, 1), mean, var, weight=gamma, bias=beta, training=False, momentum=0.0, eps=1e-5
    )


def fx_replacement(x, w, b, gamma, beta, mean, var):
    """The folded conv. fx cannot evaluate constants while rewriting, so the fold stays in the graph
    as ops on the weights (to be constant-folded later); gawee computes the new weights at rewrite time."""
    import torch

    s = gamma / torch.sqrt(var + 1e-5)
    return torch.conv2d(x, w * s.reshape(-1, 1, 1, 1), (b - mean) * s + beta, 1, 1)


# ---------------------------------------------------------------------------------------
# measurements (each in its own process)
# ---------------------------------------------------------------------------------------


def measure_resnet18(repeat: int) -> dict:
    import gc

    import gawee
    from gawee.backend.allocator import keep_freed_memory
    from gawee.frontend.models import resolve
    from gawee.machine import minor_faults

    # the allocator as gawee.compile sets it (gawee.backend.allocator): freed pages stay in the process, so a
    # released result's pages serve the next one whatever glibc's adaptive trimming would have given back
    keep_freed_memory()
    src = resolve("resnet18")
    graph = gawee.capture(src.module, src.example_inputs, name="resnet18")
    loads = []
    for _ in range(3):
        t0 = time.perf_counter()
        rules = gawee.default_rules()
        loads.append(time.perf_counter() - t0)
    for _ in range(3):  # warm-up: caches of shape inference, first-time imports
        out, report = gawee.rewrite(graph, rules)
    times, engine, clones, faults = [], [], [], []
    for _ in range(repeat):
        # the previous result released first (its Value/Node cycles wait for a full collection otherwise), as
        # timeit and pyperf collect between runs: its pages are reused instead of fresh ones faulted in
        del out
        gc.collect()
        f0 = minor_faults()
        t0 = time.perf_counter()
        out, report = gawee.rewrite(graph, rules)
        times.append(time.perf_counter() - t0)
        faults.append(minor_faults() - f0)
        engine.append(report.seconds)
        t0 = time.perf_counter()
        graph.clone()
        clones.append(time.perf_counter() - t0)
    kept, kept_faults = [], []
    for _ in range(repeat):  # a caller that keeps each result until the next one is made
        f0 = minor_faults()
        t0 = time.perf_counter()
        out, report = gawee.rewrite(graph, rules)
        kept.append(time.perf_counter() - t0)
        kept_faults.append(minor_faults() - f0)
    t0 = time.perf_counter()
    gawee.rewrite(graph)  # what a caller that passes no rules pays (the bundled rules, cached)
    no_rules = time.perf_counter() - t0
    eq = gawee.verify_equivalent(graph, out)
    return {
        "runs": repeat,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "engine_median_s": statistics.median(engine),
        "faults_median": statistics.median(faults),
        "kept_median_s": statistics.median(kept),
        "kept_faults_median": statistics.median(kept_faults),
        "clone_median_s": statistics.median(clones),
        "load_rules_s": loads[0],  # the first call compiles; later ones hit the per-process cache
        "no_rules_arg_s": no_rules,
        "nodes_before": len(graph),
        "nodes_after": len(out),
        "firings": sum(report.firings.values()),
        "equivalent": eq.ok,
    }


def measure_cold() -> dict:
    """What a fresh process (`gawee-rewrite optimize resnet18`) spends on the rules: loading the bundled
    rules (from the on-disk cache of parsed rule files when it holds them) and the first rewrite of the
    captured ResNet-18. Capture is not counted."""
    import gawee
    from gawee.frontend.models import resolve

    src = resolve("resnet18")
    graph = gawee.capture(src.module, src.example_inputs, name="resnet18")
    t0 = time.perf_counter()
    rules = gawee.default_rules()
    t1 = time.perf_counter()
    gawee.rewrite(graph, rules)
    t2 = time.perf_counter()
    return {"load_rules_s": t1 - t0, "first_rewrite_s": t2 - t1, "median_s": t2 - t0}


def measure_onnxscript(repeat: int) -> dict:
    """onnxscript's rewriter with its default rules on torch.onnx's export of the same ResNet-18
    (seeded weights): the median of ``onnx_ir.load`` + ``rewriter.rewrite``, as gawee's figure
    includes copying its graph."""
    import gc
    import tempfile

    import torch
    import torchvision

    try:
        import onnx_ir as ir
        from onnxscript import rewriter
    except ImportError:
        return {"error": "onnxscript is not installed (pip install 'gawee[onnx]')"}
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with tempfile.TemporaryDirectory(prefix="gawee-speed-") as tmp:
        path = str(Path(tmp) / "resnet18.onnx")
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), path, dynamo=True, external_data=False)
        times = []
        for _ in range(repeat + 3):
            gc.collect()  # as for gawee: the previous run's objects released before the next is timed
            t0 = time.perf_counter()
            loaded = ir.load(path)
            before = len(list(loaded.graph))
            out = rewriter.rewrite(loaded)
            times.append(time.perf_counter() - t0)
    times = times[3:]  # warm-up
    return {
        "runs": repeat,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "nodes_before": before,
        "nodes_after": len(list(out.graph)),
    }


def _fold_only(rules):
    from gawee.rewrite.ruleset import Phase, RuleSet

    return RuleSet([Phase("fold", [rules.rule("fold_conv_bn")])])


def measure_gawee(blocks: int, which: str, repeat: int) -> dict:
    import gc

    import gawee

    rules = gawee.default_rules()
    if which == "fold":
        rules = _fold_only(rules)
    warm = gawee_graph(8)
    gawee.rewrite(warm, rules)
    t0 = time.perf_counter()
    graph = gawee_graph(blocks)
    build_s = time.perf_counter() - t0
    times, engine = [], []
    out = None
    for _ in range(repeat):
        del out  # the previous result released and collected first, as for ResNet-18 (a) and as pyperf does
        gc.collect()
        t0 = time.perf_counter()
        out, report = gawee.rewrite(graph, rules)
        times.append(time.perf_counter() - t0)
        engine.append(report.seconds)
    row = {
        "blocks": blocks,
        "nodes_before": len(graph),
        "nodes_after": len(out),
        "build_s": build_s,
        "runs": repeat,
        "median_s": statistics.median(times),
        "engine_median_s": statistics.median(engine),
        "firings": dict(report.firings),
    }
    if blocks <= 400:
        row["equivalent"] = gawee.verify_equivalent(graph, out).ok
    return row


def measure_fx(blocks: int, repeat: int) -> dict:
    import torch
    from torch.fx import subgraph_rewriter

    warm = fx_module(8)
    subgraph_rewriter.replace_pattern(warm, fx_pattern, fx_replacement)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gm = fx_module(blocks)
        build_s = time.perf_counter() - t0
        nodes_before = len(gm.graph.nodes)
        x = torch.randn(1, 4, 8, 8)
        ref = gm(x) if blocks <= 400 else None
        t0 = time.perf_counter()
        matches = subgraph_rewriter.replace_pattern(gm, fx_pattern, fx_replacement)
        times.append(time.perf_counter() - t0)
    row = {
        "blocks": blocks,
        "nodes_before": nodes_before,
        "nodes_after": len(gm.graph.nodes),
        "matches": len(matches),
        "build_s": build_s,
        "runs": repeat,
        "median_s": statistics.median(times),
    }
    if ref is not None:
        got = gm(x)
        row["equivalent"] = bool((got - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item()))
    return row


def worker_main(args) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if args.worker == "resnet18":
        row = measure_resnet18(args.repeat)
    elif args.worker == "cold":
        row = measure_cold()
    elif args.worker == "onnxscript":
        row = measure_onnxscript(args.repeat)
    elif args.worker in ("gawee", "fold", "interpreted"):
        row = measure_gawee(args.blocks, args.worker, args.repeat)
    else:
        row = measure_fx(args.blocks, args.repeat)
    from gawee import accel

    row["engine"] = accel.summary()
    Path(args.out).write_text(json.dumps(row))
    return 0


def profile(nodes: int, top: int = 30) -> int:
    """cProfile of the default rewrite of the synthetic graph of ``nodes`` nodes: where the time goes."""
    import cProfile
    import pstats

    import gawee

    rules = gawee.default_rules()
    gawee.rewrite(gawee_graph(8), rules)
    graph = gawee_graph(blocks_for(nodes))
    prof = cProfile.Profile()
    prof.enable()
    _, rep = gawee.rewrite(graph, rules)
    prof.disable()
    print(f"{len(graph)} nodes -> {rep.nodes_after}, {rep.total} firings, {rep.seconds:.2f} s in the engine")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return 0


def measure_cold_twice(timeout: float) -> dict:
    """The cold worker in two fresh processes sharing an empty cache directory: the first parses the
    rule files (nothing kept yet), the second finds them kept, as every later `gawee-rewrite` run does."""
    import os
    import tempfile

    from gawee import accel

    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ.setdefault(accel.STORE, str(accel.GAWEE.store))  # the compiled engine stays where it was built
    with tempfile.TemporaryDirectory(prefix="gawee-speed-cache-") as tmp:
        os.environ["XDG_CACHE_HOME"] = tmp
        try:
            return {"empty_cache": measure("cold", 0, 1, timeout), "kept": measure("cold", 0, 1, timeout)}
        finally:
            if saved is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = saved


def measure(kind: str, blocks: int, repeat: int, timeout: float) -> dict:
    """One measurement in a worker process; ``interpreted``: the default rewrite with the engine's modules run by the
    interpreter (``GAWEE_ACCEL=0``), beside the compiled engine's ``gawee`` row."""
    row, why, wall = run_worker(
        Path(__file__).resolve(),
        ["--worker", kind, "--blocks", str(blocks), "--repeat", str(repeat)],
        timeout=timeout,
        env={"GAWEE_ACCEL": "0"} if kind == "interpreted" else None,
    )
    if row is not None:
        return row
    return {"timeout_s": timeout, "wall_s": wall} if why == TIMEOUT else {"error": why}


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------


def fmt_s(row: dict) -> str:
    if "timeout_s" in row:
        return f"> {row['timeout_s']:.0f} s (stopped)"
    if "error" in row:
        return "failed"
    s = row["median_s"]
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def size_label(n: int) -> str:
    return f"{n / 1000:g}k" if n >= 1000 else str(n)


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def report(res: dict, sizes: list[int], command: str, limits: tuple[float, float]) -> tuple[str, list[str]]:
    """The README section body and the console lines."""
    import torch
    from readme import machine, source_version

    lines, md = [], []
    r = res["resnet18"]
    engine = r.get("engine", "engine (form not reported)")
    lines.append(f"gawee's {engine}")
    if "median_s" in r:
        ok = r["median_s"] * 1e3 < TARGET_RESNET_MS
        lines.append(
            f"(a) ResNet-18, default rules: median {r['median_s'] * 1e3:.1f} ms over {r['runs']} warm runs "
            f"(min {r['min_s'] * 1e3:.1f}, max {r['max_s'] * 1e3:.1f}; engine {r['engine_median_s'] * 1e3:.1f} ms "
            f"+ graph copy {r['clone_median_s'] * 1e3:.1f} ms), {r['nodes_before']} → {r['nodes_after']} nodes, "
            f"{r['firings']} firings, equivalent: {r['equivalent']} — target < {TARGET_RESNET_MS:.0f} ms "
            f"{verdict(ok)}. The previous result was released before each run, with the allocator as "
            f"gawee.compile sets it (freed pages kept: {r['faults_median']:.0f} page faults per rewrite); where "
            f"the caller still holds the previous result, the folded weights go to fresh pages: "
            f"median {r['kept_median_s'] * 1e3:.1f} ms ({r['kept_faults_median']:.0f} page faults). "
            f"Compiling the bundled rules takes {r['load_rules_s'] * 1e3:.0f} ms, once per "
            f"process (cached after); `gawee.rewrite(graph)` with no rule set given took "
            f"{r['no_rules_arg_s'] * 1e3:.0f} ms."
        )
    else:
        lines.append(f"(a) ResNet-18: {fmt_s(r)} {r.get('error', '')}")
    md.append(lines[-1])
    o = res.get("onnxscript", {})
    if "median_s" in o and "median_s" in r:
        faster = r["median_s"] < o["median_s"]
        lines.append(
            f"(a') the same ResNet-18 through onnxscript's rewriter (default rules, torch.onnx's export, "
            f"`onnx_ir.load` included): median {o['median_s'] * 1e3:.1f} ms over {o['runs']} runs "
            f"({o['nodes_before']} → {o['nodes_after']} nodes); gawee {r['median_s'] * 1e3:.1f} ms: "
            f"{o['median_s'] / r['median_s']:.2f}× onnxscript's speed — target faster {verdict(faster)}."
        )
    else:
        lines.append(f"(a') onnxscript's rewriter on ResNet-18: {fmt_s(o)} {o.get('error', '')}")
    md.append(lines[-1])
    cold = res.get("cold", {})
    parts = []
    for key, what in (("empty_cache", "nothing kept yet"), ("kept", "parsed rule files kept on disk")):
        c = cold.get(key, {})
        if "median_s" in c:
            parts.append(
                f"{what}: {c['median_s'] * 1e3:.0f} ms (rules {c['load_rules_s'] * 1e3:.0f} ms + first rewrite "
                f"{c['first_rewrite_s'] * 1e3:.0f} ms)"
            )
    if parts:
        ok = "median_s" in cold.get("kept", {}) and cold["kept"]["median_s"] * 1e3 <= TARGET_COLD_MS
        lines.append(
            "(a'') a fresh process (`gawee-rewrite optimize resnet18`), loading the rules plus its first rewrite, "
            f"capture excluded — {'; '.join(parts)} — target ≤ {TARGET_COLD_MS:.0f} ms {verdict(ok)}."
        )
        md.append(lines[-1])

    header = [
        "nodes (blocks)",
        "gawee, default rules",
        "µs / node",
        "interpreted (GAWEE_ACCEL=0)",
        "after",
        "gawee, fold_conv_bn only",
        "fx replace_pattern (Conv+BN)",
        "fx ÷ gawee (fold only)",
    ]
    rows = []
    for n in sizes:
        g, f, x, i = res["gawee"][n], res["fold"][n], res["fx"][n], res["interpreted"][n]
        per = f"{g['median_s'] / g['nodes_before'] * 1e6:.0f}" if "median_s" in g else "—"
        interp = fmt_s(i) + (
            f", {i['median_s'] / i['nodes_before'] * 1e6:.0f} µs/node ({i['median_s'] / g['median_s']:.2f}×)"
            if "median_s" in i and "median_s" in g
            else ""
        )
        after = f"{g['nodes_after']}" if "nodes_after" in g else "—"
        ratio = (
            f"{x['median_s'] / f['median_s']:.1f}×"
            if "median_s" in x and "median_s" in f
            else (f"> {x['timeout_s'] / f['median_s']:.0f}×" if "timeout_s" in x and "median_s" in f else "—")
        )
        label = f"{g.get('nodes_before', n)} ({g.get('blocks', blocks_for(n))})"
        fx_cell = fmt_s(x) + (f", {x['matches']} matches" if "matches" in x else "")
        rows.append([label, fmt_s(g), per, interp, after, fmt_s(f), fx_cell, ratio])
    table = "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )

    def t(kind, n):
        return res[kind].get(n, {}).get("median_s")

    summary = []
    if 10_000 in sizes and 100_000 in sizes:
        a, b = t("gawee", 10_000), t("gawee", 100_000)
        if a and b:
            summary.append(
                f"t(100k) / t(10k) = {b / a:.1f} (target ≤ {TARGET_RATIO:g}: {verdict(b / a <= TARGET_RATIO)})"
                f"; 100k nodes in {b:.1f} s (target < {TARGET_100K_S:g} s: {verdict(b < TARGET_100K_S)})."
            )
        elif a and "timeout_s" in res["gawee"][100_000]:
            lim = res["gawee"][100_000]["timeout_s"]
            summary.append(
                f"t(100k) / t(10k) > {lim / a:.0f} (target ≤ {TARGET_RATIO:g}: **missed**); 100k nodes "
                f"did not finish in {lim:.0f} s (target < {TARGET_100K_S:g} s: **missed**)."
            )
    if 10_000 in sizes and t("gawee", 10_000):
        per = t("gawee", 10_000) / res["gawee"][10_000]["nodes_before"] * 1e6
        summary.append(
            f"10k nodes: {per:.0f} µs per node (target ≤ {TARGET_US_PER_NODE:g}: {verdict(per <= TARGET_US_PER_NODE)})."
        )
    if 1000 in sizes and 10_000 in sizes and t("gawee", 1000) and t("gawee", 10_000):
        summary.append(f"t(10k) / t(1k) = {t('gawee', 10_000) / t('gawee', 1000):.1f}.")
    for n in sizes:
        if t("fold", n) and t("fx", n):
            summary.append(
                f"{size_label(n)}: fx's replace_pattern takes {t('fx', n) / t('fold', n):.1f}× gawee's time "
                f"for the same Conv+BN folding."
            )
    for kind in ("gawee", "interpreted", "fold", "fx"):
        for n in sizes:
            if "error" in res[kind][n]:
                summary.append(f"{kind} {n}: failed: {res[kind][n]['error']}")
    lines += ["(b, c) synthetic graphs:", table, *summary]

    body = [
        "How fast the rewriter is (issue 3). Only rewriting is timed: not capture, not graph construction, "
        "not loading the rules. `gawee.rewrite(graph, rules)` is timed as a caller sees it (copy of the input "
        "graph included). Each measurement runs in its own process with one torch thread, after a warm-up "
        "rewrite; graphs up to 10k nodes are timed as the median of several runs, 100k once, the previous run's "
        "result released and collected before each. "
        "`--profile N` prints a cProfile of the default rewrite of the N-node graph.",
        f"```sh\n{command}\n```",
        f"Run {datetime.date.today().isoformat()} · {source_version()} · torch {torch.__version__} · {machine()}.",
        f"gawee's figures are of its {engine} (`gawee/accel.py`, built by `make speed`); the column *interpreted* "
        "is the same default rewrite with `GAWEE_ACCEL=0`, every module run by the interpreter, and its ratio the "
        "interpreted time over the compiled one.",
        *md,
        "(b) and (c): synthetic graphs built with `GraphBuilder` — blocks of conv2d → batch_norm → relu on "
        "1×4×8×8 activations with 4×4×3×3 weights, every 4th block ResNet-style conv2d → batch_norm → "
        "add(skip) → relu. The default rules fold every batch norm and fuse every relu and residual add into "
        "its conv. (c) does only the Conv+BN fold: gawee with the one rule `fold_conv_bn` (new weights computed "
        "at rewrite time) against `torch.fx.subgraph_rewriter.replace_pattern` on an fx graph of the same blocks "
        "(its replacement keeps the fold as ops on the weights; fx also has one `get_attr` node per constant, "
        "6 per block, which gawee's constants are not). A measurement is stopped after "
        f"{limits[0]:.0f} s (gawee) or {limits[1]:.0f} s (fx) and shown as > that.",
        table,
        "\n".join(f"* {s}" for s in summary),
    ]
    return "\n\n".join(body), lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts (default 1000,10000,100000)")
    ap.add_argument("--repeat", type=int, default=15, help="warm runs of ResNet-18 (default 15, at least 10)")
    ap.add_argument("--small-repeat", type=int, default=5, help="runs of synthetic graphs of <= 10k nodes")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per gawee measurement (default 1500)")
    ap.add_argument("--fx-timeout", type=float, default=1500.0, help="seconds per fx measurement (default 1500)")
    ap.add_argument("--profile", type=int, metavar="N", help="only profile the default rewrite of the N-node graph")
    ap.add_argument("--no-readme", action="store_true", help="do not write benchmarks/README.md")
    ap.add_argument("--readme", type=Path, default=HERE / "README.md", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="also write the raw figures to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.profile:
        return profile(args.profile)

    from rich.console import Console

    console = Console()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    res: dict = {"resnet18": {}, "gawee": {}, "interpreted": {}, "fold": {}, "fx": {}}
    t_all = time.perf_counter()
    with console.status("ResNet-18 ...") as status:
        res["resnet18"] = measure("resnet18", 0, max(10, args.repeat), args.timeout)
        console.print(f"ResNet-18: {fmt_s(res['resnet18'])}", highlight=False)
        status.update("ResNet-18: onnxscript's rewriter ...")
        res["onnxscript"] = measure("onnxscript", 0, max(10, args.repeat), args.timeout)
        console.print(f"ResNet-18, onnxscript: {fmt_s(res['onnxscript'])}", highlight=False)
        status.update("cold processes ...")
        res["cold"] = measure_cold_twice(args.timeout)
        console.print(f"cold: {res['cold']}", highlight=False)
        for n in sizes:
            blocks = blocks_for(n)
            repeat = args.small_repeat if n <= 10_000 else 1
            kinds = (("gawee", args.timeout), ("interpreted", args.timeout), ("fold", args.timeout))
            for kind, limit in (*kinds, ("fx", args.fx_timeout)):
                status.update(f"{n} nodes: {kind} ...")
                row = measure(kind, blocks, repeat, limit)
                res[kind][n] = row
                console.print(f"{n:>7} nodes  {kind:<5} {fmt_s(row)}", highlight=False)
    body, lines = report(
        res,
        sizes,
        ("python benchmarks/engine_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip(),
        (args.timeout, args.fx_timeout),
    )
    console.print()
    for line in lines:
        console.print(line, highlight=False)
    console.print(f"total {time.perf_counter() - t_all:.0f} s", highlight=False)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    if not args.no_readme:
        from readme import replace_section

        replace_section(SECTION, body, args.readme)
        console.print(f"wrote the {SECTION!r} section of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
