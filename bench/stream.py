"""Streaming benchmark: a real `gradscape serve` on a free loopback port, W3 steps streamed into it.

Measures, in one run:
  latency     time from the end of a traced step (the `with` block exits) to the step being readable
              through the JSON API, per step (median, max);
  throughput  steps per second the tracer → server → store pipeline sustains (one recorded W3 step
              pushed N times through the socket sink, from the first write to the last step readable);
  overhead    the training loop's per-step cost with the socket sink against the memory sink
              (interleaved rounds, median of per-round ratios).

    python bench/stream.py [--steps 5] [--push 20] [--rounds 5] [--workload W3]
"""

from __future__ import annotations

import argparse
import copy
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from workloads import build  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W3")
    ap.add_argument("--steps", type=int, default=5, help="steps for the latency measurement")
    ap.add_argument("--push", type=int, default=20, help="steps pushed for the throughput measurement")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds for the overhead measurement")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="gradscape-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "gradscape", "serve", "--store", str(tmp / "bench.sqlite"),
                               "--port", str(port)], cwd=HERE.parent, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_readable(base + "/api/runs")
        wl = build(args.workload)
        batch = wl.batch()
        print(f"gradscape streaming benchmark: {args.workload} {wl.name}, torch {torch.__version__}, "
              f"threads {args.threads}, loadavg {os.getloadavg()}")

        # latency: end of traced step -> readable through the API
        tr = gradscape.Tracer(wl.model, run="latency", sink=base)
        lat, sizes = [], []
        for i in range(args.steps):
            with tr.step(i) as st:
                wl.loss(wl.model, batch).backward()
            t_end = time.perf_counter()
            t_ok = wait_readable(f"{base}/api/runs/latency/steps/{i}")
            lat.append(t_ok - t_end)
            sizes.append(len(st.nodes))
        tr.close()
        print(f"latency  nodes/step {sizes[0]}  median {statistics.median(lat) * 1e3:.0f} ms  "
              f"max {max(lat) * 1e3:.0f} ms  ({args.steps} steps)")

        # throughput: push one recorded step N times through the sink
        sink = SocketSink(base, "throughput", spill=str(tmp / "spill.sqlite"))
        t0 = time.perf_counter()
        for k in range(args.push):
            one = copy.copy(st)
            one.run, one.step = "throughput", k
            sink.write(one)
        t_written = time.perf_counter() - t0
        wait_readable(f"{base}/api/runs/throughput/steps/{args.push - 1}", timeout=600)
        dt = time.perf_counter() - t0
        sink.close()
        from gradscape.tracer.wire import pack, step_to_wire

        mb = len(pack(step_to_wire(st))) / 1e6
        print(f"throughput  {args.push / dt:.2f} steps/s  ({mb:.1f} MB per step, {args.push * mb / dt:.1f} MB/s; "
              f"the {args.push} write() calls took {t_written * 1e3:.1f} ms in all)  stats {sink.stats}")

        # overhead: training step with the socket sink vs the memory sink
        tr_mem = gradscape.Tracer(wl.model, run="mem")
        tr_net = gradscape.Tracer(wl.model, run="net", sink=base)
        ratios, t_mem, t_net = [], [], []
        for r in range(args.rounds + 1):
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
        print(json.dumps({"latency_ms_median": statistics.median(lat) * 1e3, "latency_ms_max": max(lat) * 1e3,
                          "steps_per_s": args.push / dt, "socket_vs_memory": statistics.median(ratios)}))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
