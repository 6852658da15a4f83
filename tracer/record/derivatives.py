"""Backward node class name → forward op schema and the names of its differentiable arguments.

The source of truth is torchgen's `derivatives.yaml`, shipped inside every torch wheel: it is what
the installed torch generated its `XxxBackwardN` classes from, so `args_with_derivatives` are exactly
the slots of `next_functions`, in order. Loading it takes seconds and needs pyyaml, so the table is
built once per torch version and kept as JSON: the one for the torch this project pins ships in
`tracer/data/`, others are built on first use into the user's cache directory.

Run `python -m gradscape.tracer.record.derivatives` to (re)build the shipped table for the installed torch.
"""

from __future__ import annotations

import json
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_DATA = Path(__file__).parent.parent / "data"  # tracer/data


def _torch_version() -> str:
    return torch.__version__.split("+")[0]


def build_table() -> dict[str, dict[str, Any]]:
    """Read torchgen's derivatives.yaml: {node name: {"schema": str, "args": [str], "list": [bool]}}."""
    import torchgen
    from torchgen.packaged.autograd.load_derivatives import load_derivatives

    pkg = os.path.join(os.path.dirname(torchgen.__file__), "packaged")
    infos, _ = load_derivatives(
        f"{pkg}/autograd/derivatives.yaml",
        f"{pkg}/ATen/native/native_functions.yaml",
        f"{pkg}/ATen/native/tags.yaml",
    )
    table: dict[str, dict[str, Any]] = {}
    for per_dispatch in infos.values():
        for info in per_dispatch.values():
            if not info.op or info.op in table:
                continue
            args = info.args_with_derivatives
            table[info.op] = {
                "schema": str(info.func.func),
                "args": [a.name for a in args],
                "list": ["TensorList" in str(a.type) or "ITensorListRef" in str(a.type) for a in args],
            }
    return table


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradscape"


@lru_cache(maxsize=1)
def derivatives_table() -> dict[str, dict[str, Any]]:
    """The table for the installed torch; an empty dict (generic labels) if it cannot be had."""
    name = f"derivatives-{_torch_version()}.json"
    for path in (_DATA / name, _cache_dir() / name):
        if path.exists():
            try:
                return dict(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("gradscape: unreadable derivatives table %s: %s", path, exc)
    try:
        table = build_table()
    except Exception as exc:  # torchgen or pyyaml missing, or a torch whose layout differs
        log.warning("gradscape: cannot read torch's derivatives table (%s); slots get generic labels", exc)
        shipped = sorted(_DATA.glob("derivatives-*.json"))
        return dict(json.loads(shipped[-1].read_text())) if shipped else {}
    try:
        out = _cache_dir() / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(table, sort_keys=True))
    except OSError as exc:
        log.info("gradscape: could not cache the derivatives table: %s", exc)
    return table


if __name__ == "__main__":
    _DATA.mkdir(exist_ok=True)
    target = _DATA / f"derivatives-{_torch_version()}.json"
    target.write_text(json.dumps(build_table(), sort_keys=True, separators=(",", ":")))
    print(f"wrote {target}")
