"""StableHLO lowerings of the shape ops (gawee.ops.shape): views, copies into new arrangements, indexing, scatters."""

from __future__ import annotations

import math

import torch

from gawee.backend.lower_mlir import MLIR
from gawee.ir.types import DType


@MLIR.register("reshape", "flatten", "unsqueeze", "squeeze")
def _reshape_mlir(c):
    return c.reshape(c.x(0), c.out.shape)


@MLIR.register("select")
def _select_mlir(c):
    i = c.attrs["index"]
    return c.reshape(c.slice_dim(c.x(0), c.attrs["dim"], i, i + 1), c.out.shape)


@MLIR.register("cat")
def _cat_mlir(c):
    """stablehlo.concatenate of the operands in the result's dtype (torch skips legacy empty 1-D ones)."""
    xs = [c.convert(v, c.out.dtype) for v in c.xs]
    if c.out.rank > 1:
        xs = [v for v in xs if v.shape != (0,)]
    return c.concat(xs, c.attrs["dim"])


@MLIR.register("stack")
def _stack_mlir(c):
    d = c.attrs["dim"]
    return c.concat([c.reshape(c.convert(v, c.out.dtype), (*v.shape[:d], 1, *v.shape[d:])) for v in c.xs], d)


@MLIR.register("split")
def _split_mlir(c):
    x, d, start, outs = c.x(0), c.attrs["dim"], 0, []
    for n in c.attrs["split_sizes"]:
        outs.append(c.slice_dim(x, d, start, start + n))
        start += n
    return outs


@MLIR.register("unbind")
def _unbind_mlir(c):
    x, d = c.x(0), c.attrs["dim"]
    return [c.reshape(c.slice_dim(x, d, i, i + 1), t.shape) for i, t in enumerate(c.outs)]


@MLIR.register("pad")
def _pad_mlir(c):
    """constant: stablehlo.pad (negative pads crop); reflect, replicate, circular: slices and concatenations."""
    x, pad, mode = c.x(0), c.attrs["pad"], c.attrs["mode"]
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):  # F.pad lists (before, after) pairs from the last dim backwards
        low[x.rank - 1 - i], high[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if mode == "constant":
        return c.pad(x, c.splat(c.attrs["value"], x.dtype), low, high)
    for d, (lo, hi) in enumerate(zip(low, high)):
        if not lo and not hi:
            continue
        n = x.shape[d]
        if mode == "reflect":
            left, right = (
                c.reverse(c.slice_dim(x, d, 1, lo + 1), [d]),
                c.reverse(c.slice_dim(x, d, n - 1 - hi, n - 1), [d]),
            )
        elif mode == "replicate":
            edge = lambda i, k: c.broadcast(c.slice_dim(x, d, i, i + 1), (*x.shape[:d], k, *x.shape[d + 1 :]))
            left, right = edge(0, lo), edge(n - 1, hi)
        elif mode == "circular":
            left, right = c.slice_dim(x, d, n - lo, n), c.slice_dim(x, d, 0, hi)
        else:
            c.fail(f"pad mode {mode!r}")
        x = c.concat([v for v, k in ((left, lo), (x, 1), (right, hi)) if k], d)
    return x


@MLIR.register("roll")
def _roll_mlir(c):
    x, shifts, dims = c.x(0), c.attrs["shifts"], c.attrs["dims"]
    if not dims:
        flat = c.reshape(x, (math.prod(x.shape),))
        return c.reshape(_roll_v(c, flat, shifts[0], 0), x.shape)
    for s, d in zip(shifts, dims):
        x = _roll_v(c, x, s, d % x.rank)
    return x


def _roll_v(c, x, shift, d):
    n = x.shape[d]
    s = shift % n if n else 0
    return c.concat([c.slice_dim(x, d, n - s, n), c.slice_dim(x, d, 0, n - s)], d) if s else x


@MLIR.register("index")
def _index_mlir(c):
    """Advanced indexing with adjacent index tensors: their dims merged into one, the broadcast
    indices linearized (negative ones wrapped), one index_select. Boolean masks (data-dependent
    shapes) and index tensors separated by a slice have no lowering."""
    x, idx = c.x(0), [c.x(i) for i in range(1, c.arity)]
    pos = [i for i, v in enumerate(idx) if v is not None]
    if not pos:
        return x
    if pos != list(range(pos[0], pos[-1] + 1)) or any(idx[p].dtype is DType.bool for p in pos):
        c.fail("boolean masks or index tensors separated by a slice")
    shape = tuple(torch.broadcast_shapes(*(idx[p].shape for p in pos)))
    flat = None
    for p in pos:
        v = c.convert(idx[p], DType.i64)
        v = c.broadcast(c.select(c.compare("LT", v, 0), c.add(v, x.shape[p]), v), shape)
        flat = v if flat is None else c.add(c.mul(flat, x.shape[p]), v)
    d0, d1 = pos[0], pos[-1] + 1
    merged = c.reshape(x, (*x.shape[:d0], math.prod(x.shape[d0:d1]), *x.shape[d1:]))
    return c.index_select(merged, flat, d0)


@MLIR.register("gather")
def _gather_mlir(c):
    """torch.gather: every output element's coordinates are its own, with the index along dim
    (torch rejects negative ones), one point gather."""
    x, idx = c.x(0), c.convert(c.x(1), DType.i64)
    d = c.attrs["dim"] % max(x.rank, 1)
    if x.rank == 0:
        return x
    coords = [idx if i == d else c.iota(idx.shape, i, DType.i64) for i in range(x.rank)]
    coords = c.concat([c.reshape(v, (*idx.shape, 1)) for v in coords], idx.rank)
    return c.gather_points(x, coords)


@MLIR.register("index_put")
def _index_put_mlir(c):
    """x[indices] = values (or +=): integer index tensors (broadcast together, negative ones
    wrapped) as one stablehlo.scatter into the indexed dims moved first, whose windows are the
    unindexed dims; values arranged as
    torch's indexing result (the index dims in place when adjacent, first otherwise). A boolean
    mask with one value is a select. Other boolean masks (data-dependent shapes) have no lowering."""
    x, values, idx = c.x(0), c.convert(c.x(1), c.x(0).dtype), [c.x(i) for i in range(2, c.arity)]
    acc = c.attrs["accumulate"]
    pos = [i for i, v in enumerate(idx) if v is not None]
    if not pos:
        c.fail("index_put without index tensors")
    if any(idx[p].dtype is DType.bool for p in pos):
        mask = idx[pos[0]]
        if len(pos) > 1 or math.prod(values.shape) != 1 or mask.shape != x.shape[pos[0] : pos[0] + mask.rank]:
            c.fail("a boolean mask with more than one value, or beside other indices")
        mask = c.broadcast_dims(mask, x.shape, range(pos[0], pos[0] + mask.rank))
        one = c.reshape(values, ())
        if acc:
            one = c.add(x, one) if x.dtype is not DType.bool else c.ew("stablehlo.or", x, one)
        return c.select(mask, one, x)
    batch = tuple(torch.broadcast_shapes(*(idx[p].shape for p in pos)))
    coords = []
    for p in pos:
        v = c.convert(idx[p], DType.i64)
        v = c.broadcast(c.select(c.compare("LT", v, 0), c.add(v, x.shape[p]), v), batch)
        coords.append(c.reshape(v, (*batch, 1)))
    coords = c.concat(coords, len(batch))
    rest = [d for d in range(x.rank) if d not in pos]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    before = [x.shape[d] for d in rest if d < first]
    shape = (*before, *batch, *(x.shape[d] for d in rest if d >= first))
    updates = c.broadcast(values, shape)
    nb, nbefore = len(batch), len(before)
    updates = c.transpose(updates, [*range(nbefore, nbefore + nb), *range(nbefore), *range(nbefore + nb, len(shape))])
    if not math.prod(batch):
        return x
    combine = ("or" if x.dtype is DType.bool else "add") if acc else None
    # the indexed dims first (IREE lowers only scatters into leading dims), then back
    perm = [*pos, *rest]
    y = c.scatter(c.transpose(x, perm), coords, updates, range(len(pos)), combine)
    return c.transpose(y, [perm.index(d) for d in range(x.rank)])


def _slice_scatter_v(c, x, src, dim: int, start: int, step: int):
    """``x`` with ``x[start::step]`` along ``dim`` (as many as ``src`` has) replaced by ``src``: src
    padded into place (interior padding step - 1) and a mask of where it lands."""
    k = src.shape[dim]
    if not k:
        return x
    low, high, interior = [0] * x.rank, [0] * x.rank, [0] * x.rank
    low[dim], interior[dim] = start, step - 1
    high[dim] = x.shape[dim] - start - ((k - 1) * step + 1)
    placed = c.pad(c.convert(src, x.dtype), c.splat(0, x.dtype), low, high, interior)
    mask = c.pad(c.splat(True, DType.bool, src.shape), c.splat(False, DType.bool), low, high, interior)
    return c.select(mask, placed, x)


@MLIR.register("select_scatter")
def _select_scatter_mlir(c):
    x, src = c.x(0), c.x(1)
    d = c.attrs["dim"] % x.rank
    src = c.reshape(src, (*x.shape[:d], 1, *x.shape[d + 1 :]))
    return _slice_scatter_v(c, x, src, d, c.attrs["index"] % x.shape[d], 1)


@MLIR.register("repeat")
def _repeat_mlir(c):
    """Broadcast to (r0, s0, r1, s1, ...) and merge each pair: tile by repeats."""
    x, reps = c.x(0), c.attrs["repeats"]
    shape = (1,) * (len(reps) - x.rank) + x.shape
    x = c.reshape(x, shape)
    tiled = [v for r, s in zip(reps, shape) for v in (r, s)]
    y = c.broadcast_dims(x, tiled, [2 * i + 1 for i in range(len(shape))])
    return c.reshape(y, c.out.shape)


MLIR.add("permute", lambda c: c.transpose(c.x(0), c.attrs["dims"]))
MLIR.add(
    "transpose",
    lambda c: c.transpose(
        c.x(0),
        [{c.attrs["dim0"]: c.attrs["dim1"], c.attrs["dim1"]: c.attrs["dim0"]}.get(i, i) for i in range(c.out.rank)],
    ),
)
MLIR.add("expand", lambda c: c.broadcast(c.x(0), c.out.shape))
MLIR.add("slice", lambda c: c.slice_dim(c.x(0), c.attrs["dim"], c.attrs["start"], c.attrs["end"], c.attrs["step"]))
MLIR.add("alias", lambda c: c.x(0))
MLIR.add("to_layout", lambda c: c.x(0))
MLIR.add("clone", lambda c: c.x(0))
MLIR.add("flip", lambda c: c.reverse(c.x(0), sorted({d % c.x(0).rank for d in c.attrs["dims"]})))
MLIR.add(
    "index_select",
    lambda c: c.index_select(c.x(0), c.x(1) if c.x(1).rank else c.reshape(c.x(1), (1,)), c.attrs["dim"] % c.x(0).rank),
)
MLIR.add("copy", lambda c: c.broadcast(c.convert(c.x(1), c.out.dtype), c.out.shape))
MLIR.add(
    "slice_scatter", lambda c: _slice_scatter_v(c, c.x(0), c.x(1), c.attrs["dim"], c.attrs["start"], c.attrs["step"])
)
