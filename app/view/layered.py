"""The layered graph the layout works on: every drawn element in a layer, and a dummy vertex wherever
an edge passes a layer (Sugiyama's "proper" graph), so long edges take part in ordering and get a
lane of their own. Used by `app.view.layout` and the steps it calls."""

from __future__ import annotations

from collections.abc import Sequence

Group = tuple[str, ...]  # the module prefixes an element is nested in, outermost first
SPACING = 16.0  # the least free space between two drawn nodes of a layer


__all__ = ["SPACING", "Group", "ProperGraph", "common", "corners"]


class ProperGraph:
    """The layered graph with a dummy vertex wherever an edge passes a layer (Sugiyama's "proper"
    graph), so long edges take part in ordering and get a lane of their own.

    Vertices 0..n-1 are the drawn elements, the rest are dummies. `routes[k]` is the vertex path
    of the k-th edge from its upper to its lower end.
    """

    def __init__(self, layer: list[int], groups: list[Group], pairs: Sequence[tuple[int, int]]) -> None:
        self.layer = list(layer)
        self.groups = list(groups)
        n = len(layer)
        self.above: list[list[int]] = [[] for _ in range(n)]
        self.below: list[list[int]] = [[] for _ in range(n)]
        self.pairs: list[tuple[int, int]] = []
        self.routes: list[list[int]] = []
        fan = _fans(layer, pairs)
        lanes: dict[tuple[int, int, Group], int] = {}  # (fan end, layer, group) -> the dummy its edges share
        linked: set[tuple[int, int]] = set()
        for a, b in pairs:
            top, bot = (a, b) if layer[a] <= layer[b] else (b, a)
            if layer[top] == layer[bot]:  # only inside a folded cycle: no lane
                self.routes.append([top, bot])
                continue
            shared = common(groups[top], groups[bot])
            end = top if fan[top] else bot if fan[bot] else -1
            route = [top]
            for k in range(layer[top] + 1, layer[bot]):
                if end < 0:
                    route.append(self._add(k, shared))
                elif (lane := lanes.get((end, k, shared))) is not None:
                    route.append(lane)
                else:
                    route.append(lanes.setdefault((end, k, shared), self._add(k, shared)))
            route.append(bot)
            for u, v in zip(route, route[1:]):
                if (u, v) not in linked:
                    linked.add((u, v))
                    self.below[u].append(v)
                    self.above[v].append(u)
                    self.pairs.append((u, v))
            self.routes.append(route)

    def _add(self, layer: int, group: Group) -> int:
        self.layer.append(layer)
        self.groups.append(group)
        self.above.append([])
        self.below.append([])
        return len(self.layer) - 1


FAN = 8  # long edges at one end from which they share one lane (NOTE [Shared lanes])


def _fans(layer: list[int], pairs: Sequence[tuple[int, int]]) -> list[bool]:
    """NOTE [Shared lanes]: an element with `FAN` or more edges spanning several layers at one end (a
    folded read-out that every call of a loop feeds, a parameter every call uses) routes them through one
    lane, each edge leaving it at its own layer; one lane per edge made O(edges × layers) dummies, 20,000
    for a loop's 100 calls drawn, and seconds of ordering. Fans out of an element are preferred to fans
    into one."""
    long_at = [0] * len(layer)
    for a, b in pairs:
        if abs(layer[a] - layer[b]) > 1:
            long_at[a] += 1
            long_at[b] += 1
    return [k >= FAN for k in long_at]


def common(a: Group, b: Group) -> Group:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return a[:k]


def corners(route: list[int], x: list[float]) -> list[int]:
    """The dummies of a route where its line bends (straight runs need no point)."""
    out = []
    for i in range(1, len(route) - 1):
        p, c, q = x[route[i - 1]], x[route[i]], x[route[i + 1]]
        if abs((c - p) - (q - c)) > 1e-6:
            out.append(route[i])
    return out
