"""NOTE [Superseded norms] (tracer/monitor/superseded.py): a micro-batched step takes the norms once, after its last
backward, once the step before showed each backward's snapshot superseded by the next; the history's norms are
those of the gradients the optimizer stepped with (torch's own to 1e-6: the extension's where it takes them, NOTE
[Native norms] in tracer/monitor/grad_norms.py), and a step whose shape changes keeps each parameter's norm as its
last backward left it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.monitor import capture


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.a = nn.Linear(8, 1)
        self.b = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.a(h), self.b(h)


def _norms(model: nn.Module) -> dict[str, float]:
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    return {n: float(v) for (n, _), v in zip(named, torch._foreach_norm([g for _, g in named]))}


def _total(norms: dict[str, float]) -> float:
    return float(torch.linalg.vector_norm(torch.tensor(list(norms.values()), dtype=torch.float32)))


@pytest.mark.parametrize("every", [10 ** 9, 1])  # untraced steps with norms; every step traced
def test_micro_batches_take_one_snapshot_of_what_was_stepped(every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []
    finish = capture.StepCapture.finish

    def counted(self: capture.StepCapture) -> None:
        finish(self)
        taken.append(len(self.snaps))

    monkeypatch.setattr(capture.StepCapture, "finish", counted)
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    want: list[dict[str, float]] = []
    head_b_after_first: list[float] = []
    with gradscape.Tracer(model, every=every, norms_every=1, tensors="summary") as tr:
        for step in range(1, 6):
            with tr.step(step):
                for micro in range(4):
                    a, b = model(torch.randn(5, 6, generator=g))
                    loss = a.pow(2).mean() + (b.pow(2).mean() if step != 5 or micro == 0 else 0.0)
                    loss.backward()
                    if step == 5 and micro == 0:  # the loop changes shape: head b leaves this step's later calls
                        head_b_after_first.append(float(torch._foreach_norm([model.b.weight.grad])[0]))
                        model.b.zero_grad(set_to_none=True)
                want.append(_norms(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
        rows = {r["step"]: r for r in tr.history}
    # step 1 learns; steps 2-4 take the norms once, after the last backward; step 5 (changed) takes them as it goes
    assert taken[:4] == [4, 1, 1, 1]
    for step in range(1, 5):
        row, ref = rows[step], want[step - 1]
        assert row["param_norms"] == pytest.approx(ref, rel=1e-6), step
        assert row["grad_norm"] == pytest.approx(_total(ref), rel=1e-6), step
    # step 5: head b's gradient was dropped after the first call, whose snapshot was then taken at the second
    # call's start (not superseded): its norm is the first call's
    row = rows[5]
    assert row["param_norms"]["b.weight"] == pytest.approx(head_b_after_first[0], rel=1e-6)
    assert {n: v for n, v in row["param_norms"].items() if not n.startswith("b.")} == pytest.approx(want[4], rel=1e-6)


def test_a_clip_after_a_kept_snapshot_takes_it_before_it_clips() -> None:
    """The loop's shape learned as two calls, then a clip after the first call and no second: the kept snapshot
    is taken as the clip starts, and the norm before clipping is the one `clip_grad_norm_` returned, bit for
    bit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    with gradscape.Tracer(model, every=1, norms_every=1) as tr:
        for step in range(1, 4):
            with tr.step(step) as st:
                model(torch.randn(5, 6, generator=g)).pow(2).mean().backward()
                if step == 3:
                    returned = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3))
                else:
                    model(torch.randn(5, 6, generator=g)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            assert tr._monitor.superseded == ((True, False) if step < 3 else (False,))
    assert st is not None and st.step == 3
    (rec,) = st.optimizer_steps
    assert rec.grad_norm_before_clip == returned  # bitwise: the same computation as clip_grad_norm_
    assert rec.grad_norm == pytest.approx(1e-3, rel=1e-4)
