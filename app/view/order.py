"""The player's order of a step: every executed node, in the order autograd ran it, with its name and drawn
module by index (`exec_order`), made once per step (`PageData.order`)."""

from __future__ import annotations

from typing import Any

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
    module_code, name_code = index.module_code, index.name_code
    modules: dict[int, int] = {-1: -1}  # module code -> its index here (by first execution)
    names: dict[int, int] = {}
    module_of, name_of = [], []
    for nid in nodes:
        module_of.append(modules.setdefault(module_code[nid], len(modules) - 1))
        name_of.append(names.setdefault(name_code[nid], len(names)))
    del modules[-1]
    return {"run": wire["run"], "rank": int(rank), "step": wire["step"], "nodes": nodes,
            "names": [index.names[c] for c in names], "name_of": name_of,
            "modules": [index.modules[c] for c in modules], "module_of": module_of}


def order_name(order: dict[str, Any], k: int) -> str:
    """The name of the node at execution index `k` of `exec_order`'s order."""
    return str(order["names"][order["name_of"][k]])
