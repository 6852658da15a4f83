"""Tutorial 6: live breakpoints inside backward.

    python examples/live_breakpoints.py

A real `gradscape serve` on a free loopback port; a training loop on a thread of this process streams to
it (`sink=<the server's URL>`). Through the server's JSON API (the page's breakpoint panel does the same)
this script sets a breakpoint on the `AddmmBackward0` nodes, waits until training pauses INSIDE its backward
pass, reads the gradients that arrived at the paused node, runs one more node (`step`), clears the
breakpoint and lets training go on (`continue`). The parameters at the end are bitwise those of the same
loop run without gradscape.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape

RUN = "bp-tutorial"


def api(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """One JSON API call; an HTTP error comes back as its status and body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"waited {timeout:g} s for {what}")


def serve(store: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`gradscape serve` on a port the system picks; returns the process and the URL it printed."""
    log = store.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gradscape", "serve", "--store", str(store), "--port", "0"],
                                stdout=out, stderr=subprocess.STDOUT)
    found = wait_for("the server's URL", lambda: proc.poll() is None and re.search(
        r"(http://127\.0\.0\.1:\d+)/", log.read_text(errors="replace")))
    return proc, found.group(1)


def model_and_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(6, 8))
    model.add_module("act", nn.ReLU())
    model.add_module("fc2", nn.Linear(8, 3))
    return model, torch.randn(16, 6), torch.randint(0, 3, (16,))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, tr: gradscape.Tracer | None,
          steps: int | None = None, stop: threading.Event | None = None, ran: list[int] | None = None) -> int:
    """SGD steps: `steps` of them, or until `stop` is set (`ran[0]` counts them as they end)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    i = 0
    while (steps is None or i < steps) and not (stop is not None and stop.is_set()):
        if tr is not None:
            with tr.step(i):
                F.cross_entropy(model(x), y).backward()
        else:
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        i += 1
        if ran is not None:
            ran[0] = i
    return i


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(Path(tmp) / "live.sqlite")
        try:
            return debug_session(url)
        finally:
            proc.terminate()
            proc.wait(10)


def debug_session(url: str) -> dict[str, Any]:
    model, x, y = model_and_data()
    twin = copy.deepcopy(model)
    run = f"{url}/api/runs/{RUN}"
    tr = gradscape.Tracer(model, sink=url, run=RUN)
    stop, ran = threading.Event(), [0]
    trainer = threading.Thread(target=train, args=(model, x, y, tr), kwargs={"stop": stop, "ran": ran})
    trainer.start()
    try:
        # the run exists on the server once its tracer connected; then set the breakpoint
        wait_for("the run", lambda: api(f"{run}/breakpoints", "POST", {"on": "node", "name": "AddmmBackward0"})[0]
                 == 201)
        paused = wait_for("a pause", lambda: (lambda d: d if d.get("paused") else None)(api(f"{run}/paused")[1]))
        node = paused["node"]
        print(f"paused at step {paused['step']} inside backward, at node {node['id']} {node['name']} "
              f"(module {node['module']}, {node['source']}), after {paused['executed']} nodes ran")
        listing = api(f"{run}/paused/nodes")[1]["nodes"]
        arrived = listing[-1]["grad_outputs"][0]
        print(f"  arrived there: grad_outputs[0] {arrived['shape']}, norm {arrived['stats']['norm']:.6g}")

        api(f"{run}/resume", "POST", {"mode": "step"})  # run exactly one more node, and pause again
        again = wait_for("the next node", lambda: (lambda d: d if d.get("executed", 0) > paused["executed"]
                                                   else None)(api(f"{run}/paused")[1]))
        print(f"step: one more node ran, now paused at {again['node']['name']} ({again['executed']} nodes ran)")
        api(f"{run}/breakpoints", "DELETE")
        api(f"{run}/resume", "POST", {"mode": "continue"})
        wait_for("training to go on", lambda: api(f"{run}/paused")[1] == {"paused": False}
                 and ran[0] >= paused["step"] + 5)
    finally:
        stop.set()
        trainer.join(60)
        tr.close(timeout=60)  # every step streamed is stored before the server stops
    steps = ran[0]
    print(f"training went on: {steps} steps in all")

    # Check against torch: the same loop without gradscape ends with bitwise the same parameters, and the
    # gradient that arrived at fc2's addmm is dL/dlogits at the paused step
    probe = copy.deepcopy(twin)
    train(probe, x, y, None, steps=paused["step"])
    logits = probe(x)
    (dlogits,) = torch.autograd.grad(F.cross_entropy(logits, y), logits)
    assert node["name"] == "AddmmBackward0" and node["module"] == "fc2" and arrived["shape"] == [16, 3]
    assert abs(arrived["stats"]["norm"] - float(dlogits.norm())) <= 1e-5 * float(dlogits.norm())
    train(twin, x, y, None, steps=steps)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    print("parameters after the run: bitwise those of a run that never paused")
    return {"paused": paused, "again": again, "steps": steps}


if __name__ == "__main__":
    main()
