"""`gradscape demo` (what `make run` runs): a new user sees a live trace within a minute."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from serving import ROOT, ApiError, free_port, get_json

from gradscape.app.demo import make


def _step_zero(model: str) -> tuple[list[str], dict[str, float]]:
    """The demo's step 0 (app/demo.py: seed 0, the first batch) without the tracer: the names of the nodes
    of its backward graph (a walk over grad_fn.next_functions), and each parameter's gradient norm from
    torch.autograd.grad."""
    torch.manual_seed(0)
    net, batch = make(model)
    x, y = batch()  # type: ignore[operator]
    out = net(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    seen, todo = set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    params = dict(net.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()))
    return sorted(fn.name() for fn in seen), {k: g.norm().item() for k, g in zip(params, grads)}


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_demo_streams_a_live_trace(tmp_path: Path, model: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gradscape", "demo", "--port", str(port), "--store",
                             str(tmp_path / "demo.sqlite"), "--model", model, "--every", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        steps: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(steps) < 2:
            with contextlib.suppress(OSError, ApiError):
                steps = get_json(f"http://127.0.0.1:{port}/api/runs/demo-{model}/steps", timeout=2)["steps"]
            time.sleep(0.2)
        assert len(steps) >= 2, "no live steps within a minute"
        assert [s["step"] for s in steps[:2]] == [0, 2]  # every 2nd step is traced
        graph = get_json(f"http://127.0.0.1:{port}/api/runs/demo-{model}/steps/0")
        want_nodes, want_grads = _step_zero(model)
        assert sorted(n["name"] for n in graph["nodes"]) == want_nodes  # the whole backward graph, every node run
        assert sorted(graph["order"]) == sorted(n["id"] for n in graph["nodes"])
        assert set(graph["params"]) == set(want_grads)
        for name, norm in want_grads.items():  # the gradients of the demo's first step, as torch computes them
            assert graph["tensors"][graph["params"][name]]["stats"]["norm"] == pytest.approx(norm, rel=1e-5), name
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert f"http://127.0.0.1:{port}/" in out
