"""Where gradscape writes files that the user did not name: a per-user data directory
(platformdirs: ~/.local/share/gradscape on Linux, ~/Library/Application Support/gradscape on macOS,
%LOCALAPPDATA%\\gradscape on Windows), or GRADSCAPE_DATA_DIR when set."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """The per-user data directory (not created here)."""
    env = os.environ.get("GRADSCAPE_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir("gradscape", appauthor=False))


def spill_dir() -> Path:
    """Where a live sink spills the steps its server did not take."""
    return data_dir() / "spill"


def spill_path(run: str) -> str:
    """The default spill file of a run; its directory is created when it can be (when it cannot, the
    sink's first spill fails, is counted as dropped and logged: training is never interrupted)."""
    folder = spill_dir()
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run) or "run"
    return str(folder / f"gradscape-spill-{safe}.sqlite")
