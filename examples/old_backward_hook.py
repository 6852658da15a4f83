"""Tutorial 2: why the old `register_backward_hook` gave "bias, input, weight" for an `nn.Linear`, and what
`register_full_backward_hook` gives.

    python examples/old_backward_hook.py

The old module hook was attached to the autograd node of the module's LAST op, and reported that node's
`grad_inputs`: for `nn.Linear` that node is `AddmmBackward0` (`bias + input @ weight.T`), whose slots are
the gradients w.r.t. `bias`, `input` and `weight.T`, in the op's argument order. People read them as "the
data, the weights and the bias". The full hook reports the gradient w.r.t. the module's own input.
gradscape records both: `st.modules[name].grad_input` (full-hook meaning) and, at
`st.modules[name].calls[0].last_op`, the node the old hook would have reported.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape


def old_and_full_hooks(net: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[Any, ...]]:
    """What the deprecated hook and the full hook on the last Linear receive (one backward each: torch
    refuses both kinds on one module)."""
    seen: dict[str, tuple[Any, ...]] = {}
    for kind in ("old", "full"):
        twin = copy.deepcopy(net)  # a fresh copy each: torch keeps a module to the first kind it was given
        layer = twin[2]
        register = layer.register_backward_hook if kind == "old" else layer.register_full_backward_hook
        register(lambda m, gin, gout, kind=kind: seen.__setitem__(kind, gin))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the old hook is deprecated, and torch says so
            F.cross_entropy(twin(x), y).backward()
    return seen


def main() -> dict[str, Any]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))  # LeNet's last two layers
    x, y = torch.randn(64, 120), torch.randint(0, 10, (64,))

    tr = gradscape.Tracer(net, tensors="full")
    with tr.step(0) as st:
        F.cross_entropy(net(x), y).backward()
    assert st is not None
    net.zero_grad()
    hooks = old_and_full_hooks(net, x, y)

    module = st.modules["2"]  # the last Linear
    last_op = st.nodes[module.calls[0].last_op]  # type: ignore[index]
    assert last_op.grad_inputs is not None
    print(f"The old hook reported the grad_inputs of {last_op.name}, the Linear's last op:")
    for label, g, old in zip(last_op.input_labels, last_op.grad_inputs, hooks["old"]):
        assert g is not None and tuple(old.shape) == g.shape
        torch.testing.assert_close(torch.from_numpy(g.values), old)  # slot for slot what the old hook got
        print(f"  {label:34s} {g.shape}")
    full = module.grad_input[0]
    assert full is not None
    torch.testing.assert_close(torch.from_numpy(full.values), hooks["full"][0])
    print(f"\nThe full hook's grad_input: one tensor, dL/d(input of the Linear), {full.shape}: "
          f"st.modules['2'].grad_input[0]")
    return {"old_labels": list(last_op.input_labels), "old_shapes": [tuple(g.shape) for g in hooks["old"]],
            "full_shape": full.shape, "last_op": last_op.name}


if __name__ == "__main__":
    main()
