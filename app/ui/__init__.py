"""The Dash page: layout (`page.py`) and callbacks (`callbacks.py`). Callbacks are small; the work is
done by `app.view` (which imports no Dash) and the trace store."""
