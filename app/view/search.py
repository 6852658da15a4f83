"""The find box: its options for a step (modules, parameters, then every node in the order backward ran
them), a search over them typed on the server for a big step, and `find`, which resolves what a user
typed to an element id (`app.view.ids`)."""

from __future__ import annotations

import heapq

from gradscape.app.view.ids import MODULE_PREFIX, box_of, module_element, module_of, node_element
from gradscape.app.view.step_fields import ACCUMULATE, ROOT_MODULE, Wire, node_label, node_module
from gradscape.tracer.wire import WireNode

SEARCH_ALL = 2000  # up to this many nodes, every search option goes to the browser
SEARCH_HITS = 50  # a bigger step: this many first options, and this many hits per typed query


def searched_on_server(wire: Wire) -> bool:
    """True for a step too big to send every search option to the page (see `search_index`)."""
    return len(wire["nodes"]) > SEARCH_ALL


def search_index(wire: Wire) -> list[dict[str, str]]:
    """`{"label", "value"}` options for a search box: modules, parameters, then every node in the
    order backward ran them. Values are element ids: `m:<module>` or `n<id>`.

    A step with more than `SEARCH_ALL` nodes gets its first `SEARCH_HITS` options only (top-level
    modules first): the rest are found by `search` as the user types."""
    if not searched_on_server(wire):
        return _search_options(wire)
    out = _search_options(wire, SEARCH_HITS)
    out.sort(key=lambda o: (not o["value"].startswith(MODULE_PREFIX), o["value"].count(".")))
    return out[:SEARCH_HITS]


def _search_options(wire: Wire, nodes_wanted: int | None = None) -> list[dict[str, str]]:
    """Every option, or with `nodes_wanted` only that many of the nodes (the first ones backward ran):
    a 100k-node step's first options need not label every node."""
    out: list[dict[str, str]] = []
    for name, m in wire["modules"].items():
        if name == ROOT_MODULE:
            continue
        out.append({"label": f"{name} · {m.get('type', 'module')} (module)", "value": module_element(name)})
    nodes = wire["nodes"]
    for n in nodes:
        if n["param"]:
            out.append({"label": f"{node_label(n, wire)} (parameter)", "value": node_element(n["id"])})

    def ran(n: WireNode) -> tuple[bool, int, int]:
        return n["order"] is None, n["order"] or 0, n["id"]
    for n in sorted(nodes, key=ran) if nodes_wanted is None else heapq.nsmallest(nodes_wanted, nodes, key=ran):
        where = node_module(n) or n["module"] or ""
        name = "AccumulateGrad" if n["name"] == ACCUMULATE else n["name"]
        extra = f" · {n['param']}" if n["param"] else (f" · {where}" if where else "")
        out.append({"label": f"{name}{extra} ({node_element(n['id'])})", "value": node_element(n["id"])})
    return out


def search(wire: Wire, query: str, limit: int = 20) -> list[dict[str, str]]:
    """The first `limit` search options whose label contains `query` (case-insensitive): for a
    dropdown that filters on the server instead of shipping every option of a big graph."""
    q = query.strip().lower()
    if not q:
        return []
    hits = [o for o in _search_options(wire) if q in o["label"].lower()]
    return hits[:limit]


def find(wire: Wire, query: str) -> str | None:
    """Resolve what a user typed to an element id: `n<id>` for a node, `m:<module>` for a module.

    Tried in order: an element id or a bare node number; a module name; a parameter name; an op
    name (`AddmmBackward0` or `Addmm`, the first to run); then any search label containing the
    text. None when nothing matches.
    """
    q = query.strip()
    if not q:
        return None
    nodes = wire["nodes"]
    modules = wire["modules"]
    digits = q[1:] if q[:1] in "nN" else q
    if digits.isdigit():
        return node_element(int(digits)) if int(digits) < len(nodes) else None
    if module_of(q) in modules:
        return q
    if (box := box_of(q)) in modules:
        return module_element(box)
    if q in modules and q != ROOT_MODULE:
        return module_element(q)
    for n in nodes:
        if n["param"] == q:
            return node_element(n["id"])
    low = q.lower()
    ran = sorted(nodes, key=lambda n: (n["order"] is None, n["order"] or 0, n["id"]))
    for n in ran:
        full = n["name"].rsplit("::", 1)[-1].lower()
        if low in (full, node_label(n, wire).lower()):
            return node_element(n["id"])
    hit = search(wire, q, limit=1)
    return hit[0]["value"] if hit else None
