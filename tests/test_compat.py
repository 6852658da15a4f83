"""Every private torch name in tracer/_compat.py resolves, and does what gradscape uses it for, on the torch
that is installed. `make test` runs this on the release it installs; `make test-torch TORCH=X` runs it on
each end of the supported range (tests/torch_range.txt names the files of that core suite)."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from gradscape.tracer import _compat

# What _compat looks up with `_private` (a name added there is added here, with a test below)
EXPECTED = {
    ("torch._C._autograd", "_get_sequence_nr"), ("torch._C", "DisableTorchFunction"),
    ("torch._C", "_push_on_torch_function_stack"), ("torch._C", "_pop_torch_function_stack"),
    ("torch._C", "_len_torch_function_stack"), ("torch._C", "_get_function_stack_at"),
    ("torch._C", "_is_torch_function_mode_enabled"),
    ("torch._C", "_current_graph_task_id"), ("torch._C", "_set_grad_enabled"),
    ("torch._C", "_are_functorch_transforms_active"),
    ("torch.autograd.graph.Node", "_sequence_nr"), ("torch.autograd.graph.Node", "_input_metadata"),
    ("torch", "_foreach_norm"), ("torch", "_amp_foreach_non_finite_check_and_unscale_"),
    ("torch.Tensor", "_indices"), ("torch.Tensor", "_values"), ("torch._C", "_GLIBCXX_USE_CXX11_ABI"),
    ("torch.nn.Module", "_call_impl"), ("torch.utils.hooks.RemovableHandle", "hooks_dict_ref"),
    ("torch.utils.hooks.RemovableHandle", "extra_dict_ref"), ("torch.utils.hooks.RemovableHandle", "id"),
}


def test_every_private_name_is_listed_and_checked_here() -> None:
    assert set(_compat.PRIVATE_NAMES) == EXPECTED


def test_the_installed_torch_is_in_the_supported_range() -> None:
    assert _compat.MIN_TORCH <= _compat.torch_version() <= _compat.MAX_TESTED, torch.__version__


def test_sequence_numbers_count_the_nodes_made() -> None:
    x = torch.ones(3, requires_grad=True)
    before = _compat.sequence_nr()
    y = x * 2
    assert _compat.node_sequence_nr(y.grad_fn) == before
    assert _compat.sequence_nr() == before + 1


def test_the_torch_function_mode_stack() -> None:
    mode = TorchFunctionMode()
    depth = _compat.mode_stack_len()
    _compat.push_mode(mode)
    try:
        assert _compat.mode_stack_len() == depth + 1
        assert _compat.mode_at(depth) is mode
    finally:
        assert _compat.pop_mode() is mode
    assert _compat.mode_stack_len() == depth
    with _compat.DisableTorchFunction():
        assert torch.ones(2).sum().item() == 2.0


def test_modes_enabled_is_false_under_disable_torch_function_with_the_mode_still_on_the_stack() -> None:
    """What tracer/record/backward_by_name.py reads to leave a call made with torch functions disabled alone."""
    with TorchFunctionMode():
        assert _compat.modes_enabled()
        with _compat.DisableTorchFunction():
            assert not _compat.modes_enabled() and _compat.mode_stack_len() >= 1
        assert _compat.modes_enabled()


def test_graph_task_id_and_grad_mode() -> None:
    seen: list[int] = []
    x = torch.ones(2, requires_grad=True)
    y = (x * 3).sum()
    y.grad_fn.register_prehook(lambda go: seen.append(_compat.current_graph_task_id()))
    assert _compat.current_graph_task_id() == -1
    y.backward()
    assert seen and seen[0] >= 0
    _compat.set_grad_enabled(False)
    try:
        assert not torch.is_grad_enabled()
    finally:
        _compat.set_grad_enabled(True)
    assert torch.is_grad_enabled()


def test_what_a_node_carries() -> None:
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
            return t * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    prod = a * b
    meta = _compat.input_metadata(prod.grad_fn)
    assert len(meta) == 1 and tuple(meta[0].shape) == (2, 3)
    assert set(_compat.saved_tensor_names(prod.grad_fn)) >= {"self", "other"}
    assert torch.equal(_compat.saved_tensor(prod.grad_fn, "other"), b)
    assert _compat.forward_class(Twice.apply(a).grad_fn) is Twice
    assert _compat.forward_class(prod.grad_fn) is None


def test_module_dicts_and_parameter_hooks() -> None:
    net = nn.Sequential(nn.Linear(2, 2))
    assert list(_compat.module_children(net)) == ["0"]
    assert list(_compat.module_parameters(net[0])) == ["weight", "bias"]
    w = net[0].weight
    w.register_post_accumulate_grad_hook(lambda p: None)
    assert len(_compat.post_accumulate_grad_hooks(w)) == 1
    assert _compat.module_call_code is nn.Module._call_impl.__code__


def test_sparse_parts_fused_norms_and_unscale() -> None:
    s = torch.sparse_coo_tensor([[0, 2]], [3.0, 4.0], (4,), check_invariants=True).coalesce()
    assert _compat.sparse_indices(s).tolist() == [[0, 2]] and _compat.sparse_values(s).tolist() == [3.0, 4.0]
    ts = [torch.randn(5), torch.randn(3, 3)]
    assert all(torch.equal(n, t.norm()) for n, t in zip(_compat.foreach_norm(ts), ts, strict=True))
    grads, found = [torch.full((3,), 4.0)], torch.zeros(1)
    _compat.amp_unscale(grads, found, torch.full((1,), 0.25))
    assert grads[0].tolist() == [1.0, 1.0, 1.0] and found.item() == 0.0
    assert isinstance(_compat.cxx11_abi, bool)


def test_global_hooks_and_handles() -> None:
    """As tracer/record/global_hooks.py uses them: a global forward hook (always_call) removed, then put
    back at its own key, runs again and is counted among the global hooks."""
    calls: list[int] = []
    net = nn.Linear(2, 2)
    fn = lambda m, i, o: calls.append(1)  # noqa: E731
    handle = nn.modules.module.register_module_forward_hook(fn, always_call=True)
    handle.remove()
    check = _compat.global_hook_check()
    try:
        assert handle.id not in _compat.global_module_hook_keys()
        assert _compat.reinsert_hook(handle, fn)
        assert handle.id in _compat.global_module_hook_keys()
        net(torch.ones(1, 2))
        assert calls == [1]
        if check is not None:
            _compat.set_global_hook_check(lambda: False)
            assert _compat.global_hook_check()() is False
    finally:
        handle.remove()
        if check is not None:
            _compat.set_global_hook_check(check)
    assert handle.id not in _compat.global_module_hook_keys()
    assert isinstance(RemovableHandle(OrderedDict()).id, int)


def test_functorch_active_only_inside_transforms() -> None:
    assert _compat.functorch_active() is False
    inside: list[Any] = []

    def f(t: torch.Tensor) -> torch.Tensor:
        inside.append(_compat.functorch_active())
        return (t * t).sum()

    torch.func.grad(f)(torch.ones(2))
    torch.func.vmap(lambda t: inside.append(_compat.functorch_active()) or t)(torch.ones(2))
    assert inside == [True, True]
    assert _compat.functorch_active() is False


def test_module_buffers_and_what_a_compiled_callable_is() -> None:
    """The dynamo names the compiled-model support reads (NOTE [Compiled regions on a traced step]): a compiled
    wrapper's module, and a hook on the stance lookup that each compiled callable makes when entered."""
    net = nn.BatchNorm1d(2)
    assert set(_compat.module_buffers(net)) == {"running_mean", "running_var", "num_batches_tracked"}
    assert _compat.compiled_wrapper_inner(net) is None
    compiled = torch.compile(net, backend="eager")
    assert _compat.compiled_wrapper_inner(compiled) is net and _compat.dynamo_loaded()
    entered: list[int] = []
    undo = _compat.compiled_entries(lambda: entered.append(1))
    assert undo is not None
    try:
        compiled(torch.randn(4, 2))
    finally:
        undo()
    assert entered
    entered.clear()
    compiled(torch.randn(4, 2))
    assert not entered  # put back


_MADE_UNDER = """
import sys
import torch
model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
with torch.inference_mode() if sys.argv[1] == "inference_mode" else torch.no_grad():
    import gradscape
    tr = gradscape.Tracer(model)  # (imports the recorder, whose import-time checks build a graph)
want = torch.autograd.grad(model(x).sum(), [model.weight])[0]
with tr.step(0) as st:
    model(x).sum().backward()
assert torch.equal(model.weight.grad, want)
assert abs(st.params["weight"].stats["norm"] - want.norm().item()) <= 1e-6 * want.norm().item()
print("ok")
"""


@pytest.mark.parametrize("how", ["inference_mode", "no_grad"])
def test_a_tracer_made_under_inference_mode_or_no_grad_traces(how: str) -> None:
    """The recorder's import-time checks (`_check_nodes`, NOTE [Backward by name]'s trial) build a small graph;
    a Tracer made (and gradscape imported) under the loop's `inference_mode` or `no_grad` still gets one, and
    traces a step whose gradients are torch's."""
    out = subprocess.run([sys.executable, "-c", _MADE_UNDER, how], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
