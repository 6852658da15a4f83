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
from gradscape.tracer._sinks import FileSink, MemorySink, Sink
from gradscape.tracer.store import StoreError, TraceStore, load
from gradscape.tracer.wire import TraceFormatError

if TYPE_CHECKING:
    from gradscape.tracer._tracer import Tracer, trace
    from gradscape.tracer.monitor.triggers import Triggers


def __getattr__(name: str) -> Any:
    # torch is imported with the tracer itself, not with the schema and the store: the server's view
    # layer reads traces without paying torch's import (about 2 s).
    if name in ("Tracer", "trace"):
        from gradscape.tracer import _tracer

        return getattr(_tracer, name)
    if name == "Triggers":  # the monitor's triggers (tracer/monitor/triggers.py)
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
    "trace",
]
__version__ = "0.1.0"
