"""What gawee learns about this machine once and keeps between processes.

Some facts cost seconds to establish and hold for as long as the machine and the installed torch do: whether
TorchScript's oneDNN Graph fuser runs here (:func:`gawee.backend.onednn_graph.unavailable` tries it in a child
process, about 2 s). Each process of a user's (every ``gawee-rewrite`` run, every script that compiles a
transformer) would pay that again; instead the answer is kept in a small text file under
``$XDG_CACHE_HOME/gawee`` (``~/.cache/gawee``), named by a digest of everything the answer depends on: the
question's own text, torch's version and build, the Python executable and the CPU (its model and feature
flags). A different CPU, torch or question is a different file, so an answer is never applied where it was not
established, and a kept answer is the one the process would have found: no behaviour depends on the cache.
Deleting the directory makes the next process establish its answers again. A directory that cannot be written
is no error (the answer is just not kept). Files are written atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import sys
from functools import cache
from pathlib import Path

import torch

from gawee.resources import cache_dir


@cache
def machine() -> str:
    """This machine and torch as an answer depends on them: CPU model and flags, torch's version and build,
    the Python executable."""
    from gawee.machine import cpu_info, cpu_name

    info = cpu_info()
    flags = info.get("flags", info.get("Features", ""))  # x86, Arm
    return "\n".join(
        [platform.machine(), cpu_name(), flags, torch.__version__, str(torch.version.git_version), sys.executable]
    )


def path(name: str, question: str, suffix: str = ".txt") -> Path:
    """Where the answer to ``question`` is kept on this machine: a file named by ``name`` and a digest of the
    question and the machine (also for answers that are not text, such as a library built here)."""
    digest = hashlib.sha256(f"{question}\n{machine()}".encode()).hexdigest()[:20]
    return cache_dir() / f"{name}-{digest}{suffix}"


def recall(name: str, question: str) -> str | None:
    """The answer kept for ``question`` (any text that determines it) on this machine, or None."""
    try:
        return path(name, question).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def keep(name: str, question: str, answer: str) -> None:
    """Keep ``answer`` to ``question`` for later processes on this machine (silently not, where the cache
    directory cannot be written)."""
    from gawee.ir.serialize import _atomic_write

    with contextlib.suppress(OSError):  # a read-only home, a full disk: the answer is just not kept
        _atomic_write(path(name, question), answer.encode())
