"""The player's order of a step: every executed node, in the order autograd ran it, with its name and drawn
module by index (`exec_order`), made once per step (`PageData.order`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.app.view.step_fields import step_index
from gradscape.tracer.wire import WireStep


def exec_order(wire: WireStep, rank: int = 0) -> dict[str, Any]:
    """Per execution index: the node id, its name (an index into `names`, the step's distinct names) and its
    drawn module (an index into `modules`, -1 at the top level); with the run, rank and step it belongs to
    (the player selects its current node there, in the browser). The same for every fold of the step: the
    browser finds the element that shows each node (itself, or the outermost folded module around it:
    `drawnElements` in assets/player.js). Names and modules go by index: a 100k-node step's order was
    2.4 MB of the page's first payload with every name spelled out, 1.3 MB so."""
    nodes = [nid for nid, _run in wire["execution"]]
    index = step_index(wire)
    ran = np.asarray(nodes, dtype=np.int64)
    names, name_of = _by_first(np.asarray(index.name_code, dtype=np.int64)[ran])
    module_code = np.asarray(index.module_code, dtype=np.int64)[ran]
    inside = module_code >= 0  # the top level (-1) stays -1
    modules, codes = _by_first(module_code[inside])
    module_of = np.full(len(nodes), -1, dtype=np.int64)
    module_of[inside] = codes
    return {"run": wire["run"], "rank": int(rank), "step": wire["step"], "nodes": nodes,
            "names": [index.names[c] for c in names], "name_of": name_of.tolist(),
            "modules": [index.modules[c] for c in modules], "module_of": module_of.tolist()}


def _by_first(codes: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The distinct `codes` in the order they first appear, and each code's position in that list."""
    distinct, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    by_first = np.argsort(first)
    position = np.empty(len(distinct), dtype=np.int64)
    position[by_first] = np.arange(len(distinct))
    return distinct[by_first].tolist(), position[inverse.reshape(-1)]


def order_name(order: dict[str, Any], k: int) -> str:
    """The name of the node at execution index `k` of `exec_order`'s order."""
    return str(order["names"][order["name_of"][k]])
