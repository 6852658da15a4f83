"""The Dash page: the layout (`page.py`) and its callbacks, one module per concern: runs, steps and the
graph (`callbacks.py`, which registers the others), node selection and folds (`selection.py`), the
inspector (`inspector.py`), the backward player (`player.py`), the problems panel (`problems.py`), ranks
and the compare view (`compare.py`), breakpoints (`debugger.py`), the big-step search
(`graph_controls.py`); what they read comes through `data.py`. Callbacks are small; the work is done by
`app.view` (which imports no Dash) and the trace store."""
