"""The part of Cython's pure-Python-mode API that gawee's compiled modules use, for a Python without Cython.

A hot module declares C types for its locals with ``@cython.locals(node=Node)`` (and its classes' fields in a
``.pxd`` beside it); :mod:`gawee.accel` compiles it with those types. Interpreted, the declarations do nothing:
Cython's own ``cython`` module (installed with the ``accel`` extra) makes them no-ops, and where Cython is absent
this module stands in for it::

    try:
        import cython
    except ImportError:
        from gawee import cython_shim as cython
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def locals(**types: Any) -> Callable[[F], F]:
    """``@cython.locals(name=Type, ...)``: C types for a function's local variables; the function, unchanged."""
    return lambda fn: fn


double = float
"""``cython.double``: a C double (a Python float, interpreted)."""

bint = bool
"""``cython.bint``: a C int used as a truth value (a Python bool, interpreted)."""
