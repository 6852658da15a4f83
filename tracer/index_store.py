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
from typing import Any

from gradscape.tracer.blobs import decompress
from gradscape.tracer.wire import unpack
from gradscape.tracer.wire.step_index import StepIndex, index_from_data
from gradscape.tracer.wire.types import TraceFormatError

INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS step_index(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, created REAL NOT NULL,
    idx BLOB NOT NULL, PRIMARY KEY(run, rank, step))
"""


def create_index_table(db: sqlite3.Connection) -> None:
    db.execute(INDEX_SCHEMA)


def write_index(db: sqlite3.Connection, key: tuple[str, int, int], created: float, blob: bytes) -> None:
    """Step `key`'s (run, rank, step) index row `blob` (`tracer.step_doc.encode`), inside the caller's transaction."""
    db.execute("INSERT OR REPLACE INTO step_index VALUES(?,?,?,?,?)", (*key, created, blob))


def delete_index(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> None:
    """Delete the indexes of the steps `where` picks (a condition on run, rank and step, as for `steps`)."""
    db.execute(f"DELETE FROM step_index WHERE {where}", args)


def read_index(db: sqlite3.Connection, key: tuple[str, int, int]) -> tuple[bytes, StepIndex, Any] | None:
    """The graph blob of step `key`, its index and its spans (an earlier release's maps:
    `tracer.wire.earlier.spans`; none for a column document); None when the step has no index written with
    it (a file or a step from before indexes, an index of another version) or no row."""
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
