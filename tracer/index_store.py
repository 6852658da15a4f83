"""Each step's index (NOTE [Step index]) in the SQLite trace file, beside the step's row.

One table, added to schema version 4 without changing it (created the first time a file is opened for
writing; a file without it, or a step without a row in it, is read whole by the page):

    step_index(run, rank, step, created REAL, idx BLOB)      PRIMARY KEY (run, rank, step)

`created` is the `created` of the step row it was written with: a release that writes steps but no index
(before this table) may replace a step of a file that has one, and an index whose `created` is not its
step's is not read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from gradscape.tracer.blobs import compress, decompress
from gradscape.tracer.wire import pack, unpack
from gradscape.tracer.wire.step_index import StepIndex, index_from_data, index_from_wire, index_to_wire
from gradscape.tracer.wire.types import TraceFormatError

INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS step_index(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, created REAL NOT NULL,
    idx BLOB NOT NULL, PRIMARY KEY(run, rank, step))
"""


def create_index_table(db: sqlite3.Connection) -> None:
    db.execute(INDEX_SCHEMA)


def index_blob(graph: Mapping[str, Any], spans: dict[str, Any]) -> bytes:
    """The stored row of `graph`'s index (a step in wire form) and of where its nodes and tensors are in the
    stored document (`pack_step`'s `spans`): made before the write's transaction, which waits for none of it."""
    return compress(pack({"index": index_to_wire(index_from_wire(graph)), "spans": spans}))


def write_index(db: sqlite3.Connection, key: tuple[str, int, int], created: float, blob: bytes) -> None:
    """Step `key`'s (run, rank, step) index row `blob` (`index_blob`), inside the caller's transaction."""
    db.execute("INSERT OR REPLACE INTO step_index VALUES(?,?,?,?,?)", (*key, created, blob))


def delete_index(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> None:
    """Delete the indexes of the steps `where` picks (a condition on run, rank and step, as for `steps`)."""
    db.execute(f"DELETE FROM step_index WHERE {where}", args)


def read_index(db: sqlite3.Connection, key: tuple[str, int, int]) -> tuple[bytes, StepIndex, Any] | None:
    """The graph blob of step `key`, its index and its spans (`pack_step`); None when the step has no index
    written with it (a file or a step from before indexes, an index of another version) or no row."""
    try:
        row = db.execute("SELECT s.graph, i.idx FROM steps s JOIN step_index i ON i.run = s.run AND i.rank = s.rank "
                         "AND i.step = s.step AND i.created = s.created WHERE s.run=? AND s.rank=? AND s.step=?",
                         key).fetchone()
    except sqlite3.OperationalError:  # a file from before indexes, opened read-only: no such table
        return None
    if row is None:
        return None
    try:
        stored = unpack(decompress(row[1]))
    except TraceFormatError:
        return None
    index = index_from_data(stored.get("index")) if isinstance(stored, dict) else None
    return None if index is None else (row[0], index, stored.get("spans"))
