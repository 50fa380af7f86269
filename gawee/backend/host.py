"""Calling a compiled module: the inputs checked against the graph's types the same way by every runtime
(:class:`InputSignature`), handed over as numpy arrays where the runtime takes them (ONNX Runtime, IREE), and the
outputs given back as torch tensors in the model's own nesting."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from gawee.errors import GaweeError, InputError
from gawee.ir.symbolic import ShapeOutOfRange, Sym, bind, symbols_of, text
from gawee.ir.types import DType, TensorType


class InputSignature:
    """The inputs a compiled graph takes, checked on every call of every runtime's module (the torch lowering, oneDNN's
    primitives, oneDNN Graph, ONNX Runtime, IREE) with the same errors: the count, each input a tensor of its dtype
    and rank, each static dimension its size, each symbolic one in its symbol's range and every expression of the
    symbols equal to what the others give (:func:`gawee.ir.symbolic.bind`). Inputs come by position, or by name as
    keywords (the names torch.export gave them: the forward's parameter names).

    The check runs on every call, so everything that can be is decided here: the check is a Python function written
    for these types (:func:`_check_source`: straight-line comparisons of each input's dtype and shape with
    constants, each symbol read where it stands alone), so a call that passes costs about the reads of each input's
    dtype and shape. Only a failing call builds its message (:meth:`refuse`). Raises
    :class:`gawee.errors.InputError` (a TypeError) for a wrong count, name, kind or dtype and
    :class:`gawee.ir.symbolic.ShapeOutOfRange` (a ValueError) for a wrong rank or size, each one line saying
    which input and what the graph takes.

    Called with the inputs (``signature(*inputs)``), it checks them and returns the symbols' values in the order of
    :attr:`symbols`; :meth:`inputs` takes a call's positional and keyword arguments. The torch lowering calls
    :meth:`inputs` as its first node and reads sizes from :meth:`values`."""

    def __init__(self, names: Sequence[str], types: Sequence[TensorType]):
        self.names = tuple(names)
        self.types = tuple(types)
        self.symbols: tuple[Sym, ...] = tuple(sorted(symbols_of(self.types), key=lambda s: s.name))
        """The symbols of the input shapes, in the order the call returns their values."""
        self._position = {name: i for i, name in enumerate(self.names)}
        self._reads = _reads(self.types, self.symbols)
        source, constants = _check_source(self.types, self.symbols, self._reads)
        namespace = {**constants, "refuse": self.refuse}
        exec(compile(source, "<gawee check_inputs>", "exec"), namespace)  # the source holds only indices and ints
        self.check: Callable[..., tuple[int, ...]] = namespace["check_inputs"]
        """The check itself: ``check(*inputs)``, the symbols' values."""

    @classmethod
    def of(cls, graph) -> InputSignature:
        """The signature of ``graph``'s inputs."""
        return cls([v.name for v in graph.inputs], [v.type for v in graph.inputs])

    def __call__(self, *inputs: Any) -> tuple[int, ...]:
        return self.check(*inputs)

    def inputs(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """The inputs of a call ``module(*args, **kwargs)`` in the graph's order, checked."""
        if kwargs:
            args = self._by_name(args, kwargs)
        self.check(*args)
        return args

    def values(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The symbols' values in ``inputs`` (checked already), in the order of :attr:`symbols`."""
        return tuple([inputs[i].shape[d] for i, d in self._reads])

    def refuse(self, inputs: Sequence[Any]) -> None:
        """Raise the error that says why ``inputs`` are not this signature's (the first input at fault)."""
        if len(inputs) != len(self.types):
            takes = ", ".join(f"{n} {_text(t)}" for n, t in zip(self.names, self.types))
            count = f"{len(self.types)} input{'s' if len(self.types) != 1 else ''}"
            raise InputError(f"the graph takes {count} ({takes}), got {len(inputs)}")
        for name, x, t in zip(self.names, inputs, self.types):
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input {name} is a {type(x).__name__}, the graph takes a tensor {_text(t)}")
            if x.dtype != t.dtype.torch:
                got = f"{_dtype_text(x.dtype)}[{','.join(map(str, x.shape))}]"
                raise InputError(f"input {name} is {got}, the graph takes {_text(t)}")
        bind(list(zip(self.names, (t.shape for t in self.types))), [x.shape for x in inputs])  # raises
        got = ", ".join(f"{n} {list(x.shape)}" for n, x in zip(self.names, inputs))  # the check and bind disagree
        raise ShapeOutOfRange(f"the inputs ({got}) do not fit the graph's ({', '.join(map(_text, self.types))})")

    def _by_name(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """``args`` then ``kwargs`` placed by name."""
        if not args and len(kwargs) == len(self.names):  # every input by name: module(**inputs)
            try:
                return tuple([kwargs[name] for name in self.names])
            except KeyError:
                pass  # a name that is not an input's: said below
        placed: list[Any] = [*args, *[_MISSING] * (len(self.names) - len(args))]
        for name, x in kwargs.items():
            i = self._position.get(name)
            if i is None:
                raise InputError(f"the graph has no input named {name!r}; its inputs are {', '.join(self.names)}")
            if i >= len(placed) or placed[i] is not _MISSING:
                raise InputError(f"input {name} is given twice, by position and by name")
            placed[i] = x
        missing = [n for n, x in zip(self.names, placed) if x is _MISSING]
        if missing:
            raise InputError(f"input {', '.join(missing)} is missing (the graph takes {', '.join(self.names)})")
        return tuple(placed)


_MISSING = object()


def _reads(types: Sequence[TensorType], symbols: Sequence[Sym]) -> list[tuple[int, int]] | None:
    """Where each symbol is read: its first bare occurrence (input, dim), in the order of ``symbols``; None where some
    symbol stands alone nowhere (it cannot be solved from the inputs: every call is refused, :func:`bind` says so)."""
    found: dict[Sym, tuple[int, int]] = {}
    for i, t in enumerate(types):
        for d, size in enumerate(t.shape):
            if isinstance(size, Sym):
                found.setdefault(size, (i, d))
    if any(s not in found for s in symbols):
        return None
    return [found[s] for s in symbols]


def _check_source(types: Sequence[TensorType], symbols: Sequence[Sym], reads) -> tuple[str, dict[str, Any]]:
    """The source of ``check_inputs(*inputs)`` for inputs of ``types`` — it returns the symbols' values, or calls
    ``refuse(inputs)`` — and the constants it reads (dtypes, static shapes, ranges, formulas), by name. Inputs are
    ``x0``..., their shapes ``s0``..., symbols' values ``v0``...; nothing of the graph but numbers is in the text."""
    constants: dict[str, Any] = {}
    n = len(types)
    tests = []
    for i, t in enumerate(types):
        constants[f"D{i}"] = t.dtype.torch
        tests.append(f"x{i}.dtype is D{i}")
        if t.symbolic:
            tests.append(f"len(s{i}) == {t.rank}")
        else:
            constants[f"S{i}"] = torch.Size(t.shape)
            tests.append(f"s{i} == S{i}")
    sizes = []  # the symbolic inputs' other dimensions, once the symbols are read
    if reads is not None:
        order = {s: k for k, s in enumerate(symbols)}
        for k, s in enumerate(symbols):
            constants[f"L{k}"], constants[f"H{k}"] = s.lo, math.inf if s.hi is None else s.hi
            sizes.append(f"L{k} <= v{k} <= H{k}")
        for i, t in enumerate(types):
            for d, size in enumerate(t.shape if t.symbolic else ()):
                if (i, d) in reads:
                    continue
                if isinstance(size, Sym):
                    sizes.append(f"s{i}[{d}] == v{order[size]}")
                elif isinstance(size, int):
                    sizes.append(f"s{i}[{d}] == {size}")
                else:
                    constants[f"F{i}_{d}"] = SizeFormula(size, list(symbols))
                    sizes.append(f"s{i}[{d}] == F{i}_{d}({', '.join(f'v{k}' for k in range(len(symbols)))})")
    xs = "".join(f"x{i}, " for i in range(n))
    body = [f"({xs}) = inputs", *(f"s{i} = x{i}.shape" for i in range(n))]
    if reads is None:  # a symbol no input gives alone: refused below, by bind's message
        body.append("pass")
    else:
        body.append(f"if {' and '.join(tests) or 'True'}:")
        values = "".join(f"v{k}, " for k in range(len(reads)))
        reading = [f"v{k} = s{i}[{d}]" for k, (i, d) in enumerate(reads)]
        inner = ["    " + line for line in reading]
        if sizes:
            inner += [f"    if {' and '.join(sizes)}:", f"        return ({values})"]
        else:
            inner.append(f"    return ({values})")
        body += inner
    lines = [
        "def check_inputs(*inputs):",
        "    try:",
        *("        " + line for line in body),
        "    except (AttributeError, ValueError):  # not a tensor; another number of inputs",
        "        pass",
        "    refuse(inputs)",
    ]
    return "\n".join(lines) + "\n", constants


class SizeFormula:
    """A size computed from symbols at run time (``2*s0``), compiled once to plain Python arithmetic."""

    __module__ = "gawee"

    def __init__(self, expr, syms: list):
        import sympy

        self.expr = expr
        self.fn = sympy.lambdify(syms, expr, modules=[{"floor": math.floor, "FloorDiv": operator.floordiv}, "math"])
        self.__name__ = self.__qualname__ = "size_" + re.sub(r"\W", "_", str(expr))

    def __call__(self, *values: int) -> int:
        return int(self.fn(*values))

    def __repr__(self) -> str:
        return f"size({self.expr})"


def _text(t: TensorType) -> str:
    """A type as the errors print it: ``f32[s0,3,224,224]`` with each symbol's range (``s0 in 1..32``)."""
    dims = f"{t.dtype.value}[{','.join(map(text, t.shape))}]"
    syms = sorted(symbols_of([t]), key=lambda s: s.name)
    return dims + (f" ({', '.join(f'{s.name} in {s.range_text}' for s in syms)})" if syms else "")


def _dtype_text(dtype: torch.dtype) -> str:
    try:
        return DType.from_torch(dtype).value
    except GaweeError:
        return str(dtype).removeprefix("torch.")


def numpy_inputs(inputs: Sequence[torch.Tensor], types: Sequence[TensorType], runtime: str) -> list[np.ndarray]:
    """``inputs`` (checked: :class:`InputSignature`) as contiguous numpy arrays."""
    arrays = []
    for x, t in zip(inputs, types):
        if t.dtype is DType.bf16:
            raise TypeError(f"bf16 inputs have no numpy form for {runtime}")
        arrays.append(x.detach().cpu().contiguous().numpy())
    return arrays


class OutputStructure:
    """The model's outputs as it returns them — a tensor, a tuple, a dict, a Hugging Face ``ModelOutput`` (its own
    class: transformers registers it as a pytree node), nested — rebuilt from a runtime's flat outputs, the same
    way by every runtime. ``spec`` is the pytree spec of the model's output (``torch.utils._pytree``); each leaf is
    the next of the graph's outputs, or where the model returned something other than a tensor there (an int, a
    string), that value as the model returned it on the example inputs.

    Called with the flat outputs (``structure(outputs)``), it returns the model's structure: the torch lowering
    calls it as its last node (``model_outputs``). A tensor or a tuple of tensors is returned without pytree."""

    __name__ = "model_outputs"  # fx names a call's target by its module and name
    __qualname__ = __name__
    __module__ = "gawee"

    def __init__(self, spec: pytree.TreeSpec, constants: dict[int, Any] | None = None):
        self.spec = spec
        self.constants = dict(constants or {})
        """Leaf position → the value the model returned there (a leaf that is not a tensor)."""
        self.tensors = spec.num_leaves - len(self.constants)
        """How many of the leaves are the graph's outputs."""
        self._positions = [k for k in range(spec.num_leaves) if k not in self.constants]
        children = spec.children() if hasattr(spec, "children") else spec.children_specs  # an attribute in older torch
        plain_tuple = spec.type is tuple and all(c.is_leaf() for c in children)
        self._kind = "leaf" if spec.is_leaf() else "tuple" if plain_tuple and not self.constants else "tree"

    @classmethod
    def of(cls, example: Any) -> OutputStructure:
        """The structure of ``example``, what the model returned."""
        leaves, spec = pytree.tree_flatten(example)
        return cls(spec, {k: x for k, x in enumerate(leaves) if not isinstance(x, torch.Tensor)})

    def __call__(self, outputs: Sequence[Any]) -> Any:
        if self._kind == "leaf":
            return outputs[0]
        if self._kind == "tuple":
            return tuple(outputs)
        leaves = [self.constants.get(k) for k in range(self.spec.num_leaves)]
        for k, x in zip(self._positions, outputs):
            leaves[k] = x
        return pytree.tree_unflatten(leaves, self.spec)

    def __repr__(self) -> str:
        return "model_outputs"


def arrange(outputs: Sequence[torch.Tensor], structure: OutputStructure | pytree.TreeSpec | None) -> Any:
    """The outputs as a tuple, or as the model returned them (``structure``: :class:`OutputStructure`, or the pytree
    spec of an output of tensors only)."""
    if structure is None:
        return tuple(outputs)
    return as_structure(structure)(outputs)


def as_structure(structure: OutputStructure | pytree.TreeSpec) -> OutputStructure:
    """``structure`` as an :class:`OutputStructure` (a pytree spec: every leaf a tensor)."""
    return structure if isinstance(structure, OutputStructure) else OutputStructure(structure)
