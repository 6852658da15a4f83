"""The graph's views in the offline file: a page without a server cannot lay out again, so the views a
person can open are laid out when the file is written, as the live page lays them out (`layout_graph`),
and each click on a fold in the file shows one of them.

    elements, edge_labels, states, show, left_out = fold_states(wire)

- The first view (key `""`) is folded as the live page opens the step (`default_collapse`).
- A click on a fold opens it as a click on the live page does (`app.view.folds.after_tap`): a module
  one level, or, called many times, into its calls (`cell · call 17 of 300`, the first `CALLS_SHOWN`);
  a folded call into its ops; the calls not drawn yet into the next ones; a run of ops into its ops.
- Each view is keyed by the fold clicked to open it (`m:cell`, `c:cell#17`; the calls not drawn yet
  also by how many are drawn then: `c:cell#more@100`), laid out from the view where that fold was
  first found. So the file opens one path of folds at a time: a fold opened from another view
  shows the view it was laid out in, where the path that was open is folded.
- A click on a box folds it: the view the path was at before the box's module was opened (before
  its call was opened into ops, when one is: as on the live page).
- Each view's `opens` says which view each fold and box in it shows. The views are laid out breadth
  first until NOTE [Export budgets] is spent; a fold past it has no entry, and the page says so.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gradscape.app.view import MAX_DRAWN, cytoscape_elements, default_collapse, layout_graph
from gradscape.app.view.call_folds import fold_calls, fold_tokens, split_folds
from gradscape.app.view.folds import after_tap
from gradscape.app.view.ids import call_of, module_of, run_of
from gradscape.app.view.layout import box_bounds
from gradscape.app.view.op_runs import fold_runs, split_runs
from gradscape.app.view.step_fields import Wire, inside

__all__ = ["DEFAULT_STATE", "STATE_WORK", "fold_states", "view_state"]

DEFAULT_STATE = ""
# NOTE [Export budgets]: a 10,290-node step wrote 29.65 MB in 33 s, and a one-pass 10k-node LSTMCell loop
# took 266 s, laying out every view that can be opened, each of the whole graph. Laying out one view reads
# the whole step (its folds: about 40 ms at 10k nodes) and places its elements, so the views are laid out
# breadth first until `STATE_WORK` (the step's nodes + the elements placed, summed over the views) is
# spent: the first view always. The 10k-node loop gets 20 views (the step, `cell` and `head` opened into
# their calls, 17 calls opened) and writes 3.8 MB in 4.4–5.6 s (`bench/export.py lstm10000`); the 12-layer GPT
# all 139 of its views. `gradscape serve` shows everything. The heatmaps' budget is `data.CELL_BUDGET`.
STATE_WORK = 200_000
MAX_STATES = 400


def _target(key: str, folds: list[str]) -> str:
    """A view's key: the fold clicked to open it; for the calls or runs not drawn yet, also how many are
    drawn."""
    if (run := run_of(key)) is not None:
        return key if run[2] else f"{key}@{split_runs(folds).drawn(run[:2])}"
    owner = call_of(key)
    if owner is None or owner[1] is not None:
        return key
    shown = split_folds(folds)[1].get(owner[0])
    return f"{key}@{shown.shown if shown else 0}"


def _clickable(layout: dict[str, Any]) -> list[str]:
    """The folds drawn in a view (modules, calls, the calls not drawn yet), in drawing order."""
    return [e for e in layout["nodes"] if module_of(e) is not None or call_of(e) is not None
            or run_of(e) is not None]


def fold_states(wire: Wire, max_states: int = MAX_STATES, budget: int | None = None) -> tuple[
        dict[str, Any], dict[str, str], dict[str, Any], dict[int, str], int]:
    """(elements, edge labels, states, the view that first shows each node, folds that open no view in the
    file), breadth first from the first view (see the module's docstring)."""
    elements: dict[str, Any] = {}
    edge_labels: dict[str, str] = {}
    states: dict[str, Any] = {}
    show: dict[int, str] = {}
    queue: deque[tuple[str, str | None, list[str]]] = deque(
        [(DEFAULT_STATE, None, fold_tokens(default_collapse(wire), {}))])
    queued = {DEFAULT_STATE}
    work, budget = 0, STATE_WORK if budget is None else budget
    while queue and len(states) < max_states and (not states or work < budget):
        key, parent, folds = queue.popleft()
        layout = layout_graph(wire, folds, max_drawn=MAX_DRAWN)
        work += len(wire["nodes"]) + len(layout["nodes"])
        st = states[key] = view_state(wire, layout, parent, elements, edge_labels)
        for eid in layout["nodes"]:
            if eid.startswith("n"):
                show.setdefault(int(eid[1:]), key)
        back = _box_targets(states, key)
        for eid in _clickable(layout) + [f"g:{b[0]}" for b in st["boxes"]]:
            if eid in back:
                st["opens"][eid] = back[eid]
                continue
            opened = after_tap(wire, _one_call_open(layout["collapsed"], eid), eid) or []
            target = st["opens"][eid] = _target(eid, opened)
            if target not in queued:
                queued.add(target)
                queue.append((target, key, opened))
    for st in states.values():  # a fold whose view is past the budget opens nothing in the file
        st["opens"] = {e: k for e, k in st["opens"].items() if k in states}
    return elements, edge_labels, states, show, len(queue)


def _one_call_open(folds: list[str], eid: str) -> list[str]:
    """The folds a click on call `eid` starts from: no other call of its module open (the file opens one
    path at a time, so the views do not multiply as calls opened together would); a click on a run, no other
    run of its box open."""
    if (run := run_of(eid)) is not None:
        return fold_runs(folds, run[0]) or folds
    owner = call_of(eid)
    if owner is None or owner[1] is None:
        return folds
    return fold_calls(*split_folds(folds), owner[0]) or folds


def _box_targets(states: dict[str, Any], key: str) -> dict[str, str]:
    """A click on a box in view `key` folds its module: the view the path there was at before its first
    fold inside that module, or before its first call opened into ops, when one is. A box open from the
    first view has none here (it is laid out as a fold)."""
    path = []
    at: str | None = key
    while at:
        path.append(at)
        at = states[at]["parent"]
    path.reverse()
    out = {}
    for module, *_ in states[key]["boxes"]:
        if "#" in module:  # an opened call's box (`cell#17`): the view its call was opened from
            opened_by = f"c:{module}"
            if opened_by in path and states[opened_by]["parent"] is not None:
                out[f"g:{module}"] = states[opened_by]["parent"]
            continue
        # as on the live page: a run of ops in the box opened folds back first, then a call of the module
        # opened into its ops, then the module
        opened = [k for k in path if (r := run_of(k)) is not None and inside(r[0], module)] or \
            [k for k in path if (c := call_of(k)) is not None and c[0] == module and c[1] is not None]
        first = opened[0] if opened else next((k for k in path if inside(_fold_module(k), module)), None)
        if first is not None and states[first]["parent"] is not None:
            out[f"g:{module}"] = states[first]["parent"]
    return out


def _fold_module(key: str) -> str | None:
    """The module of the fold a view was opened by (`m:blocks.3`, `c:cell#17`, `c:cell#more@100`, `o:scan#0.2`)."""
    if (module := module_of(key)) is not None:
        return module
    if (run := run_of(key.partition("@")[0])) is not None:
        return run[0]
    owner = call_of(key.partition("@")[0])
    return owner[0] if owner else None


def _r(v: float) -> float:
    return round(float(v), 1)


def view_state(wire: Wire, layout: dict[str, Any], parent: str | None, elements: dict[str, Any],
               edge_labels: dict[str, str]) -> dict[str, Any]:
    """One laid-out view: `nodes` [[element, x, y, w, h]] (centres; a sixth item, {label, members}, where
    the element looks different here: the calls or runs not drawn yet), `boxes` [[module, x1, y1, x2, y2]],
    `edges` [[source, target, classes, [x, y, ...] bends]], `opens` (filled by `fold_states`); what each
    element looks like goes once into `elements`, each edge's slot labels into `edge_labels`."""
    drawn = cytoscape_elements(wire, layout, "norm")
    bounds = box_bounds(layout)
    nodes: list[list[Any]] = []
    boxes, edges = [], []
    for el in drawn:
        d = el["data"]
        if el["group"] == "edges":
            edge_labels.setdefault(f"{d['source']}>{d['target']}", d["label"])
            continue
        look = _look(d, el.get("classes", ""), layout)
        if d["id"] not in elements:
            elements[d["id"]] = look
        if d["kind"] == "box":
            x1, y1, x2, y2 = bounds.get(d["module"], (0.0, 0.0, 0.0, 0.0))
            boxes.append([d["module"], _r(x1), _r(y1), _r(x2), _r(y2)])
            continue
        p = el["position"]
        nodes.append([d["id"], _r(p["x"]), _r(p["y"]), _r(d["w"]), _r(d["h"])])
        if look != elements[d["id"]] or "more" in look["classes"].split():  # the calls or runs left
            nodes[-1].append({"label": look["label"], "title": look["title"], "members": look.get("members", [])})
    for e in layout["edges"]:
        classes = ("up" if e.get("up") else "") + (" merged" if len(e["slots"]) > 1 else "")
        edges.append([e["source"], e["target"], classes.strip(), [_r(c) for pt in e.get("bends") or [] for c in pt]])
    return {"parent": parent, "nodes": nodes, "boxes": boxes, "edges": edges, "opens": {}}


def _look(d: dict[str, Any], classes: str, layout: dict[str, Any]) -> dict[str, Any]:
    """What an element looks like: label, fill, label colour, classes, hover title; a fold's node ids."""
    look = {"label": d["label"], "fill": d.get("fill"), "text": d.get("text_color"), "classes": classes,
            "title": d.get("title", d["label"]), "kind": d["kind"]}
    if d["kind"] in ("module", "call", "run"):
        look["members"] = layout["nodes"][d["id"]].get("members") or []
    if "node" in d:
        look["node"] = d["node"]
    return look
