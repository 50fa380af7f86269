"""Writing the pictures and the HTML report that ``gawee-rewrite optimize`` was asked for.

A :class:`PicturePlan` is checked before any work starts (known extensions, which keep
every picture apart from the inputs and from each other; Graphviz present for ``.svg``),
then written after the rewrite, each file atomically. Mermaid and DOT files hold both
graphs, before and after, side by side; the HTML report holds both graphs, the tables
and the trace.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from gawee.errors import GaweeError
from gawee.ir.core import Graph
from gawee.report import Column

HTML_EXT = (".html", ".htm")
MERMAID_EXT = (".mmd", ".mermaid", ".md")
DOT_EXT = (".dot", ".gv", ".svg")


@dataclass(frozen=True)
class PicturePlan:
    """The files to write: None where that format was not asked for."""

    html: Path | None = None
    mermaid: Path | None = None
    dot: Path | None = None

    def __bool__(self) -> bool:
        return any(p is not None for p in (self.html, self.mermaid, self.dot))

    def write(
        self, before: Graph, after: Graph, columns: list[Column], *, trace=(), firings=None, title: str | None = None
    ) -> list[Path]:
        """Render and write every planned file atomically; returns the paths written.

        Raises RenderError if Graphviz fails on an ``.svg``, GaweeError if a file cannot be written.
        """
        trace = list(trace)
        written = []
        if self.html is not None:
            from gawee.viz.html import html_report

            text = html_report(before, after, columns, trace=trace, firings=firings, title=title)
            written.append(_write(self.html, text))
        if self.mermaid is not None:
            from gawee.viz.mermaid import to_mermaid

            text = to_mermaid(after, trace=trace, before=before)
            if self.mermaid.suffix.lower() == ".md":  # GitHub and GitLab render a ```mermaid block in Markdown
                text = f"# {title or after.name}\n\n```mermaid\n{text}```\n"
            written.append(_write(self.mermaid, text))
        if self.dot is not None:
            from gawee.viz.dot import to_dot, to_svg

            text = to_dot(after, trace=trace, before=before)
            written.append(_write(self.dot, to_svg(text) if self.dot.suffix.lower() == ".svg" else text))
        return written


def plan_pictures(*, html: str | None = None, mermaid: str | None = None, dot: str | None = None) -> PicturePlan:
    """Check the requested output paths and return the plan.

    Each format has its own extensions, and none of them is an input's (``.json``,
    ``.npz``, ``.py``) or ``-o``'s, so a picture can overwrite neither the input nor
    another output. Raises GaweeError with a hint for an unknown extension or a
    directory, RenderError for an ``.svg`` without Graphviz installed.
    """
    plan = PicturePlan(*(None if p is None else Path(p) for p in (html, mermaid, dot)))
    for flag, path, exts in (
        ("--html", plan.html, HTML_EXT),
        ("--mermaid", plan.mermaid, MERMAID_EXT),
        ("--dot", plan.dot, DOT_EXT),
    ):
        if path is None:
            continue
        if path.suffix.lower() not in exts:
            raise GaweeError(
                f"{flag} {path}: unknown extension {path.suffix or '(none)'!r}",
                hint=f"{flag} writes {' or '.join(exts)} files"
                + ("; .svg renders the DOT with Graphviz" if flag == "--dot" else ""),
            )
        if path.is_dir():
            raise GaweeError(
                f"{flag} {path} is a directory", hint=f"give a file name, e.g. {path / ('graph' + exts[0])}"
            )
    if plan.dot is not None and plan.dot.suffix.lower() == ".svg" and shutil.which("dot") is None:
        from gawee.viz.dot import INSTALL_HINT, RenderError

        raise RenderError(
            f"--dot {plan.dot}: rendering SVG needs Graphviz's `dot`, which is not installed", hint=INSTALL_HINT
        )
    return plan


def _write(path: Path, text: str) -> Path:
    from gawee.ir.serialize import write_output  # the one atomic writer (temp file + rename; GaweeError)

    write_output(path, text.encode())
    return path
