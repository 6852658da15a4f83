"""gradscape: a visual debugger for the PyTorch backward pass. This module is the public API.

    import gradscape
    tr = gradscape.Tracer(model, sink="run.sqlite")
    with tr.step(i) as st:
        loss = loss_fn(model(x), y)
        loss.backward()

The package is built from three folders (pyproject.toml's package-dir): this one (this module, `__main__`
for `python -m gradscape`, and `integrations`, the framework callbacks), tracer/ as `gradscape.tracer`
and app/ as `gradscape.app` (docs/architecture.md).
"""

from typing import TYPE_CHECKING, Any

from gradscape.tracer._model import (
    HTML_RENDERERS,
    STAT_NAMES,
    BackwardPass,
    ModuleCall,
    ModuleTrace,
    NodeRun,
    NodeTrace,
    OptimizerStep,
    Problem,
    StepTrace,
    TensorTrace,
)
from gradscape.tracer.sinks.base import Sink
from gradscape.tracer.sinks.file import FileSink
from gradscape.tracer.sinks.memory import MemorySink
from gradscape.tracer.store import StoreError, TraceStore, load
from gradscape.tracer.wire import TraceFormatError

if TYPE_CHECKING:
    from gradscape.app.notebook import show
    from gradscape.tracer.monitor.triggers import Triggers
    from gradscape.tracer.tracing import Tracer, trace


def _html_inline(st: StepTrace) -> str:
    """`StepTrace._repr_html_`: the notebook's display (app/export/inline.py), of the form the trace file keeps
    (`page_form`)."""
    from gradscape.app.export.inline import step_html_inline
    from gradscape.tracer.step_doc import page_form

    return step_html_inline(page_form(st, arrays=False)[0])


def _html_file(st: StepTrace, path: Any) -> Any:
    """`StepTrace.to_html`: the offline page (app/export/html.py)."""
    from gradscape.app.export.html import write_html

    return write_html(st, path)


# The model (tracer/_model.py) draws no HTML itself: the app does, a layer above it (docs/architecture.md).
HTML_RENDERERS.update(inline=_html_inline, file=_html_file)


def __getattr__(name: str) -> Any:
    # torch is imported with the tracer itself, not with the schema and the store: the server's view
    # layer reads traces without paying torch's import (about 2 s).
    if name in ("Tracer", "trace"):
        from gradscape.tracer import tracing

        return getattr(tracing, name)
    if name == "show":  # a server and Dash are imported only when a notebook asks for the page
        from gradscape.app.notebook import show

        return show
    if name == "Triggers":  # the monitor's triggers (tracer/monitor/triggers.py), imported with torch
        from gradscape.tracer.monitor import triggers

        return triggers.Triggers
    raise AttributeError(f"module 'gradscape' has no attribute {name!r}")


__all__ = [
    "STAT_NAMES",
    "BackwardPass",
    "FileSink",
    "MemorySink",
    "ModuleCall",
    "ModuleTrace",
    "NodeRun",
    "NodeTrace",
    "OptimizerStep",
    "Problem",
    "Sink",
    "StepTrace",
    "StoreError",
    "TensorTrace",
    "TraceFormatError",
    "TraceStore",
    "Tracer",
    "Triggers",
    "load",
    "show",
    "trace",
]
__version__ = "0.1.0"
