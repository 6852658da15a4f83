"""Tutorial 3: `out.backward(gradient)` and `torch.autograd.grad(..., grad_outputs=v)` as vector-Jacobian
products, on `y = torch.outer(x, x)`.

    python examples/vjp_outer.py

`y` is a 3×3 matrix, so `y.backward()` alone has no scalar to start from. `y.backward(v)` starts the
backward pass with `v` standing for dL/dy: every node then computes `vᵀ·J`, and `x.grad` becomes
Σᵢⱼ vᵢⱼ · ∂yᵢⱼ/∂x = (v + vᵀ) @ x. `torch.autograd.grad(y, x, grad_outputs=v)` computes the same and returns
it instead of adding it to `x.grad`. gradscape records the `v` supplied (`st.passes[k].root_grads`) and what
each node received and sent on.
"""

from __future__ import annotations

from typing import Any

import torch

import gradscape


def main() -> dict[str, Any]:
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    v = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # dL/dy: L = y[0, 1] = x0 * x1

    try:
        torch.outer(x, x).backward()
    except RuntimeError as exc:
        print(f"y.backward() with no gradient: {exc}")

    tr = gradscape.Tracer(tensors="full")
    with tr.step(0) as st:
        y = torch.outer(x, x)
        y.backward(v)  # pass 0: Tensor.backward with gradient=v
        (g,) = torch.autograd.grad(torch.outer(x, x), x, grad_outputs=v)  # pass 1: the same product, returned
    assert st is not None and x.grad is not None

    expected = (v + v.T) @ x.detach()  # the vector-Jacobian product by hand
    jacobian = torch.autograd.functional.jacobian(lambda t: torch.outer(t, t), x.detach())  # [3, 3, 3]
    torch.testing.assert_close(x.grad, expected)
    torch.testing.assert_close(g, expected)
    torch.testing.assert_close((v[..., None] * jacobian).sum((0, 1)), expected)  # Σᵢⱼ vᵢⱼ ∂yᵢⱼ/∂x
    print(f"x.grad = (v + vᵀ) @ x = {x.grad.tolist()}; autograd.grad gives {g.tolist()}")

    for p in st.passes:
        root = p.root_grads[0]
        assert root is not None
        torch.testing.assert_close(torch.from_numpy(root.values), v)  # the gradient supplied at the root is v
        print(f"pass {p.index} ({p.api}): started from grad_outputs = v, shape {root.shape}")
    print("\nnode by node, in the order autograd ran them (pass 0, then pass 1):")
    for nid in st.order:
        n = st.nodes[nid]
        arrived = [None if t is None else t.values.tolist() for t in (n.grad_outputs or [])]
        print(f"  {n.name:36s} arrived {arrived}")
        for label, t in zip(n.input_labels, n.grad_inputs or []):
            print(f"  {'':36s} sent on {label}: {None if t is None else t.values.tolist()}")
    leaf = next(n for n in st.nodes if n.kind == "leaf")
    per_pass = [r.grad_outputs[0] for r in leaf.runs]  # what reached x in each pass
    for r in per_pass:
        assert r is not None
        torch.testing.assert_close(torch.from_numpy(r.values), expected)
    return {"apis": [p.api for p in st.passes], "x_grad": x.grad.tolist(), "runs_at_x": len(per_pass)}


if __name__ == "__main__":
    main()
