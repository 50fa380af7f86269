"""The opaque `aten` op: an ATen call gawee has no OpDef for, executed through torch as recorded.

Its attributes hold the exact target (``aten.nonzero.default``) and an argument
template in which tensor arguments are placeholders ``("$in", k)`` for operand k and
the other torch objects are tagged (``("$dtype", "f32")``, ``("$device", "cpu")``...),
so the node is plain JSON and replays without pickles. Rules never match it.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from gawee.errors import EvaluationError, InferenceError
from gawee.ir.registry import OPAQUE
from gawee.ir.symbolic import dim
from gawee.ir.types import DType
from gawee.ops.base import Attr, OpDef, Operand, register

_TAGS = {
    "$dtype": (torch.dtype, lambda v: DType.from_torch(v).value, lambda s: DType.parse(s).torch),
    "$device": (torch.device, lambda v: str(v), torch.device),
    "$memory_format": (torch.memory_format, lambda v: str(v).split(".")[-1], lambda s: getattr(torch, s)),
    "$layout": (torch.layout, lambda v: str(v).split(".")[-1], lambda s: getattr(torch, s)),
}


def encode_arg(arg: Any, tensor_index: dict[int, int]) -> Any:
    """JSON-able form of an ATen argument. ``tensor_index`` maps id(fx node) → operand index."""
    if isinstance(arg, (bool, int, float, str)) or arg is None:
        return arg
    if isinstance(arg, sympy.Expr):  # a symbolic size: kept as an expression, bound to a value at run time
        return dim(arg)
    if isinstance(arg, (list, tuple)):
        return tuple(encode_arg(a, tensor_index) for a in arg)
    for tag, (cls, enc, _dec) in _TAGS.items():
        if isinstance(arg, cls):
            return (tag, enc(arg))
    if id(arg) in tensor_index:
        return ("$in", tensor_index[id(arg)])
    raise TypeError(f"cannot record argument {arg!r} ({type(arg).__name__})")


def decode_arg(arg: Any, inputs: tuple[torch.Tensor | None, ...]) -> Any:
    if isinstance(arg, tuple):
        if len(arg) == 2 and isinstance(arg[0], str) and arg[0].startswith("$"):
            if arg[0] == "$in":
                return inputs[arg[1]]
            return _TAGS[arg[0]][2](arg[1])
        return [decode_arg(a, inputs) for a in arg]
    return arg


def resolve_target(target: str):
    """``aten.foo.overload`` → the torch OpOverload; EvaluationError if torch lacks it."""
    parts = target.split(".")
    try:
        ns, name, overload = parts[0], parts[1], parts[2] if len(parts) > 2 else "default"
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, IndexError, RuntimeError):
        raise EvaluationError(
            f"torch has no operator {target!r}", hint="the graph was captured with a different torch version"
        ) from None


def _evaluate(*inputs, target: str, args: tuple, kwargs: tuple):
    fn = resolve_target(target)
    call_args = decode_arg(args, inputs)
    call_kwargs = {k: decode_arg(v, inputs) for k, v in kwargs}
    out = fn(*call_args, **call_kwargs)
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def _no_inference(ins, attrs):
    raise InferenceError(
        f"opaque node {attrs.get('target')} cannot infer types",
        hint="opaque nodes keep the output types recorded at capture",
    )


register(
    OpDef(
        OPAQUE,
        (Operand("args", optional=True, variadic=True),),
        _evaluate,
        attrs=(Attr("target", "str"), Attr("args", "any", ()), Attr("kwargs", "any", ())),
        traits=frozenset(),
        infer=_no_inference,
        flops=None,
        doc="an ATen call without an OpDef, replayed through torch; rules never match it",
    )
)
