"""gawee-rewrite: the command line. Exit codes: 0 ok, 1 a finding (an unsound rule, a failed verification, a rule
that misbehaves while rewriting: ``GaweeError.finding``), 2 usage or input error."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from rich.console import Console

from gawee.errors import GaweeError

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2

EPILOG = """\
examples:
  gawee-rewrite optimize resnet18
  gawee-rewrite optimize resnet18 --rules my.rules --trace -o resnet18-opt.json
  gawee-rewrite optimize resnet18 --html resnet18.html --mermaid resnet18.mmd --dot resnet18.dot
  gawee-rewrite optimize mobilenet_v3_small --explain conv2d_3
  gawee-rewrite explain resnet18 conv2d
  gawee-rewrite check rules/ my.rules --examples 500 --seed 1
  gawee-rewrite show resnet18
  gawee-rewrite show path/to/model.py:make_model --input-shape 1,3,64,64
  gawee-rewrite show saved.json --json
"""


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 1,3,224,224") from None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a torchvision model name, hf:FAMILY (bert, gpt2, t5-encoder, llama, vit, whisper-encoder, or any "
        "transformers model type: mistral, bart...), "
        "timm:NAME (all with random weights), path/to/file.py:factory, or a saved .json",
    )
    p.add_argument("--batch", type=int, default=1, help="batch size of the default input (default 1)")
    p.add_argument(
        "--input-shape",
        type=_shape,
        action="append",
        metavar="N,C,H,W",
        help="example input shape (repeat for several inputs)",
    )
    p.add_argument(
        "--dynamic",
        metavar="SPEC",
        help="dynamic dimensions: batch (dim 0 of every input), seq (dim 1), or INPUT:DIM[=NAME],... "
        "(e.g. x:0 or input_ids:1,attention_mask:1); one capture then serves every size in range",
    )
    p.add_argument("--meta", action="store_true", help="capture on the meta device: no weights, structure only")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gawee-rewrite",
        description="Capture, analyse and rewrite PyTorch models with text rules.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show = sub.add_parser(
        "show",
        help="print the analysis report of a model",
        description="Print node counts by op, FLOPs, bytes read/written, peak memory and opaque ops of MODEL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(show)
    show.add_argument("--graph", action="store_true", help="also print the graph, one node per line")
    show.set_defaults(func=cmd_show)

    opt = sub.add_parser(
        "optimize",
        help="rewrite a model with rules and report before/after",
        description="Capture MODEL, apply the rules (default: the bundled pipeline), check the "
        "result is equivalent, and print a before/after report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(opt)
    opt.add_argument(
        "--rules",
        action="append",
        metavar="FILE_OR_DIR",
        help="rule files or directories, one phase per file (repeat; default: the bundled rules)",
    )
    opt.add_argument(
        "--precision",
        metavar="NAME",
        help="also run the bundled precision phase NAME last (rules/precision/NAME.rules; bf16, int8): approximate "
        "rules, each with its declared error bound, that compute in that precision",
    )
    opt.add_argument(
        "--target",
        metavar="RUNTIME[:VARIANT]",
        help="also run that runtime's bundled target phase last (rules/targets/RUNTIME/; onednn), then VARIANT's "
        "phase (rules/targets/RUNTIME/variants/VARIANT.rules: onednn:blocked, onednn:channels_last, "
        "onednn:per_conv, the activation layouts): the fusions and decisions of the module gawee.compile builds",
    )
    opt.add_argument("-o", "--output", metavar="OUT.json", help="write the optimized graph (+ .npz) atomically")
    opt.add_argument(
        "--mlir", metavar="OUT.mlir", help="write the optimized graph as StableHLO (MLIR text, weights as resources)"
    )
    opt.add_argument(
        "--vmfb",
        metavar="OUT.vmfb",
        help="compile the optimized graph with IREE for this CPU (llvm-cpu) and write the module (needs gawee[iree])",
    )
    opt.add_argument("--trace", action="store_true", help="print every rule firing")
    opt.add_argument(
        "--explain",
        action="append",
        metavar="NODE",
        help="say why each candidate rule did or did not rewrite NODE (repeatable)",
    )
    opt.add_argument("--no-verify", action="store_true", help="skip the numerical equivalence check")
    opt.add_argument(
        "--bench",
        action="store_true",
        help="also time the model (eager) and the compiled result on this machine, and profile the latter",
    )
    opt.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    opt.add_argument(
        "--html",
        metavar="OUT.html",
        help="write a self-contained HTML report: both graphs side by side, the tables, the trace",
    )
    opt.add_argument(
        "--mermaid",
        metavar="OUT.mmd",
        help="write both graphs (before, after) as a Mermaid flowchart (.mmd; .md: a ```mermaid block)",
    )
    opt.add_argument(
        "--dot",
        metavar="OUT.dot",
        help="write both graphs (before, after) as Graphviz DOT (.dot, .gv), or as .svg through `dot`",
    )
    opt.set_defaults(func=cmd_optimize)

    exp = sub.add_parser(
        "explain",
        help="say why each rule did or did not rewrite a node",
        description="Capture MODEL and, for NODE (a node or value name as `show --graph` prints "
        "it), show for every candidate rule how far its pattern got and which "
        "sub-pattern or guard conjunct failed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(exp)
    exp.add_argument("node", metavar="NODE", help="the node to explain (e.g. conv2d_3)")
    exp.add_argument(
        "--rules", action="append", metavar="FILE_OR_DIR", help="rule files or directories (default: the bundled rules)"
    )
    exp.add_argument("--after", action="store_true", help="explain NODE in the optimized graph instead")
    exp.set_defaults(func=cmd_explain)

    rule = sub.add_parser(
        "show-rule",
        help="print a rule as written and, with --code, the matcher generated for it",
        description="Print rule NAME (every spelling its alternatives make) from the rules given, "
        "and with --code the Python each pattern was compiled to (gawee.dsl.codegen).",
    )
    rule.add_argument("name", metavar="NAME", help="the rule's name (e.g. fuse_conv_relu)")
    rule.add_argument(
        "--rules", action="append", metavar="FILE_OR_DIR", help="rule files or directories (default: the bundled rules)"
    )
    rule.add_argument("--code", action="store_true", help="also print the generated matcher")
    rule.set_defaults(func=cmd_show_rule)

    chk = sub.add_parser(
        "check",
        help="prove rules sound on random instances (the soundness harness)",
        description="For every rule in FILE_OR_DIR: draw graphs matching its pattern, apply it, "
        "and compare shapes, dtypes and numbers. Exit 1 if a rule is unsound or "
        "never fired.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chk.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="rule files or directories")
    chk.add_argument("--examples", type=int, default=200, metavar="N", help="valid draws per rule (default 200)")
    chk.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: fixed per rule)")
    chk.add_argument("--rule", action="append", metavar="NAME", help="check only these rules (repeatable)")
    chk.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="rules checked at once, each in its own worker process (default: the number of CPUs)",
    )
    chk.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a rule still running after this long gets the `crashed` verdict (default: no limit)",
    )
    chk.add_argument("--json", action="store_true", help="print machine-readable JSON")
    chk.set_defaults(func=cmd_check)

    acc = sub.add_parser(
        "accel",
        help="compile the rewrite engine with Cython, or say whether it is (gawee.accel)",
        description="build: compile the rewrite engine's hot modules with Cython and the C compiler into gawee's "
        "cache (only those whose source changed since their build); status: which modules run compiled. A module "
        "not compiled runs interpreted, with the same results.",
    )
    acc.add_argument("action", choices=["build", "status"])
    acc.add_argument("--jobs", type=int, default=None, metavar="N", help="modules compiled at once (default: the CPUs)")
    acc.add_argument("--strict", action="store_true", help="exit 1 when a module cannot be compiled")
    acc.set_defaults(func=cmd_accel)
    return parser


def _load(args, console: Console, stats=None):
    """(graph, source) of MODEL: captured with a spinner unless --json, or loaded from .json."""
    from gawee.frontend.models import load_graph

    with console.status(f"capturing {args.model} ...", spinner="dots") if not args.json else _null():
        graph, _src = load_graph(
            args.model,
            batch=args.batch,
            meta=args.meta,
            stats=stats,
            input_shapes=args.input_shape,
            dynamic=args.dynamic,
        )
    return graph, _src


def cmd_show(args, console: Console) -> int:
    from gawee.analysis import cost
    from gawee.frontend.capture import CaptureStats
    from gawee.report import Column, rich_report

    stats = CaptureStats()
    graph, _src = _load(args, console, stats)
    report = cost(graph)
    if args.json:
        out = {
            "model": args.model,
            "graph": graph.name,
            **report.as_dict(),
            "opaque_ops": stats.opaque_ops,
            "capture_s": stats.seconds(),
            "warnings": stats.warnings,
        }
        print(json.dumps(out, indent=1))
        return EXIT_OK
    if args.graph:
        console.print(str(graph), markup=False, highlight=False)
    extra = {}
    if stats.total_s:
        functionalize = f"functionalize {stats.decompose_s:.2f}s" if stats.decompose_s else "no functionalization"
        extra["capture"] = f"export {stats.export_s:.2f}s + {functionalize} + gawee {stats.convert_s:.3f}s"
    extra["peak at"] = report.peak_at
    console.print(rich_report(f"{graph.name}: {len(graph)} nodes", [Column("value", report, extra)]))
    if stats.opaque_ops:
        console.print(
            "[yellow]opaque ops (no OpDef, executed through torch): "
            + ", ".join(f"{k} x{v}" for k, v in stats.opaque_ops.items())
        )
    else:
        console.print("opaque ops: none")
    for w in stats.warnings:
        console.print(f"[yellow]warning: {w}", highlight=False)
    return EXIT_OK


def _write_mlir(graph, mlir_path: str | None, vmfb_path: str | None) -> list[str]:
    """``optimize --mlir/--vmfb``: the StableHLO text and/or its IREE module, each written atomically (a large
    model's weights as an ``.irpa`` parameter archive beside them, when IREE is installed to write it)."""
    if not mlir_path and not vmfb_path:
        return []
    from gawee.backend.iree import IREE_HINT, compile_iree, iree_unavailable, write_artifacts
    from gawee.backend.stablehlo import lower_mlir

    missing = iree_unavailable()
    if vmfb_path and missing is not None:
        raise GaweeError(f"--vmfb {vmfb_path}: the IREE compiler is not installed", hint=IREE_HINT)
    lowered = lower_mlir(graph, external_weights=None if missing is None else False)
    written = write_artifacts(lowered, None, mlir_path, None, parameters=not vmfb_path)  # even if IREE rejects it
    if vmfb_path:
        written += write_artifacts(lowered, compile_iree(lowered.text), None, vmfb_path)
    return [str(p) for p in written]


def _target_phases(target: str) -> list:
    """``--target RUNTIME[:VARIANT]``: the runtime's bundled target phase, then its variant's phase (a file)."""
    from gawee.rewrite.ruleset import target_dir, variant_dir

    name, _, variant = target.partition(":")
    phases = [target_dir(name)]
    return [*phases, variant_dir(name, variant)] if variant else phases


def cmd_optimize(args, console: Console) -> int:
    from pathlib import Path

    from gawee.analysis import cost
    from gawee.equivalence import verify_rewrite
    from gawee.errors import GaweeError as _Err
    from gawee.frontend.capture import CaptureStats
    from gawee.ir.serialize import check_writable
    from gawee.report import Column, markdown_report, rich_report
    from gawee.rewrite.driver import rewrite
    from gawee.rewrite.explain import explain, find_node
    from gawee.rewrite.ruleset import RULES_DIR, default_rules, load_rules, precision_rules
    from gawee.viz.files import plan_pictures

    if args.output and args.model.endswith(".json") and Path(args.output).resolve() == Path(args.model).resolve():
        raise _Err(f"-o {args.output} would overwrite the input", hint="write the result to another file")
    if args.output and not args.output.endswith(".json"):
        raise _Err(f"-o {args.output}: the output is a .json file (its tensors go to a .npz beside it)")
    pictures = plan_pictures(html=args.html, mermaid=args.mermaid, dot=args.dot)
    for flag, path in (("-o", args.output), ("--mlir", args.mlir), ("--vmfb", args.vmfb)):
        if path:
            check_writable(path, flag)
    for flag, path in (("--html", pictures.html), ("--mermaid", pictures.mermaid), ("--dot", pictures.dot)):
        if path is not None:
            check_writable(path, flag)
    # the precision phase, then the target phase, run last, after the given (or the bundled) phases
    extra = [precision_rules(args.precision)] if args.precision else []
    extra += _target_phases(args.target) if args.target else []
    if extra:
        rules = load_rules(*(args.rules or [RULES_DIR]), *extra)
    else:
        rules = load_rules(*args.rules) if args.rules else default_rules()
    stats = CaptureStats()
    graph, _src = _load(args, console, stats)
    calibration = _calibration(graph, _src)  # measured only where a phase reads calibrated ranges (int8)
    optimized, report = rewrite(
        graph, rules, trace=args.trace or bool(pictures) or not args.no_verify, calibration=calibration
    )
    before, after = cost(graph), cost(optimized)
    verification = None
    if not args.no_verify:
        with console.status("verifying equivalence ...", spinner="dots") if not args.json else _null():
            verification = verify_rewrite(graph, optimized, report.trace, rules=rules)
    explanations = []
    for name in args.explain or ():
        target = optimized if any(n.name == name for n in optimized) else graph
        node = find_node(target, name)
        explanations.append((name, target is optimized, explain(target, node, rules)))
    extra = {
        "rewrite time": f"{report.seconds * 1000:.1f} ms",
        "verification": "skipped" if verification is None else verification.short(),
    }
    accuracy, errors = None, []
    if any(rules.rule(name).approximate for name in report.firings):
        accuracy, errors = _accuracy(graph, optimized, report.trace, _src)
        extra["accuracy"] = "needs real weights (drop --meta)" if accuracy is None else str(accuracy)
        if errors:
            extra["largest error"] = f"{errors[0]} (worst of {len(errors)} values approximate rewrites made)"
    runtime = None
    if args.bench:
        with console.status("measuring runtime ...", spinner="dots") if not args.json else _null():
            runtime = _bench(graph, optimized, _src)
        extra["runtime"] = runtime.summary()
    cols = [
        Column("before", before, {"runtime": _ms(runtime.before)} if runtime else {}),
        Column("after", after, extra),
    ]
    title = f"{graph.name}: {len(graph)} -> {len(optimized)} nodes"
    if args.output:
        optimized.save(args.output)
    mlir_written = _write_mlir(optimized, args.mlir, args.vmfb)
    written = pictures.write(graph, optimized, cols, trace=report.trace, firings=report.firings, title=title)

    if args.json:
        out = {
            "model": args.model,
            "before": before.as_dict(),
            "after": after.as_dict(),
            "rewrite_s": report.seconds,
            "firings": dict(report.firings),
            "verification": None if verification is None else verification.as_dict(),
            "trace": [f.as_dict() for f in report.trace] if args.trace else None,
            "explain": {n: [e.__dict__ for e in es] for n, _, es in explanations} or None,
            "output": args.output,
            "pictures": [str(p) for p in written],
            "runtime": None if runtime is None else runtime.as_dict(),
            "accuracy": None if accuracy is None else accuracy.as_dict(),
            "firing_errors": [e.__dict__ for e in errors] or None,
        }
        print(json.dumps(out, indent=1, default=str))
    else:
        if args.trace:
            console.print(f"[bold]trace[/] ({report.total} firings)")
            for f in report.trace:
                console.print(f"  {f}", markup=False, highlight=False)
        if args.markdown:
            print(markdown_report(title, cols))
            if runtime is not None:
                print("\n```\n" + "\n".join(runtime.lines()) + "\n```")
        else:
            console.print(rich_report(title, cols))
            if report.firings:
                console.print(
                    "rules fired: " + ", ".join(f"{k} x{v}" for k, v in report.firings.most_common()), highlight=False
                )
            for line in runtime.lines() if runtime is not None else ():
                console.print(line, markup=False, highlight=False)
        for name, in_optimized, es in explanations:
            where = "optimized graph" if in_optimized else "captured graph"
            console.print(f"[bold]explain {name}[/] (in the {where})")
            for e in es:
                console.print(f"  {e}", markup=False, highlight=False)
            if not es:
                console.print("  no rule is rooted at this op", highlight=False)
        if args.output:
            console.print(f"wrote {args.output} (+ {Path(args.output).with_suffix('.npz').name})", highlight=False)
        for path in mlir_written:
            console.print(f"wrote {path}", highlight=False)
        for path in written:
            console.print(f"wrote {path}", highlight=False)
        if verification is not None and not verification.ok:
            from rich.markup import escape

            console.print(f"[bold red]verification failed[/]: {escape(str(verification))}", highlight=False)
    if verification is not None and not verification.ok:
        return EXIT_FINDING
    return EXIT_OK


def _ms(t) -> str:
    return f"{t.median * 1e3:.2f} ms"


def _calibration(graph, src):
    """The batches calibration measures ranges on: the model's example inputs (random ones for a saved graph),
    one batch; None without real weights."""
    from gawee.equivalence import random_inputs
    from gawee.rewrite.calibration import Calibration

    if any(not v.has_known_data for v in graph.constants()):
        return None
    if src.module is not None:
        return Calibration.of([tuple(src.example_inputs)], "the example inputs")
    return Calibration.of([tuple(random_inputs([v.type for v in graph.inputs]))], "random inputs")


def _accuracy(graph, optimized, trace, src):
    """The optimized graph's outputs against the captured graph's (the float model), both interpreted on the
    model's example inputs (random ones for a saved graph), and the values approximate rewrites made against
    the values they stand for (``gawee.equivalence.firing_errors``, from the trace); (None, []) without real
    weights."""
    from gawee.accuracy import compare_outputs
    from gawee.equivalence import firing_errors, random_inputs
    from gawee.interp import run

    if any(not v.has_known_data for v in graph.constants()):
        return None, []
    if src.module is not None:
        inputs = list(src.example_inputs)
    else:
        inputs = random_inputs([v.type for v in graph.inputs])
    accuracy = compare_outputs(run(graph, *inputs), run(optimized, *inputs))
    return accuracy, firing_errors(graph, optimized, trace, inputs)


def _bench(graph, optimized, src):
    """Runtime report: the model in eager PyTorch (or, for a saved graph, the captured graph compiled
    without rewriting) against the optimized graph compiled."""
    from gawee.backend.torch_backend import to_torch
    from gawee.equivalence import random_inputs
    from gawee.profile import measure

    if graph.constants() and any(not v.has_known_data for v in graph.constants()):
        raise GaweeError("--bench needs real weights", hint="drop --meta")
    if src.module is not None:
        inputs = list(src.example_inputs)
        return measure(optimized, inputs, lambda: src.module(*inputs), "eager")
    inputs = random_inputs([v.type for v in graph.inputs])
    unoptimized = to_torch(graph)
    return measure(optimized, inputs, lambda: unoptimized(*inputs), "captured graph")


def cmd_explain(args, console: Console) -> int:
    from gawee.rewrite.driver import rewrite
    from gawee.rewrite.explain import explain, find_node
    from gawee.rewrite.ruleset import default_rules, load_rules

    rules = load_rules(*args.rules) if args.rules else default_rules()
    graph, _src = _load(args, console)
    if args.after:
        graph, _ = rewrite(graph, rules)
    node = find_node(graph, args.node)
    found = explain(graph, node, rules)
    if args.json:
        print(json.dumps({"node": node.name, "op": node.op, "explanations": [e.__dict__ for e in found]}, indent=1))
        return EXIT_OK
    from gawee.ir.printer import format_node

    console.print(f"[bold]{node.name}[/]: {format_node(node)}", highlight=False)
    if not found:
        console.print("no rule is rooted at this op or at its users", highlight=False)
    for e in found:
        colour = {"matches": "green", "guard": "yellow"}.get(e.outcome, "red")
        console.print(f"  [{colour}]{e.outcome:8}[/] {e.rule} ({e.location}): {e.reason}", highlight=False)
    return EXIT_OK


def _solver_cell(r) -> str:
    """The solver's column of `check`: the proof's bound, or in short what kept the rule from proven."""
    if r.rule.approximate:
        return "approximate: not run"
    if r.proof is None:
        return "-"
    if r.proof.complete and r.proof.definition:
        return "proven for every shape (by definition)"
    if r.proof.complete:
        return f"proven within {r.proof.bound} ({r.proof.instances})"
    if r.proof.counterexample is not None:
        return "refuted"
    return f"{r.proof.proven}/{r.proof.instances} instances"


def cmd_show_rule(args, console: Console) -> int:
    from gawee.dsl.codegen import match_functions
    from gawee.rewrite.ruleset import default_rules, load_rules

    rules = load_rules(*args.rules) if args.rules else default_rules()
    found = [r for r in rules.rules if r.name == args.name]
    if not found:
        raise GaweeError(f"no rule named {args.name!r}", hint="`gawee-rewrite show-rule NAME` takes a rule's name")
    first = found[0]
    console.print(f"# {first.location}" + (f"  {first.comment}" if first.comment else ""), markup=False)
    span = first.span
    if span.text is not None and span.end_line is not None:
        console.print("\n".join(span.text.splitlines()[span.line - 1 : span.end_line]), markup=False)
    if args.code:
        for r in found:
            match_functions(r)
            console.print(f"\n# {r.label}: generated matcher", markup=False)
            console.print(r.code or "# no generated code: the pattern is interpreted", markup=False)
    return EXIT_OK


def cmd_check(args, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from gawee.rewrite.ruleset import load_rules
    from gawee.testing import check_rules

    if args.examples < 1:
        raise GaweeError("--examples must be at least 1")
    if args.jobs < 1:
        raise GaweeError("--jobs must be at least 1")
    rules = load_rules(*args.paths).rules
    if args.rule:
        unknown = sorted(set(args.rule) - {r.name for r in rules})
        if unknown:
            raise GaweeError(f"no rule named {', '.join(unknown)} in {' '.join(args.paths)}")
        rules = [r for r in rules if r.name in args.rule]
    with Progress(
        TextColumn("checking {task.fields[rule]:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=args.json,
        transient=True,
    ) as bar:
        task = bar.add_task("check", total=len(rules), rule=rules[0].name if rules else "")
        results = check_rules(
            rules,
            args.examples,
            args.seed,
            progress=lambda rule, _: bar.update(task, advance=1, rule=rule.name),
            jobs=args.jobs,
            timeout=args.timeout,
        )
    bad = [r for r in results if not r.ok]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "rule": r.rule.name,
                        "alternative": list(r.rule.variant),
                        "location": r.rule.location,
                        "verdict": r.verdict,
                        "tier": r.tier,
                        "proof": r.proof_note,
                        "solver_instances": r.proof.instances if r.proof else 0,
                        "solver_proven": r.proof.proven if r.proof else 0,
                        "solver_seconds": round(r.proof.seconds, 2) if r.proof else 0.0,
                        "examples": r.examples,
                        "guard_hit_rate": round(r.hit_rate, 3),
                        "fired": r.fired,
                        "guard": r.guard_verdict,
                        "seconds": round(r.seconds, 2),
                        "counterexample": None if r.counterexample is None else str(r.counterexample),
                        "assumes": [a.text for a in r.rule.assumptions],
                        "assumption_false": r.assumption_false,
                        "error": r.error or None,
                        "crash": r.crash or None,
                        "scope_instances": r.scope_instances,
                        "scope_bound": r.scope_bound or None,
                        "scope_truncated": r.scope_truncated,
                        "scope_partial": r.scope_partial or None,
                        "value_classes": sorted(r.value_classes),
                        "largest_shape": list(r.extent.shape),
                        "largest_rank": r.extent.rank,
                        "largest_kernel": r.extent.kernel,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
        return EXIT_FINDING if bad else EXIT_OK
    table = Table(show_edge=False, header_style="bold")
    cols = ("rule", "location", "examples", "guard hits", "fired", "guard", "scope", "largest", "verdict", "solver")
    for col in cols:
        table.add_column(col, justify="right" if col in ("examples", "guard hits", "fired") else "left")
    for r in results:
        style = {"UNSOUND": "bold red", "crashed": "bold red", "untested": "red", "error": "red", "weak": "yellow"}.get(
            r.verdict, "green"
        )
        table.add_row(
            r.rule.label,
            r.rule.location,
            str(r.examples),
            f"{r.hit_rate:.0%}",
            str(r.fired),
            r.guard_verdict,
            f"{r.scope_instances}: {r.scope}" if r.scope_instances else "-",
            str(r.extent),
            f"[{style}]{r.verdict}[/]",
            _solver_cell(r),
        )
    console.print(table)
    for r in results:
        if r.counterexample is not None:
            console.print(f"\n[bold red]{r.rule.label}[/] ({r.rule.location}) is unsound:")
            console.print(str(r.counterexample), markup=False, highlight=False)
        elif r.crash:
            console.print(f"\n[bold red]{r.rule.label}[/] ({r.rule.location}) crashed the harness:")
            console.print(f"  {r.crash}", markup=False, highlight=False)
        elif r.verdict in ("untested", "weak", "error"):
            why = r.error or (
                f"the guard held in {r.guard_hits} of {r.examples} draws; most often false: "
                f"`{r.guard_failures.most_common(1)[0][0]}`"
                if r.guard_failures
                else f"fired {r.fired} times in {r.examples} draws"
            )
            console.print(f"[yellow]{r.rule.label}[/] ({r.rule.location}) is {r.verdict}: {why}", highlight=False)
    total = sum(r.seconds for r in results)
    console.print(
        f"\n{len(results)} rules, {sum(r.examples for r in results)} examples, "
        f"{sum(r.tier == 'proven' for r in results)} proven, "
        f"{sum(r.tier == 'tested' for r in results)} tested, "
        f"{sum(r.verdict == 'UNSOUND' for r in results)} unsound, "
        f"{sum(r.verdict == 'untested' for r in results)} untested, "
        f"{sum(r.verdict == 'error' for r in results)} harness errors, "
        f"{sum(r.verdict == 'crashed' for r in results)} crashed, {total:.1f} s "
        f"(solver {sum(r.proof.seconds for r in results if r.proof):.1f} s)",
        highlight=False,
    )
    tested = [r for r in results if r.tier == "tested"]
    if tested:
        console.print("\nnot proven:", highlight=False)
        for r in tested:
            console.print(f"  {r.rule.label}: {r.proof_note}", markup=False, highlight=False)
    for r in results:
        if r.rule.assumptions:
            facts = ", ".join(a.text for a in r.rule.assumptions)
            console.print(
                f"{r.rule.name} assumes {facts}: {r.assumption_false} draws broke it and were set aside",
                highlight=False,
            )
    return EXIT_FINDING if any(not r.ok for r in results) else EXIT_OK


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def cmd_accel(args, console: Console) -> int:
    from gawee import accel

    if args.action == "build":
        failed = accel.build(jobs=args.jobs, echo=lambda line: console.print(line, markup=False))
        return 1 if failed and args.strict else 0
    for module, form in accel.status().items():
        console.print(f"{module:32s} {form}", markup=False)
    console.print(accel.summary(), markup=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    wide = None if sys.stdout.isatty() else 200  # pipes and files get whole lines, not 80 columns
    console = Console(highlight=False, soft_wrap=False, width=wide)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
    try:
        return args.func(args, console)
    except GaweeError as e:
        err.print(str(e), markup=False)
        return EXIT_FINDING if e.finding else EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
