"""The checks on a finished step (NOTE [Two moments] in problems.py): gradients made non-finite by a
backward node, parameters that got no gradient, exploding or vanishing layers, dead ReLUs. Thresholds:
docs/problems.md."""

from __future__ import annotations

import functools
import math
import re
from collections import deque
from typing import Any

from gradscape.tracer import _compat
from gradscape.tracer._model import NodeTrace, Problem, StepTrace, TensorTrace
from gradscape.tracer.record.labels import RELU_LIKE
from gradscape.tracer.record.native import extension
from gradscape.tracer.record.tables import LazyNodes, grads_of, ids_named
from gradscape.tracer.record.view import StepView
from gradscape.tracer.summary.stats import median

DEAD_ZEROS = 0.99  # a ReLU-like node sending back at least this fraction of zeros is dead
LAYER_FACTOR = 1e3  # a layer's gradient norm this far above (or below) the median of the layers of its kind
HISTORY_FACTOR = 1e2  # a layer's gradient norm this far above (or below) the median of its own history
HISTORY_LEN = 20  # traced steps a layer's norm is remembered for
HISTORY_MIN = 5  # steps of history needed before comparing with it
MIN_LAYERS = 3  # layers of a kind with a gradient needed before comparing a layer with their median


def op_name(name: str) -> str:
    """`SqrtBackward0` → `sqrt`, for messages."""
    short = re.sub(r"Backward\d*$", "", name.rsplit("::", 1)[-1])
    return short.lower() if short else name


def has_nonfinite(t: TensorTrace | None) -> bool:
    """True for a summary that counted a NaN or an Inf."""
    if t is None:
        return False
    s = t.stats
    return bool(s.get("nan", 0.0) or s.get("inf", 0.0))


def any_nonfinite_gradient(st: StepTrace) -> bool:
    for n in st.nodes:
        for r in n.runs:
            for g in r.grad_inputs or ():
                if g is not None and has_nonfinite(g):
                    return True
            for g in r.grad_outputs:
                if g is not None and has_nonfinite(g):
                    return True
    return False


def where(n: NodeTrace) -> str:
    """" (module, file.py:LINE)" of a node, as far as known."""
    parts = [p for p in (n.module, n.source) if p]
    return f" ({', '.join(parts)})" if parts else ""


def backward_born(st: StepTrace, bad_forward: set[int]) -> list[Problem]:
    """Nodes that sent a non-finite gradient on although every gradient arriving at them was finite,
    in the order they ran. Written for the finite step: one pass over the sent gradients' counts."""
    found: list[tuple[int, Problem]] = []
    for n in st.nodes:
        for r in n.runs:
            bad = None
            for g in r.grad_inputs or ():
                if g is not None:
                    s = g.stats
                    if s.get("nan") or s.get("inf"):
                        bad = g
                        break
            if bad is None or any(has_nonfinite(g) for g in r.grad_outputs):
                continue
            word = "a NaN" if bad.stats.get("nan") else "an Inf"
            why = " (its forward values were already non-finite)" if n.id in bad_forward else ""
            found.append((r.order, Problem(
                "nonfinite_backward",
                f"The backward of {op_name(n.name)}{where(n)} made {word} gradient from finite ones{why}.",
                n.id, None, n.source)))
            break
    found.sort(key=lambda p: p[0])
    return [p for _, p in found]


def _cut_at(node: Any, detaches: list[tuple[Any, str | None]]) -> str | None:
    """The line of the first detach whose tensor's graph holds `node` (so the detach cut its path)."""
    import networkx as nx  # (here: a step with no cut graph never loads it)

    for fn, line in detaches:
        g = nx.DiGraph()
        stack, seen = [fn], {fn}
        while stack:
            n = stack.pop()
            for child, _ in n.next_functions:
                if child is not None:
                    g.add_edge(n, child)
                    if child not in seen:
                        seen.add(child)
                        stack.append(child)
        if node is fn or (node in g and nx.has_path(g, fn, node)):
            return line
    return None


def no_grad(st: StepTrace, view: StepView, detaches: list[tuple[Any, str | None]],
            no_grad_uses: dict[Any, str | None] | None = None,
            unmade: dict[str, tuple[float, bool]] | None = None) -> tuple[list[Problem], list[str]]:
    """Parameters that need a gradient and got none, in the model's order: a `no_grad` problem with the
    reason when known, except those whose module took no part in the step's forward (no call through
    `__call__`, no node made in its forward): no gradient was expected of them, and they are listed
    apart, as not in this step (the second list). `unmade`: parameters that got one not in `st.params` yet."""
    if not st.passes or all(p.api == "autograd.grad" for p in st.passes):
        return [], []  # autograd.grad fills no .grad: no parameter is expected to get one
    unmade = unmade or {}
    if len(st.params) + len(unmade) >= len(view.model.params):
        return [], []  # every parameter got one (the usual step: no need to look at each)
    wanted = [name for p, name in view.model.params if p.requires_grad]
    missing = [name for name in wanted if name not in st.params and name not in unmade]
    if not missing:
        return [], []
    in_graph = {n.param: n.id for n in st.nodes if n.param}
    owner = {p: mod for mod, plist in view.model.module_params.items() for p in plist}
    calls: dict[str, list[Any]] = {}
    for c in view.forward.calls:
        calls.setdefault(c.name, []).append(c)
    ran = set(calls) | {n.module for n in st.nodes if n.module}  # modules that took part in the forward
    out: list[Problem] = []
    absent: list[str] = []
    for name in missing:
        node = in_graph.get(name)
        mod = owner.get(name)
        source = None
        p = view.model.param_by_name.get(name)
        if node is not None:
            why = "it is in the graph, but every path from the loss to it carried no gradient (None)."
        elif no_grad_uses and p is not None and p in no_grad_uses:
            source = no_grad_uses[p]
            why = (f"it was used under torch.no_grad() (at {source}), which records no graph to it."
                   if source else "it was used under torch.no_grad(), which records no graph to it.")
        elif mod is not None and mod not in ran:
            absent.append(name)  # its module took no part in this step: not a problem of the step
            continue
        elif mod is None or mod == "<root>" or not calls.get(mod):
            why = "it has no path to the loss (unused, or cut by .detach() or torch.no_grad())."
        else:
            outs = [e for c in calls[mod] for e in c.outputs if e is not None]
            if not outs:
                why = (f"{mod} ran, but its output needs no gradient: it was computed under torch.no_grad() "
                       f"or detached inside {mod}.")
            else:
                cut = _cut_at(outs[0][0], detaches)
                try:
                    made = view.forward.source_of(_compat.node_sequence_nr(outs[0][0]))
                except Exception:
                    made = None
                at = f" (made at {made})" if made else ""
                if cut is not None:
                    source = cut
                    why = f"{mod}'s output{at} was cut from the graph by .detach() at {cut}."
                else:
                    source = made
                    why = (f"{mod}'s output{at} never reached the loss: it is unused, or cut by torch.no_grad() "
                           "after that.")
        out.append(Problem("no_grad", f"{name} got no gradient: {why}", node, name, source))
    return out, absent


def kind_of(module: str, module_types: dict[str, str]) -> tuple[str, str]:
    """A layer's kind: its class and its name with every index made `#` (`encoder.layer.#.attention.self.query`):
    the same layer in each block of a stack, or each head of a `ModuleList`."""
    return module_types.get(module, ""), _stacked(module)


_INDEX = re.compile(r"(^|\.)\d+(?=\.|$)")


@functools.lru_cache(maxsize=4096)
def _stacked(module: str) -> str:
    """`module` with every index made `#` (the same names come back every traced step)."""
    return _INDEX.sub(r"\1#", module)


def _norms_of_layers(st: StepTrace, module_params: dict[str, list[str]],
                     unmade: dict[str, tuple[float, bool]]) -> dict[str, float]:
    """Each layer's parameter-gradient norm (finite values only): the extension sums them where it is built (NOTE
    [Parameter rules in one call] in tracer/record/csrc/param_grads.h)."""
    layers, flat, groups = _layout(module_params)
    vals: list[tuple[float, bool] | None] = list(map(unmade.get, flat))
    params = st.params
    if params:
        for k, p in enumerate(flat):
            if vals[k] is None and (t := params.get(p)) is not None:  # (one in `unmade`: no `TensorTrace` made)
                vals[k] = (t.stats.get("norm", math.nan), has_nonfinite(t))
    ext = extension()
    norms = _group_norms(vals, groups, len(layers)) if ext is None else ext.group_norms(vals, groups, len(layers))
    return {mod: v for mod, v in zip(layers, norms) if v is not None}


def _group_norms(vals: list[tuple[float, bool] | None], groups: list[int], n: int) -> list[float | None]:
    """Each of `n` groups' norm from its values': the square root of the sum of their squares, in order, over those
    that are a finite norm of a finite gradient (None: a group with none); the extension's `group_norms`."""
    sq, seen = [0.0] * n, [False] * n
    for val, k in zip(vals, groups):
        if val is not None and val[0] == val[0] and val[0] != math.inf and not val[1]:
            sq[k] += val[0] * val[0]
            seen[k] = True
    return [math.sqrt(v) if ok else None for v, ok in zip(sq, seen)]


_last_layout: tuple[dict[str, list[str]], list[str], list[str], list[int]] | None = None


def _layout(module_params: dict[str, list[str]]) -> tuple[list[str], list[str], list[int]]:
    """(the layers, all their parameters in one list, each one's layer): the same model's come back every traced
    step, so the last are kept (one tuple, read and replaced whole by any thread)."""
    global _last_layout
    last = _last_layout
    if last is not None and last[0] is module_params:
        return last[1], last[2], last[3]
    layers = list(module_params)
    flat = [p for plist in module_params.values() for p in plist]
    groups = [k for k, plist in enumerate(module_params.values()) for _ in plist]
    _last_layout = (module_params, layers, flat, groups)
    return layers, flat, groups


def _against_kind(norms: dict[str, float], module_types: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Layers far from the median of the layers of their kind (at least `MIN_LAYERS` of them). Not the median
    of all layers: a layer's norm is normal only against others that play its part (an attention query's is
    about 1/1000 of the median of all layers at initialisation, as a freshly made BERT shows)."""
    out: dict[str, tuple[str, str]] = {}
    for (cls, pattern), mods in _kinds(tuple(norms), module_types):
        med = median(norms[m] for m in mods)
        if med <= 0:
            continue
        high, low = LAYER_FACTOR * med, med / LAYER_FACTOR
        for m in mods:  # (the words are made only for a layer found: every traced step runs this loop)
            v = norms[m]
            if v > high:
                out[m] = ("exploding", f"{v:.3g}, over {LAYER_FACTOR:g}× {_peers(len(mods), cls, pattern, med)}")
            elif v < low:
                out[m] = ("vanishing", f"{v:.3g}, under 1/{LAYER_FACTOR:g} of {_peers(len(mods), cls, pattern, med)}")
    return out


_Groups = list[tuple[tuple[str, str], list[str]]]
_last_kinds: tuple[tuple[str, ...], dict[str, str], _Groups] | None = None  # (layers, module_types, groups)


def _kinds(mods: tuple[str, ...], module_types: dict[str, str]) -> _Groups:
    """The layers `mods` by kind (`kind_of`), only the kinds of `MIN_LAYERS` layers or more: the same layers come
    back every traced step, so the last grouping is kept (one tuple, read and replaced whole by any thread)."""
    global _last_kinds
    last = _last_kinds
    if last is not None and last[1] is module_types and last[0] == mods:
        return last[2]
    kinds: dict[tuple[str, str], list[str]] = {}
    for mod in mods:
        kinds.setdefault(kind_of(mod, module_types), []).append(mod)
    groups = [(k, ms) for k, ms in kinds.items() if len(ms) >= MIN_LAYERS]
    _last_kinds = (mods, module_types, groups)
    return groups


def _peers(n: int, cls: str, pattern: str, med: float) -> str:
    return f"the median of the {n} layers of its kind ({cls} {pattern}: {med:.3g})"


def _against_history(v: float, past: deque[float] | None) -> tuple[str, str] | None:
    """Far from the median of the layer's own norms over its last traced steps."""
    # the median only when the bounds do not settle it (v within 100x of every past norm)
    if past is None or len(past) < HISTORY_MIN or not (v > HISTORY_FACTOR * min(past) or
                                                       v < max(past) / HISTORY_FACTOR):
        return None
    med = median(past)
    if med > 0 and v > HISTORY_FACTOR * med:
        return "exploding", f"{v:.3g}, over {HISTORY_FACTOR:g}× its median over the last {len(past)} traced " \
                            f"steps ({med:.3g})"
    if med > 0 and v < med / HISTORY_FACTOR:
        return "vanishing", f"{v:.3g}, under 1/{HISTORY_FACTOR:g} of its median over the last {len(past)} " \
                            f"traced steps ({med:.3g})"
    return None


def layer_norms(st: StepTrace, module_params: dict[str, list[str]], history: dict[str, deque[float]],
                unmade: dict[str, tuple[float, bool]] | None = None,
                module_types: dict[str, str] | None = None) -> list[Problem]:
    """Exploding / vanishing layers: a layer's parameter-gradient norm against the layers of its kind
    (`kind_of`) and against its own recent history (docs/problems.md has the thresholds). `unmade`: (norm,
    counted a NaN or an Inf) of gradients read without their `TensorTrace` (not in `st.params` yet, or in it as a
    row of the step's tensor table): their `st.params` entry is not read."""
    norms = _norms_of_layers(st, module_params, unmade or {})
    by_kind = _against_kind(norms, module_types or {})
    out: list[Problem] = []
    for mod, v in norms.items():
        found = by_kind.get(mod) or _against_history(v, history.get(mod))
        if found is not None:
            pnode = next((st.param_node(p) for p in module_params[mod] if st.param_node(p) is not None), None)
            out.append(Problem(found[0], f"The gradient norm of layer {mod} is {found[1]}.",
                               None if pnode is None else pnode.id, module_params[mod][0], None))
    for mod, v in norms.items():
        past = history.get(mod)
        if past is None:
            past = history[mod] = deque(maxlen=HISTORY_LEN)
        past.append(v)
    return out


def dead(st: StepTrace) -> list[Problem]:
    out: list[Problem] = []
    for k, (zeros, numel), (came, came_numel) in _relu_zeros(st.nodes):
        if not numel:
            continue
        frac = zeros / numel
        if frac >= DEAD_ZEROS and came / max(came_numel, 1) < DEAD_ZEROS:
            n = st.nodes[k]
            out.append(Problem("dead", f"{op_name(n.name)}{where(n)} passed back zero for {frac:.1%} of its "
                                       "elements: its units were inactive for the whole batch.",
                               n.id, None, n.source))
    return out


def _relu_zeros(nodes: Any) -> list[tuple[int, tuple[float, int], tuple[float, int]]]:
    """Each ReLU-like node that sent and got a gradient (slot 0 of its first run): (id, (zeros, numel) of
    what it sent, the same of what came). A natively recorded step's are read from its tables, making no
    `TensorTrace` (NOTE [Step tables]): the extension found their slots (`StepTables.relu_slots`)."""
    if isinstance(nodes, LazyNodes):
        z = nodes.tables.tensors.zeros_of
        return [(k, z(s), z(c)) for k, s, c in nodes.tables.relu_slots]
    out = []
    ids = ids_named(nodes, RELU_LIKE)
    for k in ids:
        gi, go = grads_of(nodes, k, True), grads_of(nodes, k, False)
        s, c = (gi[0] if gi else None), (go[0] if go else None)
        if s is not None and c is not None:
            out.append((k, (s.stats.get("zeros", 0.0), s.numel), (c.stats.get("zeros", 0.0), c.numel)))
    return out
