"""The read-only JSON API over the trace store (docs/api.md has examples).

    GET /api/runs                                   runs, with step counts and their ranks
    GET /api/runs/<run>/steps                       steps of a run (of one rank), and its ranks
    GET /api/runs/<run>/steps/<step>                the graph: nodes, edges, execution order, stats
    GET /api/runs/<run>/steps/<step>/nodes/<id>     one node with its tensors, thumbnails included

The three routes under a run take `?rank=R` (torch.distributed rank, default 0; a run outside
torch.distributed has rank 0 only): not an integer ≥ 0 → 400, a rank the run does not have → 404.
The answers' forms are in `forms`; errors are mapped to responses in `errors`.
"""

from __future__ import annotations

from flask import Flask, Response, jsonify, request

from gradscape.app.api.errors import NotFound, check_index, check_run, error
from gradscape.app.api.forms import graph_json, node_json, node_tensor_indices
from gradscape.app.step_flags import StepFlags
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import TraceFormatError, WireStep


def _read_graph(store: TraceStore, run: str, step: int, rank: int = 0, *, one_node: bool = False) -> WireStep:
    """The step (`one_node`: read for one node's sake, its other nodes and tensors left undecoded when the
    step has its index stored: `TraceStore.read_indexed`)."""
    try:
        return store.read_indexed(run, step, rank) if one_node else store.read_graph(run, step, rank)
    except StoreError:
        raise NotFound(f"no step {step} in run {run!r}" + (f" (rank {rank})" if rank else "")) from None


def register_runs(server: Flask, store: TraceStore, flags: StepFlags) -> None:
    """The read routes. A run has `flagged` (its steps traced by a trigger or with problems, rank 0); a step
    has its `trigger` and its count of `problems` (`StepFlags`)."""

    @server.get("/api/runs")
    def api_runs() -> Response:
        return jsonify({"runs": [{**r, "flagged": flags.flagged(r["run"])} for r in store.runs()]})

    def rank_arg(run: str) -> int:
        """`?rank=` (default 0): BadParameter when malformed, NotFound when the run lacks that rank."""
        text = request.args.get("rank")
        if text is None:
            return 0
        rank = check_index(text, "rank")
        ranks = store.ranks(run)
        if rank not in ranks and (ranks or rank != 0):
            raise NotFound(f"run {run!r} has no rank {rank} (its ranks: {ranks})")
        return rank

    @server.get("/api/runs/<run>/steps")
    def api_steps(run: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        steps = store.steps(run, rank)
        if not steps and run not in {r["run"] for r in store.runs()}:
            raise NotFound(f"no run {run!r}")
        steps_out = [{**s, **flags.step_json(run, rank, s["step"])} for s in steps]
        return jsonify({"run": run, "rank": rank, "ranks": store.ranks(run), "steps": steps_out})

    @server.get("/api/runs/<run>/steps/<step>")
    def api_step(run: str, step: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        return jsonify(graph_json(_read_graph(store, run, check_index(step, "step"), rank)))

    @server.get("/api/runs/<run>/steps/<step>/nodes/<node>")
    def api_node(run: str, step: str, node: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        s, nid = check_index(step, "step"), check_index(node, "node")
        wire = _read_graph(store, run, s, rank, one_node=True)
        if not 0 <= nid < len(wire["nodes"]):
            raise NotFound(f"no node {nid} in step {s} of run {run!r} (it has {len(wire['nodes'])})")
        arrays = store.read_arrays(run, s, node_tensor_indices(wire["nodes"][nid]), rank)
        try:
            return jsonify(node_json(wire, nid, arrays))
        except TraceFormatError as exc:
            return error(f"stored tensors of node {nid} of step {s} in run {run!r} are malformed: {exc}", 500)
