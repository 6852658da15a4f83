"""Tracing changes nothing: same gradients bit for bit, no hook left anywhere, nothing stored on the
user's objects, nothing installed on untraced steps, no memory kept across steps."""

from __future__ import annotations

import copy
import gc
import weakref

import psutil
import pytest
import torch
import torch.nn as nn
import torch.optim.optimizer as optim_module
from zoo import ZOO, build

import gradscape
from gradscape.tracer.record import recorder as _recorder


def _global_hook_state() -> tuple[int, ...]:
    mm = torch.nn.modules.module
    om = optim_module
    return (len(mm._global_forward_hooks), len(mm._global_forward_pre_hooks), len(mm._global_backward_hooks),
            len(mm._global_backward_pre_hooks), len(mm._global_forward_hooks_always_called),
            len(mm._global_forward_hooks_with_kwargs), len(om._global_optimizer_pre_hooks),
            len(om._global_optimizer_post_hooks), torch._C._len_torch_function_stack())


def _module_state(model: nn.Module) -> list[tuple[str, int, int, int, int, frozenset[str]]]:
    return [(n, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
             len(m._backward_pre_hooks), frozenset(vars(m))) for n, m in model.named_modules()]


def _param_state(model: nn.Module) -> list[tuple[str, object, object, frozenset[str]]]:
    return [(n, p._backward_hooks, getattr(p, "_post_accumulate_grad_hooks", None), frozenset(vars(p)))
            for n, p in model.named_parameters()]


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("mode", ["summary", "full"])
def test_gradients_bitwise_equal(name: str, mode: str) -> None:
    case = build(name)
    twin = copy.deepcopy(case.model)
    case.loss(twin, case.batch).backward()
    tr = gradscape.Tracer(case.model, tensors=mode)
    with tr.step(0):
        case.loss(case.model, case.batch).backward()
    for (n, p), (_, q) in zip(case.model.named_parameters(), twin.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), n


def _track_recorders(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[object]]:
    refs: list[weakref.ref[object]] = []
    orig = _recorder.StepRecorder.__init__

    def init(self: object, *a: object, **k: object) -> None:
        orig(self, *a, **k)  # type: ignore[arg-type]
        refs.append(weakref.ref(self))

    monkeypatch.setattr(_recorder.StepRecorder, "__init__", init)
    return refs


def test_no_hook_left_after_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    refs = _track_recorders(monkeypatch)
    case = build("cnn")
    before = (_global_hook_state(), _module_state(case.model), _param_state(case.model))
    tr = gradscape.Tracer(case.model)
    with tr.step(0):
        loss = case.loss(case.model, case.batch)
        loss.backward(retain_graph=True)  # keep the graph (and its nodes) alive after the step
    assert (_global_hook_state(), _module_state(case.model), _param_state(case.model)) == before
    graph = [loss.grad_fn]
    while graph:  # nothing written into node metadata either
        n = graph.pop()
        assert n.metadata == {}
        graph.extend(c for c, _ in n.next_functions if c is not None)
    del tr
    gc.collect()
    # a node hook left behind would keep its recorder alive through the closure
    assert refs and all(r() is None for r in refs)
    loss.backward()  # the retained graph still works without us


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_no_hook_left_when_the_step_raises(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    refs = _track_recorders(monkeypatch)
    case = build("mlp")
    before = (_global_hook_state(), _module_state(case.model), _param_state(case.model))
    tr = gradscape.Tracer(case.model)

    def boom(grad: torch.Tensor) -> None:
        raise RuntimeError("user hook failed")

    with pytest.raises(RuntimeError, match="user hook failed" if where == "backward" else "in forward"), tr.step(0):
        out = case.model(case.batch[0])
        if where == "forward":
            raise RuntimeError("error in forward")
        out.register_hook(boom)
        out.sum().backward()
    assert (_global_hook_state(), _module_state(case.model), _param_state(case.model)) == before
    assert tr.last is not None and tr.last.error is not None
    del tr
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_every_n_installs_nothing_on_untraced_steps() -> None:
    case = build("mlp")
    tr = gradscape.Tracer(case.model, every=3, monitor=False)  # the monitor installs a little on every step
    base = _global_hook_state()
    traced, hooked = [], []
    for i in range(7):
        with tr.step(i) as st:
            if st is None:
                assert _global_hook_state() == base  # nothing at all while an untraced step runs
            else:
                hooked.append(_global_hook_state() != base)
            case.loss(case.model, case.batch).backward()
        traced.append(st is not None)
    assert traced == [True, False, False, True, False, False, True]
    # the first two traced steps record their forward with the hooks and the mode; the third makes the same
    # forward and is carried, without them (NOTE [Carried forwards], NOTE [Backward handoff])
    assert hooked == [True, True, False]
    assert tr.last is not None and tr.last.meta.get("notes") is None  # carried: its lines and modules kept
    assert any(n.module is not None for n in tr.last.nodes) and all(n.source for n in tr.last.nodes if n.kind == "op")


def test_graph_freed_after_each_step() -> None:
    """200 traced steps: memory must not grow with the number of steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr = gradscape.Tracer(model, keep=1)
    x = torch.randn(128, 64)
    proc = psutil.Process()
    rss = []
    for i in range(200):
        with tr.step(i):
            model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i in (50, 199):
            gc.collect()
            rss.append(proc.memory_info().rss)
    assert rss[1] - rss[0] < 16 * 1024 * 1024, f"grew by {(rss[1] - rss[0]) / 1e6:.1f} MB over 150 steps"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="every"):
        gradscape.Tracer(every=0)
    with pytest.raises(ValueError, match="tensors"):
        gradscape.Tracer(tensors="all")
    with pytest.raises(TypeError, match="model"):
        gradscape.Tracer(model="net")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sink"):
        gradscape.Tracer(sink="out.txt")


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_a_traced_step_leaves_no_cyclic_garbage(name: str) -> None:
    """Everything a step allocated is freed by reference counting when it is dropped: cyclic garbage
    would wait for (and feed) Python's cyclic collector, whose passes land inside training steps."""
    case = build(name)
    tr = gradscape.Tracer(case.model)
    for i in range(2):  # warm-up: caches that live as long as the Tracer
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for i in range(2, 7):
            with tr.step(i):
                case.loss(case.model, case.batch).backward()
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("closed", [True, False])
def test_a_dropped_tracer_frees_its_model_at_once(closed: bool) -> None:
    """Nothing but reference counting is needed to free a Tracer and the model it traced (a DDP model holds
    its process group: freed at the interpreter's exit instead, gloo's teardown aborted the process), also
    after a traced step, a monitored one, and `with Tracer(model).step(i)` with no other reference to it."""
    case = build("mlp")
    model = weakref.ref(case.model)
    was = gc.isenabled()
    gc.disable()
    try:
        tr = gradscape.Tracer(case.model, every=2)
        for i in range(3):
            with tr.step(i):
                case.loss(case.model, case.batch).backward()
        with gradscape.Tracer(case.model).step(0) as st:  # the block alone holds this one
            case.loss(case.model, case.batch).backward()
        assert st is not None and len(st.nodes) > 5
        if closed:
            tr.close()
        tracer = weakref.ref(tr)
        del tr, case, st
        assert tracer() is None and model() is None
    finally:
        if was:
            gc.enable()


class _StepFails(torch.optim.SGD):
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        raise RuntimeError("optimizer failed")


@pytest.mark.parametrize("fails", [False, True])
def test_an_optimizer_step_inside_the_block_loses_nothing_after_it(fails: bool) -> None:
    """The tracer's function mode steps aside while `optimizer.step()` runs (NOTE [Optimizer
    steps]); a forward and a backward after it in the same block are still seen in full, also when
    the step raised, and the mode stack is as it was afterwards."""
    case = build("mlp")
    opt = (_StepFails if fails else torch.optim.SGD)(case.model.parameters(), lr=0.1)
    before = _global_hook_state()
    tr = gradscape.Tracer(case.model, monitor=False)  # the tracer's own mode alone
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
        assert torch._C._len_torch_function_stack() == 1
        if fails:
            with pytest.raises(RuntimeError, match="optimizer failed"):
                opt.step()
        else:
            opt.step()
        assert torch._C._len_torch_function_stack() == (0 if fails else 1)  # resumed, unless the step raised
        opt.zero_grad()
        case.loss(case.model, case.batch).backward()  # a module call brings the mode back
    assert _global_hook_state() == before
    assert st is not None and len(st.passes) == 2
    first = [n for n in st.nodes if n.kind == "op" and any(r.pass_index == 0 for r in n.runs)]
    second = [n for n in st.nodes if n.kind == "op" and any(r.pass_index == 1 for r in n.runs)]
    assert first and len(second) == len(first) and not set(map(id, first)) & set(map(id, second))
    # the same code ran twice: the second forward is attributed exactly like the first
    assert [(n.name, n.source, n.module) for n in second] == [(n.name, n.source, n.module) for n in first]
    assert all(n.source for n in second)


def test_an_optimizer_step_leaves_a_user_mode_above_ours_alone() -> None:
    case = build("mlp")
    opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
    seen: list[object] = []

    class Counting(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func)
            return func(*args, **(kwargs or {}))

    tr = gradscape.Tracer(case.model, monitor=False)  # the tracer's own mode alone
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
        with Counting():
            opt.step()
            assert torch._C._len_torch_function_stack() == 2  # ours stays under the user's
    assert seen and st is not None and st.nodes


def test_a_module_call_on_another_thread_never_gets_our_mode() -> None:
    """After a step that raised left the mode aside, a module called on another thread must not
    put it back there (the mode belongs on the training thread's stack); the training thread's next
    module call does."""
    import threading

    case = build("mlp")
    opt = _StepFails(case.model.parameters(), lr=0.1)
    seen: list[int] = []

    def other() -> None:
        with torch.no_grad():
            case.model(case.batch[0])
        seen.append(torch._C._len_torch_function_stack())

    tr = gradscape.Tracer(case.model, monitor=False)  # the tracer's own mode alone
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
        with pytest.raises(RuntimeError, match="optimizer failed"):
            opt.step()
        assert torch._C._len_torch_function_stack() == 0
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert torch._C._len_torch_function_stack() == 0  # not resumed from the other thread
        case.loss(case.model, case.batch).backward()  # a module call here brings it back
        assert torch._C._len_torch_function_stack() == 1
    assert seen == [0]
    assert st is not None and len(st.passes) == 2
    assert torch._C._len_torch_function_stack() == 0


def test_forward_caches_are_bounded() -> None:
    from gradscape.tracer.record import sources as _attrib

    for k in range(_attrib._MAX_CACHED + 10):  # code objects of many files (generated code, notebooks)
        ns: dict[str, object] = {}
        exec(compile("import sys\nframe = sys._getframe()", f"user_{k}.py", "exec"), ns)
        assert _attrib.user_frame(ns["frame"]) == f"user_{k}.py:2"
    assert 0 < len(_attrib._is_user_code) <= _attrib._MAX_CACHED
    model = nn.Linear(2, 2)
    tr = gradscape.Tracer(model)
    with tr.step(0):  # module classes made on the fly, each a library leaf
        x = model(torch.randn(1, 2))
        for k in range(_attrib._MAX_CACHED + 10):
            x = type(f"Act{k}", (nn.Identity,), {})()(x)
        x.sum().backward()
    assert 0 < len(_attrib._library_leaf) <= _attrib._MAX_CACHED


def test_summaries_on_two_threads_at_once_are_exact() -> None:
    """The non-zero count goes through a scratch buffer; two threads summarising at once (engine
    threads of two devices, two traced loops) must not share it."""
    import threading

    import numpy as np

    from gradscape.tracer.summary.stats import raw_stats

    n = 1 << 20  # several chunks of the count
    tensors = []
    for k in range(2):
        t = torch.ones(n, dtype=torch.float64)
        t[k::3] = 0.0
        tensors.append(t)
    want = [float(np.count_nonzero(t.numpy())) for t in tensors]
    bad: list[tuple[int, float]] = []
    go = threading.Barrier(2)

    def work(k: int) -> None:
        go.wait()
        for _ in range(40):
            got = raw_stats(tensors[k])[4]
            if got != want[k]:
                bad.append((k, float(got)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.parametrize("kind", ["eager", "compiled", "direct"])
def test_process_state_is_as_it_was_after_traced_steps(kind: str) -> None:
    """Warnings filters, the logging configuration, `sys` hooks and torch's global hook check, read in
    a fresh process before and after two traced steps (tests/state_worker.py), are equal; no warning
    about our hooks reaches the user, and a user's own global hook still gets torch's warning after."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(here / "state_worker.py"), kind], capture_output=True, text=True,
                          timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for key, was in seen["before"].items():
        assert seen["after"][key] == was, key
    warned = done.stderr.count("when there are global hooks on modules")
    assert warned == (1 if kind == "compiled" else 0), done.stderr  # the user's own hook's, after the steps


def test_the_collector_is_paused_through_a_traced_step_and_put_back_as_it_was() -> None:
    """NOTE [Garbage collector]: off from a traced step's start to its end, also when the block raises;
    untraced steps and a program that switched the collector off itself are left as they are."""
    case = build("mlp")
    tr = gradscape.Tracer(case.model, every=2)
    assert gc.isenabled()
    with tr.step(0):
        assert not gc.isenabled()  # the forward of a traced step
        case.loss(case.model, case.batch).backward()
    assert gc.isenabled()
    with tr.step(1):  # not traced (every=2)
        assert gc.isenabled()
    with pytest.raises(ValueError, match="in the forward"), tr.step(2):
        raise ValueError("in the forward")
    assert gc.isenabled()
    gc.disable()
    try:
        with tr.step(4):
            case.loss(case.model, case.batch).backward()
        assert not gc.isenabled()
    finally:
        gc.enable()
