"""What the page reads: decoded steps, their layouts, search indexes and gradient flow over steps, from the
trace store, each in a small LRU keyed by (run, step, rank) (a step is decoded once however many
callbacks ask for it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from gradscape.app import view
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import WireStep

MAX_STEPS_OVER_TIME = 30


class UIData:
    """Reads for the page, with a small LRU of decoded step graphs and their layouts. Every entry is
    keyed by (run, step, rank): the ranks of one step are different traces (their own batches)."""

    def __init__(self, store: TraceStore, size: int = 6) -> None:
        self.store = store
        self.size = size
        self._graphs: OrderedDict[tuple[str, int, int], WireStep] = OrderedDict()
        self._layouts: OrderedDict[tuple[str, int, int, tuple[str, ...] | None], dict[str, Any]] = OrderedDict()
        self._flows: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._search: OrderedDict[tuple[str, int, int], list[dict[str, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def _lru(self, cache: OrderedDict[Any, Any], key: Any, make: Any) -> Any:
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with self._lock:
            cache[key] = value
            while len(cache) > self.size:
                cache.popitem(last=False)
        return value

    def graph(self, run: str, step: int, rank: int = 0) -> WireStep:
        return self._lru(self._graphs, (run, int(step), int(rank)),
                         lambda: self.store.read_graph(run, int(step), int(rank)))

    def search_index(self, run: str, step: int, rank: int = 0) -> list[dict[str, str]]:
        return self._lru(self._search, (run, int(step), int(rank)),
                         lambda: view.search_index(self.graph(run, step, rank)))

    def flow_over_steps(self, run: str, step: int, rank: int = 0) -> dict[str, Any]:
        """Per-layer gradient norm over the rank's last steps up to `step`: read once per (run, step,
        rank), not on every node click (it decodes up to MAX_STEPS_OVER_TIME stored steps)."""
        def make() -> dict[str, Any]:
            steps = [s["step"] for s in self.store.steps(run, int(rank)) if s["step"] <= step][-MAX_STEPS_OVER_TIME:]
            return view.norm_over_steps([self.store.read_graph(run, s, int(rank)) for s in steps])
        return self._lru(self._flows, (run, int(step), int(rank)), make)

    def layout(self, run: str, step: int, collapsed: list[str] | None, rank: int = 0) -> dict[str, Any]:
        key = (run, int(step), int(rank), None if collapsed is None else tuple(sorted(collapsed)))
        return self._lru(self._layouts, key, lambda: view.layout_graph(self.graph(run, step, rank), collapsed))
