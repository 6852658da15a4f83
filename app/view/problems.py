"""The problems panel's data: a step's `problems` (see docs/problems.md) as lines to show. No Dash."""

from __future__ import annotations

from typing import Any

from gradscape.tracer.wire import WireStep

KIND_LABELS = {
    "nonfinite_forward": "NaN/Inf born in the forward",
    "nonfinite_loss": "non-finite loss",
    "nonfinite_backward": "NaN/Inf born in the backward",
    "no_grad": "no gradient",
    "exploding": "exploding gradient",
    "vanishing": "vanishing gradient",
    "dead": "dead ReLU",
}


def problem_lines(wire: WireStep | None) -> dict[str, Any]:
    """`{"count", "badge", "lines", "not_in_step"}` for a step's wire form; each line has `k` (its position),
    `kind`, `label`, `message`, `node` (an id that exists in the step, else None), `node_name` and `source`;
    `not_in_step` is the one quiet line for the parameters whose modules took no part in the step (no
    problem: docs/problems.md), or None."""
    if wire is None:
        return {"count": 0, "badge": "no problems found", "lines": [], "not_in_step": None}
    nodes = wire["nodes"]
    lines = []
    for k, p in enumerate(wire["problems"]):
        node = p["node"]
        if not isinstance(node, int) or not 0 <= node < len(nodes):
            node = None
        lines.append({"k": k, "kind": p["kind"], "label": KIND_LABELS.get(p["kind"], p["kind"]),
                      "message": p["message"], "node": node, "source": p["source"],
                      "node_name": None if node is None else nodes[node]["name"]})
    count = len(lines)
    badge = "no problems found" if count == 0 else f"{count} problem" + ("s" if count > 1 else "")
    absent = wire.get("not_in_step") or []
    quiet = f"not in this step (their modules took no part in its forward): {', '.join(absent)}" if absent else None
    return {"count": count, "badge": badge, "lines": lines, "not_in_step": quiet}
