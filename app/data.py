"""The one source the page's callbacks read (`PageData`): the stored steps (runs, steps, ranks, decoded
graphs, their layouts, the marks their elements show, search indexes, arrays, gradient flow over steps,
the monitor's history), each decoded step and what is derived from it kept in a small LRU keyed by (run,
step, rank), so it is decoded once however many callbacks ask for it; and the paused state of a run
stopped at a breakpoint
(`paused_node`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from gradscape.app import view
from gradscape.app.serving.state import DebugState
from gradscape.app.step_flags import StepFlags
from gradscape.tracer.collector import made_frozen
from gradscape.tracer.store import RunInfo, TraceStore
from gradscape.tracer.wire import TensorArrays, WireStep
from gradscape.tracer.wire.lazy import decode_all_with

MAX_STEPS_OVER_TIME = 30
# decoded graphs kept, in nodes over all of them (the newest is always kept): a 100k-node step decodes to
# about 500 MB and 2.3 million objects: six of them would be 3 GB, and 14 million objects for every full
# collection of the garbage collector to walk
MAX_KEPT_NODES = 250_000


class _Making:
    """A value one caller is making, that others wait for (`PageData._lru`)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def done(self, value: Any) -> None:
        self._value = value
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    def wait(self) -> Any:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._value


class PageData:
    """Reads for the page, with a small LRU of decoded step graphs and their layouts. Every entry is
    keyed by (run, step, rank): the ranks of one step are different traces (their own batches). A read
    of a step the store does not have raises `StoreError`. `freeze`: decoded graphs are frozen out of the
    garbage collector's reach (`made_frozen`, NOTE [Kept frozen]); only where the process is the server's."""

    def __init__(self, store: TraceStore, debug: DebugState | None = None, size: int = 6,
                 freeze: bool = False, flags: StepFlags | None = None) -> None:
        self.store = store
        # each step's trigger and problem count (the server's, shared with its JSON API), read through the
        # graphs kept here when one is (the step the page opens on is read once, for both)
        self.flags = flags or StepFlags(store)
        self.flags.read = self._flag_read
        self.freeze = freeze
        self.debug = debug or DebugState()
        self.size = size
        self._graphs: OrderedDict[tuple[str, int, int], WireStep] = OrderedDict()
        self._layouts: OrderedDict[tuple[str, int, int, tuple[str, ...] | None], dict[str, Any]] = OrderedDict()
        self._flows: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._flow_rows: OrderedDict[tuple[str, int, int], list[dict[str, Any]]] = OrderedDict()
        self._search: OrderedDict[tuple[str, int, int], view.SearchTable] = OrderedDict()
        self._orders: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._marks: OrderedDict[tuple[str, int, int, str], view.StepMarks] = OrderedDict()
        self._making: dict[tuple[int, Any], _Making] = {}  # misses being made, per (cache, key)
        self._lock = threading.Lock()

    def _lru(self, cache: OrderedDict[Any, Any], key: Any, make: Any, size: int | None = None) -> Any:
        """`cache[key]`, made by `make()` on a miss. Callers that miss the same key at once wait for the
        first one's value rather than each making it: the page asks for a new step from several callbacks
        together, and a 100k-node step took 2 s to decode each time."""
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
            pending = self._making.get((id(cache), key))
            if pending is None:
                self._making[(id(cache), key)] = pending = _Making()
                mine = True
            else:
                mine = False
        if not mine:
            return pending.wait()
        try:
            value = make()
        except BaseException as exc:
            with self._lock:
                del self._making[(id(cache), key)]
            pending.fail(exc)
            raise
        with self._lock:
            del self._making[(id(cache), key)]
            cache[key] = value
            while len(cache) > (size or self.size) or (cache is self._graphs and len(cache) > 1 and
                                                        sum(len(w["nodes"]) for w in cache.values()) > MAX_KEPT_NODES):
                cache.popitem(last=False)
        pending.done(value)
        return value

    def _flag_read(self, run: str, step: int, rank: int) -> WireStep:
        key = (run, int(step), int(rank))
        with self._lock:
            kept = key in self._graphs or (id(self._graphs), key) in self._making
        return self.graph(run, step, rank) if kept else self.store.read_indexed(run, step, rank)

    def runs(self) -> list[RunInfo]:
        """The runs, oldest update first (as the run select lists them)."""
        return sorted(self.store.runs(), key=lambda r: r["updated"])

    def steps(self, run: str, rank: int = 0) -> list[int]:
        return [s["step"] for s in self.store.steps(run, int(rank))]

    def ranks(self, run: str) -> list[int]:
        return list(self.store.ranks(run))

    def history(self, run: str, rank: int = 0) -> list[dict[str, Any]]:
        """The monitor's row of every step of the run on `rank` (`TraceStore.history`; not cached: it grows)."""
        return self.store.history(run, int(rank))

    def arrays(self, run: str, step: int, indices: list[int], rank: int = 0) -> dict[int, TensorArrays]:
        """The thumbnails and values of tensors `indices` of a step (not cached: they are big)."""
        return self.store.read_arrays(run, int(step), indices, int(rank))

    def paused_node(self, run: str, node: int, order: int | None = None) -> tuple[dict[str, Any] | None,
                                                                                 dict[str, Any] | None]:
        """A node of a paused backward with its thumbnails (`DebugState.paused_node`)."""
        return self.debug.paused_node(run, node, order)

    def graph(self, run: str, step: int, rank: int = 0) -> WireStep:
        def read() -> WireStep:
            return self.store.read_indexed(run, int(step), int(rank))

        def frozen() -> WireStep:
            wire = made_frozen(read)
            decode_all_with(wire, made_frozen)  # a search over every node decodes them all: frozen too
            return wire

        return self._lru(self._graphs, (run, int(step), int(rank)), frozen if self.freeze else read)

    def order(self, run: str, step: int, rank: int = 0) -> dict[str, Any]:
        """The player's order of a step (`view.exec_order`): once per step, not on every fold or expand."""
        return self._lru(self._orders, (run, int(step), int(rank)),
                         lambda: view.exec_order(self.graph(run, step, rank), int(rank)))

    def search_table(self, run: str, step: int, rank: int = 0) -> view.SearchTable:
        """The find box's options of a step (`view.SearchTable`): made once, for its first options and every
        query typed."""
        return self._lru(self._search, (run, int(step), int(rank)),
                         lambda: view.SearchTable(self.graph(run, step, rank)))

    def search_index(self, run: str, step: int, rank: int = 0) -> list[dict[str, str]]:
        return self.search_table(run, step, rank).index()

    def marks(self, run: str, step: int, color_by: str, rank: int = 0) -> view.StepMarks:
        """The colour range, node statistics, NaN/Inf counts and legend of a step for one colouring: once per
        step, not on every fold or expand (`view.marks`)."""
        return self._lru(self._marks, (run, int(step), int(rank), color_by),
                         lambda: view.step_marks(self.graph(run, step, rank), color_by), 3 * self.size)

    def flow_over_steps(self, run: str, step: int, rank: int = 0) -> dict[str, Any]:
        """Per-layer gradient norm over the rank's last steps up to `step`: made once per (run, step,
        rank), not on every node click, from each step's layer rows, which are kept (for the last
        2 × MAX_STEPS_OVER_TIME steps read): a new step of a streaming run decodes that step only, where
        decoding the last 30 took 1-2 s for a small GPT-2 and the inspector, which shows this, could not
        keep up with a step every 0.4 s."""
        def make() -> dict[str, Any]:
            steps = [s for s in self.steps(run, rank) if s <= step][-MAX_STEPS_OVER_TIME:]
            return view.norm_over_rows([(s, self._layer_rows(run, s, int(rank), s == step)) for s in steps])
        return self._lru(self._flows, (run, int(step), int(rank)), make)

    def _layer_rows(self, run: str, step: int, rank: int, shown: bool) -> list[dict[str, Any]]:
        # the step the page shows is read once, by `graph`; earlier ones are read without keeping their
        # graphs, which the flow needs only once (with their index, only their parameters' tensors are decoded)
        return self._lru(self._flow_rows, (run, step, rank),
                         lambda: view.flow_rows(self.graph(run, step, rank) if shown
                                                else self.store.read_indexed(run, step, rank)),
                         2 * MAX_STEPS_OVER_TIME)

    def layout(self, run: str, step: int, collapsed: list[str] | None, rank: int = 0) -> dict[str, Any]:
        key = (run, int(step), int(rank), None if collapsed is None else tuple(sorted(collapsed)))
        return self._lru(self._layouts, key, lambda: view.layout_graph(self.graph(run, step, rank), collapsed,
                                                                 max_drawn=view.MAX_DRAWN))
