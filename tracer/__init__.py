"""gradscape's tracer: record the autograd graph and every gradient of a real training step.

    import tracer
    tr = tracer.Tracer(model, sink="run.sqlite")
    with tr.step(i) as st:
        loss = loss_fn(model(x), y)
        loss.backward()
"""

from tracer._codec import TraceFormatError
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
from tracer._tracer import Tracer, trace
from tracer.store import StoreError, TraceStore, load

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
