"""A layered, top-down graph layout (Sugiyama style) in pure Python: pictures without Graphviz.

The four classic steps, each kept simple and deterministic:

1. *Layering* by longest path from the top: a box sits one layer below its lowest
   predecessor. Sources that are not pinned to the top (a node with no tensor inputs)
   move down to just above their first reader.
2. *Dummy boxes*: an edge that spans several layers gets a zero-width dummy in each
   layer it crosses, so long edges (residual connections) run in lanes beside the
   boxes instead of through them. The edges of one value share their dummies: a value
   read by many later nodes (DenseNet's concatenations) is one lane that branches off.
3. *Ordering*: barycenter sweeps down and up, keeping the order with the fewest crossings.
4. *Coordinates*: each layer in turn is placed as close as possible (least squares) to the
   mean x of its neighbours in the layer above, then below, subject to the order and the
   minimum gaps — a small isotonic regression solved exactly by pool-adjacent-violators.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

Point = tuple[float, float]


@dataclass(frozen=True)
class Placed:
    """A box's position: its centre x, its top y, and its size."""

    x: float
    y: float
    width: float
    height: float

    @property
    def left(self) -> float:
        return self.x - self.width / 2

    @property
    def bottom(self) -> float:
        return self.y + self.height


@dataclass(frozen=True)
class Layout:
    """Where every box goes and the polyline of every edge (in the order the edges were given)."""

    boxes: dict[str, Placed]
    edges: tuple[tuple[Point, ...], ...]
    width: float
    height: float


@dataclass(frozen=True)
class Spacing:
    """Gaps of a layout, in pixels."""

    box_gap: float = 22.0
    """Horizontal gap between two boxes of one layer."""
    lane_gap: float = 12.0
    """Horizontal gap next to an edge lane (a dummy)."""
    layer_gap: float = 34.0
    """Vertical gap between layers."""
    margin: float = 12.0
    port_spread: float = 14.0
    """Distance between the ends of the edges that enter (or leave) one box."""
    sweeps: int = 6
    """Rounds of ordering and of coordinate sweeps."""


def layered_layout(
    sizes: Mapping[str, tuple[float, float]],
    edges: Sequence[tuple[str, str]],
    *,
    pinned_top: Collection[str] = (),
    spacing: Spacing = Spacing(),
) -> Layout:
    """Lay out boxes (``id → (width, height)``, in a topological order) joined by ``edges``.

    ``pinned_top`` are sources that stay in the first layer (graph inputs). Returns the
    Layout; raises KeyError if an edge names an unknown box.
    """
    ids = list(sizes)
    index = {b: i for i, b in enumerate(ids)}
    n = len(ids)
    ends = [(index[s], index[d]) for s, d in edges]
    layer = _layers(n, ends, {index[b] for b in pinned_top if b in index})

    # virtual graph: real boxes 0..n-1, then dummies; `up`/`down` are neighbours one layer away
    width = [float(sizes[b][0]) for b in ids]
    height = [float(sizes[b][1]) for b in ids]
    vlayer = list(layer)
    up: list[list[int]] = [[] for _ in range(n)]
    down: list[list[int]] = [[] for _ in range(n)]
    key = [float(i) for i in range(n)]  # initial order within a layer
    chains: list[list[int]] = []
    lane: dict[tuple[int, int], int] = {}  # (source, layer) → its dummy: one lane per value, not per edge
    for s, d in ends:
        chain = [s]
        for lay in range(layer[s] + 1, layer[d]):
            v = lane.get((s, lay))
            if v is None:
                v = lane[s, lay] = len(vlayer)
                vlayer.append(lay)
                width.append(0.0)
                height.append(0.0)
                up.append([])
                down.append([])
                key.append(s + 0.5)
            chain.append(v)
        chain.append(d)
        for a, b in itertools.pairwise(chain):
            if vlayer[b] == vlayer[a] + 1 and b not in down[a]:
                down[a].append(b)
                up[b].append(a)
        chains.append(chain)
    dummy = [v >= n for v in range(len(vlayer))]

    depth = max(vlayer, default=-1) + 1
    layers: list[list[int]] = [[] for _ in range(depth)]
    for v in sorted(range(len(vlayer)), key=lambda v: (key[v], v)):
        layers[vlayer[v]].append(v)
    layers = _order(layers, up, down, spacing.sweeps)

    x = _coordinates(layers, up, down, width, dummy, spacing)
    tops, heights = [], []
    y = spacing.margin
    for lay in layers:
        h = max((height[v] for v in lay), default=0.0) or 10.0
        tops.append(y)
        heights.append(h)
        y += h + spacing.layer_gap
    total_h = y - spacing.layer_gap + spacing.margin
    left = min((x[v] - width[v] / 2 for v in range(len(x))), default=0.0)
    shift = spacing.margin - left
    x = [xi + shift for xi in x]
    total_w = max((x[v] + width[v] / 2 for v in range(len(x))), default=0.0) + spacing.margin

    placed = {}
    for v, b in enumerate(ids):
        lay = vlayer[v]
        placed[b] = Placed(round(x[v], 1), round(tops[lay] + (heights[lay] - height[v]) / 2, 1), width[v], height[v])
    polylines = _edge_paths(chains, placed, ids, x, vlayer, tops, heights, spacing)
    return Layout(placed, polylines, round(total_w, 1), round(total_h, 1))


def _layers(n: int, ends: list[tuple[int, int]], pinned: set[int]) -> list[int]:
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for s, d in ends:
        preds[d].append(s)
        succs[s].append(d)
    layer = [0] * n
    for v in range(n):  # boxes come in topological order
        layer[v] = max((layer[p] + 1 for p in preds[v] if p < v), default=0)
    for v in reversed(range(n)):
        if not preds[v] and succs[v] and v not in pinned:
            layer[v] = max(0, min(layer[s] for s in succs[v]) - 1)
    for s, d in ends:
        if layer[d] <= layer[s]:
            raise ValueError(f"edge {s} -> {d} goes backwards: the boxes must come in topological order")
    return layer


def _order(layers: list[list[int]], up: list[list[int]], down: list[list[int]], sweeps: int) -> list[list[int]]:
    """Barycenter sweeps; the ordering with the fewest crossings wins (ties: the earliest)."""
    best = [list(lay) for lay in layers]
    best_crossings = _crossings(best, down)
    current = [list(lay) for lay in layers]
    for _ in range(sweeps):
        for i in range(1, len(current)):
            current[i] = _barycenter(current[i], current[i - 1], up)
        for i in range(len(current) - 2, -1, -1):
            current[i] = _barycenter(current[i], current[i + 1], down)
        crossings = _crossings(current, down)
        if crossings < best_crossings:
            best, best_crossings = [list(lay) for lay in current], crossings
        if best_crossings == 0:
            break
    return best


def _barycenter(layer: list[int], fixed: list[int], nbrs: list[list[int]]) -> list[int]:
    pos = {v: i for i, v in enumerate(fixed)}
    keys = {}
    for i, v in enumerate(layer):
        ps = [pos[u] for u in nbrs[v] if u in pos]
        keys[v] = (sum(ps) / len(ps) if ps else float(i), i)
    return sorted(layer, key=keys.__getitem__)


def _crossings(layers: list[list[int]], down: list[list[int]]) -> int:
    total = 0
    for upper, lower in itertools.pairwise(layers):
        pos = {v: i for i, v in enumerate(lower)}
        pairs = sorted((i, pos[w]) for i, v in enumerate(upper) for w in down[v] if w in pos)
        tree = [0] * (len(lower) + 1)  # Fenwick tree: count earlier edges ending to the right
        for seen, (_, p) in enumerate(pairs):
            k, below = p + 1, 0
            while k > 0:
                below += tree[k]
                k -= k & -k
            total += seen - below
            k = p + 1
            while k <= len(lower):
                tree[k] += 1
                k += k & -k
    return total


def _coordinates(
    layers: list[list[int]],
    up: list[list[int]],
    down: list[list[int]],
    width: list[float],
    dummy: list[bool],
    spacing: Spacing,
) -> list[float]:
    x = [0.0] * len(width)
    for lay in layers:
        for v, xv in zip(lay, _place(lay, [0.0] * len(lay), width, dummy, spacing)):
            x[v] = xv
    for _ in range(spacing.sweeps):
        for lay in layers[1:]:
            _settle(lay, up, x, width, dummy, spacing)
        for lay in reversed(layers[:-1]):
            _settle(lay, down, x, width, dummy, spacing)
    for lay in layers[1:]:
        _settle(lay, up, x, width, dummy, spacing)
    return x


def _settle(
    lay: list[int], nbrs: list[list[int]], x: list[float], width: list[float], dummy: list[bool], spacing: Spacing
) -> None:
    desired = [sum(x[u] for u in nbrs[v]) / len(nbrs[v]) if nbrs[v] else x[v] for v in lay]
    for v, xv in zip(lay, _place(lay, desired, width, dummy, spacing)):
        x[v] = xv


def _place(
    lay: list[int], desired: list[float], width: list[float], dummy: list[bool], spacing: Spacing
) -> list[float]:
    """Centres closest (least squares) to ``desired`` that keep the order and the gaps.

    With offsets o_i (the tightest packing), y_i = x_i - o_i must be non-decreasing:
    an isotonic regression of desired_i - o_i, solved by pool-adjacent-violators.
    """
    offsets = [0.0]
    for a, b in itertools.pairwise(lay):
        gap = spacing.lane_gap if dummy[a] or dummy[b] else spacing.box_gap
        offsets.append(offsets[-1] + (width[a] + width[b]) / 2 + gap)
    blocks: list[list[float]] = []  # [sum, count]
    for d, o in zip(desired, offsets):
        blocks.append([d - o, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    ys: list[float] = []
    for s, c in blocks:
        ys += [s / c] * int(c)
    return [y + o for y, o in zip(ys, offsets)]


def _edge_paths(
    chains: list[list[int]],
    placed: dict[str, Placed],
    ids: list[str],
    x: list[float],
    vlayer: list[int],
    tops: list[float],
    heights: list[float],
    spacing: Spacing,
) -> tuple[tuple[Point, ...], ...]:
    """Polylines: out of the source's bottom, vertically through each dummy's layer, into the target's top.
    The edges leaving (entering) one box are spread along its bottom (top) edge, ordered by direction."""
    inner: list[list[Point]] = []
    for chain in chains:
        pts: list[Point] = []
        for v in chain[1:-1]:
            lay = vlayer[v]
            pts += [(x[v], tops[lay]), (x[v], tops[lay] + heights[lay])]
        inner.append(pts)
    out_port = _ports([(c[0], c[1]) for c in chains], x, placed, ids, spacing)
    in_port = _ports([(c[-1], c[-2]) for c in chains], x, placed, ids, spacing)
    paths = []
    for i, chain in enumerate(chains):
        src, dst = placed[ids[chain[0]]], placed[ids[chain[-1]]]
        pts = [(out_port[i], src.bottom), *inner[i], (in_port[i], dst.y)]
        paths.append(tuple((round(px, 1), round(py, 1)) for px, py in pts))
    return tuple(paths)


def _ports(
    ends: list[tuple[int, int]], x: list[float], placed: dict[str, Placed], ids: list[str], spacing: Spacing
) -> list[float]:
    """For each edge end (box, the next vertex towards the far side): the x where it touches the box.
    Ends that go to the same next vertex (one value's shared lane) share a port."""
    by_box: dict[int, list[int]] = {}
    for box, nxt in ends:
        nbrs = by_box.setdefault(box, [])
        if nxt not in nbrs:
            nbrs.append(nxt)
    where: dict[tuple[int, int], float] = {}
    for v, nbrs in by_box.items():
        box = placed[ids[v]]
        k = len(nbrs)
        step = min(spacing.port_spread, box.width * 0.8 / max(k - 1, 1))
        for rank, nxt in enumerate(sorted(nbrs, key=lambda u: (x[u], u))):
            where[v, nxt] = box.x + (rank - (k - 1) / 2) * step
    return [where[end] for end in ends]
