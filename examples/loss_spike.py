"""Tutorial 5: a loss spike at a step nobody scheduled a trace for, and which layer moved first.

    python examples/loss_spike.py

The loop traces only step 0 (`every=1000`), but the every-step monitor watches each step's loss and
gradient norms. At step 30 one batch comes in a hundred times too large; the loss jumps, the `loss_spike`
trigger traces that very backward (`st.trigger`), and its first problem names the parameter whose gradient
norm rose first and most against its own median. Inside the block `st` is None (the step was not known to be
traced when it began): the trace is in `tr.last` and in the sinks.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
import torch.nn as nn

import gradscape

SPIKE, STEPS = 30, 34


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    data = []
    for i in range(STEPS):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
        data.append((x * 100, y * 100) if i == SPIKE else (x, y))  # one corrupt batch
    return data


def main() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    norms: list[dict[str, float]] = []  # each parameter's gradient norm, read from p.grad, step by step
    traced: list[gradscape.StepTrace] = []
    with gradscape.Tracer(model, every=1000, norms_every=1) as tr:  # norms on every step, not sampled
        for i, (x, y) in enumerate(batches(), start=1):  # from 1: step 0 would be scheduled
            with tr.step(i):
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
            norms.append({n: float(p.grad.norm()) for n, p in model.named_parameters()})  # type: ignore[union-attr]
            opt.step()
            opt.zero_grad()
            if tr.last is not None and tr.last.step == i:
                traced.append(tr.last)
        history = tr.history

    st = traced[0]
    spike = SPIKE + 1
    print(f"traced steps: {[(s.step, s.trigger) for s in traced]}")
    print(f"loss: step {spike - 1} {history[spike - 2]['loss']:.3g}, step {spike} {history[spike - 1]['loss']:.3g}")
    problem = st.problems[0]
    print(f"{problem.kind}: {problem.message}")
    assert st.step == spike and st.trigger == "loss_spike" and problem.kind == "loss_spike"
    assert st.nodes[problem.node].param == problem.param  # type: ignore[index]

    # Check against torch, from p.grad: each parameter's gradient norm at the spike over its own median before
    # it, and the first of the 5 steps before the spike where it already stood at 3× that median or more.
    # The layer named is the one that rose first, and of those the one that rose most.
    before = norms[:spike - 1]
    rows = []
    for name in norms[0]:
        med = statistics.median(r[name] for r in before)
        rose = [s for s in range(spike - 5, spike) if norms[s - 1][name] / med >= 3.0]
        rows.append(((rose or [spike])[0], norms[spike - 1][name] / med, name))
    for first, ratio, name in sorted(rows, key=lambda r: (r[0], -r[1])):
        print(f"  {name:10s} ×{ratio:7.1f} its median at step {spike}, at 3× or more from step {first}")
    first, _, name = min(rows, key=lambda r: (r[0], -r[1]))
    assert problem.param == name and f"from step {first}" in problem.message
    row = history[spike - 1]["param_norms"]  # the monitor's row of the spike: the norms torch computed
    assert all(math.isclose(row[n], norms[spike - 1][n], rel_tol=1e-4) for n in norms[0])
    return {"step": st.step, "trigger": st.trigger, "param": problem.param}


if __name__ == "__main__":
    main()
