"""Compiled models on a traced step: their regions run eagerly for that step, so the trace has every op.

NOTE [Compiled regions on a traced step]
    Under `torch.compile` a compiled region's backward is one `CompiledFunctionBackward` node: no op of
    the region, no module, no source line, no gradient inside it. So on a step that gradscape traces
    (`Tracer(compiled="eager")`, the default), the block runs under the compiler stance "force_eager"
    (`torch.compiler.set_stance`): every compiled callable entered in the block (`torch.compile(model)`,
    `module.compile()`, a `torch.compile(fn)` called inside `forward`) runs its original Python, and the
    trace is the one an eager step would give, op by op, with the eager step's gradients. The stance
    is put back when the block ends, also when it raises. Untraced steps run compiled as before.

    No compile happens because of it: under "force_eager" dynamo neither compiles nor looks up its
    cache, and an untraced step finds no hook and no mode of ours, so the guards of its cached graphs
    hold (tests/test_compiled.py counts dynamo's compiles over 50 steps against a run without gradscape).
    What it costs: the traced step is an eager step (a compiled model's traced step is slower than its
    untraced ones, by what compiling saved), and its gradients are the eager ones, which may differ from
    the compiled step's by rounding (`Tracer.compare_compiled` measures by how much). The stance is the
    process's, not the thread's: another thread's compiled calls run eagerly for the step's duration too.
    So it is set once for all the traced blocks open at a time: by the first to open, and put back by the last
    to close, whatever order they close in (two Tracers' blocks may overlap without nesting; a stance put back
    by each block would then leave "force_eager" on for the rest of the process).

    `st.meta["compiled"]`: "eager" when at least one compiled callable was entered in the block and ran
    eagerly for the trace (counted through the hook dynamo's wrappers call as they enter,
    `_compat.compiled_entries`); "opaque" when the trace holds a compiled region as one node
    (`Tracer(compiled="opaque")`, which keeps the compiled step bit for bit and compiles once more for
    its traced steps, NOTE [Hooks under torch.compile] in global_hooks.py; or a backward traced after
    a compiled forward already ran, as a loss trigger's). Absent otherwise.

    All this only once the process made a compiled callable (`_compat.compiled_anything`: dynamo keeps
    the backend of each). gradscape never imports dynamo, but torch 2.13 does with the first optimizer
    made, and under "force_eager" every call of a function torch marks dynamo-disabled (an optimizer's
    `step` and `zero_grad`) takes another path, which with the entry hook cost 15–20 µs a traced step on
    the regression program of bench/ (0.1 ms a step) that never compiled. After `torch._dynamo.reset()`
    (which forgets the backends) and before the next compiled callable is made, a traced step runs its
    compiled callables as they are: the trace says "opaque" where a region was compiled.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gradscape.tracer import _compat

log = logging.getLogger(__name__)

COMPILED_MODES = ("eager", "opaque")


class EagerRegions:
    """The stance "force_eager" for one traced block (`start` / `stop`; `stop` is idempotent), and whether a
    compiled callable was entered meanwhile (`entered`)."""

    def __init__(self) -> None:
        self.entered = 0
        self._held = False  # this block counts in `_open`
        self._undo: Any = None

    def start(self) -> None:
        if not _compat.compiled_anything():  # nothing to run eagerly (and nothing of ours on torch's calls)
            return
        with _lock:
            if not _open:
                try:
                    _prior.append(_compat.force_eager())
                except RuntimeError as exc:  # inside a compiled region (a step block in a compiled function)
                    log.warning("gradscape: the traced step could not set torch.compile aside: %s", exc)
                    return
            _open.append(self)
            self._held = True
        self._undo = _compat.compiled_entries(self._count)

    def _count(self) -> None:
        self.entered += 1

    def stop(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()
        with _lock:
            if not self._held:
                return
            self._held = False
            _open.remove(self)
            if not _open:
                _compat.put_stance(_prior.pop())  # the stance the first block found


_lock = threading.Lock()
_open: list[EagerRegions] = []  # the traced blocks open now that hold the stance "force_eager"
_prior: list[Any] = []  # the stance the first of them found (`_compat.force_eager`), put back by the last


def compiled_meta(nodes: Any, regions: EagerRegions | None) -> str | None:
    """`st.meta["compiled"]` of a step (NOTE [Compiled regions on a traced step]), or None to leave it out."""
    if regions is not None and regions.entered:
        return "eager"
    if not _compat.dynamo_loaded():
        return None
    tables = getattr(nodes, "tables", None)  # a natively recorded step: its kind column, no NodeTrace made
    kinds = tables.kinds if tables is not None else (n.kind for n in nodes)
    return "opaque" if "compiled" in kinds else None
