"""The one writer of ``benchmarks/README.md``: each benchmark program owns one ``## `` section.

It also spells the provenance every section states: the machine and the gawee commit.

A program replaces its own section (or appends it) and leaves every other section as it
is; the hand-written ``### `` subsections inside the old section (``### Notes``, ``### Figures
behind the code``: every one whose heading the program's new text does not write itself) are
carried over to the end of the new one, in their order, so commentary survives a rerun. The
file is replaced atomically.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
README = HERE / "README.md"
INTRO = """# gawee benchmarks

Figures produced by the programs in this folder. Each section is written by the program
named in it; rerun that program to refresh it (other sections are left untouched).
"""


def _headings(lines: list[str]) -> list[int]:
    """Indices of markdown heading lines, skipping fenced code blocks."""
    out, fence = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.append(i)
    return out


def replace_section(heading: str, body: str, path: Path = README) -> None:
    """Replace the ``heading`` section of ``path`` (up to the next ``## `` heading) with ``body``, or append it."""
    text = path.read_text() if path.exists() else INTRO
    lines = text.splitlines(keepends=True)
    heads = _headings(lines)
    start = next((i for i in heads if lines[i].rstrip() == heading), None)
    block = heading + "\n\n" + body.strip() + "\n"
    if start is None:
        new = text.rstrip() + "\n\n" + block
    else:
        end = next((i for i in heads if i > start and lines[i].startswith("## ")), len(lines))
        subs = [i for i in heads if start < i < end and lines[i].startswith("### ")]
        written = {line.rstrip() for line in body.splitlines() if line.startswith("### ")}
        for i, sub in enumerate(subs):
            if lines[sub].rstrip() not in written:  # hand-written: kept
                stop = subs[i + 1] if i + 1 < len(subs) else end
                block += "\n" + "".join(lines[sub:stop]).strip() + "\n"
        rest = "".join(lines[end:])
        new = "".join(lines[:start]) + block + ("\n" + rest if rest else "")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".README.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(new.rstrip() + "\n")
    os.replace(tmp, path)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    cpu = cpu_name()
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def source_version() -> str:
    """The commit of the gawee being measured, marked when gawee/ or rules/ differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "gawee", "rules", "grammar"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "gawee (not a git checkout)"
    return f"gawee {head}" + (" + uncommitted changes" if dirty else "")
