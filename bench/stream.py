"""Streaming benchmark: a real `gradscape serve` on a free loopback port, W3 steps streamed into it.

Measures, in one run:
  latency     time from the end of a traced step (the `with` block exits) to the step being readable
              through the JSON API, per step (median, max);
  throughput  steps per second the tracer → server → store pipeline sustains (one recorded W3 step
              pushed N times through the socket sink, from the first write to the last step readable);
  overhead    the training loop's per-step cost with the socket sink against the memory sink
              (interleaved rounds, median of per-round ratios).

    python bench/stream.py [--steps 5] [--push 20] [--rounds 5] [--workload W3]
    python bench/stream.py --loop 100000 [--steps 2]

`--loop N` measures one thing instead: steps of an N-node `nn.LSTMCell` loop (bench/workloads.py)
streamed one at a time, each traced step's time against a plain step's, and the time from the end of
the step to the step listed by the server (`/api/runs/<run>/steps`: stored; reading a 100k-node step
back through the API is a cost of its own, which `wait_readable` would add).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from workloads import Workload, build, lstm_loop  # noqa: E402

import gradscape  # noqa: E402
from gradscape.tracer.sinks.socket import SocketSink  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            resp.read()
            return True
    except (urllib.error.HTTPError, OSError):
        return False


def wait_readable(url: str, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if readable(url):
            return time.perf_counter()
        time.sleep(0.005)
    raise TimeoutError(url)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W3")
    ap.add_argument("--steps", type=int, default=5, help="steps for the latency measurement")
    ap.add_argument("--push", type=int, default=20, help="steps pushed for the throughput measurement")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds for the overhead measurement")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loop", type=int, metavar="N", help="stream steps of an N-node LSTMCell loop (see above)")
    return ap.parse_args()


def wait_listed(base: str, run: str, step: int, timeout: float = 600.0) -> float:
    """When `step` of `run` is in the server's step list (stored), polled every 50 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/api/runs/{run}/steps", timeout=30) as resp:
                if step in [s["step"] for s in json.loads(resp.read())["steps"]]:
                    return time.perf_counter()
        except (urllib.error.HTTPError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"step {step} of {run} not listed in {timeout} s")


def measure_big_steps(nodes: int, base: str, steps: int) -> None:
    wl = lstm_loop(nodes)
    batch = wl.batch()
    tr = gradscape.Tracer(wl.model, run="loop", sink=base)
    for i in range(steps):
        t0 = time.perf_counter()
        wl.loss(wl.model, batch).backward()
        plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        with tr.step(i) as st:
            wl.loss(wl.model, batch).backward()
        t_end = time.perf_counter()
        listed = wait_listed(base, "loop", i)
        print(f"step {i}: {len(st.nodes)} nodes; plain {plain:.2f} s, traced {t_end - t0:.2f} s "
              f"({(t_end - t0) / plain:.2f}x); end of step -> stored on the server {listed - t_end:.1f} s", flush=True)
    t0 = time.perf_counter()
    tr.close()
    print(f"close() {time.perf_counter() - t0:.1f} s")


def start_server(store: Path, port: int) -> subprocess.Popen[bytes]:
    """`gradscape serve` in a child process, its output discarded."""
    return subprocess.Popen([sys.executable, "-m", "gradscape", "serve", "--store", str(store),
                             "--port", str(port)], cwd=HERE.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def measure_latency(wl: Workload, batch: Any, base: str, steps: int) -> tuple[list[float], Any]:
    """End of traced step -> readable through the API, per step; returns the latencies and the last step."""
    tr = gradscape.Tracer(wl.model, run="latency", sink=base)
    lat, sizes = [], []
    for i in range(steps):
        with tr.step(i) as st:
            wl.loss(wl.model, batch).backward()
        t_end = time.perf_counter()
        t_ok = wait_readable(f"{base}/api/runs/latency/steps/{i}")
        lat.append(t_ok - t_end)
        sizes.append(len(st.nodes))
    tr.close()
    print(f"latency  nodes/step {sizes[0]}  median {statistics.median(lat) * 1e3:.0f} ms  "
          f"max {max(lat) * 1e3:.0f} ms  ({steps} steps)")
    return lat, st


def measure_throughput(st: Any, base: str, spill: Path, push: int) -> float:
    """Push one recorded step `push` times through the sink; returns steps per second."""
    sink = SocketSink(base, "throughput", spill=str(spill))
    t0 = time.perf_counter()
    for k in range(push):
        sink.write(dataclasses.replace(st, run="throughput", step=k))
    t_written = time.perf_counter() - t0
    wait_readable(f"{base}/api/runs/throughput/steps/{push - 1}", timeout=600)
    dt = time.perf_counter() - t0
    sink.close()
    from gradscape.tracer.wire import pack
    from gradscape.tracer.wire.column_write import step_message

    mb = len(pack(step_message(st))) / 1e6
    print(f"throughput  {push / dt:.2f} steps/s  ({mb:.1f} MB per step, {push * mb / dt:.1f} MB/s; "
          f"the {push} write() calls took {t_written * 1e3:.1f} ms in all)  stats {sink.stats}")
    return push / dt


def measure_overhead(wl: Workload, batch: Any, base: str, rounds: int) -> float:
    """Training step with the socket sink vs the memory sink; returns the median per-round ratio."""
    tr_mem = gradscape.Tracer(wl.model, run="mem")
    tr_net = gradscape.Tracer(wl.model, run="net", sink=base)
    ratios, t_mem, t_net = [], [], []
    for r in range(rounds + 1):
        times = {}
        order = [("mem", tr_mem), ("net", tr_net)][:: 1 if r % 2 else -1]
        for name, t in order:
            a = time.perf_counter()
            with t.step(r):
                wl.loss(wl.model, batch).backward()
            times[name] = time.perf_counter() - a
        if r == 0:
            continue  # warm-up
        t_mem.append(times["mem"])
        t_net.append(times["net"])
        ratios.append(times["net"] / times["mem"])
    tr_net.close()
    print(f"overhead  memory sink {statistics.median(t_mem) * 1e3:.0f} ms/step  socket sink "
          f"{statistics.median(t_net) * 1e3:.0f} ms/step  ratio {statistics.median(ratios):.3f}x "
          f"(max write() {tr_net.sinks[1].max_write_ms:.2f} ms)")
    return statistics.median(ratios)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="gradscape-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(tmp / "bench.sqlite", port)
    try:
        wait_readable(base + "/api/runs")
        if args.loop:
            return measure_big_steps(args.loop, base, args.steps)
        wl = build(args.workload)
        batch = wl.batch()
        print(f"gradscape streaming benchmark: {args.workload} {wl.name}, torch {torch.__version__}, "
              f"threads {args.threads}, loadavg {os.getloadavg()}")
        lat, st = measure_latency(wl, batch, base, args.steps)
        steps_per_s = measure_throughput(st, base, tmp / "spill.sqlite", args.push)
        ratio = measure_overhead(wl, batch, base, args.rounds)
        print(json.dumps({"latency_ms_median": statistics.median(lat) * 1e3, "latency_ms_max": max(lat) * 1e3,
                          "steps_per_s": steps_per_s, "socket_vs_memory": ratio}))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
