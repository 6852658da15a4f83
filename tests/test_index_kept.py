"""NOTE [Index kept] (tracer/record/model_index.py): a Tracer names the model's modules and parameters once and
keeps the names while the model holds the very same objects; a parameter replaced, a module added or a
parameter tied to another's between traced steps is named as the model now has it."""

from __future__ import annotations

import torch
import torch.nn as nn

import gradscape


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.extra: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.tanh(self.a(x)))
        return self.extra(h) if self.extra is not None else h


def _step(tr: gradscape.Tracer, model: Net, i: int) -> gradscape.StepTrace:
    with tr.step(i) as st:
        model(torch.randn(3, 4)).pow(2).sum().backward()
    assert st is not None
    return st


def _param_grads(st: gradscape.StepTrace) -> dict[str, float]:
    return {n.param: n.grad_outputs[0].stats["norm"] for n in st.nodes if n.kind == "param" and n.grad_outputs}


def _want(model: nn.Module) -> dict[str, float]:
    out = {n: float(torch.linalg.vector_norm(p.grad)) for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def test_names_follow_the_model_between_traced_steps() -> None:
    torch.manual_seed(0)
    model = Net()
    tr = gradscape.Tracer(model, every=1)
    changes = [
        ("first", lambda: None),
        ("unchanged", lambda: None),
        ("a parameter replaced", lambda: setattr(model.a, "weight", nn.Parameter(torch.randn(4, 4)))),
        ("a module added", lambda: setattr(model, "extra", nn.Linear(4, 2))),
        ("a parameter tied to another", lambda: setattr(model.b, "weight", model.a.weight)),
        ("unchanged again", lambda: None),
    ]
    built = []
    for i, (what, change) in enumerate(changes):
        change()
        st = _step(tr, model, i)
        built.append(tr._names.built)
        got, want = _param_grads(st), _want(model)
        assert set(got) == set(want), what  # every parameter named as `named_parameters()` names it now
        for name, norm in want.items():
            assert abs(got[name] - norm) <= 1e-5 * max(1.0, norm), (what, name)
    assert built[1] is built[0] and built[5] is built[4]  # kept while nothing changed
    assert len({id(b) for b in built[1:5]}) == 4  # made anew at each change
    assert "extra.weight" in want and "b.weight" not in want  # (the tied parameter's first name is a.weight)
    tr.close()
