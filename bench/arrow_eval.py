"""Apache Arrow as the step's form, measured against the column document (NOTE [Column document] in
tracer/wire/columns.py), on one natively recorded step of an LSTMCell loop (100k nodes by default).

    python bench/arrow_eval.py                    # 100k nodes, best of 5
    python bench/arrow_eval.py --nodes 10000 --rounds 9

Both forms hold the same arrays: the column document packs them as msgpack `bin` fields and the store
compresses the whole blob with Zstandard (level 3, tracer/blobs.py); the Arrow form puts the same arrays in
record batches (nodes, offsets, edges, outputs, output dims, runs, slots, tensors; the name/kind/module/source/static
codes as dictionary arrays, which are that same code-and-table scheme), the step's other fields in the
schema's metadata as msgpack, written as an IPC stream with Arrow's own Zstandard buffer compression, or as
one Parquet file per table. Read means: bytes to a checked `StepColumns` and the step's index, the work the
server does before the page can draw the step (tracer/wire/column_index.py).

It prints, per form, the bytes and the best write and read times. pyarrow is not a dependency of gradscape:
`pip install pyarrow` to run this (`gradscape.tables` needs it too).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
for p in (str(REPO_ROOT / "bench"), str(REPO_ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from workloads import lstm_loop  # noqa: E402

import gradscape  # noqa: E402
from gradscape.tracer.blobs import compress, decompress  # noqa: E402
from gradscape.tracer.wire import pack, unpack  # noqa: E402
from gradscape.tracer.wire.column_index import index_from_columns  # noqa: E402
from gradscape.tracer.wire.column_write import step_columns  # noqa: E402
from gradscape.tracer.wire.columns import NODE_ARRAYS, TENSOR_ARRAYS, StepColumns  # noqa: E402

# which arrays go in which record batch: every array of a batch has the batch's length
BATCHES: dict[str, tuple[str, ...]] = {
    "nodes": ("name_code", "kind_code", "module_code", "source_code", "static_code"),
    "outputs": ("out_ndim", "out_dtype"),
    "offsets": ("child_off", "out_off"),  # n + 1 rows
    "edges": ("child_id", "child_nr"),
    "dims": ("out_dims",),
    "runs": ("run_node", "run_pass", "run_time", "go_off", "go_n", "gi_off", "gi_n"),
    "slots": ("slots",),
}
CODES = {"name_code": "name", "kind_code": "kind", "module_code": "module", "source_code": "source",
         "static_code": "static"}


def recorded_step(nodes: int) -> Any:
    """A natively recorded, carried step of an LSTMCell loop of about `nodes` nodes."""
    wl = lstm_loop(nodes)
    tr = gradscape.Tracer(wl.model, every=1, tensors="summary", recorder="native")
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.01)
    steps = []
    for i in range(3):
        with tr.step(i) as st:
            wl.loss_fn(wl.model, wl.batch()).backward()
            opt.step()
            opt.zero_grad()
        steps.append(st)
    assert step_columns(steps[-1]) is not None, "the native recorder is not built"
    return steps[-1]


def _column_arrays(cols: dict[str, Any]) -> dict[str, np.ndarray]:
    spec = {**NODE_ARRAYS, **TENSOR_ARRAYS}
    return {k: np.frombuffer(v, spec[k]) for part in ("nodes", "tensors") for k, v in cols[part].items()
            if k in spec}


def to_arrow(doc: dict[str, Any], dictionaries: bool = True) -> list[pa.RecordBatch]:
    """The step document as record batches: its column arrays zero-copy, the codes as dictionary arrays
    (or as plain codes, their tables in the metadata, for Parquet, which writes no null in a dictionary), the
    rest (tables of plans and maps, modules, passes, meta) msgpack in the first batch's metadata."""
    cols = doc["columns"]
    arrays = _column_arrays(cols)
    tables = cols["nodes"]
    rest = {k: v for k, v in doc.items() if k != "columns"}
    small = {"nodes": {k: v for k, v in tables.items() if k not in NODE_ARRAYS and (not dictionaries or k
                                                                                   not in CODES.values())},
             "tensors": {k: v for k, v in cols["tensors"].items() if k not in TENSOR_ARRAYS}}
    meta = {b"gradscape": pack({"doc": rest, "small": small, "version": cols["version"]})}
    out = []
    for name, keys in BATCHES.items():
        fields = []
        for k in keys:
            a = arrays[k]
            if k in CODES and dictionaries:
                fields.append(pa.DictionaryArray.from_arrays(pa.array(a), pa.array(tables[CODES[k]], pa.string())
                                                             if CODES[k] != "static" else
                                                             pa.array([pack(s) for s in tables["static"]])))
            else:
                fields.append(pa.array(a))
        out.append(pa.RecordBatch.from_arrays(fields, names=list(keys),
                                              metadata={**meta, b"batch": name.encode()} if not out else
                                              {b"batch": name.encode()}))
    stats = arrays["stats"].reshape(-1, 8)
    out.append(pa.RecordBatch.from_arrays(
        [pa.array(arrays["plan_code"]), pa.FixedSizeListArray.from_arrays(pa.array(stats.ravel()), 8)],
        names=["plan_code", "stats"], metadata={b"batch": b"tensors"}))
    return out


def from_arrow(batches: list[pa.RecordBatch]) -> StepColumns:
    """The batches back to a checked `StepColumns` (the arrays as Arrow's buffers, no copy)."""
    meta = unpack(batches[0].schema.metadata[b"gradscape"])
    nodes: dict[str, Any] = dict(meta["small"]["nodes"])
    tensors: dict[str, Any] = dict(meta["small"]["tensors"])
    for b in batches:
        for k in b.schema.names:
            col = b.column(k)
            if k == "stats":
                tensors[k] = col.values.buffers()[1]
            elif k in CODES and isinstance(col, pa.DictionaryArray):
                nodes[k] = col.indices.buffers()[1]
                nodes[CODES[k]] = [unpack(v) for v in col.dictionary.to_pylist()] if k == "static_code" else \
                    col.dictionary.to_pylist()
            elif k == "plan_code":
                tensors[k] = col.buffers()[1]
            else:
                nodes[k] = col.buffers()[1]
    return StepColumns({"version": meta["version"], "nodes": nodes, "tensors": tensors})


def ipc_write(batches: list[pa.RecordBatch], codec: str | None) -> bytes:
    sink = io.BytesIO()
    opts = pa.ipc.IpcWriteOptions(compression=codec)
    for b in batches:  # one stream per batch: their schemas differ
        buf = pa.BufferOutputStream()
        with pa.ipc.new_stream(buf, b.schema, options=opts) as w:
            w.write_batch(b)
        data = buf.getvalue().to_pybytes()
        sink.write(len(data).to_bytes(8, "little") + data)
    return sink.getvalue()


def ipc_read(blob: bytes) -> list[pa.RecordBatch]:
    out, at = [], 0
    view = memoryview(blob)
    while at < len(blob):
        n = int.from_bytes(view[at:at + 8], "little")
        out.append(pa.ipc.open_stream(pa.py_buffer(view[at + 8:at + 8 + n])).read_next_batch())
        at += 8 + n
    return out


def parquet_write(batches: list[pa.RecordBatch]) -> list[bytes]:
    out = []
    for b in batches:
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_batches([b]), sink, compression="zstd", store_schema=True)
        out.append(sink.getvalue())
    return out


def parquet_read(blobs: list[bytes]) -> list[pa.RecordBatch]:
    return [pq.read_table(io.BytesIO(b)).combine_chunks().to_batches()[0] for b in blobs]


def best(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, got = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
    return min(times), got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    st = recorded_step(args.nodes)
    doc, _ = step_columns(st)
    n = StepColumns(doc["columns"]).n_nodes
    print(f"one natively recorded step of {n:,} nodes (the graph row only: thumbnails are rows of their own "
          f"in both forms); best of {args.rounds}")
    rows = []
    t_w, blob = best(lambda: compress(pack(doc)), args.rounds)
    t_r, _ = best(lambda: index_from_columns(StepColumns(unpack(decompress(blob))["columns"])), args.rounds)
    rows.append(("column document, msgpack + zstd 3 (today)", len(blob), t_w, t_r))
    for codec in (None, "lz4", "zstd"):
        t_w, ipc = best(lambda codec=codec: ipc_write(to_arrow(doc), codec), args.rounds)  # type: ignore[misc]
        t_r, _ = best(lambda ipc=ipc: index_from_columns(from_arrow(ipc_read(ipc))), args.rounds)  # type: ignore[misc]
        rows.append((f"Arrow IPC, buffers {codec or 'uncompressed'}", len(ipc), t_w, t_r))
    t_w, pqs = best(lambda: parquet_write(to_arrow(doc, dictionaries=False)), args.rounds)
    t_r, _ = best(lambda: index_from_columns(from_arrow(parquet_read(pqs))), args.rounds)
    rows.append(("Parquet, zstd, a file per table", sum(len(b) for b in pqs), t_w, t_r))
    print(f"{'form':46s} {'bytes':>12s} {'write ms':>9s} {'read+index ms':>14s}")
    for name, size, w, r in rows:
        print(f"{name:46s} {size:12,d} {w * 1e3:9.1f} {r * 1e3:14.1f}")


if __name__ == "__main__":
    main()
