"""Ops in runs: a box that would draw over `RUNS_FROM` ops one by one draws them as folded runs of `RUN_OPS`,
in the order backward ran them (`scan · ops 101–200 of 10,000`), the first `RUNS_SHOWN` of them and one node
for the runs not drawn yet (a click draws the next ones); a click on a run draws its ops.

A module whose forward is a Python loop over plain ops (a scan written by hand, called once) holds 10,000
ops of its own and no submodule, so neither folding submodules nor opening it into its calls
(`call_folds`) helps: opened, it drew every op, and past `MAX_DRAWN` stayed folded with nothing to click.
The ops of a box are grouped by call: the module's own (call 0), or those of its call 17 opened into ops
(when the module is opened into its calls: drawn in the call's box, `scan#17`); each group of over
`RUNS_FROM` ops is cut into runs.

The page's fold list (`app.ui.ids.COLLAPSED`) holds the runs opened as tokens `scan#run=0.3` (run 3 of box
`scan`'s own ops) and `scan#17#run=17.3` (of its call 17, in that call's box), and how many runs are drawn
where more than `RUNS_SHOWN` are, `scan#runs=0.100`. `call_folds.split_folds` leaves them to `split_runs` here.

Sizes (`bench/ui.py --loop scan10000,scan100000 --loop-only`, page clock from the click): 50 runs of a
10k-op scan draw in 0.49 s (0.55 s at 100k ops), and a run of 100 ops opens in 0.91 s (0.95 s). Runs of
200 ops opened in 0.84–1.47 s, runs of 500 in 2.2–3.4 s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gradscape.app.view.ids import run_element
from gradscape.app.view.step_fields import Wire, inside

__all__ = ["RUNS_FROM", "RUNS_SHOWN", "RUN_OPS", "Run", "Runs", "cut_runs", "drawn_ops", "fold_runs",
           "is_run_token", "open_run", "run_label", "run_tokens", "split_runs"]

RUN_OPS = 100  # ops a run holds
RUNS_FROM = 1_000  # a group of more ops than this is drawn in runs
RUNS_SHOWN = 50  # runs drawn at once; the node for the rest draws as many again

Run = tuple[str, int, int]  # (box, call or 0, run counted from 1; 0 for the runs not drawn yet)
Group = tuple[str, int]  # (box, call or 0)
_RUN, _SHOWN = "#run=", "#runs="


@dataclass
class Runs:
    """The runs opened into their ops, and how many runs each group draws (`RUNS_SHOWN` if not named)."""

    opened: set[Run] = field(default_factory=set)
    shown: dict[Group, int] = field(default_factory=dict)

    def drawn(self, group: Group) -> int:
        return self.shown.get(group, RUNS_SHOWN)


def split_runs(collapsed: Iterable[str]) -> Runs:
    """The runs opened and drawn, from the page's fold list."""
    out = Runs()
    for item in collapsed:
        for mark in (_RUN, _SHOWN):
            box, found, which = item.partition(mark)
            call, dot, number = which.partition(".")
            if found and dot and call.isdigit() and number.isdigit():
                if mark == _RUN:
                    out.opened.add((box, int(call), int(number)))
                else:
                    out.shown[(box, int(call))] = int(number)
    return out


def run_tokens(runs: Runs) -> list[str]:
    """`split_runs` the other way, sorted."""
    return sorted([f"{box}{_RUN}{call}.{run}" for box, call, run in runs.opened]
                  + [f"{box}{_SHOWN}{call}.{n}" for (box, call), n in runs.shown.items()])


def is_run_token(item: str) -> bool:
    return _RUN in item or _SHOWN in item


def open_run(collapsed: Iterable[str], run: Run) -> list[str]:
    """The fold list with `run` drawn op by op, or (run 0) with the next `RUNS_SHOWN` runs drawn."""
    items = list(collapsed)
    runs = split_runs(items)
    box, call, k = run
    if k:
        runs.opened.add(run)
    else:
        runs.shown[(box, call)] = runs.drawn((box, call)) + RUNS_SHOWN
    return [i for i in items if not is_run_token(i)] + run_tokens(runs)


def fold_runs(collapsed: Iterable[str], module: str) -> list[str] | None:
    """The runs opened in `module`'s box and in the boxes inside it folded back (a first click on its box);
    None when none is open."""
    items = list(collapsed)
    runs = split_runs(items)
    kept = Runs({r for r in runs.opened if not inside(r[0], module)}, runs.shown)
    if kept.opened == runs.opened:
        return None
    return [i for i in items if not is_run_token(i)] + run_tokens(kept)


def drawn_ops(ops: int, opened: int = 0) -> int:
    """About how many elements a group of `ops` ops draws, `opened` of its runs opened."""
    if ops <= RUNS_FROM:
        return ops
    return min(-(-ops // RUN_OPS), RUNS_SHOWN + 1) + min(opened * RUN_OPS, ops)


def run_label(box: str, call: int, run: int, total: int, shown: int = RUNS_SHOWN) -> str:
    """`scan · ops 101–200 of 10,000` (`scan · call 17 · ops …` for a call's ops); run 0 the runs past the
    `shown` drawn."""
    first = (run - 1 if run else shown) * RUN_OPS + 1
    last = min(run * RUN_OPS, total) if run else total
    return f"{box}{f' · call {call}' if call else ''}\nops {first:,}–{last:,} of {total:,}"


def backward_rank(wire: Wire) -> dict[int, int]:
    """Node id → where backward first ran it (nodes that did not run: absent)."""
    rank: dict[int, int] = {}
    for k, (nid, _run) in enumerate(wire["execution"]):
        rank.setdefault(nid, k)
    return rank


def cut_runs(wire: Wire, groups: dict[Group, list[int]], runs: Runs, every: bool = False) -> tuple[
        dict[int, str], dict[str, str]]:
    """For the groups of ops drawn one by one (`(box, call)` → node ids) of over `RUNS_FROM` ops: node id →
    its folded run's element (none for a run opened; the runs past those drawn: the node for the rest), and
    each run element's label. `every`: every run drawn (where is a node?)."""
    big = {g: ids for g, ids in groups.items() if len(ids) > RUNS_FROM}
    if not big:
        return {}, {}
    rank = backward_rank(wire)
    late = len(wire["nodes"])  # a node that did not run goes after those that did, by id
    where: dict[int, str] = {}
    labels: dict[str, str] = {}
    for (box, call), ids in big.items():
        ordered = sorted(ids, key=lambda n: rank.get(n, late + n))
        shown = len(ordered) if every else runs.drawn((box, call))
        for start in range(0, len(ordered), RUN_OPS):
            run = start // RUN_OPS + 1
            if (box, call, run) in runs.opened:
                continue
            k = run if run <= shown else 0
            eid = run_element(box, call, k)
            labels[eid] = run_label(box, call, k, len(ordered), shown)
            where.update(dict.fromkeys(ordered[start:start + RUN_OPS], eid))
    return where, labels
