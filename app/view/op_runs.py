"""Ops in runs: a box that would draw over `RUNS_FROM` ops one by one draws them as folded runs of `RUN_OPS`,
in the order backward ran them (`scan · ops 501–1,000 of 10,000`), and a click on a run draws its ops.

A module whose forward is a Python loop over plain ops (a scan written by hand, called once) holds 10,000
ops of its own and no submodule, so neither folding submodules nor opening it into its calls
(`call_folds`) helps: opened, it drew every op, and past `MAX_DRAWN` stayed folded with nothing to click.
The ops of a box are grouped by call: the module's own (call 0), or those of its call 17 opened into ops
(when the module is opened into its calls); each group of over `RUNS_FROM` ops is cut into runs.

The page's fold list (`ids.COLLAPSED`) holds the runs opened as tokens `scan#run=0.3` (run 3 of box
`scan`'s own ops) and `scan#run=17.3` (of its call 17). `call_folds.split_folds` leaves them to
`split_runs` here.
"""

from __future__ import annotations

from collections.abc import Iterable

from gradscape.app.view.ids import run_element
from gradscape.app.view.step_fields import Wire, inside

__all__ = ["RUNS_FROM", "RUN_OPS", "Run", "cut_runs", "drawn_ops", "fold_runs", "is_run_token", "open_run",
           "run_label", "run_tokens", "split_runs"]

RUN_OPS = 500  # ops a run holds
RUNS_FROM = 1_000  # a group of more ops than this is drawn in runs

Run = tuple[str, int, int]  # (box, call or 0, run counted from 1)
_TOKEN = "#run="


def split_runs(collapsed: Iterable[str]) -> set[Run]:
    """The runs opened into their ops, from the page's fold list."""
    out: set[Run] = set()
    for item in collapsed:
        box, mark, which = item.partition(_TOKEN)
        call, dot, run = which.partition(".")
        if mark and dot and call.isdigit() and run.isdigit():
            out.add((box, int(call), int(run)))
    return out


def run_tokens(runs: Iterable[Run]) -> list[str]:
    """`split_runs` the other way, sorted."""
    return sorted(f"{box}{_TOKEN}{call}.{run}" for box, call, run in runs)


def is_run_token(item: str) -> bool:
    return _TOKEN in item


def open_run(collapsed: Iterable[str], run: Run) -> list[str]:
    """The fold list with `run` drawn op by op."""
    items = list(collapsed)
    return [i for i in items if not is_run_token(i)] + run_tokens(split_runs(items) | {run})


def fold_runs(collapsed: Iterable[str], module: str) -> list[str] | None:
    """The runs opened in `module`'s box and in the boxes inside it folded back (a first click on its box);
    None when none is open."""
    items = list(collapsed)
    runs = split_runs(items)
    kept = {r for r in runs if not inside(r[0], module)}
    if kept == runs:
        return None
    return [i for i in items if not is_run_token(i)] + run_tokens(kept)


def drawn_ops(ops: int, opened: int = 0) -> int:
    """Elements a group of `ops` ops draws, `opened` of its runs opened."""
    if ops <= RUNS_FROM:
        return ops
    runs = -(-ops // RUN_OPS)
    return runs - opened + min(opened * RUN_OPS, ops)


def run_label(box: str, call: int, run: int, total: int) -> str:
    """`scan · ops 501–1,000 of 10,000` (`scan · call 17 · ops …` for a call's ops)."""
    first = (run - 1) * RUN_OPS + 1
    last = min(run * RUN_OPS, total)
    return f"{box}{f' · call {call}' if call else ''}\nops {first:,}–{last:,} of {total:,}"


def backward_rank(wire: Wire) -> dict[int, int]:
    """Node id → where backward first ran it (nodes that did not run: absent)."""
    rank: dict[int, int] = {}
    for k, (nid, _run) in enumerate(wire["execution"]):
        rank.setdefault(nid, k)
    return rank


def cut_runs(wire: Wire, groups: dict[tuple[str, int], list[int]], opened: set[Run]) -> tuple[
        dict[int, str], dict[str, str]]:
    """For the groups of ops drawn one by one (`(box, call)` → node ids) of over `RUNS_FROM` ops: node id →
    its folded run's element (none for a run opened), and each run element's label."""
    big = {g: ids for g, ids in groups.items() if len(ids) > RUNS_FROM}
    if not big:
        return {}, {}
    rank = backward_rank(wire)
    late = len(wire["nodes"])  # a node that did not run goes after those that did, by id
    where: dict[int, str] = {}
    labels: dict[str, str] = {}
    for (box, call), ids in big.items():
        ordered = sorted(ids, key=lambda n: rank.get(n, late + n))
        for start in range(0, len(ordered), RUN_OPS):
            run = start // RUN_OPS + 1
            if (box, call, run) in opened:
                continue
            eid = run_element(box, call, run)
            labels[eid] = run_label(box, call, run, len(ordered))
            where.update(dict.fromkeys(ordered[start:start + RUN_OPS], eid))
    return where, labels
