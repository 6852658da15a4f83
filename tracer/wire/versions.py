"""The wire version, and what a field an earlier writer of that version left out means.

Files written by an earlier release of the same wire version can lack fields added since (`problems`,
`not_in_step`, `rank`, `world_size`, `trigger`, `optimizer_steps`); `step_from_wire` takes each absence to
mean the default here, and `with_defaults` fills them in so that every reader can index every key of the types
in `wire.types`.
"""

from __future__ import annotations

from typing import Any, cast

from gradscape.tracer.wire.types import WireStep

WIRE_VERSION = 1

_STEP_DEFAULTS: dict[str, Any] = {"error": None, "meta": dict, "modules": dict, "params": dict, "passes": list,
                                  "execution": list, "problems": list, "not_in_step": list, "rank": None,
                                  "world_size": None, "trigger": None, "optimizer_steps": list}
_NODE_DEFAULTS: dict[str, Any] = {"kind": "op", "module": None, "param": None, "source": None, "schema": None,
                                  "order": None, "labels": list, "args": list, "in_shapes": list, "out_shapes": list,
                                  "out_dtypes": list, "gi": None, "go": None, "t": None, "runs": list}
_TENSOR_DEFAULTS: dict[str, Any] = {"view": "", "device": "cpu"}
_MODULE_DEFAULTS: dict[str, Any] = {"type": "", "params": list, "calls": list}


def _set_missing(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Give every key of `defaults` that `d` lacks its default (a fresh one where the default is a type)."""
    for k, v in defaults.items():
        if k not in d:
            d[k] = v() if isinstance(v, type) else v


def with_defaults(d: dict[str, Any]) -> WireStep:
    """A step as stored (checked when it was written, `TraceStore.read_graph`), with every field an
    earlier writer left out set to what `step_from_wire` takes its absence to mean. In place; cheap
    when nothing is missing (one look at the first node, tensor and module)."""
    _set_missing(d, _STEP_DEFAULTS)
    for items, defaults in ((d.get("nodes") or [], _NODE_DEFAULTS), (d.get("tensors") or [], _TENSOR_DEFAULTS),
                            (list(d["modules"].values()), _MODULE_DEFAULTS)):
        if items and not all(k in items[0] for k in defaults):
            for x in items:
                _set_missing(x, defaults)
    return cast(WireStep, d)  # every WireStep key is now present
