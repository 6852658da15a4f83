"""One self-contained HTML file of one step: it opens from disk in any browser, with no server and no
network. Everything is inside it: the step's page data as JSON (`app.export.data`) and the heatmaps'
cell codes, each deflated and base64 (the JSON repeats its keys and words on every node: a 1,500-node
loop's was 3.1 MB as text; the page inflates both with `DecompressionStream`), and the page's scripts and
styles (`app/export/page/`, plus the live page's CSS from the assets folder).

    write_html(st, "step.html")                       # a StepTrace (`st.to_html(path)`)
    export_file("runs/train.sqlite", "r", 10, 0, "step.html")   # `gradscape export`

The file is what a person sends (attached to an issue, dropped in a chat), so it holds no path of the
machine it was written on: every absolute path in its text (a source line, a note, the meta) is cut
to its file name (`scrub_paths`).
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradscape.app.export.data import page_data
from gradscape.tracer._model import StepTrace
from gradscape.tracer.collector import raised_gc_threshold
from gradscape.tracer.step_doc import page_form
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import TensorArrays, WireStep

PAGE = Path(__file__).parent / "page"
SCRIPTS = ("graph.js", "inspector.js")  # graph.js first: inspector.js starts the page
# an absolute path: POSIX (`/home/a/x.py`, at least two parts), home (`~/x/y.py`) or Windows (`C:\a\x.py`)
_ABSOLUTE = re.compile(r"(?<![\w.:/])(?:~|[A-Za-z]:)?[/\\](?:[^\s/\\:\"'<>|]+[/\\])+(?=[^\s/\\\"'<>|]+)")
_MARK = re.compile(r"<!--gs:(\w+)-->")


# where a path may be in a JSON text: two separators ('/' or a JSON-escaped '\\') around a segment. A JSON
# text has no separator outside its strings, so each such place is inside one string (`scrub_json`)
_CANDIDATE = re.compile(r'[/\\][^\s/\\:"\'<>|]+[/\\]')


def scrub_paths(obj: Any) -> Any:
    """`obj` (JSON-ready data) with every absolute path in its strings cut to the file name:
    `/home/me/proj/train.py:41` becomes `train.py:41`."""
    if isinstance(obj, str):
        return _ABSOLUTE.sub("", obj)
    if isinstance(obj, list):
        return [scrub_paths(v) for v in obj]
    if isinstance(obj, dict):
        return {scrub_paths(k) if isinstance(k, str) else k: scrub_paths(v) for k, v in obj.items()}
    return obj


def scrub_json(text: str) -> str:
    """JSON text with every absolute path in its strings cut, as `scrub_paths` cuts them in the data: only
    the strings with two separators are read (a 10k-node step's page data has a million strings)."""
    out, done, seen = [], 0, 0
    for m in _CANDIDATE.finditer(text):
        if m.start() < seen:
            continue  # a string already read
        first, last = _quote(text, m.start(), -1), _quote(text, m.end(), 1)
        seen = last + 1
        raw = json.loads(text[first:seen])
        clean = _ABSOLUTE.sub("", raw)
        if clean != raw:
            out += [text[done:first], json.dumps(clean, ensure_ascii=False)]
            done = seen
    return "".join(out) + text[done:]


def _quote(text: str, at: int, way: int) -> int:
    """The JSON string's own quote before (`way` −1) or after (1) index `at` inside it: the nearest one
    not escaped (not after an odd run of backslashes)."""
    i = at
    while True:
        i = text.rfind('"', 0, i) if way < 0 else text.find('"', i)
        slashes = 0
        while text[i - 1 - slashes] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return i
        i = i if way < 0 else i + 1


def _assets_css() -> str:
    """The live page's styles (the inspector, the problems panel, the header, the player's icons from
    icons.css), so both pages look alike."""
    folder = Path(__file__).resolve().parent.parent.parent / "assets"
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.css")))


def _json_script(data: Any) -> str:
    """JSON safe inside a <script> element: no `<` at all, so no `</script>` or `<!--` can end it early; no
    path of the writer's machine (`scrub_json`)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return scrub_json(text).replace("<", "\\u003c")


def _packed(raw: bytes) -> str:
    """Deflated (zlib, level 6: level 9 took twice as long for a few per cent less), then base64."""
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def step_html(wire: WireStep, arrays: Mapping[int, TensorArrays] | None = None) -> str:
    """The page of one step as HTML text; `wire` is the whole step, arrays included, or its arrays are given
    by tensor index (`page_data`)."""
    # NOTE [Raised threshold] (tracer/collector.py): a 10k-node step's page data is millions of objects
    with raised_gc_threshold():
        data, cells = page_data(wire, arrays)
        packed = _packed(_json_script(data).encode("utf-8"))
    rank = f" · rank {data['rank']}" if data["rank"] else ""
    where = scrub_paths(f"run {data['run']} · step {data['step']}{rank}")
    parts = {
        "title": html.escape(f"gradscape · {where}"),
        "heading": html.escape(where),
        "notes": "".join(_note(n) for n in scrub_paths(data["notes"])),
        "css": _assets_css() + "\n" + (PAGE / "page.css").read_text(encoding="utf-8"),
        "data": packed,
        "cells": _packed(cells),
        "scripts": "\n".join((PAGE / name).read_text(encoding="utf-8") for name in SCRIPTS).replace("</", "<\\/"),
    }
    template = (PAGE / "page.html").read_text(encoding="utf-8")
    return _MARK.sub(lambda m: parts[m.group(1)], template)  # one pass: nothing inserted is read as a mark


def _note(note: dict[str, str]) -> str:
    """A note of the step's header (`app.view.compiled.step_notes`), as the live page draws it."""
    return (f'<span class="gs-step-note gs-note-{html.escape(note["kind"])}" title="{html.escape(note["title"])}">'
            f'{html.escape(note["text"])}</span>')


def write_html(step: StepTrace | WireStep, path: str | os.PathLike[str],
               arrays: Mapping[int, TensorArrays] | None = None) -> Path:
    """Write the offline page of `step` (a `StepTrace`, drawn from the form the trace file keeps: `page_form`;
    or a step's wire form with its arrays or `arrays`) to `path`."""
    if isinstance(step, StepTrace):
        wire, arrays = page_form(step)
    else:
        wire = step
    out = Path(path)
    out.write_text(step_html(wire, arrays), encoding="utf-8")
    return out


def export_file(trace_file: str | Path, run: str | None, step: int | None, rank: int, out: str | Path) -> Path:
    """Write the offline page of one stored step (`gradscape.load`'s defaults: the newest run, its
    last step), from the stored document as the page's data layer reads it (`read_graph`: the node and
    tensor maps, made from the stored columns) and every tensor's arrays (`read_arrays`): no `StepTrace`
    is made, and the step is not encoded again."""
    with TraceStore(trace_file, readonly=True) as store:
        run, step = store.which_step(run, step, rank)
        wire = store.read_graph(run, step, rank)
        arrays = store.read_arrays(run, step, range(len(wire["tensors"])), rank)
    return write_html(wire, out, arrays)
