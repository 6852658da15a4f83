"""The every-step monitor and its triggers: a history row for every step in `tr.step(i)`, traced or
not; traces of the steps that go wrong; the gradients each optimizer really stepped with.

    models.py    several models for one Tracer (a list, tuple or dict of modules)
    installed.py what a block installs: two global optimizer hooks, and the backward calls, GradScaler's
                 unscale and the clipping wrapped (tracer/record/patched_calls.py)
    capture.py   what a full step's block sees: losses, norms before/after clipping, GradScaler, optimizer steps
    light.py     a light step's block: its losses and GradScaler's skip, nothing else (NOTE [Light steps])
    light_native.py the light step as the extension's block, where it is built (NOTE [Native light steps])
    light_rows.py light steps' rows, joining the history in batches under the rules' quiet bounds (NOTE [Light rows])
    grad_norms.py the norms of a list of gradients, in one fused call
    stepped.py   what an optimizer stepped with: its gradients and their norms
    arrival_norms.py the norms after a backward read from the arrivals' summaries, on a traced step
    lazy.py      numbers read without waiting on the device
    rows.py      a step's history row
    kept_rows.py the rows kept in memory and not yet written, light rows compact until read (NOTE [Kept rows])
    sampling.py  the full steps (the gradient norms) every k-th step, k from the measured cost (NOTE [Sampled norms])
    superseded.py the norms after a backward the next backward supersedes, left untaken (NOTE [Superseded norms])
    triggers.py  the triggers, their rules, thresholds and caps
    problems.py  the monitor's problems (spikes, skipped AMP steps)
    full.py      the context of a full step (its capture, its trace)
    monitor.py   one Tracer's monitor: which kind each step is, its rows, the triggers
"""

from gradscape.tracer.monitor.full import MonitoredStep
from gradscape.tracer.monitor.models import as_module
from gradscape.tracer.monitor.monitor import Monitor
from gradscape.tracer.monitor.triggers import TRIGGERS, Triggers

__all__ = ["TRIGGERS", "Monitor", "MonitoredStep", "Triggers", "as_module"]
