"""Trying native code where a crash costs only the try: a forked child process runs it and reports back.

A runtime that runs native code on the user's graph — TorchScript's oneDNN Graph fuser, oneDNN's primitives and
gawee's own C kernels driven through ctypes, IREE's compiled module — can abort the process on a graph it
mishandles (the fuser's ``munmap_chunk(): invalid pointer`` on timm's VOLO class attention), and nothing in
Python can catch that. :func:`tried` runs each piece of work in a child made by ``fork``: the child shares the
caller's memory copy-on-write (the rewritten graph, its weights, the example inputs, the modules built so far),
so nothing is serialized and no interpreter starts; it runs the work, writes the answer (text or None) to a pipe
and exits. A child that dies — a signal, an exit without an answer, no answer within the timeout — costs that
work only, and :class:`Tried` says why, with the last line the child wrote to stderr (glibc's and oneDNN's
messages end up there), which the caller's terminal never sees.

The child runs on one thread: the GNU OpenMP runtime torch and oneDNN share is not fork-safe, and a child's first
parallel region after the parent has used OpenMP waits forever for the parent's worker threads (torch's
DataLoader sets its forked workers to one thread for the same reason). Several children run at once instead,
up to the caller's thread count, each on its own core. What the work measures there (a kernel race) is
meaningless, but a race runs every candidate, so every kernel the caller's own build could pick has run in a
child. A runtime with threads of its own has the same problem: IREE keeps one task driver per process, whose
workers are not in a child either, so an IREE module is tried on IREE's synchronous driver (the same dispatches).
Where ``fork`` is missing (Windows), :func:`supported` is False and nothing can be tried apart.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import selectors
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gawee.errors import first_line

TIMEOUT_S = 300.0
"""A child (on one thread) that has not answered after this long is killed, and its work taken for one that
crashed: a hang is as fatal to the user as a crash."""

STDERR_CHARS = 200
"""The last stderr line of a child that died is cut here."""

ERROR_EXIT = 70
"""A child's exit status when it could not write its answer."""


@dataclass(frozen=True)
class Tried:
    """How one piece of work went in its child: its answer, or why the child gave none."""

    answer: str | None = None
    """What the work returned (None: it returned None, or the child died)."""
    died: str | None = None
    """Why the child gave no answer — ``SIGABRT: munmap_chunk(): invalid pointer``, ``exit status 3``, ``no answer
    within 300 s`` —; None when it answered."""
    error: str | None = None
    """The first line of the exception the work raised, if it raised (the child then exits normally)."""
    seconds: float = 0.0

    @property
    def why(self) -> str:
        """The child's death as a clause (``it crashed in a trial process (SIGABRT: ...)``), or ""."""
        if self.died is None:
            return ""
        if self.died.startswith("no "):  # no answer in time, no process started
            return f"its trial process gave {self.died}" if self.died.startswith("no answer") else self.died
        return f"it crashed in a trial process ({self.died})"


def supported() -> bool:
    """Whether work can be tried apart from this process here (the OS has ``fork``)."""
    return hasattr(os, "fork")


def tried(
    work: dict[str, Callable[[], str | None]], *, timeout_s: float = TIMEOUT_S, parallel: int | None = None
) -> dict[str, Tried]:
    """Each of ``work`` (name → a callable returning text or None) run in a child process of its own, at most
    ``parallel`` at a time (default: this process's thread count), each given ``timeout_s`` seconds; name → how it
    went. Where the OS has no ``fork`` (:func:`supported`) nothing runs, and each is said to have died: work that
    could crash the process is then never done in it."""
    if not supported():
        return {name: Tried(died="no trial process could be started (this OS has no fork)") for name in work}
    parallel = max(1, parallel or torch.get_num_threads())
    pending = list(work.items())
    running: dict[int, _Child] = {}  # pipe's read end -> child
    done: dict[str, Tried] = {}
    with selectors.DefaultSelector() as selector, _reaping(running):
        while pending or running:
            while pending and len(running) < parallel:
                name, fn = pending.pop(0)
                try:
                    child = _Child.start(name, fn, timeout_s)
                except OSError as e:
                    done[name] = Tried(died=f"no trial process could be started ({e})")
                    continue
                running[child.fd] = child
                selector.register(child.fd, selectors.EVENT_READ, child)
            if not running:  # none could be started
                continue
            wait = min(c.deadline for c in running.values()) - time.monotonic()
            for key, _ in selector.select(timeout=max(0.0, wait)):
                child = key.data
                if child.read():
                    continue
                selector.unregister(child.fd)
                done[child.name] = running.pop(child.fd).finish()
            now = time.monotonic()
            for child in [c for c in running.values() if now >= c.deadline]:
                selector.unregister(child.fd)
                done[child.name] = running.pop(child.fd).finish(timed_out=timeout_s)
    return {name: done[name] for name in work}


@contextlib.contextmanager
def _reaping(running: dict[int, _Child]):
    """Kill and reap the children still ``running`` when the caller is interrupted (KeyboardInterrupt)."""
    try:
        yield
    finally:
        for child in running.values():
            child.finish(timed_out=0.0)


@dataclass
class _Child:
    name: str
    pid: int
    fd: int
    log: object
    start_s: float
    deadline: float
    chunks: list

    @classmethod
    def start(cls, name: str, fn: Callable[[], str | None], timeout_s: float) -> _Child:
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by finish(), once the child is reaped)
        read, write = os.pipe()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: "fork() of a threaded process"
                pid = os.fork()
        except OSError:  # out of memory or processes: no child to reap
            for fd in (read, write):
                os.close(fd)
            log.close()
            raise
        if pid == 0:  # the child: never returns
            os.close(read)
            _run_child(fn, write, log.fileno())
        os.close(write)
        now = time.monotonic()
        return cls(name, pid, read, log, now, now + timeout_s, [])

    def read(self) -> bool:
        """Take what the child wrote to the pipe; False at its end."""
        data = os.read(self.fd, 1 << 16)
        self.chunks.append(data)
        return bool(data)

    def finish(self, timed_out: float | None = None) -> Tried:
        """Reap the child (killed first when it ``timed_out``) and say how its work went."""
        if timed_out is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        seconds = time.monotonic() - self.start_s
        last = _last_line(self.log)
        self.log.close()
        if timed_out is not None:
            return Tried(died=f"no answer within {timed_out:g} s", seconds=seconds)
        try:
            message = json.loads(b"".join(self.chunks) or b"null")
        except ValueError:
            message = None
        if os.waitstatus_to_exitcode(status) == 0 and isinstance(message, dict):
            return Tried(answer=message.get("answer"), error=message.get("error"), seconds=seconds)
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            how = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        else:
            how = f"exit status {os.waitstatus_to_exitcode(status)}"
        return Tried(died=f"{how}: {last}" if last else how, seconds=seconds)


def _run_child(fn: Callable[[], str | None], write: int, log: int) -> None:
    """The child's whole life: stdout and stderr (the descriptors and Python's streams) to ``log``, one thread,
    ``fn()``'s answer (or the first line of what it raised) to the pipe ``write``, then ``os._exit`` — the caller's
    code (its ``finally`` blocks, atexit handlers, a test runner) never runs in the child."""
    status = ERROR_EXIT
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = sys.stderr = open(log, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as the child)
        faulthandler.disable()  # its dump of a crash would hide the crash's own last line (and reach a terminal)
        torch.set_num_threads(1)  # the parent's OpenMP workers do not exist here (module docstring)
        try:
            message = {"answer": fn()}
        except Exception as e:  # the work's own failure is an answer: the caller decides what it means
            message = {"answer": None, "error": first_line(e)}
        os.write(write, json.dumps(message).encode())
        status = 0
    finally:
        os._exit(status)


def _last_line(log) -> str:
    """The last non-empty line of the child's output, cut to :data:`STDERR_CHARS`."""
    log.seek(0, os.SEEK_END)
    size = log.tell()
    log.seek(max(0, size - 4096))
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:STDERR_CHARS] if lines else ""
