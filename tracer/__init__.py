"""gradscape's tracer: record the autograd graph and every gradient of a real training step.

    import tracer
    tr = tracer.Tracer(model, sink="run.sqlite")
    with tr.step(i) as st:
        loss = loss_fn(model(x), y)
        loss.backward()
"""

from typing import TYPE_CHECKING, Any

from tracer._model import (
    STAT_NAMES,
    BackwardPass,
    ModuleCall,
    ModuleTrace,
    NodeRun,
    NodeTrace,
    Problem,
    StepTrace,
    TensorTrace,
)
from tracer._sinks import FileSink, MemorySink, Sink
from tracer.store import StoreError, TraceStore, load
from tracer.wire import TraceFormatError

if TYPE_CHECKING:
    from tracer._tracer import Tracer, trace


def __getattr__(name: str) -> Any:
    # torch is imported with the tracer itself, not with the schema and the store: the server's view
    # layer reads traces without paying torch's import (about 2 s).
    if name in ("Tracer", "trace"):
        from tracer import _tracer

        return getattr(_tracer, name)
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")


__all__ = [
    "STAT_NAMES",
    "BackwardPass",
    "FileSink",
    "MemorySink",
    "ModuleCall",
    "ModuleTrace",
    "NodeRun",
    "NodeTrace",
    "Problem",
    "Sink",
    "StepTrace",
    "StoreError",
    "TensorTrace",
    "TraceFormatError",
    "TraceStore",
    "Tracer",
    "load",
    "trace",
]
__version__ = "0.1.0"
