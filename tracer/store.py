"""The SQLite trace file: written by the tracer's file sink and by the server, read by both.

Schema (version `SCHEMA_VERSION`, in `meta`), WAL mode so readers see complete steps while a writer
appends. A step is written in one transaction: it is visible whole or not at all.

    meta(key TEXT PRIMARY KEY, value TEXT)                      schema_version, created_by
    runs(run TEXT PRIMARY KEY, created REAL, updated REAL)
    steps(run, rank, step, created REAL, n_nodes, n_edges, error, graph BLOB)   PRIMARY KEY (run, rank, step)
    tensors(run, rank, step, idx, arrays BLOB)                  PRIMARY KEY (run, rank, step, idx)
    step_index(run, rank, step, created, idx BLOB)   what the page reads of every node (tracer/index_store.py)
    history(run, rank, step, params_key, row BLOB)   the monitor's row of every step (tracer/history_store.py)
    history_params(run, rank, key, names BLOB)       the parameter names the rows' columns stand for

Ranks (torch.distributed): every rank of a run writes its steps side by side, keyed by its rank (0
outside torch.distributed, where the step's `rank` is None). Several processes may write ONE file at
once (one per rank, or the server): SQLite's WAL journal serialises the writers and each connection
waits up to `BUSY_TIMEOUT` seconds for the write lock instead of failing. A version-1 file (no rank)
is migrated in place, in one transaction, the first time it is opened for writing; its steps become
rank 0.

`graph` is the step's document (`tracer/step_doc.py`): its nodes and tensors as columns (NOTE [Column
document] in `tracer.wire.columns`), as this release writes every step; files of earlier releases may hold
its maps (`tracer.wire`) without the arrays, nodes and tensors last (NOTE [Maps of earlier releases] in
`tracer.wire.earlier`), read as they are; `arrays` is the msgpack map `{"thumb": C|None,
"values": A|None}` of tensor `idx`, so a view that needs one node's heatmaps reads only those rows.
Values (`tensors="full"`) are raw little-endian bytes with dtype and shape; thumbnails are kept compactly
(NOTE [Compact thumbnails] in `tracer.wire.compact`). Since version 4 both blobs are Zstandard frames
(`tracer/blobs.py`), small rows apart; version 3 wrote zlib, version 2 plain msgpack with float32
thumbnails: all read as they are. Opening a file of version 2 to 4 for writing marks it version 5
(nothing is rewritten): a release that reads version 4 refuses it by its version, not by a row.

`keep_last=N` (the file sink's, `gradscape serve --keep-last N`): after each step is written, only
the newest N steps of its run and rank stay, so a run that traces for days keeps a bounded file
(SQLite reuses the freed pages).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from gradscape.tracer import step_doc
from gradscape.tracer._model import StepTrace
from gradscape.tracer.blobs import compress, decompress
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.history_store import create_history_tables, read_history, write_history
from gradscape.tracer.index_store import create_index_table, delete_index, read_index, write_index
from gradscape.tracer.store_tables import MIGRATE_1_2, STEP_TABLES
from gradscape.tracer.wire import TensorArrays, TraceFormatError, WireStep, decode_array, encode_array, pack, unpack
from gradscape.tracer.wire.column_write import column_parts
from gradscape.tracer.wire.compact import ThumbTable, expand_all, expand_pictures, refers_to
from gradscape.tracer.wire.history import WireHistory
from gradscape.tracer.wire.lazy import indexed

T = TypeVar("T")
SCHEMA_VERSION = 5
_READABLE = ("2", "3", "4", "5")  # the same tables; blobs uncompressed in 2, zlib in 3, no columns before 5
BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's write to finish

class RunInfo(TypedDict):
    """A row of `TraceStore.runs()` (and of the JSON API's `/api/runs`)."""
    run: str
    created: float
    updated: float
    steps: int  # on rank 0
    last_step: int | None
    ranks: list[int]


class StepInfo(TypedDict):
    """A row of `TraceStore.steps()` (and of the JSON API's `/api/runs/<run>/steps`)."""
    step: int
    created: float
    nodes: int
    edges: int
    error: str | None


def wire_rank(wire: WireStep) -> int:
    """The rank a step is stored under: its `rank`, 0 when it has none (outside torch.distributed)."""
    r = wire.get("rank")
    return 0 if r is None else int(r)


class StoreError(RuntimeError):
    """The trace file cannot be used (wrong schema version, not a trace file, missing step)."""


class TraceStore:
    """Thread-safe access to one trace file. Open several (one per process) on the same file freely."""

    def __init__(self, path: str | Path, *, readonly: bool = False, keep_last: int | None = None) -> None:
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise ValueError(f"keep_last must be a positive int or None, got {keep_last!r}")
        self.path = str(path)
        self.readonly = readonly
        self.keep_last = keep_last
        self._lock = threading.RLock()
        if readonly:
            if not Path(self.path).exists():
                raise StoreError(f"no trace file at {self.path}")
            uri = f"file:{Path(self.path).resolve()}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT)
        else:
            try:
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT,
                                           isolation_level=None)
                self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
                self._set_up()
                self._db.isolation_level = "DEFERRED"  # back to the module's transactions for the writes
            except sqlite3.OperationalError as exc:  # a missing folder, no permission, a directory
                raise StoreError(f"cannot open the trace file {self.path} for writing: {exc}") from exc
        self._check_version()

    def _set_up(self) -> None:
        """WAL mode, then the tables created or migrated under BEGIN IMMEDIATE (two processes opening a
        new file take turns). Switching a file to WAL can be refused at once ("database is locked", the
        busy timeout does not apply) while another process does the same: retried until BUSY_TIMEOUT."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        try:
            self._create_or_migrate()
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _create_or_migrate(self) -> None:
        has_meta = self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if has_meta else None
        if row is not None and row[0] == "1":
            for stmt in MIGRATE_1_2.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
        if row is not None and row[0] in ("1", "2", "3", "4"):  # version 5 reads rows of 2 to 4 as they are
            self._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        for stmt in STEP_TABLES.split(";"):
            if stmt.strip():
                self._db.execute(stmt)
        create_history_tables(self._db)  # the monitor's history (tracer/history_store.py)
        create_index_table(self._db)  # the steps' indexes (tracer/index_store.py)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._db.execute("INSERT OR IGNORE INTO meta VALUES('created_by', 'gradscape')")

    def _check_version(self) -> None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a gradscape trace file: {exc}") from exc
        if row is not None and row[0] == "1" and self.readonly:
            raise StoreError(f"{self.path}: trace schema version 1 (before ranks); open it once for writing "
                             f"(e.g. `gradscape serve --store {self.path}`) to migrate it to version {SCHEMA_VERSION}")
        if row is None or row[0] not in _READABLE:
            raise StoreError(f"{self.path}: trace schema version {row[0] if row else None!r}, "
                             f"this gradscape reads version {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ writing
    @collector_paused()  # the step's forms are made and let go inside (NOTE [Collector paused])
    def write_step(self, st: StepTrace) -> None:
        """Store a step as its column document, in one transaction; its arrays go to their rows without
        becoming wire arrays. A step the columns cannot hold (one built by hand) raises `TraceFormatError`."""
        self._writable()
        graph, arrays, stacked = column_parts(st)
        thumbs = ThumbTable().keep_arrays([thumb for thumb, _ in arrays], stacked)
        self._write(graph, thumbs, [None if v is None else encode_array(v) for _, v in arrays])

    @collector_paused()
    def write_wire(self, doc: Mapping[str, Any], arrays: list[tuple[Any, Any]]) -> None:
        """Store a checked column document and its `arrays` (`column_check`'s, thumbnails as arrays), at once."""
        self._writable()
        if "columns" not in doc:
            raise TraceFormatError("a step is stored as its column document; maps are read, not written "
                                   "(NOTE [Maps of earlier releases] in tracer/wire/earlier/__init__.py)")
        self._write(doc, ThumbTable().keep_arrays([th for th, _ in arrays]), [v for _, v in arrays])

    def _write(self, graph: Mapping[str, Any], thumbs: list[Any], values: list[Any]) -> None:
        """The step's rows: its document, and each tensor's kept thumbnail (`ThumbTable`) and values."""
        tensors = [(i, compress(pack({"thumb": th, "values": v})))
                   for i, (th, v) in enumerate(zip(thumbs, values)) if th is not None or v is not None]
        self.write_rows(graph, step_doc.encode(graph), tensors)

    def write_rows(self, graph: Mapping[str, Any], encoded: tuple[bytes, bytes, int, int],
                   tensors: list[tuple[int, bytes]]) -> None:
        """One step's rows in one transaction: its document, index and counts (`step_doc.encode`'s), arrays."""
        doc, index, n_nodes, n_edges = encoded
        now = time.time()
        run, step, rank = graph["run"], int(graph["step"]), wire_rank(cast(WireStep, graph))
        with self._lock, self._db:
            self._db.execute("INSERT INTO runs VALUES(?,?,?) ON CONFLICT(run) DO UPDATE SET updated=excluded.updated",
                             (run, now, now))
            self._db.execute("DELETE FROM tensors WHERE run=? AND rank=? AND step=?", (run, rank, step))
            self._db.execute("INSERT OR REPLACE INTO steps VALUES(?,?,?,?,?,?,?,?)",
                             (run, rank, step, now, n_nodes, n_edges, graph.get("error"), doc))
            self._db.executemany("INSERT INTO tensors VALUES(?,?,?,?,?)",
                                 [(run, rank, step, i, a) for i, a in tensors])
            write_index(self._db, (run, rank, step), now, index)
            if self.keep_last is not None:
                self._prune(run, rank, self.keep_last)

    def _writable(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only")

    def _prune(self, run: str, rank: int, keep_last: int) -> None:
        """Delete all but the newest `keep_last` steps of (run, rank), inside the caller's transaction."""
        old = "SELECT step FROM steps WHERE run=? AND rank=? ORDER BY step DESC LIMIT -1 OFFSET ?"
        args = (run, rank, run, rank, keep_last)
        self._db.execute(f"DELETE FROM tensors WHERE run=? AND rank=? AND step IN ({old})", args)
        delete_index(self._db, f"run=? AND rank=? AND step IN ({old})", args)
        self._db.execute(f"DELETE FROM steps WHERE run=? AND rank=? AND step IN ({old})", args)

    def prune(self, run: str, keep_last: int, rank: int = 0) -> None:
        """Keep only the newest `keep_last` steps of `run` on `rank`."""
        self._writable()
        if type(keep_last) is not int or keep_last < 1:
            raise ValueError(f"keep_last must be a positive int, got {keep_last!r}")
        with self._lock, self._db:
            self._prune(run, int(rank), keep_last)

    def write_history(self, batch: WireHistory) -> None:
        """Store a batch of the monitor's history rows (`tracer.wire.history`, already checked)."""
        self._writable()
        now = time.time()
        with self._lock, self._db:
            self._db.execute("INSERT INTO runs VALUES(?,?,?) ON CONFLICT(run) DO UPDATE SET updated=excluded.updated",
                             (batch["run"], now, now))
            write_history(self._db, batch)

    def history(self, run: str, rank: int = 0, since: int | None = None) -> list[dict[str, Any]]:
        """The monitor's row of every step of `run` on `rank` (after step `since` when given), by step:
        dicts with `step`, `loss`, `grad_norm`, `param_norms` (name → norm), `traced`, `trigger`, ...
        (`tracer.wire.history`). [] for a run without history."""
        with self._lock:
            return read_history(self._db, run, rank, since)

    # ------------------------------------------------------------------ reading
    def runs(self) -> list[RunInfo]:
        """Each run with its rank 0 step count and last step (the only rank outside torch.distributed)
        and `ranks`, the ranks that stored steps."""
        with self._lock:
            rows = self._db.execute(
                "SELECT r.run, r.created, r.updated, COUNT(s.step), MAX(s.step) FROM runs r "
                "LEFT JOIN steps s ON s.run = r.run AND s.rank = 0 GROUP BY r.run ORDER BY r.created").fetchall()
            ranks: dict[str, list[int]] = {}
            for run, rank in self._db.execute("SELECT DISTINCT run, rank FROM steps ORDER BY run, rank"):
                ranks.setdefault(run, []).append(int(rank))
        return [{"run": r, "created": c, "updated": u, "steps": n, "last_step": last, "ranks": ranks.get(r, [])}
                for r, c, u, n, last in rows]

    def ranks(self, run: str) -> list[int]:
        """The ranks of `run` that stored steps, ascending."""
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT rank FROM steps WHERE run=? ORDER BY rank", (run,)).fetchall()
        return [int(r) for (r,) in rows]

    def steps(self, run: str, rank: int = 0) -> list[StepInfo]:
        """The steps stored for `run` on `rank`, in step order (`StepInfo`: step, created, nodes, edges,
        error)."""
        with self._lock:
            rows = self._db.execute("SELECT step, created, n_nodes, n_edges, error FROM steps WHERE run=? AND rank=? "
                                    "ORDER BY step", (run, int(rank))).fetchall()
        return [{"step": s, "created": c, "nodes": n, "edges": e, "error": err} for s, c, n, e, err in rows]

    def latest_step(self, run: str | None = None, rank: int = 0) -> tuple[str, int] | None:
        """`(run, step)` of the newest step stored (of `run`, when given) on `rank`, or None."""
        with self._lock:
            if run is None:
                row = self._db.execute("SELECT run, step FROM steps WHERE rank=? ORDER BY created DESC LIMIT 1",
                                       (int(rank),)).fetchone()
            else:
                row = self._db.execute("SELECT run, step FROM steps WHERE run=? AND rank=? ORDER BY step DESC LIMIT 1",
                                       (run, int(rank))).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def which_step(self, run: str | None = None, step: int | None = None, rank: int = 0) -> tuple[str, int]:
        """(run, step) with `load`'s defaults filled in: the only run (or the newest), its last step on `rank`."""
        runs = self.runs() if run is None else [{"run": run}]
        if not runs:
            raise StoreError(f"{self.path} holds no runs")
        run = str(runs[-1]["run"])
        latest = self.latest_step(run, rank) if step is None else (run, step)
        if latest is None:
            raise StoreError(f"run {run!r} in {self.path} has no steps on rank {rank}")
        return run, int(latest[1])

    @collector_paused()  # the step's graph is decoded inside (NOTE [Collector paused])
    def read_graph(self, run: str, step: int, rank: int = 0) -> WireStep:
        """The step's wire form without arrays (tensors carry stats, shape and dtype only). Not checked again:
        what is stored was written in the schema's own form, checked on the server; fields an earlier release
        did not write get their defaults (`with_defaults`)."""
        return step_doc.read_whole(self._graph_blob(run, step, rank))

    def _graph_blob(self, run: str, step: int, rank: int) -> bytes:
        with self._lock:
            row = self._db.execute("SELECT graph FROM steps WHERE run=? AND rank=? AND step=?",
                                   (run, int(rank), int(step))).fetchone()
        if row is None:
            where = f" on rank {rank}" if rank else ""
            raise StoreError(f"no step {step} of run {run!r}{where} in {self.path}")
        return bytes(row[0])

    @collector_paused()  # the step's fields are decoded inside (NOTE [Collector paused])
    def read_indexed(self, run: str, step: int, rank: int = 0) -> WireStep:
        """The step as `read_graph` gives it, with its index (NOTE [Step index]): its node and tensor maps made
        when read when the step has an index stored (`tracer.step_doc`), else all, and the index from them."""
        with self._lock:
            found = read_index(self._db, (run, int(rank), int(step)))
        if found is None:
            return indexed(self.read_graph(run, step, rank))
        try:
            return step_doc.read_indexed(*found)
        except TraceFormatError as exc:
            raise StoreError(f"step {step} of run {run!r} in {self.path}: {exc}") from exc

    def read_arrays(self, run: str, step: int, indices: Iterable[int], rank: int = 0) -> dict[int, TensorArrays]:
        """The thumbnail and, when kept, the values of the tensors at `indices` of a stored step."""
        idx = sorted({int(i) for i in indices})
        rows, thumbs = self._thumbs(run, step, idx, rank, expand_all)
        return {i: {"thumb": thumbs[i], "values": rows[i].get("values")} for i in idx if i in rows}

    def _thumbs(self, run: str, step: int, idx: list[int] | None, rank: int,
                expand: Callable[[list[int], dict[int, Any]], dict[int, T]]) -> tuple[dict[int, dict[str, Any]],
                                                                                   dict[int, T]]:
        """The rows of tensors `idx` (None: every tensor of the step) that have one, the rows their
        thumbnails refer to included, and the thumbnails of `idx` turned back by `expand` (`expand_all`,
        `expand_pictures`)."""
        if idx == []:
            return {}, {}
        with self._lock:
            rows = self._rows(run, step, idx, rank)
            missing = {k for r in rows.values() if (k := refers_to(r.get("thumb"))) is not None} - rows.keys()
            if missing:  # repeats of thumbnails kept in other rows (NOTE [Compact thumbnails])
                rows.update(self._rows(run, step, sorted(missing), rank))
        kept = {i: r.get("thumb") for i, r in rows.items()}
        try:
            return rows, expand(sorted(rows) if idx is None else [i for i in idx if i in rows], kept)
        except TraceFormatError as exc:
            raise StoreError(f"step {step} of run {run!r} in {self.path}: {exc}") from exc

    def _rows(self, run: str, step: int, idx: list[int] | None, rank: int) -> dict[int, dict[str, Any]]:
        """The arrays rows of tensors `idx` (None: all the step's, in one query: at 100k nodes, 0.04 s
        against 0.2 s for its 50k rows asked for 500 at a time)."""
        key = (run, int(rank), int(step))
        where = "SELECT idx, arrays FROM tensors WHERE run=? AND rank=? AND step=?"
        found = (self._db.execute(where, key) if idx is None else
                 (r for chunk in (idx[i:i + 500] for i in range(0, len(idx), 500))
                  for r in self._db.execute(f"{where} AND idx IN ({','.join('?' * len(chunk))})", (*key, *chunk))))
        out: dict[int, dict[str, Any]] = {}
        for i, blob in found:
            row = unpack(decompress(blob))
            if not isinstance(row, dict):
                raise StoreError(f"step {step} of run {run!r} in {self.path}: tensor {i}'s arrays are not a map")
            out[int(i)] = row
        return out

    @collector_paused()  # the step's graph, arrays and trace are made inside (NOTE [Collector paused])
    def read_step(self, run: str, step: int, rank: int = 0) -> StepTrace:
        """The whole step as a `StepTrace`. Its thumbnails go from the rows to arrays directly, not through
        wire arrays: at 100k nodes, encoding 50k of them to be decoded again took 0.4 s."""
        doc = step_doc.read_doc(self._graph_blob(run, step, rank))
        rows, thumbs = self._thumbs(run, step, None, rank, expand_pictures)
        try:
            arrays = {i: (thumb, _values(rows[i].get("values"), i)) for i, thumb in thumbs.items()}
            return step_doc.read_trace(doc, arrays)
        except TraceFormatError as exc:
            raise StoreError(f"step {step} of run {run!r} in {self.path} is malformed: {exc}") from exc

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _values(stored: Any, i: int) -> Any:
    return None if stored is None else decode_array(stored, f"tensors[{i}].values")


def load(path: str | Path, run: str | None = None, step: int | None = None, rank: int = 0) -> StepTrace:
    """Read one step back from a trace file. Defaults: the only run (or the newest), its last step, rank 0."""
    with TraceStore(path, readonly=True) as store:
        return store.read_step(*store.which_step(run, step, rank), rank)
