"""A module opened into its calls: one folded node per call (`cell · call 17 of 300`), the first
`CALLS_SHOWN` of them, and one node for the calls not drawn yet, which draws the next `CALLS_SHOWN` when
clicked; a call opens into its ops (which calls made which nodes: `app.view.calls`).

The page keeps what is folded as one list of strings (`app.ui.ids.COLLAPSED`, the layout's `"collapsed"`): the
module prefixes folded, and for a module opened into its calls the tokens `cell#calls=50` (how many calls
are drawn) and `cell#call=17` (call 17 opened into its ops). `split_folds` reads them back; a module name
never holds `#` (a module's qualified name is attribute names joined by dots). A call opened into its ops
draws them in a box of its own, `cell#17` (`g:cell#17`, labelled `cell · call 17 of 300`), inside the
module's: a click on it folds that call back alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gradscape.app.view.calls import call_members, calls_of
from gradscape.app.view.step_fields import Wire, inside, node_module

__all__ = ["CALLS_SHOWN", "MIN_CALL_NODES", "CallView", "fold_tokens", "opens_into_calls", "split_folds"]

CALLS_SHOWN = 50  # calls drawn at once; the "more" node draws as many again
MIN_CALL_NODES = 40  # a module called more than once opens into its calls from this many nodes


@dataclass
class CallView:
    """A module opened into its calls: the first `shown` calls drawn (folded unless in `opened`)."""

    shown: int = CALLS_SHOWN
    opened: set[int] = field(default_factory=set)


def split_folds(collapsed: Iterable[str]) -> tuple[set[str], dict[str, CallView]]:
    """The page's fold list → (module prefixes folded, modules opened into their calls)."""
    folds: set[str] = set()
    views: dict[str, CallView] = {}
    for item in collapsed:
        module, mark, what = item.partition("#")
        if not mark:
            folds.add(item)
            continue
        key, _, value = what.partition("=")
        if key not in ("calls", "call") or not value.isdigit():  # a run of ops opened: `op_runs.split_runs`
            continue
        view = views.setdefault(module, CallView(0))
        if key == "calls":
            view.shown = max(view.shown, int(value))
        else:
            view.opened.add(int(value))
    for view in views.values():
        view.shown = view.shown or CALLS_SHOWN
    return folds, views


def fold_tokens(folds: Iterable[str], views: dict[str, CallView]) -> list[str]:
    """`split_folds` the other way: the page's fold list, sorted."""
    out = set(folds)
    for module, view in views.items():
        out.add(f"{module}#calls={view.shown}")
        out.update(f"{module}#call={k}" for k in view.opened)
    return sorted(out)


def opens_into_calls(wire: Wire, module: str, size: int) -> bool:
    """A module called more than once that holds at least `MIN_CALL_NODES` nodes (`size`) opens into its
    calls; a smaller one (a pooling layer used twice) opens into its ops."""
    return calls_of(wire, module) > 1 and size >= MIN_CALL_NODES


def valid_views(wire: Wire, folds: set[str], views: dict[str, CallView]) -> dict[str, CallView]:
    """The views that can be drawn: of a module called more than once, not inside a fold or another view."""
    kept = {m: v for m, v in views.items() if calls_of(wire, m) > 1
            and not any(inside(m, f) for f in folds)}
    return {m: v for m, v in kept.items() if not any(o != m and inside(m, o) for o in kept)}


def open_into_calls(folds: Iterable[str], views: dict[str, CallView], module: str) -> list[str]:
    """`module` unfolded into its first calls (folds inside it forgotten: its calls hide them)."""
    kept = {f for f in folds if not inside(f, module)}
    return fold_tokens(kept, {**{m: v for m, v in views.items() if not inside(m, module)}, module: CallView()})


def open_call(folds: Iterable[str], views: dict[str, CallView], module: str, call: int) -> list[str]:
    """Call `call` of `module` (opened into its calls) drawn op by op."""
    view = views.get(module) or CallView()
    return fold_tokens(folds, {**views, module: CallView(view.shown, view.opened | {call})})


def show_more(wire: Wire, folds: Iterable[str], views: dict[str, CallView], module: str) -> list[str]:
    """The next `CALLS_SHOWN` calls of `module` drawn."""
    view = views.get(module) or CallView()
    shown = min(view.shown + CALLS_SHOWN, calls_of(wire, module))
    return fold_tokens(folds, {**views, module: CallView(shown, set(view.opened))})


def fold_calls(folds: Iterable[str], views: dict[str, CallView], module: str) -> list[str] | None:
    """The calls of `module` opened into their ops folded back, its calls still drawn (a first click on its
    box); None when none is open (the click folds the module whole: `fold_whole`)."""
    view = views.get(module)
    if view is None or not view.opened:
        return None
    return fold_tokens(folds, {**views, module: CallView(view.shown)})


def fold_call(folds: Iterable[str], views: dict[str, CallView], box: str) -> list[str] | None:
    """The call whose box is `box` (`cell#17`: a call opened into its ops is drawn in a box of its own)
    folded back alone; None for a module's box."""
    module, mark, call = box.partition("#")
    view = views.get(module)
    if not mark or not call.isdigit() or view is None:
        return None
    return fold_tokens(folds, {**views, module: CallView(view.shown, view.opened - {int(call)})})


def fold_whole(folds: Iterable[str], views: dict[str, CallView], module: str) -> list[str]:
    """`module` folded again (its box clicked): its views and those inside it forgotten."""
    kept = {f for f in folds if not inside(f, module)} | {module}
    return fold_tokens(kept, {m: v for m, v in views.items() if not inside(m, module)})


def reveal_in_calls(wire: Wire, views: dict[str, CallView], node_id: int) -> dict[str, CallView]:
    """The call that made node `node_id` opened, when a module opened into its calls holds it (a search
    hit, a deep link)."""
    module = node_module(wire["nodes"][node_id])
    out = dict(views)
    for m, view in views.items():
        if inside(module, m):
            for k, members in enumerate(call_members(wire, m).calls, 1):
                if node_id in members:
                    out[m] = CallView(view.shown, view.opened | {k})
                    break
    return out
