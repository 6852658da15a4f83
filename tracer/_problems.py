"""The problem finder: `StepTrace.problems`, what a person should look at first in a step.

docs/problems.md states what each kind means and the thresholds; this module follows it.

NOTE [Two moments]
    At the start of each backward (the graph is walked, saved tensors are still readable) the finder
    reads the value of each root: one scalar read per backward, the only work on a finite step there.
    Only when a root is NaN/Inf does it look further, at every walked node's saved tensors, to find
    where the first non-finite value of the forward was made (`_ForwardSearch`). At the end of the
    step it reads the gradient statistics the tracer computed anyway (the `nan`/`inf` counts) for the
    backward-born check, and the parameter gradients for the no-gradient, exploding, vanishing and
    dead checks.

NOTE [Where a non-finite forward value was born]
    Each walked node's output is judged non-finite, finite or unknown from what autograd saved: a
    node's `_saved_result*` is its own output, its saved inputs (`_saved_self`, `_saved_mat1`, ...,
    matched to input slots by argument name) are its children's outputs, a leaf's value is its
    AccumulateGrad node's `variable`, and a bad root is a non-finite output. Unknown outputs are then
    inferred in forward order (`_sequence_nr()`): a non-finite input makes a non-finite output
    (except through ops that can mask it, `_MASKING`); finite inputs make a finite output unless the
    op can make NaN/Inf by itself (`_RISKY`: log, sqrt, div, pow, exp, ...). The origin is a
    non-finite node whose inputs are all finite, a parameter or leaf that already held a non-finite
    value, or an input from outside the graph (data, a buffer) that was saved non-finite. Where an
    unknown risky op sits between finite inputs and a non-finite node, the risky op is named as the
    probable origin.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import weakref
from collections import deque
from typing import Any

import networkx as nx
import torch

from gradscape.tracer._attrib import user_frame
from gradscape.tracer._labels import slot_args
from gradscape.tracer._model import Problem, StepTrace, TensorTrace

# Forward ops (named by their backward node) that can turn finite inputs into NaN or Inf by themselves
_RISKY = frozenset({
    "LogBackward0", "Log2Backward0", "Log10Backward0", "Log1PBackward0", "SqrtBackward0", "RsqrtBackward0",
    "DivBackward0", "DivBackward1", "DivBackward2", "DivBackward3", "ReciprocalBackward0",
    "PowBackward0", "PowBackward1", "PowBackward2", "ExpBackward0", "Exp2Backward0", "Expm1Backward0",
    "AcosBackward0", "AsinBackward0", "AtanhBackward0", "AcoshBackward0", "TanBackward0", "CoshBackward0",
    "SinhBackward0", "LgammaBackward0", "DigammaBackward0", "PolygammaBackward0", "XlogyBackward0",
    "XlogyBackward1", "XlogyBackward2", "ErfinvBackward0", "LogitBackward0", "ProdBackward0",
    "ProdBackward1", "CumprodBackward0", "LogdetBackward0", "LinalgInvExBackward0", "FmodBackward0",
    "RemainderBackward0", "AtanBackward0", "SpecialEntrBackward0", "LogsumexpBackward0",
})
# Forward ops that can give finite outputs from a non-finite input (they pick or replace elements)
_MASKING = frozenset({"WhereBackward0", "MaskedFillBackward0", "MaskedFillBackward1", "NanToNumBackward0",
                      "MaskedScatterBackward0", "IndexBackward0", "GatherBackward0", "SliceBackward0",
                      "SelectBackward0", "ClampMinBackward0", "ClampMaxBackward0"})
RELU_LIKE = frozenset({"ReluBackward0", "ThresholdBackward0", "HardtanhBackward0"})

DEAD_ZEROS = 0.99  # a ReLU-like node sending back at least this fraction of zeros is dead
LAYER_FACTOR = 1e3  # a layer's gradient norm this far above (or below) the median of all layers'
HISTORY_FACTOR = 1e2  # a layer's gradient norm this far above (or below) the median of its own history
HISTORY_LEN = 20  # traced steps a layer's norm is remembered for
HISTORY_MIN = 5  # steps of history needed before comparing with it
MIN_LAYERS = 3  # layers with a gradient needed before comparing a layer with the median of all
MAX_FORWARD = 5  # forward origins listed at most
MAX_DETACHES = 256  # detaches of a step remembered at most (each holds its graph until the step ends)
MAX_NO_GRAD_USES = 256  # leaf tensors needing grad that an op used under no_grad, remembered at most per step

log = logging.getLogger(__name__)

# A layer's norm history lives as long as its Tracer: keyed by the per-Tracer `StructureCache` every
# step recorder of that Tracer is given (a weak key, so it goes with the Tracer)
_histories: weakref.WeakKeyDictionary[Any, dict[str, deque[float]]] = weakref.WeakKeyDictionary()

# Off: steps get no problems and the finder costs nothing (bench/overhead.py --finder compares both)
enabled = True

_saved_names: dict[type, tuple[str, ...]] = {}  # node class → its saved-tensor attributes


def op_name(name: str) -> str:
    """`SqrtBackward0` → `sqrt`, for messages."""
    short = re.sub(r"Backward\d*$", "", name.rsplit("::", 1)[-1])
    return short.lower() if short else name


def _value_word(t: torch.Tensor) -> str:
    return "NaN" if bool(torch.isnan(t).any()) else "Inf"


def _nonfinite(t: Any) -> bool | None:
    """True/False for a tensor holding / not holding NaN or Inf; None when it cannot be read."""
    if not isinstance(t, torch.Tensor):
        return None
    try:  # (no grad mode needed: neither reading a value nor a boolean result records anything)
        if not t.is_floating_point():
            return False if not t.is_complex() else not bool(torch.isfinite(t).all())
        if t.numel() == 1:
            return not math.isfinite(t.item())
        return not bool(torch.isfinite(t).all())
    except Exception:  # sparse, meta, a subclass that cannot answer: unknown
        return None


def root_values(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor | None]:
    """The tensors a backward starts from, one per root in the recorder's order (`_roots_of`): a
    tensor that needs grad, or None for a `GradientEdge` (which has no value to read)."""
    if api == "Tensor.backward":
        tensors: Any = [args[0]]
    else:
        first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        tensors = [first] if isinstance(first, (torch.Tensor, torch.autograd.graph.GradientEdge)) \
            else list(first or ())
    out: list[torch.Tensor | None] = []
    for t in tensors:
        if isinstance(t, torch.autograd.graph.GradientEdge):
            out.append(None)
        elif isinstance(t, torch.Tensor) and t.requires_grad:
            out.append(t)
    return out


class StepProblems:
    """The finder's part of one step's recorder (NOTE [Two moments])."""

    def __init__(self, per_tracer: Any = None) -> None:
        self.history: dict[str, deque[float]] = {} if per_tracer is None else _histories.setdefault(per_tracer, {})
        self.bad_roots: list[tuple[int, int, str]] = []  # (pass index, root node id, "NaN" | "Inf")
        self.origins: list[dict[str, Any]] = []
        self.bad_forward: set[int] = set()  # node ids whose forward output held NaN/Inf
        self.detaches: list[tuple[Any, str | None]] = []  # (grad_fn of a detached tensor, line of the detach)
        # leaf tensors that need a gradient (parameters) used by an op under torch.no_grad(): the op's line
        self.no_grad_uses: dict[Any, str | None] = {}

    def note_detach(self, t: Any, frame: Any) -> None:
        """A `.detach()` in the step's forward, of a tensor with a graph: where a graph may have been cut."""
        fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
        if fn is not None and enabled and len(self.detaches) < MAX_DETACHES:
            self.detaches.append((fn, user_frame(frame)))

    def note_no_grad(self, args: tuple[Any, ...], frame: Any) -> None:
        """An op run under torch.no_grad() in the step: the parameters among its arguments, and its line (the
        first for each; a cut that explains a parameter without a gradient)."""
        uses = self.no_grad_uses
        if not enabled or len(uses) >= MAX_NO_GRAD_USES:
            return
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad and a.grad_fn is None and a not in uses:
                uses[a] = user_frame(frame)

    # ------------------------------------------------------------------ backward start
    def at_backward(self, recs: list[Any], root_ids: list[int], values: list[torch.Tensor | None],
                    pass_index: int) -> None:
        """Read each root's value; look for the forward origin only when one is NaN/Inf. Never raises."""
        if not enabled:
            return
        try:
            bad: dict[int, str] = {}
            for rid, t in zip(root_ids, values):
                if t is not None and _nonfinite(t):
                    bad[rid] = _value_word(t)
                    self.bad_roots.append((pass_index, rid, bad[rid]))
            if bad:
                search = _ForwardSearch(recs, bad)
                for o in search.origins():
                    if all(o != old for old in self.origins):
                        self.origins.append(o)
                self.bad_forward |= search.bad
        except Exception as exc:  # the finder must never break the user's backward
            log.warning("gradscape: the problem finder could not look at this backward's start: %s", exc)

    # ------------------------------------------------------------------ step end
    def finish(self, st: StepTrace, recorder: Any) -> list[Problem]:
        """Every problem of the step, root cause first. Never raises (the step is kept without them)."""
        if not enabled:
            return []
        try:
            return self._find(st, recorder)
        except Exception as exc:
            log.warning("gradscape: the problem finder failed on step %s: %s", st.step, exc)
            return []

    def _find(self, st: StepTrace, recorder: Any) -> list[Problem]:
        out: list[Problem] = []
        nodes = st.nodes
        for o in self.origins[:MAX_FORWARD]:
            out.append(_forward_problem(st, o))
        for index, rid, word in self.bad_roots:
            n = nodes[rid]
            where = f" ({op_name(n.name)} at {n.source})" if n.source else f" ({n.name})"
            out.append(Problem("nonfinite_loss",
                               f"The loss{where}, where backward pass {index} started, is {word}"
                               + ("; every gradient is finite, so only the loss shows it." if
                                  not _any_bad_gradient(st) else "."), rid, None, n.source))
        out.extend(_backward_born(st, self.bad_forward))
        out.extend(_no_grad(st, recorder, self.detaches, self.no_grad_uses))
        self.detaches, self.no_grad_uses = [], {}
        out.extend(_layer_norms(st, recorder.module_params, self.history))
        out.extend(_dead(st))
        return out


def _bad(t: TensorTrace | None) -> bool:
    if t is None:
        return False
    s = t.stats
    return bool(s.get("nan", 0.0) or s.get("inf", 0.0))


def _any_bad_gradient(st: StepTrace) -> bool:
    for n in st.nodes:
        for r in n.runs:
            for g in r.grad_inputs or ():
                if g is not None and _bad(g):
                    return True
            for g in r.grad_outputs:
                if g is not None and _bad(g):
                    return True
    return False


def _where(n: Any) -> str:
    parts = [p for p in (n.module, n.source) if p]
    return f" ({', '.join(parts)})" if parts else ""


def _forward_problem(st: StepTrace, o: dict[str, Any]) -> Problem:
    n = st.nodes[o["node"]]
    word = o["value"]
    if o["what"] in ("param", "leaf"):
        what = f"Parameter {n.param}" if n.param else "A leaf tensor of the graph"
        return Problem("nonfinite_forward", f"{what} already held {word} before this step's forward used it.",
                       n.id, n.param, None)
    if o["what"] == "input":
        return Problem("nonfinite_forward",
                       f"The input {o['arg']!r} of {op_name(n.name)}{_where(n)} already held {word}: a tensor "
                       "from outside the graph (data, a buffer, or one computed without gradients).",
                       n.id, None, n.source)
    how = "made" if o["certain"] else "probably made"
    return Problem("nonfinite_forward",
                   f"The first {word} of the forward was {how} by {op_name(n.name)}{_where(n)} from finite inputs.",
                   n.id, None, n.source)


def _backward_born(st: StepTrace, bad_forward: set[int]) -> list[Problem]:
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
            if bad is None or any(_bad(g) for g in r.grad_outputs):
                continue
            word = "a NaN" if bad.stats.get("nan") else "an Inf"
            why = " (its forward values were already non-finite)" if n.id in bad_forward else ""
            found.append((r.order, Problem(
                "nonfinite_backward",
                f"The backward of {op_name(n.name)}{_where(n)} made {word} gradient from finite ones{why}.",
                n.id, None, n.source)))
            break
    found.sort(key=lambda p: p[0])
    return [p for _, p in found]


def _cut_at(node: Any, detaches: list[tuple[Any, str | None]]) -> str | None:
    """The line of the first detach whose tensor's graph holds `node` (so the detach cut its path)."""
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


def _no_grad(st: StepTrace, rec: Any, detaches: list[tuple[Any, str | None]],
             no_grad_uses: dict[Any, str | None] | None = None) -> list[Problem]:
    """Parameters that need a gradient and got none, in the model's order, with the reason when known."""
    if not st.passes or all(p.api == "autograd.grad" for p in st.passes):
        return []  # autograd.grad fills no .grad: no parameter is expected to get one
    if len(st.params) >= len(rec.param_names):
        return []  # every parameter got one (the usual step: no need to look at each)
    wanted = [name for p, name in rec.param_names.items() if p.requires_grad]
    missing = [name for name in wanted if name not in st.params]
    if not missing:
        return []
    in_graph = {n.param: n.id for n in st.nodes if n.param}
    owner = {p: mod for mod, plist in rec.module_params.items() for p in plist}
    calls: dict[str, list[Any]] = {}
    for c in rec.forward.calls:
        calls.setdefault(c.name, []).append(c)
    out: list[Problem] = []
    for name in missing:
        node = in_graph.get(name)
        mod = owner.get(name)
        source = None
        p = rec._param_by_name.get(name)
        if node is not None:
            why = "it is in the graph, but every path from the loss to it carried no gradient (None)."
        elif no_grad_uses and p is not None and p in no_grad_uses:
            source = no_grad_uses[p]
            why = (f"it was used under torch.no_grad() (at {source}), which records no graph to it."
                   if source else "it was used under torch.no_grad(), which records no graph to it.")
        elif mod is None or mod == "<root>" or not calls.get(mod):
            why = (f"its module {mod} was not called in this step's forward (an unused layer)."
                   if mod not in (None, "<root>") else "it has no path to the loss (unused, or cut by "
                   ".detach() or torch.no_grad()).")
        else:
            outs = [e for c in calls[mod] for e in c.outputs if e is not None]
            if not outs:
                why = (f"{mod} ran, but its output needs no gradient: it was computed under torch.no_grad() "
                       f"or detached inside {mod}.")
            else:
                cut = _cut_at(outs[0][0], detaches)
                try:
                    made = rec.forward.source_of(outs[0][0]._sequence_nr())
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
    return out


def _layer_norms(st: StepTrace, module_params: dict[str, list[str]],
                 history: dict[str, deque[float]]) -> list[Problem]:
    """Exploding / vanishing layers: a layer's parameter-gradient norm against the median of all layers
    and against its own recent history (docs/problems.md has the thresholds)."""
    norms: dict[str, float] = {}
    params = st.params
    for mod, plist in module_params.items():
        sq, seen = 0.0, False
        for p in plist:
            t = params.get(p)
            if t is None:
                continue
            v = t.stats.get("norm", math.nan)
            if v == v and v != math.inf and not _bad(t):  # a finite norm of a finite gradient
                sq += v * v
                seen = True
        if seen:
            norms[mod] = math.sqrt(sq)
    out: list[Problem] = []
    med_all = statistics.median(norms.values()) if len(norms) >= MIN_LAYERS else 0.0
    for mod, v in norms.items():
        kind, why = None, ""
        if med_all > 0 and v > LAYER_FACTOR * med_all:
            kind, why = "exploding", f"{v:.3g}, over {LAYER_FACTOR:g}× the median of all layers ({med_all:.3g})"
        elif med_all > 0 and v < med_all / LAYER_FACTOR:
            kind, why = "vanishing", f"{v:.3g}, under 1/{LAYER_FACTOR:g} of the median of all layers ({med_all:.3g})"
        past = history.get(mod)
        # the median only when the bounds do not settle it (v within 100x of every past norm)
        if kind is None and past is not None and len(past) >= HISTORY_MIN and \
                (v > HISTORY_FACTOR * min(past) or v < max(past) / HISTORY_FACTOR):
            med = statistics.median(past)
            if med > 0 and v > HISTORY_FACTOR * med:
                kind, why = "exploding", f"{v:.3g}, over {HISTORY_FACTOR:g}× its median over the last " \
                                         f"{len(past)} traced steps ({med:.3g})"
            elif med > 0 and v < med / HISTORY_FACTOR:
                kind, why = "vanishing", f"{v:.3g}, under 1/{HISTORY_FACTOR:g} of its median over the last " \
                                         f"{len(past)} traced steps ({med:.3g})"
        if kind is not None:
            pnode = next((st.param_node(p) for p in module_params[mod] if st.param_node(p) is not None), None)
            out.append(Problem(kind, f"The gradient norm of layer {mod} is {why}.",
                               None if pnode is None else pnode.id, module_params[mod][0], None))
    for mod, v in norms.items():
        past = history.get(mod)
        if past is None:
            past = history[mod] = deque(maxlen=HISTORY_LEN)
        past.append(v)
    return out


def _dead(st: StepTrace) -> list[Problem]:
    out: list[Problem] = []
    for n in st.nodes:
        if n.name not in RELU_LIKE or not n.grad_inputs or not n.grad_outputs:
            continue
        sent, came = n.grad_inputs[0], n.grad_outputs[0]
        if sent is None or came is None or not sent.numel:
            continue
        zeros = sent.stats.get("zeros", 0.0) / sent.numel
        if zeros >= DEAD_ZEROS and came.stats.get("zeros", 0.0) / max(came.numel, 1) < DEAD_ZEROS:
            out.append(Problem("dead", f"{op_name(n.name)}{_where(n)} passed back zero for {zeros:.1%} of its "
                                       "elements: its units were inactive for the whole batch.",
                               n.id, None, n.source))
    return out


class _ForwardSearch:
    """NOTE [Where a non-finite forward value was born], for the nodes below the bad roots."""

    def __init__(self, recs: list[Any], bad_roots: dict[int, str]) -> None:
        g = nx.DiGraph()
        for r in recs:
            g.add_node(r.id)
            for j, c in enumerate(r.children):
                if c is not None:
                    g.add_edge(r.id, c[0], slot=j)
        below: set[int] = set(bad_roots)
        for rid in bad_roots:
            below |= nx.descendants(g, rid)
        self.g = g.subgraph(below)
        self.recs = recs
        self.status: dict[int, bool] = {rid: True for rid in bad_roots}
        self.inputs_bad: list[dict[str, Any]] = []  # saved non-finite inputs from outside the graph
        self.value: dict[int, str] = dict(bad_roots)  # node id → "NaN" | "Inf" where its value was read
        for rid in below:
            try:
                self._read(recs[rid])
            except Exception:  # a node we cannot read stays unknown
                continue
        # forward order: leaves first (their sequence number is the largest), then by creation
        self.order = sorted(below, key=lambda i: (recs[i].kind not in ("param", "leaf"), recs[i].seq))
        self.certain = set(self.status)
        self._infer()
        self.bad = {i for i, s in self.status.items() if s}

    def _set(self, rid: int, bad: bool, t: torch.Tensor | None = None) -> None:
        if bad:
            self.status[rid] = True
            if t is not None and rid not in self.value:
                self.value[rid] = _value_word(t)
        else:
            self.status.setdefault(rid, False)

    def _read(self, r: Any) -> None:
        node = r.node
        if r.kind in ("param", "leaf"):
            v = getattr(node, "variable", None)
            b = _nonfinite(v)
            if b is not None:
                self._set(r.id, b, v)
            return
        cls = type(node)
        names = _saved_names.get(cls)
        if names is None:
            names = _saved_names[cls] = tuple("_saved_" + a[len("_raw_saved_"):] for a in dir(node)
                                              if a.startswith("_raw_saved_"))
        if not names:
            return
        args = slot_args(r.name, r.kind, len(r.children))
        for attr in names:
            try:
                value = getattr(node, attr)
            except Exception:  # freed, or modified in place since
                continue
            tensors = list(value) if isinstance(value, (list, tuple)) else [value]
            for t in tensors:
                b = _nonfinite(t)
                if b is None:
                    continue
                arg = attr[len("_saved_"):]
                if arg.startswith("result"):
                    self._set(r.id, b, t)
                    continue
                slot = args.index(arg) if arg in args else -1
                child = r.children[slot] if slot >= 0 else None
                if child is not None:
                    one_output = len(self.recs[child[0]].node._input_metadata) == 1
                    if b or one_output:
                        self._set(child[0], b, t)
                elif b and slot >= 0:  # an input that needs no gradient: from outside the graph
                    self.inputs_bad.append({"node": r.id, "arg": arg, "value": _value_word(t)})

    def _infer(self) -> None:
        g, recs, status = self.g, self.recs, self.status
        bad_input_at = {d["node"] for d in self.inputs_bad}
        for rid in self.order:
            if rid in status:
                continue
            r = recs[rid]
            if r.kind in ("param", "leaf"):
                continue
            kids = [status.get(c) for c in g.successors(rid)]
            if (True in kids or rid in bad_input_at) and r.name not in _MASKING:
                status[rid] = True
            elif all(k is False for k in kids) and rid not in bad_input_at and r.name not in _RISKY \
                    and r.kind == "op":
                status[rid] = False

    def origins(self) -> list[dict[str, Any]]:
        g, recs, status = self.g, self.recs, self.status
        found: dict[int, dict[str, Any]] = {}
        for d in self.inputs_bad:
            found.setdefault(d["node"], {"node": d["node"], "what": "input", "arg": d["arg"], "value": d["value"],
                                         "certain": True})
        for rid, s in status.items():
            if not s or rid in found:
                continue
            r = recs[rid]
            if r.kind in ("param", "leaf"):
                if rid in self.certain:
                    found[rid] = {"node": rid, "what": r.kind, "arg": None, "value": self.value.get(rid, "NaN"),
                                  "certain": True}
                continue
            kids = [status.get(c) for c in g.successors(rid)]
            if True in kids or any(d["node"] == rid for d in self.inputs_bad):
                continue
            if all(k is False for k in kids):
                found[rid] = {"node": rid, "what": "op", "arg": None, "value": self._word(rid), "certain": True}
                continue
            # unknown inputs: a risky op below, reached through unknown nodes only, is the probable origin
            probable = self._probable_below(rid)
            # a node that cannot make NaN/Inf itself, above a single risky op: that op made it
            certain = len(probable) == 1 and r.name not in _RISKY and r.kind == "op"
            for p in probable or [rid]:
                found.setdefault(p, {"node": p, "what": "op", "arg": None, "value": self._word(rid),
                                     "certain": certain})
        ordered = sorted(found.values(), key=lambda o: (recs[o["node"]].kind not in ("param", "leaf")
                                                        and o["what"] != "input", recs[o["node"]].seq))
        return ordered

    def _word(self, rid: int) -> str:
        if rid in self.value:
            return self.value[rid]
        for c in nx.dfs_preorder_nodes(self.g.reverse(copy=False), rid):
            if c in self.value:
                return self.value[c]
        return "NaN/Inf"

    def _probable_below(self, rid: int) -> list[int]:
        g, recs, status = self.g, self.recs, self.status
        unknown = [c for c in g.successors(rid) if c not in status]
        seen: set[int] = set()
        out: list[int] = []
        while unknown:
            c = unknown.pop()
            if c in seen:
                continue
            seen.add(c)
            if recs[c].name in _RISKY:
                out.append(c)
            unknown.extend(k for k in g.successors(c) if k not in status)
        return sorted(out, key=lambda i: recs[i].seq)
