"""A natively recorded step's module calls are made when first read (NOTE [Lazy module calls] in
tracer/record/lazy_modules.py): the tracer makes none, a call read holds its nodes' very tensors, the sum of an
input several ops used is what `register_full_backward_hook` sees, and the wire form (maps and columns) is the
same, byte for byte, whether the calls were read before writing or not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from test_native_recorder import PROGRAMS, ModuleCalls, _program

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.record import slot_rows as slot_rows_module
from gradscape.tracer.record.lazy_modules import LazyModules
from gradscape.tracer.record.slot_rows import slot_rows
from gradscape.tracer.wire.codec import pack
from gradscape.tracer.wire.column_write import step_columns

pytestmark = pytest.mark.skipif(not native.status()[0], reason="module calls are lazy when natively recorded")


def _written(st: Any) -> tuple[bytes, bytes, list[Any], bool]:
    """The step's columns (made first: writing them makes no module call, asserted by the caller) and maps."""
    made = step_columns(st)
    assert made is not None
    doc, arrays = made
    calls_made = st.modules._made is not None
    return pack(step_to_wire(st)), pack(doc), arrays, calls_made


def _same_arrays(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (ta, va), (tb, vb) in zip(a, b):
        assert (ta is None) == (tb is None) and (va is None) == (vb is None)
        if ta is not None:
            np.testing.assert_array_equal(ta, tb)


def _read_all(st: Any) -> None:
    for m in st.modules.values():
        for c in m.calls:
            list(c.grad_input), list(c.grad_output)


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_wire_is_the_same_whether_the_calls_were_read_or_not(name: str) -> None:
    model, loss_of = _program(name)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder") == "native", st.meta
    assert isinstance(st.modules, LazyModules) and st.modules._made is None, "the tracer made the module calls"
    maps, cols, arrays, calls_made = _written(st)
    assert not calls_made, "writing the step's columns made the module calls"
    _read_all(st)
    maps2, cols2, arrays2, _ = _written(st)
    assert maps == maps2
    assert cols == cols2
    _same_arrays(arrays, arrays2)


def test_a_call_read_holds_its_nodes_tensors_and_the_hooks_sums() -> None:
    torch.manual_seed(0)
    model = ModuleCalls()
    x = torch.randn(3, 4, requires_grad=True)
    seen: dict[str, list[Any]] = {"fc": [], "act": []}
    hooks = [getattr(model, q).register_full_backward_hook(
        lambda _m, gi, go, q=q: seen[q].append((gi[0].clone(), go[0].clone()))) for q in seen]
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        model(x).sum().backward()
    for h in hooks:
        h.remove()
    assert list(st.modules) == ["<root>"] + [q for q, _ in model.named_modules() if q]
    assert "fc" in st.modules and "nope" not in st.modules and st.modules._made is None  # names: nothing made
    for q in seen:
        calls = st.modules[q].calls
        assert len(calls) == 2
        # the hooks run in backward order: the call made last in the forward first
        for call, (gi, go) in zip(calls, reversed(seen[q])):
            assert call.grad_input[0] is not None and call.grad_output[0] is not None
            np.testing.assert_allclose(call.grad_input[0].stats["norm"], float(gi.norm()), rtol=1e-6)
            np.testing.assert_allclose(call.grad_output[0].stats["norm"], float(go.norm()), rtol=1e-6)
            out = call.output_nodes[0]
            assert out is not None and any(call.grad_output[0] is t for t in st.nodes[out].grad_outputs)


@pytest.mark.parametrize("read", ["lists", "arrays", "numpy"])
@pytest.mark.parametrize("name", ["lstm", "module_calls"])
def test_slot_rows_name_the_tensors_the_nodes_hold(name: str, read: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looked up one by one (from the columns as lists, as a small graph's are once made, or from the arrays)
    or all at once with numpy, a slot's row is the one whose `TensorTrace` the node holds there."""
    monkeypatch.setattr(slot_rows_module, "_SMALL_GRAPH", 0 if read == "numpy" else 10**9)
    model, loss_of = _program(name)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss_of(model).backward()
    t = st.nodes.tables
    if read == "lists":
        t.lists()
    made = t._lists
    queries = [(k, sent, j) for k in range(len(st.nodes)) for sent in (True, False) for j in range(-1, 3)]
    queries.append((len(st.nodes), False, 0))  # past the last node: none
    nodes, sents, js = (list(q) for q in zip(*queries))
    assert len(queries) > 16  # the path for many
    many = slot_rows(t, nodes, sents, js)
    few = [slot_rows(t, [k], [s], [j])[0] for k, s, j in queries]
    assert many == few
    assert t._lists is made  # the arrays were read as they were (the lists made only when asked)
    for (k, sent, j), row in zip(queries, many):
        grads = None if k >= len(st.nodes) else st.nodes[k].grad_inputs if sent else st.nodes[k].grad_outputs
        want = grads[j] if grads is not None and 0 <= j < len(grads) else None
        assert (None if row < 0 else t.tensors.get(row)) is want, (k, sent, j)
