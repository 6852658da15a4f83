"""Slot labels come from torch's derivatives table, and never crash without it."""

from __future__ import annotations

import pytest
import torch
from zoo import build

import gradscape
from gradscape.tracer.record import derivatives as _derivatives
from gradscape.tracer.record import labels as _labels


def test_shipped_table_covers_torch_nodes() -> None:
    table = _derivatives.derivatives_table()
    assert len(table) > 600
    assert table["AddmmBackward0"]["args"] == ["self", "mat1", "mat2"]
    assert table["CatBackward0"]["list"] == [True]
    assert _labels.slot_args("CatBackward0", "op", 3) == ["tensors[0]", "tensors[1]", "tensors[2]"]
    assert _labels.slot_args("NativeLayerNormBackward0", "op", 3) == ["input", "weight", "bias"]


def test_unknown_nodes_get_generic_labels() -> None:
    assert _labels.slot_args("NoSuchBackward7", "op", 2) == ["input 0", "input 1"]
    assert _labels.slot_args("AddmmBackward0", "op", 5) == [f"input {j}" for j in range(5)]  # a mismatch


def test_tracing_works_without_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_labels, "derivatives_table", lambda: {})
    case = build("mlp")
    tr = gradscape.Tracer(case.model)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    (addmm,) = [n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc3"]
    assert addmm.input_labels == ["input 0 → fc3.bias", "input 1 → input of fc3", "input 2 → fc3.weight (transposed)"]


def test_in_place_write_into_a_view() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    tr = gradscape.Tracer()
    with tr.step(0) as st:
        z = x * 2
        z[0] = 5.0
        z.sum().backward()
    (cs,) = st.by_name("torch::autograd::CopySlices")
    assert cs.input_args[0].startswith("self (base")
    assert x.grad is not None and x.grad[0].tolist() == [0.0, 0.0, 0.0]


class _Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = self.a(x)
        return (self.b(h) if use_b else torch.relu(h)).sum()


def _static_view(st: gradscape.StepTrace) -> list[tuple[object, ...]]:
    return [(n.name, n.module, n.param, n.schema, n.input_args, n.input_labels, n.input_shapes,
             n.output_shapes, n.output_dtypes) for n in st.nodes]


def test_labels_and_shapes_follow_each_steps_graph_with_one_tracer() -> None:
    """One Tracer reuses what depends only on the graph's structure from step to step; a step with
    another graph (a branch taken, a leaf of another shape) must get its own labels and shapes,
    the same as a fresh Tracer gives for it."""
    torch.manual_seed(0)
    model = _Branchy()
    plan = [(False, 2), (True, 2), (False, 2), (False, 5), (True, 5)]
    tr = gradscape.Tracer(model)
    for i, (use_b, rows) in enumerate(plan):
        x = torch.randn(rows, 3, requires_grad=True)
        with tr.step(i) as st:
            model(x, use_b).backward()
        with gradscape.Tracer(model).step(0) as fresh:
            model(x, use_b).backward()
        assert st is not None and fresh is not None
        assert _static_view(st) == _static_view(fresh), (use_b, rows)
        leaf = next(n for n in st.nodes if n.kind == "leaf")
        assert leaf.output_shapes == [(rows, 3)]
        assert any(lab.endswith(f"leaf tensor [{rows}×3])") for n in st.nodes for lab in n.input_labels)


def test_steps_with_the_same_graph_share_their_static_lists() -> None:
    """Fewer objects per kept step (the cyclic GC re-scans every one of them): the label and shape
    lists of an unchanged graph are the previous step's objects."""
    case = build("mlp")
    tr = gradscape.Tracer(case.model)
    steps = []
    for i in range(2):
        with tr.step(i) as st:
            case.loss(case.model, case.batch).backward()
        steps.append(st)
    a, b = steps
    assert a is not None and b is not None
    for na, nb in zip(a.nodes, b.nodes):
        assert na.input_labels is nb.input_labels and na.output_shapes is nb.output_shapes
        assert na.grad_outputs is not nb.grad_outputs


@pytest.mark.parametrize("module_of", ["by_module", "none"])
def test_a_graphs_destinations_are_worded_once_and_alike(module_of: str) -> None:
    """`Destinations` (each child's chain followed once, each wording made once) words every slot as
    `destination` does on its own: parameters through pass-through chains, leaves inside and outside a
    module, outputs of other modules, and slots with no gradient."""
    from gradscape.tracer.record.labels import ACCUMULATE, Destinations, SlotInfo, destination

    mod = (lambda m: m) if module_of == "by_module" else (lambda m: None)
    nodes = [
        SlotInfo(ACCUMULATE, "param", None, "fc.weight", (3, 4), []),  # 0
        SlotInfo("TBackward0", "op", mod("fc"), None, None, [0]),  # 1: fc.weight (transposed)
        SlotInfo(ACCUMULATE, "leaf", None, None, (2, 4), []),  # 2: a leaf
        SlotInfo("AddmmBackward0", "op", mod("fc"), None, None, [None, 2, 1]),  # 3
        SlotInfo("ReluBackward0", "op", mod("act"), None, None, [3]),  # 4: output of fc
        SlotInfo("ViewBackward0", "op", mod("act"), None, None, [1]),  # 5: a chain of two pass-throughs
        SlotInfo("MulBackward0", "op", mod("head.inner"), None, None, [4, 2, 5, 3]),  # 6
        SlotInfo("SumBackward0", "op", mod("head"), None, None, [6]),  # 7: inside its own module
    ]
    where = Destinations(nodes)
    for _ in range(2):  # the second time from its memo
        for owner in nodes:
            args = [f"arg{j}" for j in range(len(owner.children))]
            assert where.labels(owner, args) == [f"{a} → {destination(nodes, owner, c)}"
                                                 for a, c in zip(args, owner.children)]
    words = {destination(nodes, o, c) for o in nodes for c in o.children}
    assert {"no gradient needed", "fc.weight (transposed)"} <= words
    assert len(words) >= 5


def test_grouped_statics_equal_the_node_by_node_ones() -> None:
    """NOTE [Grouped statics]: an unrolled loop of repeated cells (ops, pass-through chains to parameters,
    leaves, custom and compiled nodes) gets from `grouped_statics` the very arguments, labels and schemas
    `compute_statics` gives node by node; equal nodes share their lists, nodes that differ in a
    destination do not."""
    import numpy as np

    from gradscape.tracer.record.labels import ACCUMULATE, SlotInfo
    from gradscape.tracer.record.structure import ArrayGraph, compute_statics, grouped_statics

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
            return x * factor

    nodes = [SlotInfo(ACCUMULATE, "param", None, "cell.weight", (4, 4), []),
             SlotInfo(ACCUMULATE, "leaf", None, None, (2, 4), [])]
    prev = 1
    for t in range(6):  # six cells; the last three in another module
        mod = "cell" if t < 3 else "head"
        base = len(nodes)
        nodes += [SlotInfo("TBackward0", "op", mod, None, None, [0]),  # base: cell.weight (transposed)
                  SlotInfo("MmBackward0", "op", mod, None, None, [prev, base]),  # base + 1
                  SlotInfo("TanhBackward0", "op", mod, None, None, [base + 1]),  # base + 2
                  SlotInfo("CppFunction", "custom", mod, None, None, [base + 2, None]),  # base + 3
                  SlotInfo("CompiledFunctionBackward", "compiled", mod, None, None, [base + 3, 0])]
        prev = base + 4
    last = len(nodes)  # chains: two pass-throughs to a parameter, one to a leaf, one to an op, five hops
    nodes += [SlotInfo("ViewBackward0", "op", "head", None, None, [2]),  # last: → TBackward0 → cell.weight
              SlotInfo("ExpandBackward0", "op", "head", None, None, [1]),  # last + 1: → the leaf
              SlotInfo("ReshapeAliasBackward0", "op", "head", None, None, [prev]),  # last + 2: → an op
              SlotInfo("UnsqueezeBackward0", "op", "head", None, None, [last]),
              SlotInfo("SqueezeBackward0", "op", "head", None, None, [last + 3]),
              SlotInfo("PermuteBackward0", "op", "head", None, None, [last + 4]),
              SlotInfo("TBackward0", "op", "head", None, None, [last + 5]),  # last + 6: past CHAIN_HOPS to the acc
              SlotInfo("CatBackward0", "op", "head", None, None, [last, last + 1, last + 2, last + 6, None])]
    nodes.append(SlotInfo("SumBackward0", "op", None, None, None, [last + 7]))
    forward_class = lambda i: Scale if nodes[i].kind == "custom" else None  # noqa: E731
    codes = {name: k for k, name in enumerate(sorted({n.name for n in nodes}))}
    off = np.cumsum([0] + [len(n.children) for n in nodes]).astype(np.int64)
    cid = np.array([-1 if c is None else c for n in nodes for c in n.children], np.int32)
    graph = ArrayGraph(sorted(codes, key=codes.__getitem__), [codes[n.name] for n in nodes], [n.kind for n in nodes],
                       [n.module for n in nodes], {0: "cell.weight"}, {0: (4, 4), 1: (2, 4)}, off, cid)
    want = compute_statics(nodes, forward_class)
    got = grouped_statics(graph, forward_class)
    assert [(s.args, s.labels, s.schema) for s in got] == [(s.args, s.labels, s.schema) for s in want]
    assert got[8].labels is got[13].labels  # the Mm of cells 1 and 2 of "cell": one key
    assert got[18].labels != got[13].labels  # cell 3's is in "head": its input is another module's output
    assert got[3].labels != got[8].labels  # cell 0's Mm takes the leaf, cell 1's the last cell's output
    assert got[3].args == ["self", "mat2"] and got[5].args == ["x", "factor"]
    assert "compiled cell: input 1 (cell.weight) → cell.weight" in got[6].labels
    assert got[last + 7].labels == [
        "tensors[0] → cell.weight (reshaped, transposed)", "tensors[1] → input of head (leaf tensor [2×4] (broadcast, "
        "summed))", "tensors[2] → ReshapeAliasBackward0", "tensors[3] → TBackward0", "tensors[4] → no gradient needed"]
