"""`PageData`, the page's one source: a step asked for by several callbacks at once is decoded once,
and the layer rows of the step on screen come from its decoded graph, on a real SQLite trace."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gradscape
from gradscape.app.data import PageData
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import WireStep


class CountingStore(TraceStore):
    """A real store that counts its graph reads, and holds the first one until told (`release`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0
        self.first_read = threading.Event()
        self.release = threading.Event()

    def read_indexed(self, run: str, step: int, rank: int = 0) -> WireStep:  # the page's read of a step
        self.reads += 1
        self.first_read.set()
        assert self.release.wait(30)
        return super().read_indexed(run, step, rank)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    with gradscape.Tracer(model, run="r", sink=str(tmp_path / "t.sqlite")) as tr:
        for i in range(2):
            with tr.step(i):
                model(torch.randn(4, 3)).sum().backward()
    return CountingStore(tmp_path / "t.sqlite")


def waiting_in(threads: list[threading.Thread], function: str) -> bool:
    """True when every thread is inside `function` of app/data.py (a waiter, not a reader)."""
    frames = sys._current_frames()
    for t in threads:
        f: Any = frames.get(t.ident or -1)
        names = []
        while f is not None:
            if Path(f.f_code.co_filename).parts[-2:] == ("app", "data.py"):
                names.append(f.f_code.co_name)
            f = f.f_back
        if function not in names:
            return False
    return True


def ask_together(data: PageData, store: CountingStore, ask: Any, n: int = 4) -> list[Any]:
    """`ask()` from `n` threads at once: the first one reads, the others arrive while it is held."""
    out: list[Any] = [None] * n

    def run(k: int) -> None:
        try:
            out[k] = ask()
        except Exception as exc:  # the test looks at what each caller got
            out[k] = exc
    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert store.first_read.wait(30)
    others = [threading.Thread(target=run, args=(k,)) for k in range(1, n)]
    for t in others:
        t.start()
    deadline = time.monotonic() + 30
    while not waiting_in(others, "wait") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting_in(others, "wait"), "the other callers never waited for the first one's read"
    store.release.set()
    for t in [first, *others]:
        t.join(30)
    return out


def test_a_step_asked_for_at_once_is_read_once(store: CountingStore) -> None:
    data = PageData(store)
    got = ask_together(data, store, lambda: data.graph("r", 1))
    assert store.reads == 1
    assert all(g is got[0] for g in got) and got[0]["step"] == 1
    assert data.graph("r", 1) is got[0] and store.reads == 1  # and kept


def test_a_failed_read_reaches_every_caller_and_is_not_kept(store: CountingStore) -> None:
    data = PageData(store)
    got = ask_together(data, store, lambda: data.graph("r", 7))
    assert store.reads == 1
    assert all(isinstance(g, StoreError) and "no step 7" in str(g) for g in got)
    with pytest.raises(StoreError):
        data.graph("r", 7)  # asked again: read again, not a kept failure
    assert store.reads == 2


def test_the_flow_reads_the_shown_step_through_its_decoded_graph(store: CountingStore) -> None:
    store.release.set()
    data = PageData(store)
    data.graph("r", 1)
    assert store.reads == 1
    flow = data.flow_over_steps("r", 1)
    assert store.reads == 2  # step 0 read for its layer rows; step 1 was decoded already
    assert flow == PageData(TraceStore(store.path)).flow_over_steps("r", 1)



def test_big_decoded_steps_are_let_go_past_the_node_budget(store: CountingStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import gradscape.app.data as page_data

    store.release.set()
    data = PageData(store)
    nodes = len(data.graph("r", 0)["nodes"])
    data.graph("r", 1)
    data.graph("r", 0)
    assert store.reads == 2  # both kept: far under the budget
    monkeypatch.setattr(page_data, "MAX_KEPT_NODES", nodes + 1)  # room for one of them
    data = PageData(store)
    data.graph("r", 0)
    data.graph("r", 1)  # step 0 is let go for it
    data.graph("r", 1)
    assert store.reads == 4
    data.graph("r", 0)
    assert store.reads == 5
