"""StableHLO lowerings of the pooling ops (gawee.ops.pool): reduce_window, or reductions and contractions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.backend.lower_mlir import MLIR, widen


def _window_padding(c, nd: int, padding, dilation=None):
    """(low, high) padding per dim of a pooling window: high grows so that ceil_mode's last window fits."""
    a, x, out = c.attrs, c.x(0), c.out
    lead, dilation = x.rank - nd, dilation or (1,) * nd
    pads = [(0, 0)] * lead
    for i in range(nd):
        n, o, k, s, p, d = (
            x.shape[lead + i],
            out.shape[lead + i],
            a["kernel_size"][i],
            a["stride"][i],
            padding[i],
            dilation[i],
        )
        pads.append((p, max(p, (o - 1) * s + d * (k - 1) + 1 - n - p)))
    return lead, pads


@MLIR.register("max_pool2d", "max_pool3d")
def _max_pool_mlir(c):
    a, x = c.attrs, c.x(0)
    nd = len(a["kernel_size"])
    lead, pads = _window_padding(c, nd, a["padding"], a["dilation"])
    one = [1] * lead
    return c.reduce_window(
        x, "max", one + list(a["kernel_size"]), one + list(a["stride"]), pads, one + list(a["dilation"])
    )


@MLIR.register("avg_pool2d", "avg_pool3d")
def _avg_pool_mlir(c):
    """Window sums times 1/divisor per output position; the divisors (padding counted or not, ceil-mode
    windows cut short, divisor_override) come from torch's own pooling of ones, so they match it exactly."""
    a, x = c.attrs, widen(c, c.x(0))
    nd = len(a["kernel_size"])
    lead, pads = _window_padding(c, nd, a["padding"])
    one = [1] * lead
    total = c.reduce_window(x, "add", one + list(a["kernel_size"]), one + list(a["stride"]), pads)
    pool = (F.avg_pool2d, F.avg_pool3d)[nd - 2]
    ones = torch.ones((1,) * max(lead, 1) + x.shape[lead:], dtype=torch.float64)
    args = (a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"])
    avg = pool(ones, *args, a["count_include_pad"], a["divisor_override"])
    count = pool(ones, *args, False, 1)
    scale = (avg / count.clamp(min=1)).reshape((1,) * lead + tuple(avg.shape[-nd:]))
    y = c.mul(total, c.constant(scale.to(x.dtype.torch)))
    return c.convert(y, c.out.dtype)


def _adaptive_pool_mlir(kind: str):
    """Equal bins: a reduction (output 1) or a window; unequal bins (avg only): one contraction per
    spatial dim with the matrix of bin weights 1/len over [floor(i*n/o), ceil((i+1)*n/o))."""

    def lower(c):
        out_size, x = tuple(c.attrs["output_size"]), widen(c, c.x(0)) if kind == "add" else c.x(0)
        nd = len(out_size)
        lead, size = x.rank - nd, x.shape[x.rank - nd :]
        if all(o == 1 for o in out_size):
            dims = list(range(lead, x.rank))
            y = c.reduce(x, dims, kind, keepdim=True)
            y = c.div(y, math.prod(size)) if kind == "add" else y
        elif all(s % o == 0 for s, o in zip(size, out_size)):
            k = [1] * lead + [s // o for s, o in zip(size, out_size)]
            y = c.reduce_window(x, kind, k, k, [(0, 0)] * x.rank)
            y = c.div(y, math.prod(k)) if kind == "add" else y
        elif kind == "max":
            c.fail(f"adaptive max pooling to {list(out_size)} from {list(size)} (unequal bins)")
        else:
            y = x
            for i, (n, o) in enumerate(zip(size, out_size)):
                m = torch.zeros(o, n, dtype=torch.float64)
                for j in range(o):
                    lo, hi = (j * n) // o, -(-((j + 1) * n) // o)
                    m[j, lo:hi] = 1 / (hi - lo)
                y = c.dot_general(y, c.constant(m.to(x.dtype.torch)), contract=([lead + i], [1]))
                perm = [*range(lead + i), y.rank - 1, *range(lead + i, y.rank - 1)]
                y = c.transpose(y, perm)
        return c.convert(y, c.out.dtype)

    return lower


MLIR.add("adaptive_avg_pool2d", _adaptive_pool_mlir("add"))
MLIR.add("adaptive_max_pool2d", _adaptive_pool_mlir("max"))
MLIR.add("adaptive_avg_pool3d", _adaptive_pool_mlir("add"))
MLIR.add("adaptive_max_pool3d", _adaptive_pool_mlir("max"))
