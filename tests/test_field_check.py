"""A step's fields checked in place (NOTE [Fields checked in place], `tracer/wire/field_check.py`): what the
writer writes passes unchanged, for real steps with every kind of field (modules, passes, parameters, problems,
optimizer steps, ranks); what the schema leaves out is filled as the writer fills it; and the server stores a
step sent as columns without making a `StepTrace`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from torch import nn
from zoo import ZOO, build

import gradscape
from gradscape.app.server import GradscapeApp, ServerConfig, create_app
from gradscape.tracer import _model, protocol
from gradscape.tracer.wire import WIRE_VERSION as V
from gradscape.tracer.wire import TraceFormatError, pack
from gradscape.tracer.wire.column_write import step_message
from gradscape.tracer.wire.field_check import Counts, checked_fields

FIELDS = ("v", "run", "step", "error", "meta", "modules", "params", "passes", "problems", "not_in_step", "rank",
          "world_size", "trigger", "optimizer_steps")


def _zoo_step(name: str) -> Any:
    case = build(name)
    tr = gradscape.Tracer(case.model, run=name)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    return st


def _trained_step() -> Any:
    """A monitored step with an optimizer step, clipping, a NaN gradient's problem and two backward passes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = gradscape.Tracer(model, run="trained")
    x = torch.randn(5, 4)
    with tr.step(0) as st:
        model(x).pow(2).mean().backward()
        model(x).sum().mul(float("nan")).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return st


@pytest.mark.parametrize("name", [*ZOO, "trained"])
def test_what_the_writer_writes_passes_unchanged(name: str) -> None:
    st = _trained_step() if name == "trained" else _zoo_step(name)
    wire = step_to_wire(st)
    fields = checked_fields(wire, Counts(len(wire["tensors"]), len(wire["nodes"])))
    assert list(fields) == list(FIELDS)
    assert pack(fields) == pack({k: wire[k] for k in FIELDS})  # every value, its type and order included
    if name == "trained":  # the fields this step exists for are there
        assert fields["problems"] and len(fields["passes"]) == 2
        (o,) = fields["optimizer_steps"]  # clipped: its norm before clipping is kept (NaN here, as sent)
        assert o["optimizer"] == "SGD" and math.isnan(o["grad_norm_before_clip"])


def test_what_the_schema_leaves_out_is_filled_as_the_writer_fills_it() -> None:
    sent = {"v": V, "run": "r", "step": 2, "junk": 1, "params": {"w": 0, "b": None},
            "passes": [{"index": 0, "api": "Tensor.backward", "roots": [1]}],
            "optimizer_steps": [{"optimizer": "SGD", "lr": [1], "scale": 2}]}
    f = checked_fields(sent, Counts(n_tensors=1, n_nodes=2))
    assert "junk" not in f and f["params"] == {"w": 0}  # a parameter without a gradient is left out
    assert f["passes"] == [{"index": 0, "api": "Tensor.backward", "roots": [1], "root_grads": [],
                            "retain_graph": False, "create_graph": False, "start": 0, "end": 0}]
    o = f["optimizer_steps"][0]
    assert o["lr"] == [1.0] and type(o["lr"][0]) is float and o["scale"] == 2.0 and o["skipped"] is False
    assert (f["modules"], f["problems"], f["meta"], f["rank"], f["error"]) == ({}, [], {}, None, None)


@pytest.mark.parametrize("sent, named", [
    ({"v": V, "run": "r"}, "missing field 'step'"),
    ({"v": V, "run": "r", "step": 0, "params": {"w": 5}}, "params['w']: tensor index 5 out of range"),
    ({"v": V, "run": "r", "step": 0, "passes": [{"index": 0, "api": "x", "roots": [9]}]}, "passes[0].roots"),
    ({"v": V, "run": "r", "step": 0, "problems": [{"kind": "nan", "message": 3}]}, "problems[0].message"),
    ({"v": V, "run": "r", "step": 0, "optimizer_steps": [{"optimizer": "SGD", "lr": ["x"]}]},
     "optimizer_steps[0].lr[0]"),
    ({"v": V, "run": "r", "step": 0, "meta": {"f": object()}}, "meta.f"),
    ({"v": V + 1, "run": "r", "step": 0}, f"wire version {V + 1}"),
])
def test_a_wrong_field_is_named(sent: dict[str, Any], named: str) -> None:
    with pytest.raises(TraceFormatError) as err:
        checked_fields(sent, Counts(n_tensors=1, n_nodes=2))
    assert named in str(err.value)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[GradscapeApp]:
    created = create_app(str(tmp_path / "store.sqlite"), ServerConfig(notify_interval=0.02))
    yield created
    created.close()


def test_the_server_stores_a_column_step_without_making_a_step_trace(app: GradscapeApp,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    msg = step_message(_trained_step())
    assert msg is not None
    made: list[Any] = []
    init = _model.StepTrace.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(_model.StepTrace, "__init__", counted)
    dash_app, sio = app
    c = sio.test_client(dash_app.server, namespace="/tracer")
    c.emit("hello", protocol.envelope("hello", "trained", 0, {"client": "t", "accepts": [1], "pid": 1, "host": "h"}),
           namespace="/tracer", callback=True)
    ack = c.emit("step_chunk", protocol.envelope("step_chunk", "trained", 1, {"step": 0, "chunk": 0, "chunks": 1,
                                                                              "data": pack(msg)}),
                 namespace="/tracer", callback=True)
    assert ack["ok"] and made == []
    monkeypatch.undo()
    stored = gradscape.load(app.state.store.path, "trained", 0)  # and it reads back with every field
    assert [o.optimizer for o in stored.optimizer_steps] == ["SGD"] and stored.problems
