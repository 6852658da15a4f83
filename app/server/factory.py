"""The gradscape server: one process serving the Dash page, the Socket.IO endpoint and the JSON API.

`create_app(store=...)` builds everything and returns a `GradscapeApp`: it unpacks as
`(dash_app, socketio)`, and `close()` stops its notifier thread and closes the trace file it opened.
There are no module globals, so tests build as many servers as they like. The tracer streams steps on
`/tracer` and breakpoints on `/debug` (`namespaces`); every step is validated and written to the SQLite
trace file in one transaction, and the browser gets light notifications on `/ui` (`notifier`) and reads
data from the store (`app.data`) or the JSON API (`app.api`). See `tracer.protocol` for the messages,
docs/api.md for the JSON API and `security` for who may connect. Dash's version check is never enabled.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import dash
from flask import Flask, Response
from flask_socketio import SocketIO
from plotly.io.json import to_json_plotly
from plotly.utils import PlotlyJSONEncoder

from gradscape.app.server.namespaces import DebugNamespace, TracerNamespace, UINamespace
from gradscape.app.serving.notifier import Notifier
from gradscape.app.serving.security import ServerConfig, secure
from gradscape.app.serving.state import ServerState
from gradscape.tracer import protocol
from gradscape.tracer.store import TraceStore


class GradscapeDash(dash.Dash):
    """`dash.Dash` with two savings on the page load (measured by bench/ui.py):

    - `/_dash-layout` is answered from a cache while `layout_key()` is unchanged (the page is the
      newest step of the store, so the key is the store's runs and their last update): a reload
      does not rebuild and re-serialise the step's elements and execution order; it is encoded in
      one pass by the standard library whatever plotly's default engine (`layout_json`);
    - dash_table's loader is left out of the page's scripts: the page has no DataTable;
    - the page's address starts `warm` (once at a time, in a thread of its own, after the address has
      its answer): what `/_dash-layout` will need is made while the browser loads and runs the page's
      scripts, 0.3-0.9 s before it asks in a fresh browser (a 100k-node step's first open: 1.56 s
      against 1.73 s without, docs/web-stack.md).
    """

    layout_key: Callable[[], Any] | None = None
    warm: Callable[[], None] | None = None
    _layout_cache: tuple[Any, bytes] | None = None
    _warming: threading.Thread | None = None

    def __init__(self, state: ServerState, **options: Any) -> None:
        super().__init__(**options)
        self.gradscape_state = state  # what `create_app` built around this page: `GradscapeApp.state`

    def serve_layout(self) -> Any:
        if self.layout_key is None:
            return super().serve_layout()
        key = self.layout_key()  # taken before the layout is built: a write in between only rebuilds it once more
        cached = self._layout_cache
        if cached is None or cached[0] != key:
            cached = self._layout_cache = (key, layout_json(self.get_layout()))
        return Response(cached[1], mimetype="application/json")

    def index(self, *args: Any, **kwargs: Any) -> Any:
        page = super().index(*args, **kwargs)
        warming = self._warming
        if self.warm is not None and (warming is None or not warming.is_alive()):
            self._warming = threading.Thread(target=self.warm, name="gradscape-warm", daemon=True)
            self._warming.start()
        return page

    def interpolate_index(self, metas: str = "", title: str = "", css: str = "", config: str = "", scripts: str = "",
                          app_entry: str = "", favicon: str = "", renderer: str = "") -> str:
        scripts = "\n".join(line for line in scripts.split("\n") if "/dash_table/" not in line)
        scripts = _namespace_script() + "\n" + scripts
        return str(super().interpolate_index(metas=metas, title=title, css=css, config=config, scripts=scripts,
                                             app_entry=app_entry, favicon=favicon, renderer=renderer))


def layout_json(layout: Any) -> bytes:
    """The page's layout as Dash sends it, encoded by the standard library with plotly's encoder for what
    it cannot encode itself (Dash components, numpy values). Not as Dash encodes it, for two reasons:

    - Dash uses plotly's default engine, "auto", which is orjson where it is installed; orjson cannot
      encode Dash components, and plotly then converts the whole layout in Python first: with orjson
      installed, a 100k-node step's layout took 0.90-1.0 s to encode and serve instead of 0.24 s;
    - plotly's encoder decodes and encodes again any text that holds "NaN" or "Infinity" anywhere, to
      write a non-finite number as null, and the legend's "NaN/Inf" is always there: that took 0.64 s of
      a profiled 0.96 s serve of that layout. Here a non-finite number raises instead, and only then is
      the layout given to plotly's encoder whole.

    "<", ">" and "/" are escaped as plotly escapes them."""
    try:
        text = json.dumps(layout, cls=_FiniteEncoder, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity somewhere: plotly writes them as null
        return str(to_json_plotly(layout, engine="json")).encode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\u002f").encode()


class _FiniteEncoder(PlotlyJSONEncoder):
    """plotly's encoder for what the standard library cannot encode, without its second pass."""

    def encode(self, o: Any) -> str:
        return json.JSONEncoder.encode(self, o)


def _namespace_script() -> str:
    """`window.gradscape`, the page scripts' one namespace, with what the server knows that they need: the
    page's element ids (`ids`, app/ui/ids.py) and the graph's element-id prefixes (`elements`,
    app/view/ids.py), so assets/ repeat neither; written before the scripts that use them."""
    from gradscape.app.ui import ids
    from gradscape.app.view import ids as element_ids

    known = {"ids": ids.table(), "elements": element_ids.table()}
    return "<script>window.gradscape = " + json.dumps(known).replace("</", "<\\/") + ";</script>"


class GradscapeApp(NamedTuple):
    """What `create_app` returns: unpacks as `(dash_app, socketio)`; `close()` when done with it."""

    dash: GradscapeDash
    socketio: SocketIO

    @property
    def state(self) -> ServerState:
        return self.dash.gradscape_state

    def close(self) -> None:
        """Stop the notifier thread; close the trace file if `create_app` opened it. Idempotent."""
        self.state.close()


def create_app(store: str | TraceStore = "gradscape.sqlite", config: ServerConfig | None = None,
               layout: Callable[[], Any] | None = None) -> GradscapeApp:
    """Build the Dash app and its SocketIO around one trace file. Nothing global is touched. `layout`: a
    page of the caller's instead of gradscape's (tests of the server alone)."""
    config = config or ServerConfig()
    owns_store = not isinstance(store, TraceStore)
    store = store if isinstance(store, TraceStore) else TraceStore(store, keep_last=config.keep_last)
    server = Flask("gradscape")
    socketio = SocketIO(server, async_mode="threading", async_handlers=False,
                        max_http_buffer_size=protocol.MAX_MESSAGE, cors_allowed_origins=None,
                        logger=False, engineio_logger=False)
    state = ServerState(store=store, config=config, notifier=Notifier(socketio, config.notify_interval),
                        owns_store=owns_store)
    state.known_runs.update(r["run"] for r in store.runs())
    # Dash's annotations leave out two values it documents: a Flask instance as `server` (they say
    # bool | Callable[[], Any]) and None as `update_title` (no "Updating..." title while callbacks run).
    dash_options: dict[str, Any] = {"server": server, "update_title": None}
    app = GradscapeDash(state, name="gradscape", assets_folder=_assets_folder(), title="gradscape",
                        suppress_callback_exceptions=True, **dash_options)
    socketio.on_namespace(TracerNamespace(protocol.TRACER_NAMESPACE, state))
    socketio.on_namespace(DebugNamespace(protocol.DEBUG_NAMESPACE, state))
    socketio.on_namespace(UINamespace(protocol.UI_NAMESPACE, state))
    from gradscape.app.api import register_api  # not at the top: app.api's modules import app.server's

    register_api(server, socketio, state)
    if layout is not None:
        app.layout = layout
    else:
        from gradscape.app import ui
        from gradscape.app.data import PageData
        from gradscape.app.ui import page

        data = PageData(store, state.debug, freeze=config.freeze_graphs, flags=state.flags)
        ui.register(app, data, config.token)
        app.warm = lambda: page.warm(data)
        app.layout_key = lambda: tuple((r["run"], r["updated"], r["steps"], r["last_step"]) for r in store.runs())
    secure(server, config)
    state.notifier.start()
    return GradscapeApp(app, socketio)


def _assets_folder() -> str:
    """The page's assets: the folder beside the package's app/, that is the repository's `assets/` in a
    checkout (or an editable install) and `gradscape/assets/` in a built package (pyproject.toml maps
    `gradscape.assets` to assets/)."""
    folder = Path(__file__).parent.parent.parent / "assets"
    if not (folder / "player.js").is_file():
        raise FileNotFoundError(f"gradscape: the page's assets (player.js, gradscape.css) are not in {folder}; "
                                "reinstall gradscape")
    return str(folder)
