"""The run's history in the SQLite trace file (`TraceStore.write_history` / `TraceStore.history`).

Two tables, added to schema version 2 without changing it (a file without them reads as having no
history; they are created the first time a file is opened for writing):

    history(run, rank, step, params_key, row BLOB)        PRIMARY KEY (run, rank, step)
    history_params(run, rank, key, names BLOB)            PRIMARY KEY (run, rank, key)

`row` is one msgpack'd row of `tracer.wire.history` whose `param_norms` line up with the names stored
under `params_key` (the parameter names are kept once per run and rank, not on every row).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from gradscape.tracer.wire import pack, unpack
from gradscape.tracer.wire.history import WireHistory, row_as_dict

HISTORY_SCHEMA = """
CREATE TABLE IF NOT EXISTS history(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, params_key INTEGER NOT NULL,
    row BLOB NOT NULL, PRIMARY KEY(run, rank, step));
CREATE TABLE IF NOT EXISTS history_params(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, key INTEGER NOT NULL, names BLOB NOT NULL,
    PRIMARY KEY(run, rank, key));
"""


def create_history_tables(db: sqlite3.Connection) -> None:
    for stmt in HISTORY_SCHEMA.split(";"):
        if stmt.strip():
            db.execute(stmt)


def _params_key(db: sqlite3.Connection, run: str, rank: int, names: list[str]) -> int:
    blob = pack(names)
    row = db.execute("SELECT key FROM history_params WHERE run=? AND rank=? AND names=?", (run, rank, blob)).fetchone()
    if row is not None:
        return int(row[0])
    (n,) = db.execute("SELECT COUNT(*) FROM history_params WHERE run=? AND rank=?", (run, rank)).fetchone()
    db.execute("INSERT INTO history_params VALUES(?,?,?,?)", (run, rank, int(n), blob))
    return int(n)


def write_history(db: sqlite3.Connection, batch: WireHistory) -> None:
    """Store a checked batch (`history_from_wire`); the caller holds the transaction. A step written
    again replaces its row."""
    run, rank = batch["run"], int(batch["rank"] or 0)
    key = _params_key(db, run, rank, batch["params"])
    db.executemany("INSERT OR REPLACE INTO history VALUES(?,?,?,?,?)",
                   [(run, rank, r["step"], key, pack(dict(r))) for r in batch["rows"]])


def read_history(db: sqlite3.Connection, run: str, rank: int = 0, since: int | None = None) -> list[dict[str, Any]]:
    """The rows of `run` on `rank`, by step (those after step `since` when given)."""
    try:
        names = {int(k): list(unpack(b)) for k, b in db.execute(
            "SELECT key, names FROM history_params WHERE run=? AND rank=?", (run, int(rank)))}
        q = "SELECT params_key, row FROM history WHERE run=? AND rank=?"
        args: tuple[Any, ...] = (run, int(rank))
        if since is not None:
            q += " AND step>?"
            args += (int(since),)
        rows = db.execute(q + " ORDER BY step", args).fetchall()
    except sqlite3.OperationalError as exc:  # a file written before the history tables existed
        if "no such table" in str(exc):
            return []
        raise
    return [row_as_dict(unpack(blob), names.get(int(key), [])) for key, blob in rows]
