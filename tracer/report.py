"""A plain-text account of a `StepTrace`: what arrived at each node and what it sent on."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the model's text form: `StepTrace.summary()` imports this module, not the other way
    from gradscape.tracer._model import StepTrace, TensorTrace


def percent(fraction: float, decimals: int = 0) -> str:
    """`fraction` as a percentage with at least `decimals` decimals, and as many more as it takes to
    tell a non-zero fraction from 0% and a fraction under 1 from 100% (`0.004%`, `99.98%`); exactly
    0 and 1 are `0%` and `100%`, and NaN is `—`."""
    p = 100.0 * fraction
    if math.isnan(p):
        return "—"
    if p <= 0.0 or p >= 100.0 or math.isinf(p):
        return f"{p:.0f}%"
    for d in range(decimals, 7):
        text = f"{p:.{d}f}"
        if 0.0 < float(text) < 100.0:
            return text + "%"
    return f"{p:.2g}%"  # under a millionth of a percent


def _shape(t: TensorTrace | None) -> str:
    return "—" if t is None else "[" + "×".join(map(str, t.shape)) + "]"


def _brief(t: TensorTrace | None) -> str:
    if t is None:
        return "None"
    s = t.stats
    text = f"{_shape(t)} {t.dtype} norm={s.get('norm', float('nan')):.3g} min={s.get('min', float('nan')):.3g} " \
           f"max={s.get('max', float('nan')):.3g}"
    zeros = s.get("zeros", 0.0)
    if t.numel and zeros:
        text += f" zeros={percent(zeros / t.numel)}"
    if s.get("nan") or s.get("inf"):
        text += f" NaN={int(s.get('nan', 0))} Inf={int(s.get('inf', 0))}"
    return text


def format_step(st: StepTrace, max_nodes: int = 60) -> str:
    ran = [st.nodes[i] for i in st.order]
    lines = [f"run {st.run!r} step {st.step}: {len(st.nodes)} autograd nodes, {len(st.edges)} edges, "
             f"{len(st.passes)} backward pass(es), {len(st.params)} parameter gradients"]
    if st.error:
        lines.append(f"  the step raised: {st.error}")
    for p in st.passes:
        roots = ", ".join(st.nodes[r].name for r in p.roots)
        lines.append(f"  pass {p.index}: {p.api} from {roots}; gradient supplied at the root: "
                     f"{', '.join(_brief(g) for g in p.root_grads)}")
    lines.append("")
    lines.append("backward, in the order autograd ran it (grad_outputs = ∂L/∂outputs arriving, "
                 "grad_inputs = ∂L/∂inputs sent on):")
    for n in ran[:max_nodes]:
        where = " ".join(x for x in (n.module and f"in {n.module}", n.source and f"@ {n.source}",
                                     n.param and f"param {n.param}") if x)
        t = f" {n.time_us:.0f}µs" if n.time_us is not None else ""
        lines.append(f"  #{n.order:<4} {n.name} {where}{t}")
        for i, g in enumerate(n.grad_outputs or []):
            lines.append(f"        ← grad_outputs[{i}] {_brief(g)}")
        for j, g in enumerate(n.grad_inputs or []):
            label = n.input_labels[j] if j < len(n.input_labels) else f"input {j}"
            lines.append(f"        → grad_inputs[{j}] {label}: {_brief(g)}")
    if len(ran) > max_nodes:
        lines.append(f"  … {len(ran) - max_nodes} more nodes")
    never = [n for n in st.nodes if n.order is None]
    if never:
        lines.append(f"  not run in this backward: {', '.join(sorted({n.name for n in never}))}")
    called = {k: m for k, m in st.modules.items() if m.calls}
    if called:
        lines.append("")
        lines.append("modules (full-backward-hook meaning: grad_input = ∂L/∂input through the module, "
                     "grad_output = ∂L/∂output):")
        for name, m in called.items():
            gi = ", ".join(_shape(g) for g in m.grad_input)
            go = ", ".join(_shape(g) for g in m.grad_output)
            more = f" (called {len(m.calls)}×)" if len(m.calls) > 1 else ""
            last = m.calls[0].last_op
            old = ""
            if last is not None:
                node = st.nodes[last]
                old = f"; the deprecated register_backward_hook would show {node.name}'s " \
                      f"grad_inputs: {', '.join(_shape(g) for g in node.grad_inputs or [])}"
            lines.append(f"  {name} ({m.type}){more}: grad_input {gi or '—'}  grad_output {go or '—'}{old}")
    if st.params:
        lines.append("")
        lines.append("parameter gradients:")
        for name, g in st.params.items():
            lines.append(f"  {name}: {_brief(g)}")
    if st.not_in_step:
        lines.append("")
        lines.append(f"not in this step (their modules took no part in its forward): {', '.join(st.not_in_step)}")
    if st.problems:
        lines.append("")
        lines.append("problems (root cause first):")
        lines.extend(f"  {p.kind}: {p.message}" for p in st.problems)
    return "\n".join(lines)
