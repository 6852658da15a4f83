"""The find box: its options for a step (modules, parameters, then every node in the order backward ran
them), a search over them typed on the server for a big step, and `find`, which resolves what a user
typed to an element id (`app.view.ids`).

A step's options are a `SearchTable`, made once per step (the page's data keeps it: `PageData.search_table`)
from what it reads of every node at once (`node_fields`: a column document's arrays), with the maps of its
parameters' nodes only: on the 100,002-node LSTMCell step, its first options no longer make every node's map.
"""

from __future__ import annotations

import numpy as np

from gradscape.app.view.ids import MODULE_PREFIX, box_of, module_element, module_of, node_element
from gradscape.app.view.step_fields import ACCUMULATE, ROOT_MODULE, Wire, node_fields, node_label, short_name

SEARCH_ALL = 2000  # up to this many nodes, every search option goes to the browser
SEARCH_HITS = 50  # a bigger step: this many first options, and this many hits per typed query

Option = dict[str, str]


def searched_on_server(wire: Wire) -> bool:
    """True for a step too big to send every search option to the page (see `search_index`)."""
    return len(wire["nodes"]) > SEARCH_ALL


class SearchTable:
    """One step's find-box options: `head` (its modules, then its parameters), then every node in the order
    backward ran them (`ran`: node ids; those that never ran last, by id), each node's label made when first
    asked for (`label`) and all of them at the first typed search (`search`)."""

    def __init__(self, wire: Wire) -> None:
        # (the step itself is not kept: the page's data lets a big step's graph go while this may stay)
        self.fields = f = node_fields(wire)
        self.n_nodes = len(f.names)
        self.modules = set(wire["modules"])
        self.head: list[Option] = [
            {"label": f"{name} · {m.get('type', 'module')} (module)", "value": module_element(name)}
            for name, m in wire["modules"].items() if name != ROOT_MODULE]
        nodes = wire["nodes"]
        self.head += [{"label": f"{node_label(nodes[k], wire)} (parameter)", "value": node_element(k)}
                      for k in sorted(f.params)]
        # what an AccumulateGrad node is called on the graph (its parameter and shape), for `find`
        self.shown = {k: node_label(nodes[k], wire) for k, name in enumerate(f.names) if name == ACCUMULATE}
        orders = f.orders
        never = orders < 0
        key = np.where(never, int(orders.max(initial=-1)) + 1 + np.arange(self.n_nodes), orders)
        self.ran: list[int] = np.argsort(key, kind="stable").tolist()
        self._lower: list[str] | None = None  # every node's label in `ran` order, lowercased

    def label(self, k: int) -> str:
        f = self.fields
        name, param, module = f.names[k], f.params.get(k), f.modules[k]
        extra = f" · {param}" if param else (f" · {module}" if module else "")
        return f"{'AccumulateGrad' if name == ACCUMULATE else name}{extra} ({node_element(k)})"

    def options(self, nodes_wanted: int | None = None) -> list[Option]:
        """Every option, or with `nodes_wanted` only that many of the nodes (the first ones backward ran)."""
        ran = self.ran if nodes_wanted is None else self.ran[:nodes_wanted]
        return self.head + [{"label": self.label(k), "value": node_element(k)} for k in ran]

    def index(self) -> list[Option]:
        """`search_index`'s options."""
        if self.n_nodes <= SEARCH_ALL:
            return self.options()
        out = self.options(SEARCH_HITS)
        out.sort(key=lambda o: (not o["value"].startswith(MODULE_PREFIX), o["value"].count(".")))
        return out[:SEARCH_HITS]

    def search(self, query: str, limit: int = 20) -> list[Option]:
        """`search`'s hits: the first `limit` options whose label contains `query`, case-insensitive."""
        q = query.strip().lower()
        if not q:
            return []
        hits = [o for o in self.head if q in o["label"].lower()][:limit]
        if len(hits) < limit:
            if self._lower is None:
                self._lower = [self.label(k).lower() for k in self.ran]
            for k, low in zip(self.ran, self._lower):
                if q in low:
                    hits.append({"label": self.label(k), "value": node_element(k)})
                    if len(hits) == limit:
                        break
        return hits

    def find(self, query: str) -> str | None:
        """`find`'s answer."""
        q, f, modules = query.strip(), self.fields, self.modules
        if not q:
            return None
        digits = q[1:] if q[:1] in "nN" else q
        if digits.isdigit():
            return node_element(int(digits)) if int(digits) < self.n_nodes else None
        if module_of(q) in modules:
            return q
        if (box := box_of(q)) in modules:
            return module_element(box)
        if q in modules and q != ROOT_MODULE:
            return module_element(q)
        named = [k for k, p in f.params.items() if p == q]
        if named:
            return node_element(min(named))
        low = q.lower()
        for k in self.ran:
            name = f.names[k]
            shown = self.shown[k] if name == ACCUMULATE else short_name(name)
            if low in (name.rsplit("::", 1)[-1].lower(), shown.lower()):
                return node_element(k)
        hit = self.search(q, limit=1)
        return hit[0]["value"] if hit else None


def search_index(wire: Wire) -> list[Option]:
    """`{"label", "value"}` options for a search box: modules, parameters, then every node in the
    order backward ran them. Values are element ids: `m:<module>` or `n<id>`.

    A step with more than `SEARCH_ALL` nodes gets its first `SEARCH_HITS` options only (top-level
    modules first): the rest are found by `search` as the user types."""
    return SearchTable(wire).index()


def search(wire: Wire, query: str, limit: int = 20) -> list[Option]:
    """The first `limit` search options whose label contains `query` (case-insensitive): for a
    dropdown that filters on the server instead of shipping every option of a big graph."""
    return SearchTable(wire).search(query, limit)


def find(wire: Wire, query: str) -> str | None:
    """Resolve what a user typed to an element id: `n<id>` for a node, `m:<module>` for a module.

    Tried in order: an element id or a bare node number; a module name; a parameter name; an op
    name (`AddmmBackward0` or `Addmm`, the first to run); then any search label containing the
    text. None when nothing matches.
    """
    return SearchTable(wire).find(query)
