"""What the tracer uses on this machine, for problem reports (`gradscape doctor`, app/cli.py): the torch
releases it is tested with, what summarises gradients and records node hooks, and where spill files go.
Code outside the tracer reads these here, not from the private modules that own them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gradscape.tracer import _compat
from gradscape.tracer.record import native as _recorder
from gradscape.tracer.sinks import paths as _paths
from gradscape.tracer.summary import kernel as _native


@dataclass(frozen=True)
class Environment:
    tested_torch: str  # the torch releases gradscape is tested with, e.g. "2.9 to 2.14"
    summariser: str  # "native", or "torch (why)"
    kernel: Path | None  # the summary kernel's file when it is in use
    recorder: str  # "native (FILE)", or "python (why)": what records a step's node hooks
    spill_dir: Path  # where a live sink spills the steps its server did not take


def environment() -> Environment:
    """The tracer's environment as it is now (loading the summary kernel and the native recorder if that
    has not happened yet)."""
    used, why = _recorder.status()
    recorder = f"native ({_recorder.path()})" if used else f"python ({why})"
    return Environment(tested_torch=_compat.tested_range(), summariser=_native.summariser(),
                       kernel=_native.kernel_path(), recorder=recorder, spill_dir=_paths.spill_dir())
