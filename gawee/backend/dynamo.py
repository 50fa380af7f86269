"""The torch.compile backend: ``torch.compile(model, backend="gawee")`` runs each captured graph through gawee.compile.

torch finds the backend through the ``torch_dynamo_backends`` entry point in pyproject.toml
(no import of gawee needed). Dynamo hands over an fx GraphModule whose inputs are the
user's tensors *and* the module's parameters and buffers (inlined nn.Modules). Like
Inductor's freezing, gawee treats parameters and buffers as constants: the graph is
wrapped in a module that holds them as buffers and takes only the user inputs, and that
module is re-captured with torch.export (the dynamo graph is already ATen-free torch IR,
so the re-export is cheap and yields the same functional ATen graph gawee.capture
expects), rewritten, verified and lowered. Where freezing would be wrong, the graph runs
as dynamo traced it: when autograd is recording (training, or inference outside
``torch.no_grad()`` with parameters that require grad) and for dynamic shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch.fx

from gawee.backend.compiler import compile

log = logging.getLogger(__name__)


class FrozenGraph(torch.nn.Module):
    """A dynamo graph with its parameter/buffer inputs bound to constants; forward takes the user inputs."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence, frozen: Sequence[int]):
        super().__init__()
        self.gm = gm
        self.arity = len(example_inputs)
        self.frozen = tuple(frozen)
        for k, i in enumerate(self.frozen):
            self.register_buffer(f"frozen_{k}", example_inputs[i].detach())

    def forward(self, *user_inputs):
        args: list = list(user_inputs)
        for k, i in enumerate(self.frozen):
            args.insert(i, getattr(self, f"frozen_{k}"))
        return self.gm(*args)


def gawee_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """A dynamo backend: compiles ``gm`` with gawee.compile, freezing parameters and buffers.

    Falls back to running ``gm`` as traced (logged at INFO) where freezing does not apply;
    raises gawee's typed errors (wrapped by dynamo) when capture or verification fails.
    """
    if not any(n.op == "call_function" or n.op == "call_method" for n in gm.graph.nodes):
        return gm.forward
    if any(not isinstance(x, torch.Tensor) for x in example_inputs):
        log.info("gawee: dynamic shapes or non-tensor inputs; running the graph as traced")
        return gm.forward
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        log.info("gawee: autograd is recording; running the graph as traced (gawee compiles for inference)")
        return gm.forward
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen = [i for i, (node, x) in enumerate(zip(placeholders, example_inputs)) if _is_parameter_or_buffer(node, x)]
    user = [i for i in range(len(example_inputs)) if i not in set(frozen)]
    module = compile(FrozenGraph(gm, example_inputs, frozen), [example_inputs[i] for i in user])
    log.info("gawee: %s", module.gawee_report)

    def run(*args):
        return module(*[args[i] for i in user])

    run.gawee_module = module
    return run


def _is_parameter_or_buffer(node: torch.fx.Node, example: torch.Tensor) -> bool:
    if isinstance(example, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    while source is not None:
        if type(source).__name__ in ("ParamBufferSource", "UnspecializedParamBufferSource"):
            return True
        source = getattr(source, "base", None)
    return False
