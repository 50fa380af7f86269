"""gawee-rewrite: the command line. Exit codes: 0 ok, 1 a finding, 2 usage or input error."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from rich.console import Console

from gawee.errors import GaweeError

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2

EPILOG = """\
examples:
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
    p.add_argument("model", metavar="MODEL",
                   help="a torchvision model name (random weights), path/to/file.py:factory, or a saved .json")
    p.add_argument("--batch", type=int, default=1, help="batch size of the default input (default 1)")
    p.add_argument("--input-shape", type=_shape, action="append", metavar="N,C,H,W",
                   help="example input shape (repeat for several inputs)")
    p.add_argument("--meta", action="store_true", help="capture on the meta device: no weights, structure only")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gawee-rewrite", description="Capture, analyse and rewrite PyTorch models with text rules.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show = sub.add_parser("show", help="print the analysis report of a model",
                          description="Print node counts by op, FLOPs, bytes read/written, peak memory and "
                                      "opaque ops of MODEL.", epilog=EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_args(show)
    show.add_argument("--graph", action="store_true", help="also print the graph, one node per line")
    show.set_defaults(func=cmd_show)
    return parser


def cmd_show(args, console: Console) -> int:
    from gawee.analysis import cost
    from gawee.frontend.capture import CaptureStats
    from gawee.frontend.models import load_graph
    from gawee.report import Column, rich_report

    stats = CaptureStats()
    with console.status(f"capturing {args.model} ...", spinner="dots") if not args.json else _null():
        graph, _src = load_graph(args.model, batch=args.batch, meta=args.meta, stats=stats,
                                 input_shapes=args.input_shape)
    report = cost(graph)
    if args.json:
        out = {"model": args.model, "graph": graph.name, **report.as_dict(),
               "opaque_ops": stats.opaque_ops, "capture_s": graph.meta.get("capture", {}),
               "warnings": stats.warnings}
        print(json.dumps(out, indent=1))
        return EXIT_OK
    if args.graph:
        console.print(str(graph), markup=False, highlight=False)
    extra = {}
    if stats.total_s:
        extra["capture"] = (f"export {stats.export_s:.2f}s + functionalize {stats.decompose_s:.2f}s "
                            f"+ gawee {stats.convert_s:.3f}s")
    extra["peak at"] = report.peak_at
    console.print(rich_report(f"{graph.name}: {len(graph)} nodes", [Column("value", report, extra)]))
    if stats.opaque_ops:
        console.print("[yellow]opaque ops (no OpDef, executed through torch): "
                      + ", ".join(f"{k} x{v}" for k, v in stats.opaque_ops.items()))
    else:
        console.print("opaque ops: none")
    for w in stats.warnings:
        console.print(f"[yellow]warning: {w}", highlight=False)
    return EXIT_OK


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    console = Console(highlight=False, soft_wrap=False)
    err = Console(stderr=True, highlight=False)
    try:
        return args.func(args, console)
    except GaweeError as e:
        err.print(str(e), markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
