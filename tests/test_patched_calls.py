"""An untraced monitored block sees its backward calls through wrappers, not a mode (NOTE [Patched backward]
in tracer/record/patched_calls.py): no mode on the stack, the originals back after the block (also when it
raises), each backward API seen once with its loss, and another thread's calls left alone, including a
traced step's, which its own mode still records."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
import torch
import torch.nn as nn

import gradscape


def _functions() -> tuple[object, ...]:
    clip = torch.nn.utils.clip_grad  # and the clipping functions (NOTE [Clipping seen])
    return (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad,
            torch._amp_foreach_non_finite_check_and_unscale_, clip._clip_grads_with_norm_,
            torch.nn.utils.clip_grads_with_norm_, clip.clip_grad_value_, torch.nn.utils.clip_grad_value_)


_functions_at_import = _functions()


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _loss(model: nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return model(torch.randn(16, 4, generator=g)).pow(2).mean()


def test_an_untraced_block_runs_under_no_mode_and_the_functions_go_back_when_the_tracer_does() -> None:
    """The wrappers stay between the blocks of a live Tracer (NOTE [Patched backward]: no attribute set on
    `torch.Tensor` a step), pass every call outside a block straight through, and are gone once the Tracer
    is closed; also after a block that raised."""
    gc.collect()  # a Tracer an earlier test left to the cyclic collector holds the wrappers until it is collected
    originals = _functions()
    assert originals == _functions_at_import
    model = _mlp()
    tr = gradscape.Tracer(model, every=10**9)
    with tr.step(1) as st:
        assert st is None
        assert torch._C._len_torch_function_stack() == 0  # nothing between the user's calls and torch
        assert _functions() != originals
        _loss(model, 0).backward()
    held = _functions()
    assert held != originals and all(f.__wrapped__ is o for f, o in zip(held, originals))  # type: ignore[attr-defined]
    _loss(model, 1).backward()  # between blocks: straight to torch, no row
    with pytest.raises(RuntimeError, match="user code failed"), tr.step(2):
        _loss(model, 0).backward()
        raise RuntimeError("user code failed")
    assert _functions() == held  # the same wrappers: none made or set again
    assert [r["step"] for r in tr.history] == [1, 2]
    tr.close()
    assert _functions() == originals


def test_a_function_replaced_between_blocks_is_wrapped_again_by_the_next_full_block() -> None:
    """Another library's wrapper put in place between two blocks is wrapped in its turn by the next full block
    (which looks at every wrapper, NOTE [Light steps] in tracer/monitor/light.py), once: its calls and the losses
    are each seen once, and closing the Tracer leaves that library's wrapper in place."""
    gc.collect()
    originals = _functions()
    model = _mlp()
    tr = gradscape.Tracer(model, every=10**9, norms_every=1)  # (every block full)
    with tr.step(1):
        torch.autograd.backward(_loss(model, 0))
    ours, calls = torch.autograd.backward, []

    def theirs(*args: object, **kwargs: object) -> object:
        calls.append(len(calls))
        return ours(*args, **kwargs)

    torch.autograd.backward = theirs
    try:
        with tr.step(2):
            torch.autograd.backward(_loss(model, 1))
        wrapped = torch.autograd.backward
        assert wrapped is not theirs and wrapped.__wrapped__ is theirs  # type: ignore[attr-defined]
        with tr.step(3):
            torch.autograd.backward(_loss(model, 2))
        assert torch.autograd.backward is wrapped  # in place: not made again
        assert calls == [0, 1]
        want = [_loss(model, seed).item() for seed in range(3)]  # (no optimizer: the model is unchanged)
        assert [r["losses"] for r in tr.history] == [[v] for v in want]
        tr.close()
        assert torch.autograd.backward is theirs
    finally:
        torch.autograd.backward = originals[1]
    assert _functions() == originals


@pytest.mark.parametrize("closed", [False, True])
def test_a_dropped_tracer_puts_the_functions_back(closed: bool) -> None:
    """A Tracer let go without `close()` lets go of the wrappers too; two Tracers hold them until both are gone."""
    originals = _functions()
    first, second = gradscape.Tracer(_mlp(0), every=10**9), gradscape.Tracer(_mlp(1), every=10**9)
    for tr in (first, second):
        with tr.step(1):
            _loss(tr.model, 0).backward()
    if closed:
        first.close()
    del first
    gc.collect()
    assert _functions() != originals  # the second still holds them
    del tr, second
    gc.collect()
    assert _functions() == originals


@pytest.mark.parametrize("api", ["Tensor.backward", "autograd.backward", "autograd.grad"])
def test_each_backward_api_is_seen_once_with_its_loss(api: str) -> None:
    model = _mlp()
    params = list(model.parameters())
    tr = gradscape.Tracer(model, every=10**9)
    with tr.step(1) as st:
        assert st is None and torch.Tensor.backward is not _functions_at_import[0]
        loss = _loss(model, 0)
        if api == "Tensor.backward":
            loss.backward()
        elif api == "autograd.backward":
            torch.autograd.backward(loss)
        else:
            torch.autograd.grad(loss, params)
    row = tr.history[-1]
    assert row["losses"] == [loss.item()]  # once: Tensor.backward's own call of autograd.backward is not another
    if api == "autograd.grad":  # leaves .grad alone: no norms
        assert row["grad_norm"] is None
    else:
        want = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()
        assert row["grad_norm"] == pytest.approx(want, rel=1e-6)


def test_a_call_the_wrappers_would_pass_runs_no_python_frame_of_theirs() -> None:
    """Where the extension is built, the three backward functions are C fronts (NOTE [Fronts] in
    tracer/record/patched_calls.py): between blocks, and for `Tensor.backward`'s own call of `torch.autograd.backward`
    inside a block, the call reaches the original without the Python wrapper; a call in a block still reaches it."""
    from gradscape.tracer.record import native, patched_calls

    if native.extension() is None:
        pytest.skip("the native recorder is not built")
    model = _mlp()
    params = list(model.parameters())
    tr = gradscape.Tracer(model, every=10**9)
    with tr.step(0):  # (the wrappers put in place, held between blocks)
        _loss(model, 0).backward()
    frames: list[str] = []

    def profile(frame: object, event: str, arg: object) -> None:
        code = frame.f_code  # type: ignore[attr-defined]
        if event == "call" and code.co_filename == patched_calls.__file__:
            frames.append(code.co_name)

    def profiled(fn: object) -> list[str]:
        frames.clear()
        sys.setprofile(profile)
        try:
            fn()  # type: ignore[operator]
        finally:
            sys.setprofile(None)
        return list(frames)

    between = [lambda: _loss(model, 1).backward(), lambda: torch.autograd.backward(_loss(model, 2)),
               lambda: torch.autograd.grad(_loss(model, 3), params)]
    assert [profiled(call) for call in between] == [[], [], []]
    with tr.step(1):
        inside = profiled(lambda: torch.autograd.grad(_loss(model, 4), params))
        loss = _loss(model, 5)
        loss.backward()
    assert inside == ["wrapper"]  # the block's call, to its capture
    assert tr.history[-1]["losses"][-1] == loss.item()
    with tr.step(2):  # a full step's Python capture: only Tensor.backward's wrapper, not its nested call's
        nested = profiled(lambda: _loss(model, 6).backward())
    assert nested == ["wrapper"]
    tr.close()


@pytest.mark.parametrize("every", [1, 10**9])
def test_a_backward_right_after_an_optimizer_step_is_seen(every: int) -> None:
    """No module call between `opt.step()` and the next backward (the monitor's mode of the previous release
    stayed off the stack until one came, and missed it)."""
    a, b = _mlp(0), _mlp(1)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    tr = gradscape.Tracer(nn.ModuleList([a, b]), every=every)
    with tr.step(1):
        first, second = _loss(a, 0), _loss(b, 1)
        first.backward()
        opt.step()
        second.backward()
    assert tr.history[-1]["losses"] == [first.item(), second.item()]


def test_gradscaler_unscale_is_seen_in_an_untraced_block() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    tr = gradscape.Tracer(model, every=10**9)
    with tr.step(1) as st:
        assert st is None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(model, 0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        unscaled = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        scaler.step(opt)
        scaler.update()
    row = tr.history[-1]
    assert row["scale"] == 1024.0  # read from the unscale the wrapper saw
    assert row["grad_norm"] == pytest.approx(unscaled, rel=1e-5)  # the norms as unscaled, not as scaled


def test_another_threads_backward_is_left_to_it() -> None:
    """A backward on another thread while this thread's untraced block is open is not this block's, and
    a traced step there is recorded by its own tracer's mode, the wrapper notwithstanding."""
    ours, theirs = _mlp(0), _mlp(1)
    tr = gradscape.Tracer(ours, every=10**9)
    their_tr = gradscape.Tracer(theirs, every=1, monitor=False)
    opened, done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def other() -> None:
        opened.wait(30)
        try:
            _loss(theirs, 5).backward()  # a plain backward on this thread
            with their_tr.step(0) as st:
                _loss(theirs, 6).backward()
            seen["trace"] = st
            seen["grads"] = {n: p.grad.clone() for n, p in theirs.named_parameters()}
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            seen["error"] = exc
        finally:
            done.set()

    t = threading.Thread(target=other)
    t.start()
    with tr.step(1) as untraced:
        assert untraced is None
        loss = _loss(ours, 0)
        opened.set()
        assert done.wait(60)
        loss.backward()
    t.join(60)
    assert "error" not in seen, seen.get("error")
    assert tr.history[-1]["losses"] == [loss.item()]  # only this thread's backward
    st = seen["trace"]
    assert st is not None and len(st.passes) == 1 and st.passes[0].api == "Tensor.backward"
    grads = seen["grads"]
    params = dict(theirs.named_parameters())
    sent = dict(zip(params, torch.autograd.grad(_loss(theirs, 6), list(params.values()))))  # step 6's alone
    assert st.params and set(st.params) == set(grads)
    for name, g in grads.items():
        node = st.param_node(name)
        assert node is not None and node.grad_outputs is not None and node.grad_outputs[0] is not None
        assert node.grad_outputs[0].stats["norm"] == pytest.approx(sent[name].norm().item(), rel=1e-6), name
        assert st.params[name].stats["norm"] == pytest.approx(g.norm().item(), rel=1e-6), name  # .grad: 5's + 6's
