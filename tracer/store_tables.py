"""The trace file's tables of steps (`STEP_TABLES`), and the migration of a version-1 file
(`MIGRATE_1_2`); `tracer.store` creates and migrates them, `tracer.history_store` holds the monitor's."""

STEP_TABLES = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs(run TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS steps(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, created REAL NOT NULL,
    n_nodes INTEGER NOT NULL, n_edges INTEGER NOT NULL, error TEXT, graph BLOB NOT NULL,
    PRIMARY KEY(run, rank, step));
CREATE TABLE IF NOT EXISTS tensors(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, idx INTEGER NOT NULL,
    arrays BLOB NOT NULL, PRIMARY KEY(run, rank, step, idx));
"""

# version 1 -> 2: the rank joins the keys; the old rows become rank 0
MIGRATE_1_2 = """
ALTER TABLE steps RENAME TO steps_v1;
ALTER TABLE tensors RENAME TO tensors_v1;
CREATE TABLE steps(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, created REAL NOT NULL,
    n_nodes INTEGER NOT NULL, n_edges INTEGER NOT NULL, error TEXT, graph BLOB NOT NULL,
    PRIMARY KEY(run, rank, step));
CREATE TABLE tensors(
    run TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL, idx INTEGER NOT NULL,
    arrays BLOB NOT NULL, PRIMARY KEY(run, rank, step, idx));
INSERT INTO steps SELECT run, 0, step, created, n_nodes, n_edges, error, graph FROM steps_v1;
INSERT INTO tensors SELECT run, 0, step, idx, arrays FROM tensors_v1;
DROP TABLE steps_v1;
DROP TABLE tensors_v1;
UPDATE meta SET value='2' WHERE key='schema_version';
"""
