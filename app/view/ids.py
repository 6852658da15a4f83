"""The graph's element ids, made and read here only (the page's scripts get the prefixes from `table`):

    n12          node 12 of the step (a wire node id)
    m:blocks.3   a folded module, drawn as one node
    g:blocks.3   the box of an expanded module (a compound parent); `g:cell#17`, the box of call 17 of
                 `cell` opened into its ops (inside `g:cell`)
    c:cell#17    call 17 (of 1, 2, ...) of module `cell`, folded (a module opened into its calls:
                 app/view/calls.py)
    c:cell#more  the calls of `cell` not drawn yet, as one node: a click draws the next ones
    o:scan#0.3   run 3 (of 1, 2, ...) of the ops drawn in box `scan`, folded: a box of over a thousand
                 ops draws them in runs of `op_runs.RUN_OPS` (100), in the order backward ran them (of the
                 module's own ops: call 0; of its call 17 opened into ops, in that call's box:
                 `o:scan#17#17.3`; app/view/op_runs.py)
    o:scan#0.more  the runs of box `scan` not drawn yet, as one node: a click draws the next ones

The layout (app/view/collapse.py), the elements, the search and the page's callbacks all make and read
them through the functions below.
"""

from __future__ import annotations

NODE_PREFIX = "n"
MODULE_PREFIX = "m:"
BOX_PREFIX = "g:"
CALL_PREFIX = "c:"
RUN_PREFIX = "o:"
MORE = "more"


def node_element(node_id: int) -> str:
    return f"{NODE_PREFIX}{int(node_id)}"


def module_element(module: str) -> str:
    return MODULE_PREFIX + module


def box_element(module: str) -> str:
    return BOX_PREFIX + module


def call_element(module: str, call: int) -> str:
    """Call `call` (counted from 1) of `module`, folded."""
    return f"{CALL_PREFIX}{module}#{int(call)}"


def more_element(module: str) -> str:
    """The calls of `module` not drawn yet."""
    return f"{CALL_PREFIX}{module}#{MORE}"


def call_of(element: str) -> tuple[str, int | None] | None:
    """`"c:cell#17"` → `("cell", 17)`, `"c:cell#more"` → `("cell", None)`; None for any other element."""
    if not element.startswith(CALL_PREFIX) or "#" not in element:
        return None
    module, _, which = element[len(CALL_PREFIX):].rpartition("#")
    if which == MORE:
        return module, None
    return (module, int(which)) if which.isdigit() else None


def run_element(box: str, call: int, run: int) -> str:
    """Run `run` (counted from 1; 0: the runs not drawn yet) of the ops drawn in box `box`: its own (`call` 0)
    or call `call`'s."""
    return f"{RUN_PREFIX}{box}#{int(call)}.{int(run) if run else MORE}"


def run_of(element: str) -> tuple[str, int, int] | None:
    """`"o:scan#0.3"` → `("scan", 0, 3)`, `"o:scan#0.more"` → `("scan", 0, 0)`; None for any other element."""
    if not element.startswith(RUN_PREFIX) or "#" not in element:
        return None
    box, _, which = element[len(RUN_PREFIX):].rpartition("#")
    call, dot, run = which.partition(".")
    if not dot or not call.isdigit() or not (run.isdigit() or run == MORE):
        return None
    return box, int(call), int(run) if run != MORE else 0


def node_of(element: str) -> int | None:
    """`"n12"` → 12; None for any other element (a module, a box, an edge)."""
    digits = element[len(NODE_PREFIX):]
    return int(digits) if element.startswith(NODE_PREFIX) and digits.isdigit() else None


def module_of(element: str) -> str | None:
    """`"m:blocks.3"` → `"blocks.3"`; None for any other element."""
    return element[len(MODULE_PREFIX):] if element.startswith(MODULE_PREFIX) else None


def box_of(element: str) -> str | None:
    """`"g:blocks.3"` → `"blocks.3"`; None for any other element."""
    return element[len(BOX_PREFIX):] if element.startswith(BOX_PREFIX) else None


def node_index(ref: str | int) -> int:
    """`"n12"`, `"12"` or `12` → 12; ValueError for anything else."""
    if isinstance(ref, int):
        return ref
    found = node_of(ref)
    if found is not None:
        return found
    if ref.isdigit():
        return int(ref)
    raise ValueError(f"{ref!r} is not a node id (expected 'n<int>')")


def table() -> dict[str, str]:
    """The prefixes, for the page's scripts (`window.gradscape.elements`)."""
    return {"node": NODE_PREFIX, "module": MODULE_PREFIX, "box": BOX_PREFIX, "call": CALL_PREFIX, "run": RUN_PREFIX}
