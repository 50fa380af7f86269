"""The before/after HTML report: both graphs side by side, the tables and the rewrite trace, in one file.

Self-contained and offline: the graphs are inline SVG laid out in Python
(:mod:`gawee.viz.svg`), the styles are inline, and nothing is fetched — no script, no
font, no stylesheet from a network. The tables are gawee.report's rows, so the page
shows exactly what the terminal and the Markdown reports show.
"""

from __future__ import annotations

from html import escape

from gawee.ir.core import Graph
from gawee.report import Column, markdown_report, op_rows, summary_rows
from gawee.viz.svg import view_svg
from gawee.viz.view import CONST_COLOR, STYLES, sections

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 16px 20px;
       color: #212529; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 20px 0 8px; }
p.sub { margin: 0 0 10px; color: #495057; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; font-size: 12px; color: #495057; margin-bottom: 10px; }
.legend span.sw { display: inline-block; width: 14px; height: 10px; vertical-align: -1px; margin-right: 4px;
                  border-radius: 3px; }
.graphs { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.panel { margin: 0; border: 1px solid #dee2e6; border-radius: 8px; min-width: 0; background: #fff; }
.panel figcaption { font-weight: 600; padding: 6px 10px; border-bottom: 1px solid #dee2e6; background: #f8f9fa;
                    border-radius: 8px 8px 0 0; }
.panel .scroll { overflow: auto; max-height: calc(100vh - 150px); min-height: 200px; }
.panel svg { display: block; margin: 0 auto; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e9ecef; text-align: right; white-space: nowrap; }
th { border-bottom: 2px solid #adb5bd; }
th:first-child, td:first-child { text-align: left; }
table.trace th, table.trace td { text-align: left; }
table.trace td { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
table.trace td.n { text-align: right; color: #868e96; }
td.rule { color: #d9480f; font-weight: 600; }
pre { background: #f8f9fa; padding: 10px; border-radius: 6px; overflow: auto; font-size: 12px; }
footer { margin-top: 24px; font-size: 12px; color: #868e96; }
"""


def html_report(
    before: Graph, after: Graph, columns: list[Column], *, trace=(), firings=None, title: str | None = None
) -> str:
    """The report page as one HTML string.

    ``columns`` are the report's figures (gawee.report Columns, "before" and "after");
    ``trace`` is ``RewriteReport.trace`` (every firing: the trace table, and the rule
    chains drawn on the nodes); ``firings`` is ``RewriteReport.firings`` (rule → count).
    Deterministic: the same inputs give the same bytes.
    """
    trace = list(trace)
    title = title or f"{before.name}: {len(before)} -> {len(after)} nodes"
    panels = [
        f'<figure class="panel" id="panel-{s.prefix}"><figcaption>{escape(s.caption)}</figcaption>'
        f'<div class="scroll">\n{view_svg(s.view, prefix=s.prefix)}\n</div></figure>'
        for s in sections(after, trace, before)
    ]
    fired = ", ".join(f"{k} x{v}" for k, v in (firings.most_common() if firings else []))
    head = ["metric", *(c.title for c in columns)] + (["change"] if len(columns) == 2 else [])
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{escape("rules fired: " + fired if fired else "no rule fired")}</p>',
        _legend(),
        '<section class="graphs">',
        *panels,
        "</section>",
        "<h2>Before and after</h2>",
        '<section class="tables">',
        _table(head, summary_rows(columns), "summary"),
        _table(["op", *head[1:]], op_rows(columns), "ops"),
        "</section>",
        f"<h2>Rewrite trace ({len(trace)} firings)</h2>",
        _trace_table(trace) if trace else "<p>No firings recorded.</p>",
        "<details><summary>The report as Markdown</summary>",
        f"<pre>{escape(markdown_report(title, columns))}</pre></details>",
        "<footer>made by gawee-rewrite; hover a box for its operands, attributes and provenance</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _legend() -> str:
    items = [
        ("io", "graph input / output"),
        ("op", "captured op"),
        ("rule", "made by a rule (its rules below)"),
        ("replaced", "replaced by a rule"),
        ("opaque", "opaque ATen op"),
    ]
    spans = []
    for key, text in items:
        st = STYLES[key]
        border = "dashed" if st.dashed else "solid"
        spans.append(
            f'<span><span class="sw" style="background:{st.fill};border:{2 if st.thick else 1}px {border} '
            f'{st.stroke}"></span>{escape(text)}</span>'
        )
    spans.append(f'<span><i style="color:{CONST_COLOR}">italic</i>: constant operands (weights)</span>')
    return '<div class="legend">' + "".join(spans) + "</div>"


def _table(head: list[str], rows: list[list[str]], cls: str) -> str:
    out = [
        f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead>",
        "<tbody>",
    ]
    out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "\n".join(out)


def _trace_table(trace) -> str:
    out = [
        '<table class="trace"><thead><tr><th>#</th><th>rule</th><th>location</th><th>phase</th>'
        "<th>matched</th><th>replaced by</th><th>new nodes</th></tr></thead><tbody>"
    ]
    for i, f in enumerate(trace, 1):
        cells = [
            f'<td class="n">{i}</td>',
            f'<td class="rule">{escape(f.rule)}</td>',
            f"<td>{escape(f.location)}</td>",
            f"<td>{escape(f.phase)}</td>",
            f"<td>{escape(' + '.join(f.matched))}</td>",
            f"<td>%{escape(f.replaced_by)}</td>",
            f"<td>{escape(', '.join(f.created) or '-')}</td>",
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)
