"""Reports: the analysis of one graph, or a before/after comparison, as rich tables or Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table

from gawee.analysis.cost import CostReport


def human(n: float, unit: str = "", base: int = 1000) -> str:
    """1234567 → '1.23 M' (base 1000) or bytes with base 1024 → '1.18 MiB'."""
    if n is None:
        return "n/a"
    prefixes = ["", "K", "M", "G", "T", "P"]
    i = 0
    x = float(n)
    while abs(x) >= base and i < len(prefixes) - 1:
        x /= base
        i += 1
    suffix = prefixes[i] + ("i" if base == 1024 and i else "") + unit
    if i == 0:
        return f"{int(x)} {unit}".strip()
    return f"{x:.2f} {suffix}"


def hbytes(n: int) -> str:
    return human(n, "B", 1024)


@dataclass
class Column:
    """One graph's figures in a report (e.g. 'before' or 'after')."""

    title: str
    cost: CostReport
    extra: dict[str, str] = field(default_factory=dict)


METRICS = [
    ("nodes", lambda c: len(c.nodes), lambda n: str(n)),
    ("FLOPs", lambda c: c.flops, lambda n: human(n)),
    ("bytes read", lambda c: c.bytes_read, hbytes),
    ("bytes written", lambda c: c.bytes_written, hbytes),
    ("peak memory", lambda c: c.peak_memory, hbytes),
    ("parameters", lambda c: c.params, lambda n: human(n)),
    ("parameter bytes", lambda c: c.param_bytes, hbytes),
]


FORMULAS = [
    ("FLOPs", "flops"),
    ("bytes read", "bytes_read"),
    ("bytes written", "bytes_written"),
    ("peak memory", "peak_memory"),
]
"""Figures also shown as formulas in the size symbols for a dynamic graph."""


def _ratio(before: float, after: float) -> str:
    if not before:
        return ""
    return f"{(after - before) / before * 100:+.1f}%"


def summary_rows(columns: list[Column]) -> list[list[str]]:
    rows = []
    for label, get, fmt in METRICS:
        vals = [get(c.cost.at()) for c in columns]  # symbolic sizes: at the example sizes
        row = [label, *[fmt(v) for v in vals]]
        if len(columns) == 2:
            row.append(_ratio(vals[0], vals[1]))
        rows.append(row)
    if any(c.cost.symbols for c in columns):  # a dynamic graph: the figures above are at the example sizes
        for label, key in FORMULAS:
            row = [f"{label} formula", *[c.cost.formulas()[key] for c in columns]]
            rows.append([*row, ""] if len(columns) == 2 else row)
    keys = [k for c in columns for k in c.extra]
    for k in dict.fromkeys(keys):
        row = [k, *[c.extra.get(k, "") for c in columns]]
        if len(columns) == 2:
            row.append("")
        rows.append(row)
    return rows


def op_rows(columns: list[Column]) -> list[list[str]]:
    ops = dict.fromkeys(op for c in columns for op in c.cost.op_counts)
    rows = []
    for op in ops:
        counts = [c.cost.op_counts.get(op, 0) for c in columns]
        row = [op, *[str(n) for n in counts]]
        if len(columns) == 2:
            row.append(f"{counts[1] - counts[0]:+d}" if counts[1] != counts[0] else "")
        rows.append(row)
    return rows


def _header(columns: list[Column]) -> list[str]:
    return [c.title for c in columns] + (["change"] if len(columns) == 2 else [])


def rich_report(title: str, columns: list[Column]) -> Group:
    """The summary table and the node-count-by-op table, for the terminal."""
    summary = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    summary.add_column("metric")
    for h in _header(columns):
        summary.add_column(h, justify="right")
    for row in summary_rows(columns):
        summary.add_row(*row)
    ops = Table(title="nodes by op", title_justify="left", show_edge=False, header_style="bold")
    ops.add_column("op")
    for h in _header(columns):
        ops.add_column(h, justify="right")
    for row in op_rows(columns):
        ops.add_row(*row)
    parts = [summary, ops]
    unc = {k: v for c in columns for k, v in c.cost.uncounted.items()}
    if unc:
        parts.append(f"[yellow]no FLOPs formula (not counted): {', '.join(f'{k} x{v}' for k, v in unc.items())}")
    return Group(*parts)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown_report(title: str, columns: list[Column]) -> str:
    head = ["metric", *_header(columns)]
    parts = [
        f"### {title}",
        "",
        markdown_table(head, summary_rows(columns)),
        "",
        markdown_table(["op", *_header(columns)], op_rows(columns)),
    ]
    unc = {k: v for c in columns for k, v in c.cost.uncounted.items()}
    if unc:
        parts += ["", "No FLOPs formula (not counted): " + ", ".join(f"`{k}` x{v}" for k, v in unc.items())]
    return "\n".join(parts) + "\n"
