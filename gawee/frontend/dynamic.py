"""The command line's short form of torch.export's ``dynamic_shapes``: ``batch``, ``seq``, ``x:0,ids:1``.

* ``batch`` — dimension 0 of every input is one dynamic size (``torch.export.Dim("batch", min=1)``);
* ``seq`` — dimension 1 of every input is one dynamic size (``Dim("seq", min=2)``);
* ``INPUT:DIM[=NAME],...`` — the listed dimensions, INPUT a ``forward`` argument name or position;
  the same NAME is the same size (default ``dim{DIM}``: one size per dimension index, so a BERT's
  ``input_ids:1`` and ``attention_mask:1`` are one sequence length). ``NAME:MIN..MAX`` is not
  needed: export reports each size's range and gawee keeps it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch.export import Dim

from gawee.errors import ModelSpecError

SHORTHANDS = {"batch": (0, 1), "seq": (1, 2)}
"""Shorthand -> (dimension index, smallest size)."""


def dynamic_spec(text: str, model: torch.nn.Module, inputs: Sequence[torch.Tensor]):
    """torch.export's ``dynamic_shapes`` for ``model(*inputs)`` from the short form ``text``, and the
    example inputs to capture with: a marked dimension of size 1 is widened to 2 (repeating the
    example), since torch.export specializes a size it sees as 0 or 1."""
    names, varargs = _input_names(model, len(inputs))
    per_input: list[dict[int, Dim]] = [{} for _ in inputs]
    dims: dict[str, Dim] = {}

    def dim_named(name: str, lo: int) -> Dim:
        if name not in dims:
            dims[name] = Dim(name, min=lo)
        return dims[name]

    text = text.strip()
    if text in SHORTHANDS:
        index, lo = SHORTHANDS[text]
        for i, x in enumerate(inputs):
            if x.dim() > index:
                per_input[i][index] = dim_named(text, lo)
    else:
        for item in filter(None, (p.strip() for p in text.split(","))):
            target, sep, rest = item.partition(":")
            dim_text, _, name = rest.partition("=")
            if not sep or not dim_text.strip().lstrip("-").isdigit():
                raise ModelSpecError(
                    f"--dynamic item {item!r} is not INPUT:DIM[=NAME]",
                    hint="e.g. --dynamic batch, --dynamic seq, --dynamic x:0 or --dynamic input_ids:1,attention_mask:1",
                )
            i = _input_index(target.strip(), names)
            d = int(dim_text)
            rank = inputs[i].dim()
            if not -rank <= d < rank:
                raise ModelSpecError(f"--dynamic {item}: input {names[i]} has {rank} dimensions")
            d %= rank
            per_input[i][d] = dim_named(name.strip() or f"dim{d}", 1)
    if not any(per_input):
        raise ModelSpecError(f"--dynamic {text!r} marks no dimension", hint="the inputs have too few dimensions")
    spec = tuple(p or None for p in per_input)
    widened = []
    for x, marked in zip(inputs, per_input):
        for d in marked:
            if x.shape[d] == 1:
                x = torch.cat([x, x], dim=d)
        widened.append(x)
    return ((spec,) if varargs else spec), tuple(widened)


def _input_names(model: torch.nn.Module, n: int) -> tuple[list[str], bool]:
    """The names of ``forward``'s first ``n`` positional parameters (``name_i`` for ``*name``), and whether
    they are varargs (then torch.export wants the spec nested one level)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return [str(i) for i in range(n)], False
    names: list[str] = []
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return names + [f"{p.name}_{k}" for k in range(n - len(names))], not names
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return (names + [str(i) for i in range(len(names), n)])[:n], False


def _input_index(target: str, names: list[str]) -> int:
    if target.isdigit() and int(target) < len(names):
        return int(target)
    if target in names:
        return names.index(target)
    raise ModelSpecError(f"--dynamic: the model has no input {target!r}", hint="its inputs: " + ", ".join(names))
