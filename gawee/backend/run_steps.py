"""A oneDNN module's steps as a program: each run of consecutive primitive executions one call into C.

Why: a module's call runs its steps in order, each a C function called through ctypes, which costs a fixed amount of
Python per step, and a network of a few milliseconds runs 60 to 100 steps (what it saved is in benchmarks/README.md,
static int8 notes). Here the primitive executions between two steps of another kind (gawee's own C kernels, torch
steps) are handed to ``gawee_run_primitives`` (``run_steps.c``) in one call; the others are called as before.
Without a C compiler every step is called from Python, as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from gawee.backend import native

SOURCE = Path(__file__).with_name("run_steps.c")
_P = ctypes.c_void_p


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    return native.load(SOURCE, {"gawee_run_primitives": [_P, _P, ctypes.c_long, _P, _P, _P, _P]})


def unavailable() -> str | None:
    """Why the runner cannot be built here, or None."""
    return _load()[1]


class Program:
    """The ``steps`` (``(function, arguments)`` each) of a module whose primitives run through ``execute`` (the
    library's ``dnnl_primitive_execute``, a C function): :meth:`run` runs them all in order."""

    def __init__(self, steps: Sequence[tuple[Callable, tuple]], execute: Callable):
        self.items: list[tuple[Callable, tuple, int, bool]] = []  # (function, arguments, first step, a run?)
        self._keep: list[Any] = []  # what the runs' calls point to
        self._failed = ctypes.c_long()
        # only a C function has an address to hand over (a test may stand a Python function in for it)
        runner = _load()[0] if isinstance(execute, ctypes._CFuncPtr) else None
        run: list[tuple] = []  # the arguments of the current run of primitive executions (on one stream)
        for i, (function, args) in enumerate(steps):
            if run and (function is not execute or args[1] != run[0][1]):
                self._add_run(runner, execute, run, i - len(run))
                run = []
            if runner is not None and function is execute:
                run.append(args)
            else:
                self.items.append((function, args, i, False))
        self._add_run(runner, execute, run, len(steps) - len(run))

    def _add_run(self, runner, execute: Callable, run: list[tuple], first: int) -> None:
        """The primitive executions ``run`` (from step ``first`` on) as one item: one call of the runner, or the
        execution itself where it is alone."""
        if len(run) <= 1:
            self.items += [(execute, args, first, False) for args in run]
            return
        n = len(run)
        prims = (_P * n)(*(_P(args[0]) for args in run))
        nargs = (ctypes.c_int * n)(*(args[2] for args in run))
        arrays = (_P * n)(*(ctypes.cast(args[3], _P) for args in run))
        self._keep += [run, prims, nargs, arrays]
        call = (ctypes.cast(execute, _P), run[0][1], n, prims, nargs, arrays, ctypes.byref(self._failed))
        self.items.append((runner.gawee_run_primitives, call, first, True))

    def run(self) -> tuple[int, int] | None:
        """Runs the steps; the first failing step's index and status (the steps after it not run), or None."""
        for function, args, first, is_run in self.items:
            status = function(*args)
            if status:
                return first + (self._failed.value if is_run else 0), status
        return None
