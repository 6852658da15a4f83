"""The problems panel's data: a step's `problems` (see docs/problems.md) as lines to show. No Dash."""

from __future__ import annotations

from typing import Any

KIND_LABELS = {
    "nonfinite_forward": "NaN/Inf born in the forward",
    "nonfinite_loss": "non-finite loss",
    "nonfinite_backward": "NaN/Inf born in the backward",
    "no_grad": "no gradient",
    "exploding": "exploding gradient",
    "vanishing": "vanishing gradient",
    "dead": "dead ReLU",
}


def problem_lines(wire: dict[str, Any] | None) -> dict[str, Any]:
    """`{"count", "badge", "lines"}` for a step's wire form; each line has `k` (its position), `kind`,
    `label`, `message`, `node` (an id that exists in the step, else None), `node_name` and `source`."""
    problems = (wire or {}).get("problems") or []
    n_nodes = len((wire or {}).get("nodes") or [])
    lines = []
    for k, p in enumerate(problems):
        node = p.get("node")
        if not isinstance(node, int) or not 0 <= node < n_nodes:
            node = None
        lines.append({"k": k, "kind": p.get("kind", ""), "label": KIND_LABELS.get(p.get("kind", ""), p.get("kind", "")),
                      "message": p.get("message", ""), "node": node, "source": p.get("source"),
                      "node_name": wire["nodes"][node]["name"] if wire is not None and node is not None else None})
    count = len(lines)
    badge = "no problems found" if count == 0 else f"{count} problem" + ("s" if count > 1 else "")
    return {"count": count, "badge": badge, "lines": lines}
