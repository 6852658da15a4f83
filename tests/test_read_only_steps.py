"""A `StepTrace` cannot be assigned to (NOTE [Read-only steps] in tracer/_model.py): not the one a `with` block
hands out, from either recorder, nor one read back from a file, in either stored form. The error names the
field, nothing changes, and `dataclasses.replace` gives a changed copy."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest
import torch
from earlier_release import step_to_wire, write_maps

import gradscape
from gradscape.tracer.blobs import decompress
from gradscape.tracer.record import native
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import unpack

RECORDERS = ["python", pytest.param("native", marks=pytest.mark.skipif(not native.status()[0],
                                                                       reason="the native recorder is not built"))]


def _traced(recorder: str, sink: str | None = None) -> gradscape.StepTrace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with gradscape.Tracer(model, run="ro", recorder=recorder, sink=sink) as tr, tr.step(0) as st:
        model(torch.randn(5, 3)).pow(2).sum().backward()
    assert st is not None
    return st


def _check_read_only(st: gradscape.StepTrace) -> None:
    nodes, meta, trigger = st.nodes, st.meta, st.trigger
    assert len(nodes) > 0
    for field, value in (("nodes", []), ("meta", {}), ("trigger", "nonfinite"), ("step", 7)):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"'{field}'"):
            setattr(st, field, value)
    with pytest.raises(AttributeError):  # FrozenInstanceError is one: code that catches AttributeError sees it
        del st.edges
    assert st.nodes is nodes and st.meta is meta and st.trigger is trigger and st.step == 0 and st.edges
    changed = dataclasses.replace(st, step=7, trigger="nonfinite")
    assert (changed.step, changed.trigger, changed.nodes) == (7, "nonfinite", nodes)
    assert (st.step, st.trigger) == (0, trigger)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_recorded_step_is_read_only(recorder: str) -> None:
    st = _traced(recorder)
    assert st.meta["recorder"] == recorder
    _check_read_only(st)


@pytest.mark.parametrize("form", [*RECORDERS, "maps"])
def test_a_step_read_back_is_read_only(form: str, tmp_path: Path) -> None:
    """Each recorder's step is stored as columns, from its tables or its nodes; "maps": the form earlier releases
    stored, read by its own reader."""
    path = str(tmp_path / "ro.sqlite")
    if form == "maps":
        recorded = _traced("python")
        with TraceStore(path) as store:
            write_maps(store, step_to_wire(recorded))
    else:
        recorded = _traced(form, sink=path)
    with sqlite3.connect(path) as db:
        (blob,) = db.execute("SELECT graph FROM steps").fetchone()
    assert ("columns" in unpack(decompress(blob))) == (form != "maps")
    st = gradscape.load(path, step=0)
    assert [n.name for n in st.nodes] == [n.name for n in recorded.nodes]
    _check_read_only(st)
