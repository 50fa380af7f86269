"""A oneDNN module's steps as a program (gawee/backend/run_steps.py): runs of primitive executions in one C call."""

import ctypes

import pytest

from gawee.backend import run_steps

pytestmark = pytest.mark.skipif(run_steps.unavailable() is not None, reason=str(run_steps.unavailable()))

_EXECUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


def _program(kinds: str, fail_at: int | None = None):
    """A program of steps of ``kinds`` ('p': a primitive execution through a stand-in ``execute``, 'q': one on
    another stream, 'o': another function), each recording its index when called; the step ``fail_at`` returns
    status 5."""
    called = []

    @_EXECUTE
    def execute(prim, stream, nargs, args):
        i = prim - 100  # a primitive's stand-in address: the step's index past 100 (0 would be NULL)
        right = stream == (98 if kinds[i] == "q" else 99) and nargs == i % 7 + 1
        called.append(i if right else ("wrong arguments", i, stream, nargs))
        return 5 if i == fail_at else 0

    def other(i):
        called.append(i)
        return 5 if i == fail_at else 0

    arrays = [(ctypes.c_int * 2)() for _ in kinds]  # stand-ins for the argument arrays
    steps = [
        (execute, (100 + i, 98 if kind == "q" else 99, i % 7 + 1, arrays[i])) if kind in "pq" else (other, (i,))
        for i, kind in enumerate(kinds)
    ]
    return run_steps.Program(steps, execute), called, execute


@pytest.mark.parametrize(
    "kinds, items", [("pppopppp", 3), ("ppp", 1), ("opo", 3), ("oppo", 3), ("p", 1), ("popp", 3), ("ppqqpo", 4)]
)
def test_every_step_runs_once_in_order_and_runs_of_primitives_on_one_stream_are_one_item(kinds, items):
    program, called, _ = _program(kinds)
    assert program.run() is None
    assert called == list(range(len(kinds)))
    assert len(program.items) == items


@pytest.mark.parametrize("kinds, fail_at", [("pppopppp", 6), ("pppopppp", 1), ("pppopppp", 3), ("opp", 0)])
def test_the_first_failing_step_is_named_and_the_later_steps_do_not_run(kinds, fail_at):
    program, called, _ = _program(kinds, fail_at)
    assert program.run() == (fail_at, 5)
    assert called == list(range(fail_at + 1))
