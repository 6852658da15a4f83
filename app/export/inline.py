"""A step as a notebook shows it inline, with no server: the graph as SVG (folded by module as the page
opens it, coloured as the page colours it), the problems, and the statistics of the busiest nodes with
each slot's label. What `StepTrace._repr_html_` returns.

The drawing is the first view of the offline page (`app.export.views.view_state`), so the notebook,
the HTML file and the live page draw the same boxes, labels and colours. Styles are attributes on the
SVG itself: a notebook's own CSS does not know ours.
"""

from __future__ import annotations

import html
import math
from typing import Any

from gradscape.app.export.views import view_state
from gradscape.app.view import default_collapse, layout_graph
from gradscape.app.view.heatmaps import slot_figures
from gradscape.app.view.problems import problem_lines
from gradscape.tracer.wire import WireStep
from gradscape.tracer.wire.lazy import indexed

BOX = "#2b5d9c"
BUSIEST = 5
MAX_WIDTH = 900  # px the drawing takes at most in the notebook (it scales down, never up)
_STROKE = {"root": ("#000", 3, ""), "nan": ("#d00", 3, ""), "collapsed": (BOX, 3, ""), "param": ("#555", 1, "4 2"),
           "leaf": ("#555", 1, "4 2"), "notrun": ("#555", 1, "1 2")}


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _fit(text: str, width: float, font: float) -> str:
    n = max(3, int((width - 4) / (font * 0.58)))
    return text if len(text) <= n else text[:n - 1] + "…"


def graph_svg(wire: WireStep) -> str:
    """The step's graph as one `<svg>` element: the page's first view (folded by module when big)."""
    elements: dict[str, Any] = {}
    labels: dict[str, str] = {}
    st = view_state(wire, layout_graph(wire, default_collapse(wire)), None, elements, labels)
    xs = [v for n in st["nodes"] for v in (n[1] - n[3] / 2, n[1] + n[3] / 2)]
    xs += [v for b in st["boxes"] for v in (b[1], b[3])]
    ys = [v for n in st["nodes"] for v in (n[2] - n[4] / 2, n[2] + n[4] / 2)]
    ys += [v for b in st["boxes"] for v in (b[2] - 16, b[4])]  # a box's label sits above it
    x0, y0 = min(xs, default=0) - 8, min(ys, default=0) - 8
    w, h = max(xs, default=1) + 8 - x0, max(ys, default=1) + 8 - y0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="gradscape-graph" '
           f'viewBox="{x0:.0f} {y0:.0f} {w:.0f} {h:.0f}" width="{min(w, MAX_WIDTH):.0f}" '
           'style="max-width:100%;height:auto;font-family:sans-serif">',
           '<defs><marker id="gs-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#999"/></marker></defs>']
    for module, x1, y1, x2, y2 in st["boxes"]:
        label = elements.get("g:" + module, {}).get("label", module)
        out.append(f'<rect x="{x1}" y="{y1}" width="{x2 - x1:.1f}" height="{y2 - y1:.1f}" rx="6" fill="{BOX}" '
                   f'fill-opacity="0.06" stroke="{BOX}"/><text x="{(x1 + x2) / 2:.1f}" y="{y1 - 4}" font-size="12" '
                   f'text-anchor="middle">{_esc(label)}</text>')
    at = {n[0]: n for n in st["nodes"]}
    for src, dst, _classes, bends in st["edges"]:
        a, b = at.get(src), at.get(dst)
        if a is None or b is None:
            continue
        down = b[2] >= a[2]
        pts = [(a[1], a[2] + (a[4] / 2 if down else -a[4] / 2))] + list(zip(bends[::2], bends[1::2]))
        pts.append((b[1], b[2] + (-b[4] / 2 - 3 if down else b[4] / 2 + 3)))
        out.append('<polyline fill="none" stroke="#999" stroke-width="1.2" marker-end="url(#gs-arrow)" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + f'"><title>{_esc(labels.get(f"{src}>{dst}", ""))}'
                   '</title></polyline>')
    for eid, x, y, w_, h_ in st["nodes"]:
        out.append(_node_svg(elements[eid], eid, x, y, w_, h_))
    out.append("</svg>")
    return "".join(out)


def _node_svg(look: dict[str, Any], eid: str, x: float, y: float, w: float, h: float) -> str:
    classes = look["classes"].split()
    stroke, width, dash = next((_STROKE[c] for c in ("nan", "root", "collapsed", "param", "leaf", "notrun")
                                if c in classes), ("#555", 1, ""))
    font = 13 if look["kind"] == "module" else 12
    bold = ' font-weight="bold"' if "root" in classes or "collapsed" in classes else ""
    lines = look["label"].split("\n")
    texts = "".join(f'<text x="{w / 2:.1f}" y="{h / 2 + (i - (len(lines) - 1) / 2) * (font + 2):.1f}" '
                    f'font-size="{font}"{bold} text-anchor="middle" dominant-baseline="central" '
                    f'fill="{look["text"]}">{_esc(_fit(line, w, font))}</text>' for i, line in enumerate(lines))
    opacity = ' opacity="0.6"' if "notrun" in classes else ""
    return (f'<g data-id="{_esc(eid)}" transform="translate({x - w / 2:.1f},{y - h / 2:.1f})"{opacity}>'
            f'<title>{_esc(look["title"])}</title><rect width="{w}" height="{h}" rx="6" fill="{look["fill"]}" '
            f'stroke="{stroke}" stroke-width="{width}"' + (f' stroke-dasharray="{dash}"' if dash else "")
            + f"/>{texts}</g>")


def busiest(wire: WireStep, count: int = BUSIEST) -> list[int]:
    """The nodes that took longest on their engine thread (`time_us`); by ‖∂L/∂output‖ when no node
    was timed (AccumulateGrad nodes have no time)."""
    timed = [n for n in wire["nodes"] if n["t"] is not None]
    if timed:
        return [n["id"] for n in sorted(timed, key=lambda n: -(n["t"] or 0.0))[:count]]

    def norm(n: Any) -> float:
        go = n["go"] or []
        t = wire["tensors"][go[0]] if go and go[0] is not None else None
        v = t["stats"][4] if t is not None else 0.0
        return v if math.isfinite(v) else math.inf
    return [n["id"] for n in sorted(wire["nodes"], key=lambda n: -norm(n))[:count]]


STATS = ("norm", "min", "max", "mean", "zeros%", "nan", "inf")


def busiest_table(wire: WireStep, count: int = BUSIEST) -> str:
    """The busiest nodes' gradients, one row per slot, each named by its label (`mat2 → fc2.weight`)."""
    rows = []
    for k in busiest(wire, count):
        n = wire["nodes"][k]
        panel = slot_figures(wire, k, {})
        time = "" if n["t"] is None else f"{n['t']:.0f} µs"
        head = f"<b>{_esc(n['name'])}</b> (n{k})<br>{_esc(n['module'] or n['param'] or '')} {_esc(n['source'] or '')}"
        slots = panel["grad_outputs"]["slots"][:1] + panel["grad_inputs"]["slots"]
        for i, s in enumerate(slots):
            stats = {r["stat"]: r["text"] for r in s["stats"]}
            first = f'<td rowspan="{len(slots)}">{head}</td><td rowspan="{len(slots)}">{time}</td>' if i == 0 else ""
            cells = "".join(f"<td>{_esc(stats.get(c, ''))}</td>" for c in STATS)
            shape = "" if s["shape"] is None else "×".join(map(str, s["shape"]))
            rows.append(f"<tr>{first}<td>{_esc(s['label'])}</td><td>{shape}</td>{cells}</tr>")
    head = "".join(f"<th>{c}</th>" for c in ("node", "time", "slot", "shape", *STATS))
    return f'<table class="gradscape-busiest"><tr>{head}</tr>{"".join(rows)}</table>'


def problems_html(wire: WireStep) -> str:
    info = problem_lines(wire)
    items = "".join(f"<li><b>{_esc(p['label'])}</b>: {_esc(p['message'])}</li>" for p in info["lines"])
    return f'<div class="gradscape-problems"><b>problems</b>: {_esc(info["badge"])}' + (
        f"<ul>{items}</ul>" if items else "") + "</div>"


def step_html_inline(wire: WireStep) -> str:
    """What a notebook shows for a StepTrace: a heading, the graph, the problems, the busiest nodes."""
    wire = indexed(wire)  # the folds and the layout read the step's index: made once
    where = f"run {wire['run']} · step {wire['step']}" + (f" · rank {wire['rank']}" if wire.get("rank") else "")
    ran = sum(1 for n in wire["nodes"] if n["order"] is not None)
    return (f'<div class="gradscape-step"><div><b>gradscape</b> · {_esc(where)} · {len(wire["nodes"])} nodes '
            f'({ran} ran) · {len(wire["edges"])} edges</div>{graph_svg(wire)}{problems_html(wire)}'
            f'<div><b>busiest nodes</b> (time on their engine thread)</div>{busiest_table(wire)}</div>')
