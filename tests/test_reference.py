"""Every recorded gradient of every node equals the engine's own answer (tensors="full")."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES, close, grad_wrt_outputs, graph_nodes, vjp_of_node
from zoo import ZOO, build

import gradscape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ZOO)
def test_every_gradient_matches_autograd(name: str, device: str) -> None:
    case = build(name, device)
    tr = gradscape.Tracer(case.model, tensors="full")
    with tr.step(0) as st:
        loss = case.loss(case.model, case.batch)
        loss.backward(retain_graph=True)
    nodes = graph_nodes(loss)
    assert [n.name() for n in nodes] == [n.name for n in st.nodes]
    checked_out = checked_in = 0
    for torch_node, nt in zip(nodes, st.nodes):
        assert nt.order is not None, f"{nt.name} #{nt.id} did not run"
        ref_out = grad_wrt_outputs(loss, torch_node)
        for i, (got, ref) in enumerate(zip(nt.grad_outputs, ref_out)):
            if ref is None:
                assert got is None
                continue
            assert got is not None and got.values is not None
            assert close(got.values, ref), f"{name}: {nt.name}#{nt.id} grad_outputs[{i}]"
            checked_out += 1
        if nt.grad_inputs is None:
            continue
        if nt.kind in ("param", "leaf"):
            assert nt.grad_inputs == []  # AccumulateGrad sends nothing on
            continue
        ref_in = vjp_of_node(torch_node, ref_out)
        for j, (got, ref) in enumerate(zip(nt.grad_inputs, ref_in)):
            if got is None or ref is None:
                continue
            assert close(got.values, ref), f"{name}: {nt.name}#{nt.id} grad_inputs[{j}] ({nt.input_labels[j]})"
            checked_in += 1
    assert checked_out >= len(st.nodes) and checked_in > 0
    for pname, p in case.model.named_parameters():
        if p.grad is not None and pname in st.params:
            assert close(st.params[pname].values, p.grad), pname


def test_summary_stats_match_values() -> None:
    case = build("cnn")
    tr = gradscape.Tracer(case.model, tensors="full")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    n = 0
    for nt in st.nodes:
        for t in (nt.grad_outputs or []) + (nt.grad_inputs or []):
            if t is None:
                continue
            v = torch.from_numpy(t.values).double()
            assert t.stats["min"] == pytest.approx(v.min().item(), rel=1e-5, abs=1e-7)
            assert t.stats["max"] == pytest.approx(v.max().item(), rel=1e-5, abs=1e-7)
            assert t.stats["mean"] == pytest.approx(v.mean().item(), rel=1e-3, abs=1e-6)
            assert t.stats["norm"] == pytest.approx(v.norm().item(), rel=1e-4, abs=1e-7)
            if v.numel() > 1:
                assert t.stats["std"] == pytest.approx(v.std().item(), rel=1e-3, abs=1e-6)
            assert t.stats["zeros"] == (v == 0).sum().item()
            assert t.stats["nan"] == 0 and t.stats["inf"] == 0
            n += 1
    assert n > 20


def _stats_close(tr: gradscape.TensorTrace, ref: torch.Tensor, where: str) -> None:
    v = ref.detach().double()
    assert tr.shape == tuple(ref.shape), where
    assert tr.stats["min"] == pytest.approx(v.min().item(), rel=1e-5, abs=1e-7), where
    assert tr.stats["max"] == pytest.approx(v.max().item(), rel=1e-5, abs=1e-7), where
    assert tr.stats["norm"] == pytest.approx(v.norm().item(), rel=1e-4, abs=1e-7), where
    assert tr.stats["zeros"] == (v == 0).sum().item(), where


@pytest.mark.parametrize("name", ZOO)
def test_summary_mode_matches_autograd(name: str) -> None:
    """The default mode keeps no values, only summaries: those of every node's gradients, on the
    second traced step (the summary kernel's fast path, with every shape's plan made on the first),
    match statistics of the engine's own answers. This covers the dedupe of a summary between the
    node that sends a gradient and the one that receives it."""
    case = build(name)
    tr = gradscape.Tracer(case.model)
    with tr.step(0):
        case.loss(case.model, case.batch).backward()
    case.model.zero_grad()
    with tr.step(1) as st:
        loss = case.loss(case.model, case.batch)
        loss.backward(retain_graph=True)
    nodes = graph_nodes(loss)
    assert [n.name() for n in nodes] == [n.name for n in st.nodes]
    checked = 0
    for torch_node, nt in zip(nodes, st.nodes):
        ref_out = grad_wrt_outputs(loss, torch_node)
        for i, (got, ref) in enumerate(zip(nt.grad_outputs, ref_out)):
            if ref is not None:
                assert got is not None
                _stats_close(got, ref, f"{name}: {nt.name}#{nt.id} grad_outputs[{i}]")
                checked += 1
        if nt.grad_inputs is None or nt.kind in ("param", "leaf"):
            continue
        for j, (got, ref) in enumerate(zip(nt.grad_inputs, vjp_of_node(torch_node, ref_out))):
            if got is not None and ref is not None:
                _stats_close(got, ref, f"{name}: {nt.name}#{nt.id} grad_inputs[{j}]")
                checked += 1
    assert checked > len(st.nodes)
