"""Recording one traced step: graph walk, node hooks, and assembly of the `StepTrace`.

NOTE [Hook lifetime]
    Node hooks are installed on the graph of each backward when it starts (see NOTE [Source lines]
    in `tracer._attrib` for how the start is seen) and removed when the step ends, also when it
    raises. The recorder holds strong references to the nodes for the step only (node wrappers are
    not weak-referenceable, and `id()` is recycled once a graph is freed), and drops them at the end
    so the graph can be freed. Nothing is written on the user's tensors, modules or nodes.

NOTE [One hook per node]
    A node post-hook `fn(grad_inputs, grad_outputs)` sees both ends of the node: what arrived (the
    engine keeps the inputs for it, after every tensor pre-hook ran) and what the node sent on. So
    each node gets that one hook, and no pre-hook: every hook is a registration, a removal and a
    call out of the engine per node per step. The exception is AccumulateGrad, which gets a pre-hook
    only: it sends nothing on, and after it ran `.grad` may already be rewritten in place (DDP).
    A node's `time_us` is therefore the time on its engine thread from the return of our previous
    hook there (or the start of the backward) to its post-hook: the node's own work plus the
    engine's scheduling around it, never our summaries.

NOTE [Dedupe]
    The tensor a node sends along an edge is the very tensor its child receives when that child
    output has a single producer. The post-hook leaves its summary under (child, input_nr); the
    child's hook takes it if the tensor (pointer, shape, strides, dtype) is the same. The entry
    lives only while the tensor sits in the engine's input buffer, so memory reuse cannot fake a
    match. View-like nodes (`VIEW_NODES`) send on the same elements in another shape: their
    `grad_inputs[0]` reuses the statistics and computes only the thumbnail.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from tracer._attrib import ForwardRecorder, ModuleCallRecord
from tracer._labels import ACCUMULATE, VIEW_NODES, SlotInfo, label_slots, schema_of, slot_args
from tracer._model import BackwardPass, ModuleCall, ModuleTrace, NodeRun, NodeTrace, StepTrace, TensorTrace
from tracer._problems import StepProblems, root_values
from tracer._summary import Summariser, dtype_name, grad_off

log = logging.getLogger(__name__)

_ACC_SEQ = (1 << 64) - 1
_now = time.perf_counter_ns
_thread_id = threading.get_ident
_grad_enabled = torch.is_grad_enabled
_set_grad = torch._C._set_grad_enabled


def _kind_of(node: Any, name: str) -> str:
    """The kind of a node other than AccumulateGrad (the walk names those "param" or "leaf")."""
    if name == "CompiledFunctionBackward":
        return "compiled"
    if name == "CheckpointFunctionBackward":
        return "checkpoint"
    if name == "BackwardHookFunctionBackward":
        return "hook"
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return "custom"
    return "op"


# node class → (name(), kind) for classes whose nodes all share one name (checked: the name is the
# class's own), so a node's name costs a dict lookup rather than a new string from `name()`
_classes: dict[type, tuple[str, str]] = {}


def _shape(meta: Any) -> tuple[int, ...] | None:
    try:
        return tuple(map(int, meta.shape))  # int(): a symbolic size with a value becomes that value
    except Exception:  # nested tensors and unbacked symbolic shapes have no plain shape
        return None


def _outputs_of(rec: _Rec) -> tuple[list[Any], list[str | None]]:
    """Shapes and dtype names of a node's forward outputs. The engine gave every gradient that
    arrived at a node its output's shape and dtype (it checks and casts them against the node's
    `_input_metadata`), so a node that ran with all its gradients answers from their summaries;
    the others read the metadata."""
    if rec.runs:
        gos = rec.runs[0].grad_outputs
        if None not in gos:
            return [g.shape for g in gos], [g.dtype for g in gos]  # type: ignore[union-attr]
    meta = rec.node._input_metadata
    return [_shape(m) for m in meta], [dtype_name(m.dtype) for m in meta]


def _same_tensor(t: torch.Tensor) -> tuple[Any, ...]:
    """What identifies a gradient between the hook of the node that sent it and the hook of the node
    that receives it (NOTE [Dedupe]): where its elements are and how they are laid out. (The id of
    its Python object would be cheaper, but whether torch keeps that object alive while the tensor
    waits in the engine's input buffer is an implementation detail.)"""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


class _Rec:
    """One node of the walked graph, while the step runs."""

    __slots__ = ("id", "node", "name", "kind", "seq", "param", "nexts", "children", "send", "sums", "runs")

    def __init__(self, id: int, node: Any, name: str, kind: str, seq: int, param: str | None,
                 nexts: tuple[tuple[Any, int], ...]) -> None:
        self.id, self.node, self.name, self.kind, self.seq, self.param = id, node, name, kind, seq, param
        self.nexts = nexts  # node.next_functions, read once (each read builds new tuples)
        self.children: list[tuple[int, int] | None] = []  # (child id, input_nr) per slot, set by the walk
        # per slot: the child input this node alone sends to, where the hook leaves its summary for
        # the child (NOTE [Dedupe]); None where another node sends there too
        self.send: list[tuple[int, int] | None] = []
        self.sums: dict[int, tuple[int, int]] | None = None  # slot → module sum it adds to (_plan_module_sums)
        self.runs: list[NodeRun] = []  # the step's NodeRuns themselves, filled in by the hooks


class _Static:
    """What one node's trace takes from the graph's structure alone, shared by the steps that build
    the same graph; also the node's last shape lists, so an unchanged one is shared too."""

    __slots__ = ("args", "labels", "schema", "input_shapes", "output_shapes", "output_dtypes")

    def __init__(self, args: list[str], labels: list[str], schema: str | None) -> None:
        self.args, self.labels, self.schema = args, labels, schema
        self.input_shapes: list[Any] | None = None
        self.output_shapes: list[Any] | None = None
        self.output_dtypes: list[Any] | None = None


class StructureCache:
    """Per-`Tracer` memo of what a step's traces take from the graph's structure alone (slot
    arguments, labels, schemas), keyed by every node's type, name, kind, module, parameter and
    edges in walk order. A training loop builds the same graph every step, so this is computed
    once; the lists it holds are shared by the steps' `NodeTrace`s (read them, do not mutate them).
    Sharing also matters for speed beyond the labelling itself: every list a kept step owns is one
    more object for Python's cyclic garbage collector to re-scan.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: dict[Any, list[_Static]] = {}

    def get(self, key: Any) -> list[_Static] | None:
        return self._entries.get(key)

    def put(self, key: Any, value: list[_Static]) -> list[_Static]:
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value
        return value


def _after_step(*args: Any) -> Any:
    raise RuntimeError("gradscape: this step's recorder has finished")


class StepRecorder:
    """Everything about one traced step that needs live torch objects; `finish()` returns the
    plain `StepTrace` and lets go of them."""

    def __init__(self, run: str, step: int, model: Any, summariser: Summariser,
                 statics: StructureCache | None = None) -> None:
        self.run, self.step = run, step
        self.summ = summariser
        self.statics = statics if statics is not None else StructureCache()
        self.module_names: dict[Any, str] = {}
        self.module_types: dict[str, str] = {}
        self.module_params: dict[str, list[str]] = {}
        self.param_names: dict[Any, str] = {}
        if model is not None:
            self._index_model(model)
        self.forward = ForwardRecorder(self.module_names, self._on_backward)
        self.recs: list[_Rec] = []
        self.ids: dict[Any, int] = {}
        self.passes: list[BackwardPass] = []
        self.execution: list[tuple[int, int]] = []
        self._handles: list[Any] = []
        self._pending: dict[tuple[int, int], tuple[tuple[Any, ...], TensorTrace]] = {}
        self._summarise = summariser.summarise_no_grad  # hooks turn grad mode off once for all their tensors
        self._pass_index = 0
        self._param_sum: dict[str, torch.Tensor] = {}
        self._param_trace: dict[str, TensorTrace] = {}
        self._param_count: dict[str, int] = {}
        self._keep_param_copies = False
        self._calls: list[ModuleCallRecord] = []
        self._module_acc: dict[tuple[int, int], torch.Tensor] = {}
        self._hidden: dict[Any, str] = {}
        # (child id, input_nr) → the (node id, slot) pairs that send to it, built by the walk
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._last_end: dict[int, int] = {}  # engine thread → when our last hook on it returned (ns)
        self._pass_t0 = 0
        self.problems = StepProblems(self.statics)  # the problem finder (tracer/_problems.py)
        self.forward.on_detach = self.problems.note_detach  # the problem finder: where graphs are cut

    def _index_model(self, model: Any) -> None:
        """Qualified names of modules and parameters, in one pre-order pass over `_modules` (what
        `named_modules(remove_duplicate=False)` walks, without its generators): a shared module or
        parameter keeps its first name, as `named_modules()` / `named_parameters()` give it."""
        names, types, params, pnames = self.module_names, self.module_types, self.module_params, self.param_names
        stack: list[tuple[str, Any]] = [("", model)]
        while stack:
            name, mod = stack.pop()
            first = mod not in names
            prefix = name + "." if name else ""
            plist: list[str] = []
            if first:
                qual = name or "<root>"
                names[mod] = qual
                types[qual] = type(mod).__name__
                params[qual] = plist
            for pname, p in mod._parameters.items():
                if p is None:
                    continue
                full = prefix + pname
                pnames.setdefault(p, full)
                if first:
                    plist.append(full)
            children = [(prefix + cname, child) for cname, child in mod._modules.items() if child is not None]
            stack.extend(reversed(children))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.forward.start()

    def stop_hooks(self) -> None:
        """Remove every hook and mode of ours. Idempotent."""
        self.forward.stop()
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    # ------------------------------------------------------------------ backward entry
    def _on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        roots, retain, create = self._roots_of(api, args, kwargs)
        try:
            root_ids = [self._walk_from(node) for node, _ in roots]
            index = self._pass_index
            self._pass_index += 1
            self._keep_param_copies = self._keep_param_copies or bool(retain) or index > 0
            bp = BackwardPass(index=index, api=api, roots=root_ids, root_grads=[],
                              retain_graph=bool(retain), create_graph=bool(create), start=len(self.execution))
            self.passes.append(bp)
            self._plan_module_sums()
            self._watch_hidden_params()
            self.problems.at_backward(self.recs, root_ids, root_values(api, args, kwargs), index)  # problem finder
        except Exception as exc:  # never let the tracer break the user's backward
            log.warning("gradscape: could not instrument this backward (%s); it runs untraced", exc)
            return func(*args, **kwargs)
        try:
            self._pass_t0 = _now()
            return func(*args, **kwargs)
        finally:
            bp.end = len(self.execution)
            for (_node, nr), rid in zip(roots, root_ids):
                runs = [r for r in self.recs[rid].runs if r.pass_index == index]
                bp.root_grads.append(runs[0].grad_outputs[nr] if runs and nr < len(runs[0].grad_outputs)
                                     else None)

    @staticmethod
    def _roots_of(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[tuple[Any, int]],
                                                                                    Any, Any]:
        if api == "Tensor.backward":
            tensors: Any = [args[0]]
            retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
            create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
        else:
            first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
            tensors = [first] if isinstance(first, (torch.Tensor, torch.autograd.graph.GradientEdge)) \
                else list(first or ())
            if api == "autograd.grad":
                retain = kwargs.get("retain_graph", args[3] if len(args) > 3 else None)
                create = kwargs.get("create_graph", args[4] if len(args) > 4 else False)
            else:
                retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
                create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
        if retain is None:
            retain = create
        roots: list[tuple[Any, int]] = []
        for t in tensors:
            if isinstance(t, torch.autograd.graph.GradientEdge):
                roots.append((t.node, t.output_nr))
            elif isinstance(t, torch.Tensor) and t.requires_grad:
                e = torch.autograd.graph.get_gradient_edge(t)
                roots.append((e.node, e.output_nr))
        return roots, retain, create

    # ------------------------------------------------------------------ graph walk
    def _walk_from(self, root: Any) -> int:
        """Iterative DFS from `root`; new nodes get ids in visit order and their hook (see NOTE [One
        hook per node]). Returns root's id. Written out in one loop: it runs for every node."""
        ids, recs, handles, param_names = self.ids, self.recs, self._handles, self.param_names
        first_new = len(recs)
        stack = [root]
        while stack:
            n = stack.pop()
            if n is None or n in ids:
                continue
            cls = type(n)
            known = _classes.get(cls)
            if known is None:
                name = n.name()
                kind = "acc" if name == ACCUMULATE else _kind_of(n, name)
                if name == cls.__name__ or name.endswith("::" + cls.__name__):
                    if len(_classes) > 4096:  # classes made on the fly (custom Functions defined per call)
                        _classes.clear()
                    _classes[cls] = (name, kind)
            else:
                name, kind = known
            nexts = n.next_functions  # each read builds new tuples: read once
            rid = len(recs)
            if kind == "acc":
                param = param_names.get(n.variable)
                rec = _Rec(rid, n, name, "param" if param else "leaf", n._sequence_nr(), param, nexts)
                handles.append(n.register_prehook(self._make_acc(rec)))
            else:
                rec = _Rec(rid, n, name, kind, n._sequence_nr(), None, nexts)
                handles.append(n.register_hook(self._make_post(rec)))
            ids[n] = rid
            recs.append(rec)
            for child, _ in reversed(nexts):
                if child is not None and child not in ids:
                    stack.append(child)
        # children ids are known only once every node of the walk has an id
        producers = self._index
        for rec in recs[first_new:]:
            kids: list[tuple[int, int] | None] = []
            send: list[tuple[int, int] | None] = []
            rec.send = send  # before the loop: a node may send twice to one input (x * x)
            for j, (child, nr) in enumerate(rec.nexts):
                if child is None:
                    kids.append(None)
                    send.append(None)
                    continue
                slot = (ids[child], nr)
                kids.append(slot)
                prods = producers.get(slot)
                if prods is None:
                    producers[slot] = [(rec.id, j)]
                    send.append(slot)
                else:  # a second sender: the engine sums what they send, so nobody's summary is the child's
                    first, fj = prods[0]
                    recs[first].send[fj] = None
                    prods.append((rec.id, j))
                    send.append(None)
            rec.children = kids
        return ids[root]

    def _watch_hidden_params(self) -> None:
        """A reentrant checkpoint (or a custom Function running its own backward) computes parameter
        gradients in a graph the walk cannot see. Holding the parameter's AccumulateGrad node makes
        that inner graph use it, so a pre-hook there still records the arriving gradient in
        `st.params` (the node itself is not part of the drawn graph)."""
        if not any(r.kind in ("checkpoint", "custom") for r in self.recs):
            return
        for p, name in self.param_names.items():
            if not p.requires_grad:
                continue
            node = torch.autograd.graph.get_gradient_edge(p).node
            if node in self.ids or node in self._hidden:
                continue
            self._hidden[node] = name
            self._handles.append(node.register_prehook(self._make_hidden_pre(name)))

    def _make_hidden_pre(self, name: str) -> Any:
        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            g = grad_outputs[0] if grad_outputs else None
            if g is not None:
                self._note_param(name, g, self.summ.summarise(g))
            return None

        return pre

    # The hooks run once per node per step, inside backward, where every Python operation costs 2-3×
    # its warm time (the kernels around a hook evict the interpreter's caches). So they are written
    # for speed, each change measured: one grad-mode check per hook rather than per tensor, the
    # execution order taken from the position in `execution` at assembly (a list append is atomic;
    # no lock), where a summary goes for dedupe decided by the walk (`_Rec.send`), and the post-hook
    # (one per node) written out in one function, `_same_tensor` inlined.
    def _new_run(self, rec: _Rec) -> NodeRun:
        run = NodeRun(self._pass_index - 1, -1, [], None)  # order: set from `execution` in finish()
        runs = rec.runs
        runs.append(run)
        self.execution.append((rec.id, len(runs) - 1))
        return run

    def _arriving(self, rec: _Rec, grad_outputs: tuple[torch.Tensor | None, ...]) -> list[TensorTrace | None]:
        """Summaries of the gradients arriving at a node; the one its single producer already
        summarised is taken from `_pending` (NOTE [Dedupe])."""
        pending = self._pending
        out: list[TensorTrace | None] = []
        for i, g in enumerate(grad_outputs):
            if g is None:
                out.append(None)
                continue
            hit = pending.pop((rec.id, i), None)
            if hit is not None and hit[0] == _same_tensor(g):
                out.append(hit[1])
            else:
                out.append(self._summarise(g, None))
        return out

    def _make_acc(self, rec: _Rec) -> Any:
        """AccumulateGrad: a pre-hook, which sees the gradient before `.grad` is written (a post-hook
        could see it already rewritten in place, e.g. by DDP's reducer)."""
        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            grad_on = _grad_enabled()  # on in a create_graph backward: summaries must not record
            if grad_on:
                _set_grad(False)
            try:
                run = self._new_run(rec)
                run.grad_outputs = gos = self._arriving(rec, grad_outputs)
                if rec.param is not None and grad_outputs and grad_outputs[0] is not None:
                    self._note_param(rec.param, grad_outputs[0], gos[0])
            finally:
                if grad_on:
                    _set_grad(True)
            self._last_end[_thread_id()] = _now()
            return None

        return pre

    def _make_post(self, rec: _Rec) -> Any:
        is_view = rec.name in VIEW_NODES
        rid, runs = rec.id, rec.runs
        # bound once: these containers live as long as the step (`_release` replaces them after it)
        execution, pending, summarise, last_end = self.execution, self._pending, self._summarise, self._last_end

        def post(grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            t1 = _now()
            tid = _thread_id()
            grad_on = _grad_enabled()
            if grad_on:
                _set_grad(False)
            try:
                run = NodeRun(self._pass_index - 1, -1, [], None,
                              (t1 - max(last_end.get(tid, 0), self._pass_t0)) / 1e3)
                execution.append((rid, len(runs)))  # order: the position here, set in finish()
                runs.append(run)
                gos = run.grad_outputs
                for i, g in enumerate(grad_outputs):  # what arrived (NOTE [Dedupe])
                    if g is None:
                        gos.append(None)
                        continue
                    hit = pending.pop((rid, i), None)
                    gos.append(hit[1] if hit is not None and hit[0] == (g.data_ptr(), g.shape, g.stride(), g.dtype)
                               else summarise(g, None))
                view_of = gos[0] if is_view and gos else None
                send, sums = rec.send, rec.sums  # set by the walk, after this hook was made
                out: list[TensorTrace | None] = []
                for j, g in enumerate(grad_inputs):  # what it sends on
                    if g is None:
                        out.append(None)
                        continue
                    tr = summarise(g, view_of if view_of is not None and j == 0 and g.numel() == view_of.numel
                                   else None)
                    out.append(tr)
                    child = send[j] if j < len(send) else None
                    if child is not None:
                        pending[child] = ((g.data_ptr(), g.shape, g.stride(), g.dtype), tr)
                    if sums is not None and j in sums:
                        self._add_to_module_sum(sums[j], g)
                run.grad_inputs = out
            finally:
                if grad_on:
                    _set_grad(True)
            last_end[tid] = _now()
            return None

        return post

    def _note_param(self, name: str, g: torch.Tensor, tr: TensorTrace | None) -> None:
        count = self._param_count.get(name, 0) + 1
        self._param_count[name] = count
        with grad_off():
            if count == 1:
                if tr is not None:
                    self._param_trace[name] = tr
                if self._keep_param_copies:
                    self._param_sum[name] = g.detach().clone()
            elif name in self._param_sum:
                self._param_sum[name] = self._param_sum[name] + g.detach()
            else:
                log.info("gradscape: %s got a second gradient in this step but its first was not kept; "
                         "st.params shows the latest arrival", name)
                if tr is not None:
                    self._param_trace[name] = tr

    # ------------------------------------------------------------------ assembly
    def finish(self, error: BaseException | None = None) -> StepTrace:
        """Stop hooks, fetch summaries, and build the `StepTrace`. Drops every torch reference."""
        self.stop_hooks()
        recs = self.recs
        for pos, (rid, k) in enumerate(self.execution):
            recs[rid].runs[k].order = pos
        for name, total in self._param_sum.items():
            if self._param_count.get(name, 0) > 1:
                self._param_trace[name] = self.summ.summarise(total)
        module_grad_sums = self._module_sums()
        self.summ.finalize()
        st = StepTrace(run=self.run, step=self.step)
        st.nodes = self._node_traces()
        st.edges = [(r.id, c[0], j) for r in self.recs for j, c in enumerate(r.children) if c is not None]
        st.passes = self.passes
        st.execution = list(self.execution)
        st.params = dict(self._param_trace)
        st.modules = self._module_traces(st, module_grad_sums)
        st.meta = {"torch": torch.__version__, "nodes": len(st.nodes), "passes": len(self.passes)}
        if error is not None:
            st.error = f"{type(error).__name__}: {error}"
        st.problems = self.problems.finish(st, self)  # the problem finder (tracer/_problems.py)
        self._release()
        return st

    def _release(self) -> None:
        self.recs = []
        self.ids = {}
        self._pending = {}
        self._param_sum = {}
        self._module_acc = {}
        self._hidden = {}
        self._calls = []
        self._index = {}
        self.forward.calls = []
        self.forward.on_backward = _after_step  # the recorder ↔ forward recorder cycle, broken: freed by refcount
        self.module_names = {}
        self.param_names = {}

    def _node_traces(self) -> list[NodeTrace]:
        recs = self.recs
        mods = self.forward.modules_of([r.seq for r in recs])
        outs = [_outputs_of(r) for r in recs]  # a node's input shapes are its children's output shapes
        key = tuple((type(r.node), r.name, r.kind, mod, r.param, tuple(r.children),
                     tuple(r.node.variable.shape) if r.kind == "leaf" else None)  # labels name a leaf's shape
                    for r, mod in zip(recs, mods))
        statics = self.statics.get(key)
        if statics is None:
            statics = self.statics.put(key, self._statics(mods))
        source_of = self.forward.source_of
        out = []
        for r, st, mod, (o_shapes, o_dtypes) in zip(recs, statics, mods, outs):
            in_shapes: list[Any] = []
            for c in r.children:
                if c is None:
                    in_shapes.append(None)
                else:
                    shapes = outs[c[0]][0]
                    in_shapes.append(shapes[c[1]] if c[1] < len(shapes) else None)
            # an unchanged list is the one the previous step's trace holds (StructureCache)
            if in_shapes != st.input_shapes:
                st.input_shapes = in_shapes
            if o_shapes != st.output_shapes:
                st.output_shapes = o_shapes
            if o_dtypes != st.output_dtypes:
                st.output_dtypes = o_dtypes
            seq = r.seq
            runs = r.runs
            order: int | None = None
            gi: list[TensorTrace | None] | None = None
            go: list[TensorTrace | None] | None = None
            time_us: float | None = None
            if runs:
                first = runs[0]
                order, gi, go, time_us = first.order, first.grad_inputs, first.grad_outputs, first.time_us
            out.append(NodeTrace(r.id, r.name, r.kind, mod, r.param, None if seq == _ACC_SEQ else source_of(seq),
                                 st.schema, order, st.labels, st.args, st.input_shapes, st.output_shapes,
                                 st.output_dtypes, gi, go, time_us, runs))
        return out

    def _statics(self, mods: list[str | None]) -> list[_Static]:
        """Slot arguments, labels and schema of every node: they depend only on the graph's structure
        (see `StructureCache`)."""
        infos = []
        for r, mod in zip(self.recs, mods):
            leaf_shape = tuple(r.node.variable.shape) if r.name == ACCUMULATE else None
            infos.append(SlotInfo(r.name, r.kind, mod, r.param, leaf_shape,
                                  [None if c is None else c[0] for c in r.children]))
        statics = []
        for r, info in zip(self.recs, infos):
            child_params = [infos[c[0]].param if c is not None else None for c in r.children]
            fwd_cls = getattr(type(r.node), "_forward_cls", None)
            args = slot_args(r.name, r.kind, len(r.children), fwd_cls, child_params)
            labels = label_slots(infos, r.id, args)
            if r.kind == "compiled" and info.module:
                labels = [lab.replace("graph input", f"compiled {info.module}: input") for lab in labels]
            statics.append(_Static(args, labels, schema_of(r.name) if r.kind == "op" else None))
        return statics

    # ---- module-level gradients, derived from node hooks (see AUTOGRAD.md §9.4)
    def _producers(self, call: ModuleCallRecord, edge: tuple[Any, int],
                   index: dict[tuple[int, int], list[tuple[int, int]]]) -> list[tuple[int, int]]:
        """The (node, slot) pairs inside this module call that send a gradient to `edge`."""
        target = self.ids.get(edge[0])
        if target is None:
            return []
        return [(rid, j) for rid, j in index.get((target, edge[1]), ())
                if call.lo <= self.recs[rid].seq < call.hi]

    def _plan_module_sums(self) -> None:
        """A module input used by several ops inside the module: its grad_input (through this module)
        is the sum of those slots. Mark them, so the post-hooks add them up on the device."""
        index = self._index
        self._calls = sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(self._calls):
            for k, edge in enumerate(call.inputs):
                if edge is None:
                    continue
                prods = self._producers(call, edge, index)
                if len(prods) > 1:
                    for rid, j in prods:
                        rec = self.recs[rid]
                        if rec.sums is None:
                            rec.sums = {}
                        rec.sums[j] = (ci, k)

    def _add_to_module_sum(self, key: tuple[int, int], g: torch.Tensor) -> None:
        with grad_off():
            prev = self._module_acc.get(key)
            self._module_acc[key] = g.detach().clone() if prev is None else prev + g.detach()

    def _module_sums(self) -> dict[tuple[int, int], TensorTrace]:
        return {key: self.summ.summarise(t) for key, t in self._module_acc.items()}

    def _module_traces(self, st: StepTrace, sums: dict[tuple[int, int], TensorTrace]) -> dict[str, ModuleTrace]:
        mods: dict[str, ModuleTrace] = {}
        params = self.module_params
        for qual, typ in self.module_types.items():
            mods[qual] = ModuleTrace(qual, typ, [], params.get(qual, []))
        # forward post-hooks run innermost first; present calls in forward-start order
        index = self._index
        calls = self._calls or sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(calls):
            gi: list[TensorTrace | None] = []
            in_nodes: list[int | None] = []
            for k, edge in enumerate(call.inputs):
                if edge is None:
                    gi.append(None)
                    in_nodes.append(None)
                    continue
                in_nodes.append(self.ids.get(edge[0]))
                prods = self._producers(call, edge, index)
                if len(prods) == 1:
                    pid, j = prods[0]
                    g = st.nodes[pid].grad_inputs
                    gi.append(g[j] if g is not None and j < len(g) else None)
                else:
                    gi.append(sums.get((ci, k)))
            go: list[TensorTrace | None] = []
            out_nodes: list[int | None] = []
            for edge in call.outputs:
                nid = None if edge is None else self.ids.get(edge[0])
                out_nodes.append(nid)
                gos = st.nodes[nid].grad_outputs if nid is not None else None
                go.append(gos[edge[1]] if gos is not None and edge is not None and edge[1] < len(gos) else None)
            mc = ModuleCall(gi, go, in_nodes, out_nodes, out_nodes[0] if out_nodes else None)
            if call.name in mods:
                mods[call.name].calls.append(mc)
        return mods

