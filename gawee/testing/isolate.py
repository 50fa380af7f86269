"""Run rule checks in worker processes, so that a crash inside a kernel is a verdict, not the end.

Each rule is checked in a process forked for it (the rules, helpers included, are inherited,
never pickled; only the finished RuleCheck travels back). Before every drawn instance runs,
the worker sends a description of it; if the worker dies (a signal, an abort, an exit) or
outlives ``timeout``, the rule gets the ``crashed`` verdict with the last instance it was
running, and the other rules are still judged. Up to ``jobs`` workers run at once; results
come back in rule order whatever the order they finish in.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch

from gawee.dsl.compiler import Rule
from gawee.testing.generate import Example, small
from gawee.testing.harness import RuleCheck, check_rule


def can_isolate() -> bool:
    """Whether this platform can fork workers (Linux and other POSIX systems)."""
    return "fork" in multiprocessing.get_all_start_methods()


def describe_instance(ex: Example, xs: list[torch.Tensor]) -> str:
    """The drawn instance as text: its graph and the values of its inputs and constants."""
    lines = ["  values:"]
    lines += [f"    %{v.name}: {v.type} = {small(x)}" for v, x in zip(ex.graph.inputs, xs)]
    lines += [f"    %{v.name}: {v.type} = {small(v.data)}" for v in ex.graph.constants()]
    lines.append("  graph:")
    lines += ["    " + line for line in str(ex.graph).splitlines()]
    return "\n".join(lines)


def _worker(rule: Rule, examples: int, seed: int | None, conn: Connection) -> None:
    faulthandler.disable()  # a crash is reported as this rule's verdict, not as a stack dump on stderr

    def on_example(ex: Example, xs: list[torch.Tensor]) -> None:
        conn.send(("instance", describe_instance(ex, xs)))

    result = check_rule(rule, examples, seed, on_example=on_example)
    result.rule = None  # compiled closures stay in this process; the parent has the rule
    conn.send(("done", result))
    conn.close()


@dataclass
class _Running:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    started: float
    instance: str = ""
    result: RuleCheck | None = None


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def check_isolated(
    rules: Sequence[Rule],
    examples: int = 200,
    seed: int | None = None,
    *,
    jobs: int = 1,
    timeout: float | None = None,
    progress: Callable[[Rule, RuleCheck], None] | None = None,
) -> list[RuleCheck]:
    """check_rule for every rule, each in its own worker process (at most ``jobs`` at once).

    A worker that dies or runs longer than ``timeout`` seconds gives its rule the
    ``crashed`` verdict, with the instance it was running. ``progress(rule, result)``
    is called as each rule finishes.
    """
    ctx = multiprocessing.get_context("fork")
    results: list[RuleCheck | None] = [None] * len(rules)
    queue = list(range(len(rules)))[::-1]
    running: dict[Connection, _Running] = {}

    def finish(run: _Running, crash: str = "") -> None:
        run.process.join(timeout=5)
        if run.process.is_alive():
            run.process.kill()
            run.process.join()
        run.conn.close()
        rule = rules[run.index]
        result = run.result
        if result is None or crash:
            result = RuleCheck(rule)
            why = crash or f"the worker process {_death(run.process.exitcode)} (a crash inside a kernel?)"
            result.crash = why + (f", running this instance:\n{run.instance}" if run.instance else "")
            result.seconds = time.perf_counter() - run.started
        result.rule = rule
        results[run.index] = result
        if progress is not None:
            progress(rule, result)

    while queue or running:
        while queue and len(running) < max(1, jobs):
            i = queue.pop()
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rules[i], examples, seed, send), daemon=True)
            p.start()
            send.close()  # the child holds the only writer: EOF here means it is gone
            running[recv] = _Running(i, p, recv, time.perf_counter())
        deadline = None
        if timeout is not None:
            deadline = min(r.started for r in running.values()) + timeout - time.perf_counter()
        ready = wait(list(running), timeout=None if deadline is None else max(0.0, deadline))
        for conn in ready:
            run = running[conn]
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):
                finish(running.pop(conn))
                continue
            if kind == "instance":
                run.instance = payload
            else:
                run.result = payload
        if timeout is not None:
            now = time.perf_counter()
            for conn, run in list(running.items()):
                if now - run.started > timeout:
                    os.kill(run.process.pid, signal.SIGKILL)
                    finish(running.pop(conn), crash=f"the worker outlived the {timeout:g} s time limit")
    return [r for r in results if r is not None]
