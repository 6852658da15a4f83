"""Module boxes as cytoscape draws them (compound nodes): their rectangles, which sibling boxes overlap,
and moving overlapping ones apart (the last step of `app.view.layout`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gradscape.app.view.layered import SPACING, Group, ProperGraph
from gradscape.app.view.step_fields import prefixes

__all__ = ["box_bounds", "box_overlaps", "box_rects", "separate_boxes"]


BOX_PAD = 10.0  # a box's padding around what it holds (the stylesheet's `padding` of `node.module`)
BORDER = 3.0  # the widest border a node is drawn with (a root, a folded module, a NaN)
LABEL_H = 16.0  # a box's label: one line of 12 px, above the box, overlapping its top edge by 3.5 px
LABEL_RISE = 12.5
BOX_CHAR = 0.5  # average glyph advance of a box label, as a fraction of its 12 px


def box_rects(xs: Sequence[float], ys: Sequence[float], sizes: Sequence[tuple[float, float]],
               groups: Sequence[Group], labels: dict[str, str]) -> dict[str, list[float]]:
    """Each box's body `[x1, y1, x2, y2]` as cytoscape sizes a compound node: what it holds (nodes
    with their borders, nested boxes with their labels, which sit above them), grown by the padding."""
    inner: dict[str, list[float]] = {}

    def grow(box: str, r: Sequence[float]) -> None:
        cur = inner.setdefault(box, [math.inf, math.inf, -math.inf, -math.inf])
        cur[0], cur[1] = min(cur[0], r[0]), min(cur[1], r[1])
        cur[2], cur[3] = max(cur[2], r[2]), max(cur[3], r[3])

    for v, g in enumerate(groups):
        if g:
            w, h = sizes[v]
            grow(g[-1], (xs[v] - w / 2 - BORDER, ys[v] - h / 2 - BORDER, xs[v] + w / 2 + BORDER,
                         ys[v] + h / 2 + BORDER))
    out: dict[str, list[float]] = {}
    for box in sorted(inner.keys() | {p for g in groups for p in g}, key=lambda b: -len(prefixes(b))):
        if box not in inner:
            continue
        r = inner[box]
        body = [r[0] - BOX_PAD - 1.5, r[1] - BOX_PAD - 1.5, r[2] + BOX_PAD + 1.5, r[3] + BOX_PAD + 1.5]
        out[box] = body
        parent = box.rsplit(".", 1)[0] if "." in box else None
        if parent is not None:
            half = len(labels.get(box, box)) * 12 * BOX_CHAR / 2
            mid = (body[0] + body[2]) / 2
            grow(parent, (min(body[0], mid - half), body[1] - LABEL_RISE, max(body[2], mid + half), body[3]))
    return out


def box_bounds(layout: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """The rectangle `(x1, y1, x2, y2)` each module box of a layout covers as drawn (its body: what it
    holds, nested boxes' labels included, plus padding; its own label is above it)."""
    names = list(layout["nodes"])
    infos = [layout["nodes"][e] for e in names]
    groups = [prefixes(i["parent"]) for i in infos]
    rects = box_rects([i["x"] for i in infos], [i["y"] for i in infos], [(i["w"], i["h"]) for i in infos],
                       groups, layout.get("box_labels") or {})
    return {b: (r[0], r[1], r[2], r[3]) for b, r in rects.items()}


def box_overlaps(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """Pairs of sibling boxes (same parent box, or both at the top level) whose rectangles intersect."""
    bounds = box_bounds(layout)
    siblings: dict[str | None, list[str]] = {}
    for b, parent in layout["boxes"].items():
        if b in bounds:
            siblings.setdefault(parent, []).append(b)
    out = []
    for group in siblings.values():
        group.sort(key=lambda b: bounds[b][0])
        for i, a in enumerate(group):
            ax1, ay1, ax2, ay2 = bounds[a]
            for b in group[i + 1:]:
                bx1, by1, bx2, by2 = bounds[b]
                if bx1 >= ax2:
                    break
                if ay1 < by2 and by1 < ay2:
                    out.append((a, b))
    return out


def separate_boxes(rows: list[list[int]], g: ProperGraph, x: list[float], ys: list[float],
                    sizes: list[tuple[float, float]], labels: dict[str, str], rounds: int = 60) -> None:
    """Move sibling boxes that still intersect apart, in place. Banded layers leave only boxes that
    share layers: a module called twice with a sibling between its calls (a pooling layer used after
    two convolutions), two branches side by side, or a nested box label wider than its box. The box
    further right (or the one inside the other's layers) moves right with everything right of it in
    its own layers, so order and gaps within every layer are kept."""
    n = len(sizes)
    groups = g.groups[:n]
    for _ in range(rounds):
        boxed = box_rects(x[:n], ys, sizes, groups, labels)
        rect = {b: [r[0], r[2], r[1], r[3]] for b, r in boxed.items()}  # x1, x2, y1, y2
        clash = None
        family: dict[str | None, list[str]] = {}
        for b in rect:
            family.setdefault(_parent_of(b), []).append(b)
        for group in family.values():
            group.sort(key=lambda b: rect[b][0])
            for i, a in enumerate(group):
                ra = rect[a]
                for b in group[i + 1:]:
                    rb = rect[b]
                    if rb[0] >= ra[1]:
                        break
                    if ra[2] < rb[3] and rb[2] < ra[3]:
                        clash = (a, b)
                        break
                if clash:
                    break
            if clash:
                break
        if clash is None:
            return
        a, b = clash
        ra, rb = rect[a], rect[b]
        inner_b = ra[2] < rb[2] and rb[3] < ra[3]
        inner_a = rb[2] < ra[2] and ra[3] < rb[3]
        left, right = (a, b) if inner_b or (not inner_a and ra[0] + ra[1] <= rb[0] + rb[1]) else (b, a)
        shift = rect[left][1] - rect[right][0] + SPACING
        depth = len(prefixes(right))
        for row in rows:
            hit = next((i for i, v in enumerate(row) if len(g.groups[v]) >= depth and g.groups[v][depth - 1] == right),
                       None)
            if hit is not None:
                for v in row[hit:]:
                    x[v] += shift


def _parent_of(box: str) -> str | None:
    return box.rsplit(".", 1)[0] if "." in box else None
