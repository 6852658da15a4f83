"""What the step shown says of torch.compile (`app.view.compiled`): its notes over the graph's top left
corner (`#step-notes`: ran eagerly for tracing, replayed, not replayed and why, compared), the
compiled-against-eager table (`#compiled-compare`, in the right column) and the colouring by that
difference, offered in the colour select only for a step that has the comparison
(NOTE [Difference colouring] in app/view/compiled.py). Each is absent, not empty, on a step it does not
apply to."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, html, no_update

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.view.compiled import number
from gradscape.app.view.step_fields import fmt_num
from gradscape.tracer.store import StoreError
from gradscape.tracer.wire import WireStep

COLOUR_OPTIONS = [{"label": "‖grad‖ (log)", "value": "norm"}, {"label": "max |grad|", "value": "maxabs"},
                  {"label": "fraction of zeros", "value": "zeros"}]
DIFF_OPTION = {"label": view.DIFF_LABEL, "value": view.DIFF}
HIDDEN = {"display": "none"}


def notes(wire: WireStep | None) -> list[Any]:
    """The step's notes as small badges (`title`: the longer sentence)."""
    return [html.Span(n["text"], title=n["title"], className=f"gs-step-note gs-note-{n['kind']}")
            for n in (view.step_notes(wire) if wire is not None else [])]


def table(wire: WireStep | None) -> list[Any]:
    """The compiled-against-eager table, worst first; nothing for a step without the comparison. Each
    number's cell has the exact value as its title."""
    rows = view.compare_rows(wire) if wire is not None else []
    if not rows:
        return []
    cmp = wire["meta"]["compare_compiled"] if wire is not None else {}
    loss = cmp.get("loss") or {}
    head: list[Any] = ["compiled vs eager gradients (", html.Code("Tracer.compare_compiled"), ")"]
    if loss:
        head.append(f"; loss compiled {fmt_num(number(loss.get('compiled')))}, "
                    f"eager {fmt_num(number(loss.get('eager')))}")
    body = [html.Tr([html.Th(c) for c in view.COMPARE_COLUMNS])]
    for r in rows:
        exact = [None, r["max_abs"], r["max_rel"], None, r["compiled"], r["eager"]]
        cells = [html.Td(text, title=None if v is None else repr(v)) for text, v in zip(r["cells"], exact)]
        body.append(html.Tr(cells, className="gs-missing" if r["missing"] else None,
                            **{"data-param": r["param"]}))
    return [html.Div(head, className="gs-compiled-head"),
            html.Div(f"colour the graph by it: colour → {view.DIFF_LABEL}", className="gs-hint"),
            html.Table(body, className="gs-table gs-compiled-table")]


def colour_options(wire: WireStep | None) -> list[dict[str, str]]:
    return COLOUR_OPTIONS + ([DIFF_OPTION] if wire is not None and view.has_comparison(wire) else [])


def payload(data: PageData, run: str | None, step: int | None, rank: int = 0) -> dict[str, Any]:
    """The notes, the table (with its style: hidden when empty) and the colour options of a step."""
    wire = None
    if run and step is not None:
        try:
            wire = data.graph(run, step, rank)
        except StoreError:
            wire = None
    rows = table(wire)
    return {"notes": notes(wire), "table": rows, "style": None if rows else HIDDEN,
            "colours": colour_options(wire)}


def panel(st: dict[str, Any] | None) -> Any:
    """The table as first served (`st`: `payload` of the step the page opens on)."""
    st = st or {}
    return html.Div(id=ids.COMPILED_COMPARE, className="gs-compiled", children=st.get("table", []),
                    style=st.get("style", HIDDEN))


def register(app: dash.Dash, data: PageData) -> None:
    @app.callback(Output(ids.STEP_NOTES, "children"), Output(ids.COMPILED_COMPARE, "children"),
                  Output(ids.COMPILED_COMPARE, "style"), Output(ids.COLOR_BY, "options"),
                  Output(ids.COLOR_BY, "value"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"), Input(ids.RANK_SELECT, "value"),
                  State(ids.COLOR_BY, "value"), prevent_initial_call=True)  # first load: the layout holds them
    def show_compiled(run: str | None, step: int | None, rank: int | None, color_by: str | None) -> Any:
        p = payload(data, run, step, int(rank or 0))
        # the difference colouring leaves with the step that had it (the graph falls back to norm meanwhile)
        value = "norm" if color_by == view.DIFF and DIFF_OPTION not in p["colours"] else no_update
        return p["notes"], p["table"], p["style"], p["colours"], value
