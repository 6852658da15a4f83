"""The player's order of a step: every executed node, in the order autograd ran it, with its name and drawn
module by index (`exec_order`), made once per step (`PageData.order`)."""

from __future__ import annotations

from typing import Any

from gradscape.app.view.step_fields import node_module
from gradscape.tracer.wire import WireStep


def exec_order(wire: WireStep, rank: int = 0) -> dict[str, Any]:
    """Per execution index: the node id, its name (an index into `names`, the step's distinct names) and its
    drawn module (an index into `modules`, -1 at the top level); with the run, rank and step it belongs to
    (the player selects its current node there, in the browser). The same for every fold of the step: the
    browser finds the element that shows each node (itself, or the outermost folded module around it:
    `drawnElements` in assets/player.js). Names and modules go by index: a 100k-node step's order was
    2.4 MB of the page's first payload with every name spelled out, 1.3 MB so."""
    nodes = [nid for nid, _run in wire["execution"]]
    modules: dict[str, int] = {}
    names: dict[str, int] = {}
    module_of, name_of = [], []
    for nid in nodes:
        node = wire["nodes"][nid]
        module = node_module(node)
        module_of.append(-1 if module is None else modules.setdefault(module, len(modules)))
        name_of.append(names.setdefault(node["name"], len(names)))
    return {"run": wire["run"], "rank": int(rank), "step": wire["step"], "nodes": nodes, "names": list(names),
            "name_of": name_of, "modules": list(modules), "module_of": module_of}


def order_name(order: dict[str, Any], k: int) -> str:
    """The name of the node at execution index `k` of `exec_order`'s order."""
    return str(order["names"][order["name_of"][k]])
