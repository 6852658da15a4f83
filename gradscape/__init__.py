"""gradscape: a visual debugger for the PyTorch backward pass. This module is the public API.

    import gradscape
    tr = gradscape.Tracer(model, sink="run.sqlite")
    with tr.step(i) as st:
        loss = loss_fn(model(x), y)
        loss.backward()
"""

from typing import TYPE_CHECKING, Any

from gradscape.tracer._model import (
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
    from gradscape.tracer.record.tracer import Tracer, trace


def __getattr__(name: str) -> Any:
    # torch is imported with the tracer itself, not with the schema and the store: the server's view
    # layer reads traces without paying torch's import (about 2 s).
    if name in ("Tracer", "trace"):
        from gradscape.tracer.record import tracer

        return getattr(tracer, name)
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
