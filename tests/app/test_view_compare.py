"""app.view.compare on real traces: the difference A − B of a parameter's gradient, against
torch.autograd.grad; thumbnails when values were not kept; desync only for parameters across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from earlier_release import step_to_wire

import gradscape
from gradscape.app.view import compare as cmp


def _wire(x: torch.Tensor, mode: str = "full") -> tuple[dict[str, Any], dict[int, Any], torch.Tensor]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    tr = gradscape.Tracer(lin, tensors=mode)
    with tr.step(0) as st:
        lin(x).pow(2).sum().backward()
    tr.close()
    (ref,) = torch.autograd.grad(lin(x).pow(2).sum(), [lin.weight])
    assert st is not None
    wire = step_to_wire(st)
    arrays = {i: {"thumb": t.get("thumb"), "values": t.get("values")} for i, t in enumerate(wire["tensors"])}
    return wire, arrays, ref


def test_difference_of_a_parameter_gradient_on_full_values() -> None:
    xa, xb = torch.randn(4, 6), torch.randn(4, 6)
    wa, aa, ga = _wire(xa)
    wb, ab, gb = _wire(xb)
    assert {"label": "parameter weight", "value": "param:weight"} in cmp.targets(wa)
    res = cmp.compare(wa, aa, wb, ab, "param:weight", label_a="rank 0", label_b="rank 1", across_ranks=True)
    assert res["error"] is None and res["basis"].startswith("full values")
    want = (ga - gb).numpy().astype(np.float64)
    assert np.isclose(res["max_abs"], np.abs(want).max(), rtol=1e-5)
    z = np.array(res["figure"]["data"][0]["z"], dtype=np.float64)
    assert np.allclose(z, want, rtol=1e-5, atol=1e-6)  # a 5×6 matrix is shown as it is
    assert res["desync"] is True
    same = cmp.compare(wa, aa, wa, aa, "param:weight", label_a="rank 0", label_b="rank 1", across_ranks=True)
    assert same["max_abs"] == 0 and same["desync"] is False
    steps = cmp.compare(wa, aa, wb, ab, "param:weight", label_a="step 0", label_b="step 1", across_ranks=False)
    assert steps["desync"] is False  # two steps may differ: no desync
    assert steps["max_abs"] == res["max_abs"] and steps["figure"]["data"][0]["z"] == res["figure"]["data"][0]["z"]


def test_thumbnails_when_values_are_not_kept_and_said_so() -> None:
    gen = torch.Generator().manual_seed(1)  # (`_wire` seeds the global generator: inputs drawn from it could match)
    wa, aa, ga = _wire(torch.randn(4, 6, generator=gen), "summary")
    wb, ab, gb = _wire(torch.randn(4, 6, generator=gen), "summary")
    assert all(a["values"] is None for a in aa.values())  # summaries only: no values to compare
    res = cmp.compare(wa, aa, wb, ab, "param:weight", label_a="a", label_b="b", across_ranks=True)
    assert res["error"] is None and "thumbnails" in res["basis"] and res["note"]
    # a 5×6 gradient is its own thumbnail, each cell at bfloat16's precision (NOTE [Arena thumbnails]): the
    # difference drawn is torch's A − B of the two gradients so rounded, cell for cell
    want = (ga.bfloat16().float() - gb.bfloat16().float()).numpy().astype(np.float64)
    assert np.abs(want).max() > 0.1
    z = np.array(res["figure"]["data"][0]["z"], dtype=np.float64)
    assert z.shape == want.shape and np.array_equal(z, want)
    assert np.isclose(res["max_abs"], np.abs(want).max(), rtol=1e-12)


def test_node_target_and_missing_gradient() -> None:
    wa, aa, _ = _wire(torch.randn(4, 6))
    node = next(n["id"] for n in wa["nodes"] if n["kind"] == "op")
    t = cmp.node_target(wa, node)
    # what arrived at the node: its first grad_outputs slot
    assert t["value"] == f"node:{node}" and cmp.target_tensor(wa, t["value"]) == wa["nodes"][node]["go"][0]
    res = cmp.compare(wa, aa, wa, aa, "param:nope", label_a="a", label_b="b", across_ranks=True)
    assert res["figure"] is None and "no gradient on a" in res["error"]
