from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """The tests check the checkout they sit in. `gradscape.tracer` and `gradscape.app` are mapped from
    tracer/ and app/ by the install (pyproject.toml's package-dir): an editable install of another
    checkout would give this checkout's gradscape/ with that checkout's tracer/, so that is refused."""
    import importlib.util

    for name, folder in (("gradscape", "gradscape"), ("gradscape.tracer", "tracer"), ("gradscape.app", "app")):
        spec = importlib.util.find_spec(name)
        where = Path(spec.origin).resolve().parent if spec and spec.origin else None
        if where != ROOT / folder:
            raise pytest.UsageError(f"{name} is imported from {where}, not from {ROOT / folder}: install this "
                                    f"checkout into the environment that runs its tests (pip install -e .)")


@pytest.fixture(autouse=True, scope="session")
def _gradscape_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Files that gradscape writes where no one named a path (a live sink's spill file) go to a
    temporary folder during the tests, not the user's data directory; child processes inherit it."""
    old = os.environ.get("GRADSCAPE_DATA_DIR")
    os.environ["GRADSCAPE_DATA_DIR"] = str(tmp_path_factory.mktemp("gradscape-data"))
    yield
    if old is None:
        os.environ.pop("GRADSCAPE_DATA_DIR", None)
    else:
        os.environ["GRADSCAPE_DATA_DIR"] = old


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Any]:
    """A server on a thread of this process for the breakpoint tests (tests/test_breakpoints*.py): a
    `bp_harness.ThreadServer`; training left running by the test is closed before the server stops."""
    from bp_harness import serve_in_thread

    yield from serve_in_thread(tmp_path)


@pytest.fixture
def worker_factory() -> Iterator[Any]:
    """Start training subprocesses for the breakpoint tests (tests/bp_worker.py); all killed afterwards."""
    from bp_harness import Worker

    made: list[Worker] = []

    def make(*args: str) -> Worker:
        w = Worker(*args)
        made.append(w)
        return w

    yield make
    for w in made:
        w.kill()


@pytest.fixture(params=["native", "python"])
def light_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The light step each monitor of the test makes (NOTE [Native light steps] in
    tracer/monitor/light_native.py): the extension's block, or the Python one."""
    from gradscape.tracer.monitor import light_native
    from gradscape.tracer.record import native

    if request.param == "python":
        monkeypatch.setattr(light_native, "ENABLED", False)
    elif native.extension() is None:
        pytest.skip(f"the native recorder is not in use: {native.status()[1]}")
    return str(request.param)
