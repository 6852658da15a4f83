"""Tutorial 1: what `grad_input` and `grad_output` of a module hook hold, on an `nn.Linear` and an `nn.Conv2d`.

    python examples/module_hooks.py

A full backward hook (`register_full_backward_hook`) gets `grad_output`, the gradient of the loss with
respect to the module's OUTPUT (what arrives from the loss side), and `grad_input`, the gradient with
respect to the module's INPUT (what the module sends on to the layer before it). gradscape records both
for every module of a traced step (`st.modules[name]`), and every slot of every autograd node inside it
(`st.nodes`). This script checks each of them against `torch.autograd.grad` and against a real hook.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.fc1 = nn.Linear(6 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        h = F.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


def reference(net: Net, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same forward by hand, and torch.autograd.grad of the loss w.r.t. each layer's input and output."""
    a1 = F.relu(net.conv1(x))
    c2 = net.conv2(a1)  # conv2: input a1, output c2
    a3 = F.relu(net.fc1(F.relu(c2).flatten(1)))
    out = net.fc2(a3)  # fc2: input a3, output out
    loss = F.cross_entropy(out, y)
    g = torch.autograd.grad(loss, [a1, c2, a3, out, net.fc2.bias, net.fc2.weight])
    return dict(zip(["conv2.in", "conv2.out", "fc2.in", "fc2.out", "fc2.bias", "fc2.weight"], g))


def hooked(net: Net, x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[Any, ...]]:
    """What real full backward hooks on conv2 and fc2 receive."""
    seen: dict[str, tuple[Any, ...]] = {}
    handles = [getattr(net, name).register_full_backward_hook(
        lambda m, gin, gout, name=name: seen.__setitem__(name, (gin, gout))) for name in ("conv2", "fc2")]
    F.cross_entropy(net(x), y).backward()
    for h in handles:
        h.remove()
    net.zero_grad()
    return seen


def main() -> dict[str, Any]:
    torch.manual_seed(0)
    net = Net()
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([0, 2])

    tr = gradscape.Tracer(net, tensors="full")  # "full": keep every gradient's values, not only a summary
    with tr.step(0) as st:
        F.cross_entropy(net(x), y).backward()
    assert st is not None
    net.zero_grad()
    ref, hooks = reference(net, x, y), hooked(net, x, y)

    for name in ("fc2", "conv2"):
        mod = st.modules[name]
        grad_input, grad_output = mod.grad_input[0], mod.grad_output[0]
        assert grad_input is not None and grad_output is not None
        print(f"{name} ({mod.type}): grad_output {grad_output.shape} = dL/d(output), "
              f"grad_input {grad_input.shape} = dL/d(input)")
        # what gradscape recorded is what torch.autograd.grad computes, and what a full hook receives
        torch.testing.assert_close(torch.from_numpy(grad_output.values), ref[f"{name}.out"])
        torch.testing.assert_close(torch.from_numpy(grad_input.values), ref[f"{name}.in"])
        torch.testing.assert_close(torch.from_numpy(grad_output.values), hooks[name][1][0])
        torch.testing.assert_close(torch.from_numpy(grad_input.values), hooks[name][0][0])

    # One level down: the autograd node nn.Linear made (AddmmBackward0), slot by slot, as the inspector shows it
    fc2 = next(n for n in st.nodes if n.module == "fc2" and n.name == "AddmmBackward0")
    assert fc2.grad_outputs is not None and fc2.grad_inputs is not None
    arriving = fc2.grad_outputs[0]
    assert arriving is not None
    print(f"\n{fc2.name} of fc2: arriving grad_outputs[0] {arriving.shape}")
    for label, g in zip(fc2.input_labels, fc2.grad_inputs):
        print(f"  sent on: {label:32s} {None if g is None else g.shape}")
    bias_slot, input_slot, weight_slot = fc2.grad_inputs
    assert bias_slot is not None and input_slot is not None and weight_slot is not None
    torch.testing.assert_close(torch.from_numpy(input_slot.values), ref["fc2.in"])
    torch.testing.assert_close(torch.from_numpy(bias_slot.values), ref["fc2.bias"])
    torch.testing.assert_close(torch.from_numpy(weight_slot.values).T, ref["fc2.weight"])  # mat2 is weight.T
    print("\nEvery slot equals torch.autograd.grad and the full backward hooks.")
    return {"labels": list(fc2.input_labels), "modules": {n: st.modules[n].type for n in ("fc2", "conv2")}}


if __name__ == "__main__":
    main()
