from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "store.sqlite").start()
    yield srv
    srv.stop()
