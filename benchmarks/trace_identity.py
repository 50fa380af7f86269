"""The bundled rules' traces on the torchvision models, against the digests recorded in traces.json.

    python benchmarks/trace_identity.py                    # compare all 80 models (exit 1 on a difference)
    python benchmarks/trace_identity.py --models resnet18,vit_b_16
    python benchmarks/trace_identity.py --record           # write benchmarks/traces.json from this engine
    python benchmarks/trace_identity.py --graphs /tmp/g    # keep captured graphs there (reused next time)

Every model is captured with seeded random weights (``resolve(name)``, seed 0, batch 1) and rewritten
with the default rules, traced. Three digests per model: ``trace`` (every firing in order: rule,
file:line, phase, root, matched nodes, created nodes, the values replaced and their replacements),
``graph`` (the rewritten graph as gawee saves it, without the constants' bytes: nodes, ops, attributes,
types, names, provenance) and ``data`` (the constants' bytes). The engine is deterministic, so a change
that keeps every firing and every graph keeps all three; a change to the rules or the capture changes
them, and ``--record`` writes the new ones. ``data`` depends on how torch computes the folded weights on
this CPU as well, and is reported apart. Each model runs in its own process (memory, crashes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from worker import run_worker

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "traces.json"


def trace_digest(trace) -> str:
    """sha256 of a rewrite's firings, in order, every field of each."""
    h = hashlib.sha256()
    for f in trace:
        fields = (f.rule, f.location, f.phase, f.root, f.matched, f.created, f.replaced_by, f.replaces, f.results)
        h.update(repr(fields).encode())
        h.update(b"\n")
    return h.hexdigest()


def graph_digests(graph) -> tuple[str, str]:
    """(sha256 of the graph's saved JSON document, sha256 of its constants' bytes by name)."""
    import torch

    from gawee.ir.serialize import to_json_dict

    doc, arrays = to_json_dict(graph)
    structure = hashlib.sha256(json.dumps(doc, sort_keys=True, allow_nan=True).encode()).hexdigest()
    h = hashlib.sha256()
    for name in sorted(arrays):
        t = arrays[name].detach().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update((t.view(torch.uint8) if t.numel() else t).numpy().tobytes())
    return structure, h.hexdigest()


def digests(graph, rules=None) -> dict:
    """The row of one captured graph: its digests after the default rewrite, and what the rewrite did."""
    import gawee

    out, report = gawee.rewrite(graph, rules, trace=True)
    structure, data = graph_digests(out)
    return {
        "trace": trace_digest(report.trace),
        "graph": structure,
        "data": data,
        "firings": report.total,
        "nodes": [report.nodes_before, report.nodes_after],
    }


def captured(name: str, graphs: Path | None):
    """The graph of torchvision model ``name`` (seeded weights), from ``graphs`` when kept there."""
    import gawee
    from gawee.frontend.models import resolve
    from gawee.ir.serialize import load, save

    kept = graphs / f"{name}.json" if graphs else None
    if kept is not None and kept.exists():
        return load(kept)
    src = resolve(name)
    graph = gawee.capture(src.module, src.example_inputs, name=name)
    if kept is not None:
        save(graph, kept)
    return graph


def worker_main(name: str, graphs: str | None, out: str) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    graph = captured(name, Path(graphs) if graphs else None)
    row = digests(graph)
    row["seconds"] = time.perf_counter() - t0
    Path(out).write_text(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated torchvision names (default: all of them)")
    ap.add_argument("--record", action="store_true", help=f"write {DIGESTS.name} instead of comparing with it")
    ap.add_argument("--graphs", type=Path, help="a directory to keep captured graphs in (and reuse)")
    ap.add_argument("--jobs", type=int, default=1, help="models at once (default 1)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model (default 1800)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, str(args.graphs) if args.graphs else None, args.out)

    from gawee.frontend.models import torchvision_names

    names = args.models.split(",") if args.models else torchvision_names()
    recorded = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    extra = ["--graphs", str(args.graphs)] if args.graphs else []

    def job(name: str) -> tuple[str, dict | None, str]:
        row, why, _ = run_worker(Path(__file__).resolve(), ["--worker", name, *extra], timeout=args.timeout)
        return name, row, why

    rows: dict[str, dict] = {}
    bad = 0
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, row, why in pool.map(job, names):
            if row is None:
                print(f"{name:<28} FAILED: {why}", flush=True)
                bad += 1
                continue
            rows[name] = row
            want = recorded.get(name)
            if args.record or want is None:
                status = "recorded" if args.record else "no recorded digest"
            else:
                differ = [k for k in ("trace", "graph", "data") if row[k] != want[k]]
                status = "identical" if not differ else "DIFFERENT: " + ", ".join(differ)
                bad += bool(differ) or 0
            before, after = row["nodes"]
            print(
                f"{name:<28} {before:>5} -> {after:>5} nodes, {row['firings']:>4} firings, "
                f"{row['seconds']:6.1f} s  {status}",
                flush=True,
            )
    if args.record:
        merged = {
            **recorded,
            **{n: {k: r[k] for k in ("trace", "graph", "data", "firings", "nodes")} for n, r in rows.items()},
        }
        DIGESTS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
        print(f"wrote {len(rows)} models' digests to {DIGESTS}")
        return 1 if bad else 0
    print(
        f"{len(names) - bad} of {len(names)} models identical" if not bad else f"{bad} of {len(names)} differ or failed"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
