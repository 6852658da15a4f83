"""Encode and decode one traced step (W4 by default) as the socket sink sends it and the server takes it: its
column document (NOTE [Column document] in tracer/wire/columns.py).

Rows, each the median of `--rounds` timings, ratios against the first row of its direction:
    encode  step_message + msgpack (the tracer's sender)        baseline
            msgspec.msgpack over the same map (byte layer only)
    decode  msgpack + column_step (the server: every field checked in place)   baseline
            msgpack only (what checking adds)
            msgspec.msgpack only (byte layer, no checking)
msgspec is optional: its rows are skipped when it is not installed. A typed msgspec schema
(Structs validated while decoding) would replace both the byte layer and the checks; these rows
bound what it could save.

    python bench/wire.py [--workload W4] [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402
import workloads  # noqa: E402

import gradscape  # noqa: E402
from gradscape.tracer.wire import pack, unpack  # noqa: E402
from gradscape.tracer.wire.column_check import column_step  # noqa: E402
from gradscape.tracer.wire.column_write import step_message  # noqa: E402


def _median(fn: Callable[[], Any], rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="W4")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    wl = workloads.build(args.workload)
    with gradscape.Tracer(wl.model, run="bench") as tr, tr.step(0) as st:
        wl.loss(wl.model, wl.batch()).backward()
    assert st is not None
    blob = pack(step_message(st))
    doc = unpack(blob)
    print(f"{args.workload}: {len(st.nodes)} nodes, {doc['columns']['tensors']['n']} tensor rows, "
          f"{len(blob) / 1e6:.2f} MB encoded")
    rows: list[tuple[str, str, Callable[[], Any]]] = [
        ("encode", "step_message + msgpack", lambda: pack(step_message(st))),
        ("decode", "msgpack + column_step", lambda: column_step(unpack(blob))),
        ("decode", "msgpack only", lambda: msgpack.unpackb(blob, raw=False, strict_map_key=False)),
    ]
    try:
        import msgspec

        enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
        assert dec.decode(enc.encode(doc)) == doc
        rows.insert(1, ("encode", "step_message + msgspec", lambda: enc.encode(step_message(st))))
        rows.append(("decode", "msgspec only", lambda: dec.decode(blob)))
    except ImportError:
        print("msgspec not installed: its rows are skipped")
    base: dict[str, float] = {}
    for direction, name, fn in rows:
        t = _median(fn, args.rounds)
        base.setdefault(direction, t)
        print(f"{direction:7s} {name:28s} {t * 1e3:8.2f} ms   x{t / base[direction]:.2f}")


if __name__ == "__main__":
    main()
