"""gawee's oneDNN runtime (``gawee.backend.dnnl``) against the reference interpreter on random small CNNs: where a
layout, a precision or a geometry makes the runtime compute other values than the rewritten graph's own semantics.

Each case is a random two-convolution block (groups, kernel, stride, padding, dilation, input size, batch, input
scale; a batch norm folded into the second convolution, an activation after each — relu, relu6, hardswish, silu or
none — in half the cases a residual add, and in half a 1x1 convolution reading the block's result: in int8 the
second convolution's result is then requantized, and its residual, held as codes, summed from its destination;
in half the cases with that convolution, the block's result multiplied first by the hard sigmoid of its mean per
channel, as mobilenet_v3's squeeze-excitation does: in int8 the multiply then writes the codes the 1x1 convolution
reads), captured, rewritten with the default rules and the ``--precision``
phase (int8: calibrated on the input and half of it), lowered for the runtime (``Runtime.lower``) and built in
each activation layout (``per_conv``, ``blocked``, ``channels_last``). Its output is compared with
:func:`gawee.run` of the rewritten graph — the reference semantics the harness checks each rule against — within
a fraction of the output's magnitude: 1e-4 for float32, 2% for bf16 (the runtime's bf16 kernels may sum in
another order, each sum rounded to bf16 once), 1% for int8 (an exact integer convolution; a tie that rounds to
the other code moves one step of the next convolution's grid).

    python benchmarks/dnnl_fuzz.py --precision int8 --cases 150
"""

from __future__ import annotations

import argparse
import collections
import random

import torch

import gawee
from gawee.backend import runtime
from gawee.backend.dnnl import LAYOUTS, DnnlModule
from gawee.errors import GaweeError
from gawee.rewrite.calibration import Calibration
from gawee.rewrite.ruleset import with_precision

TOLERANCE = {"f32": 1e-4, "bf16": 0.02, "int8": 0.01}
ACTIVATIONS = (torch.nn.ReLU, torch.nn.ReLU6, torch.nn.Hardswish, torch.nn.SiLU, torch.nn.Identity)


class Block(torch.nn.Module):
    """act(conv(x)) -> act(bn(conv3x3(.)) [+ the first's result]) [-> . * hardsigmoid(mean(.)) -> conv1x1(.)]."""

    def __init__(self, cin: int, cout: int, groups: int, kernel: int, stride: int, padding: int, dilation: int,
                 act: torch.nn.Module, residual: bool, head: bool = False, excite: bool = False):  # fmt: skip
        super().__init__()
        self.first = torch.nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups=groups)
        self.second = torch.nn.Conv2d(cout, cout, 3, 1, 1)
        self.bn = torch.nn.BatchNorm2d(cout)
        self.head = torch.nn.Conv2d(cout, cout, 1) if head else torch.nn.Identity()
        self.act, self.residual, self.excite = act, residual, excite
        with torch.no_grad():  # statistics as a trained network has them (at initialization the norm is the identity)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = self.act(self.first(x))
        z = self.bn(self.second(y))
        out = self.act(z + y if self.residual else z)
        if self.excite:
            out = out * torch.nn.functional.hardsigmoid(out.mean((2, 3), keepdim=True))
        return self.head(out)


def case(rng: random.Random, index: int) -> tuple[Block, torch.Tensor, dict]:
    """A random block, its input and how they were drawn."""
    groups = rng.choice([1, 1, 1, 2, 4])
    cin, cout = groups * rng.randint(1, 6), groups * rng.randint(1, 6)
    kernel, stride = rng.choice([1, 3, 5]), rng.choice([1, 1, 2])
    padding, dilation = rng.choice([0, 1, 2]), rng.choice([1, 1, 2])
    size = rng.randint(max(1, (kernel - 1) * dilation + 1 - 2 * padding), 20)
    act, residual, head = rng.choice(ACTIVATIONS)(), rng.random() < 0.5, rng.random() < 0.5
    excite = head and index % 4 < 2  # from the index: the draws of every case stay as they were
    torch.manual_seed(index)
    block = Block(cin, cout, groups, kernel, stride, padding, dilation, act, residual, head, excite).eval()
    x = torch.randn(rng.choice([1, 2]), cin, size, size) * rng.choice([0.1, 1.0, 10.0])
    drawn = dict(groups=groups, cin=cin, cout=cout, kernel=kernel, stride=stride, padding=padding,
                 dilation=dilation, act=type(act).__name__, residual=residual, head=head, excite=excite,
                 input=list(x.shape))  # fmt: skip
    return block, x, drawn


def _summed(node) -> bool:
    """An int8 convolution requantized to codes adding a residual that a requantized one wrote: oneDNN's runtime
    sums its codes from the destination (``dnnl_plan._Plan.accumulator``)."""
    if node.op != "conv2d_int8_static" or not node.attrs["out_scale"] or len(node.inputs) < 5:
        return False
    producer = node.inputs[4].producer if node.inputs[4] is not None else None
    return producer is not None and producer.op == "conv2d_int8_static" and bool(producer.attrs["out_scale"])


def run(precision: str, cases: int, seed: int) -> collections.Counter:
    """Run the cases; print each mismatch or failure and a summary. The counts: ``bad`` cases, ``cases`` run, the
    cases each op was lowered in, and those the runtime said it cannot run (by its reason)."""
    rng, seen = random.Random(seed), collections.Counter()
    rules = gawee.default_rules() if precision == "f32" else with_precision(gawee.default_rules(), precision)
    dnnl = runtime.get("onednn")
    for index in range(cases):
        block, x, drawn = case(rng, seed * 100_000 + index)
        try:
            calibration = Calibration.of([(x,), (x * 0.5,)], "the input") if precision == "int8" else None
            graph, _ = gawee.rewrite(gawee.capture(block, (x,)), rules, calibration=calibration)
            want = gawee.run(graph, x)
            want = want[0] if isinstance(want, (tuple, list)) else want
            why = dnnl.cannot_run(graph)
            if why is not None:
                seen["not run: " + why.split(":")[0]] += 1
                continue
            lowered, _ = dnnl.lower(graph, "")
            seen.update({n.op + (" (requantized)" if n.attrs.get("out_scale") else "") for n in lowered})
            seen["a residual held as codes"] += any(_summed(n) for n in lowered)
            for layout in LAYOUTS:
                with torch.no_grad():
                    got = DnnlModule(lowered, layout=layout)(x)
                got = got[0] if isinstance(got, (tuple, list)) else got
                error = (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)
                if not error <= TOLERANCE[precision]:
                    seen["bad"] += 1
                    print(f"MISMATCH {layout}: {error:.3g} of the output's magnitude; {drawn}", flush=True)
            seen["cases"] += 1
        except GaweeError as e:
            seen["bad"] += 1
            print(f"FAILED {drawn}: {e.message}", flush=True)
    print(f"{precision}: {seen['cases']} of {cases} cases run in {len(LAYOUTS)} layouts each, {seen['bad']} bad")
    ops = {k: v for k, v in sorted(seen.items()) if k not in ("cases", "bad")}
    print("ops in the lowered graphs (cases):", ops)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=sorted(TOLERANCE), default="int8")
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    return 1 if run(args.precision, args.cases, args.seed)["bad"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
