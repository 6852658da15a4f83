"""Layout benchmark: the page's own layered layout (`gradscape.app.view.layout`) against maintained
engines, on the traces the page must draw: the 12-layer GPT (W4, 533 autograd nodes) and the
10,151-node step (`workloads.residual_stages`: 50 stages of 29 residual blocks).

    python bench/layout.py [--engines own,dot,grandalf,dagre,klay] [--expands all] [--full]

For each engine and each view it prints the time to lay the view out, the edge crossings as drawn,
the sibling module boxes that overlap, and, for an expand, how far what was on screen moved. The views:
- `open`: the folded view the page opens with (`default_collapse`);
- `expand`: each folded module of that view opened for the first time, one at a time, from `open`
  (the 12 blocks and 4 other modules of W4; the 50 stages of the 10k step), as a person's click does
  (`expand_one_level`): p50/p95 over them;
- `full` (with --full): every node drawn (W4 only; 10k nodes are never drawn at once).

Engines:
- `own`: `layout_graph`, the page's layout (laid out fresh per view: no cache is consulted);
- `dot`: Graphviz `dot` (a subprocess; every expanded module a `cluster`, each node its drawn size);
- `grandalf`: grandalf's Sugiyama layout in Python (no compound graphs: boxes are only measured);
- `dagre`, `klay`: dash-cytoscape's extra layouts, run by cytoscape in headless Chromium on the same
  elements (time measured in the page; its edges are drawn straight).

Crossings are counted on the drawing (each edge a polyline through its bends, straight when it has
none), not on layers, so every engine is counted the same way. Overlaps: `box_overlaps` on the
positions each engine gives (a box is what it holds plus padding, as cytoscape draws compound nodes).
Stability ("moved"): how far the elements within one screen (1400 × 900 model units) of the clicked
module move, as the page shows them: after the pan the page chooses (it keeps the median of their moves
at zero), the mean move of those above or beside the module (what is below it must move down), and the
mean sideways move of all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from workloads import build, residual_stages  # noqa: E402

import gradscape  # noqa: E402
from gradscape.app import view  # noqa: E402
from gradscape.app.view.collapse import box_label, collapse_graph, default_collapse, element_size, normalise  # noqa: E402
from gradscape.app.view.layout import box_overlaps, layout_graph  # noqa: E402

Layout = dict[str, Any]
SCREEN = (1400.0, 900.0)


# ---------------------------------------------------------------------------- engines
def own(wire: Any, collapsed: Iterable[str]) -> Layout:
    return layout_graph(wire, collapsed)


def dot(wire: Any, collapsed: Iterable[str]) -> Layout:
    """Graphviz dot on the drawn graph: nodes at their drawn sizes, expanded modules as clusters."""
    folded = normalise(wire, collapsed)
    vg = collapse_graph(wire, folded, normalised=True)
    sizes = {e: element_size(wire, e, vg.members.get(e)) for e in vg.elements}
    names = {e: f"v{i}" for i, e in enumerate(vg.elements)}
    kids: dict[str | None, list[str]] = {}
    for b, parent in vg.boxes.items():
        kids.setdefault(parent, []).append(b)
    held: dict[str | None, list[str]] = {}
    for e in vg.elements:
        held.setdefault(vg.parent[e], []).append(e)
    lines = ["digraph G {", "rankdir=TB; nodesep=0.22; ranksep=0.55; splines=polyline;",
             'node [shape=box, fixedsize=true, label=""];']

    def emit(box: str | None) -> None:
        for e in held.get(box, []):
            w, h = sizes[e]
            lines.append(f"{names[e]} [width={w / 72:.3f}, height={h / 72:.3f}];")
        for b in kids.get(box, []):
            lines.append(f'subgraph "cluster_{b}" {{ label="{box_label(wire, b)}"; fontsize=12; margin=10;')
            emit(b)
            lines.append("}")

    emit(None)
    lines += [f"{names[a]} -> {names[b]};" for a, b in vg.edges]
    lines.append("}")
    out = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True, text=True, check=True)
    pos: dict[str, tuple[float, float]] = {}
    bends: dict[tuple[str, str], list[list[float]]] = {}
    back = {v: k for k, v in names.items()}
    height = 0.0
    for row in out.stdout.splitlines():
        f = row.split()
        if f[0] == "graph":
            height = float(f[3]) * 72
        elif f[0] == "node":
            pos[back[f[1]]] = (float(f[2]) * 72, height - float(f[3]) * 72)
        elif f[0] == "edge":
            n = int(f[3])
            pts = [[float(f[4 + 2 * i]) * 72, height - float(f[5 + 2 * i]) * 72] for i in range(n)]
            bends[(back[f[1]], back[f[2]])] = pts[1:-1]
    return _as_layout(wire, vg, folded, pos, sizes, bends)


def grandalf(wire: Any, collapsed: Iterable[str]) -> Layout:
    """grandalf's Sugiyama layout (pure Python; it knows nothing of modules)."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    folded = normalise(wire, collapsed)
    vg = collapse_graph(wire, folded, normalised=True)
    sizes = {e: element_size(wire, e, vg.members.get(e)) for e in vg.elements}

    class View:
        def __init__(self, w: float, h: float) -> None:
            self.w, self.h, self.xy = w, h, (0.0, 0.0)

    verts = {e: Vertex(e) for e in vg.elements}
    for e, v in verts.items():
        v.view = View(*sizes[e])
    g = Graph(list(verts.values()), [Edge(verts[a], verts[b]) for a, b in vg.edges])
    pos: dict[str, tuple[float, float]] = {}
    x0 = 0.0
    for comp in g.C:  # grandalf lays out each connected component on its own; put them side by side
        sug = SugiyamaLayout(comp)
        sug.yspace = 40
        sug.init_all()
        sug.draw(3)
        xs = [v.view.xy[0] for v in comp.sV]
        lo = min(xs)
        for v in comp.sV:
            pos[v.data] = (v.view.xy[0] - lo + x0, v.view.xy[1])
        x0 += max(xs) - lo + 100
    return _as_layout(wire, vg, folded, pos, sizes, {})


def _as_layout(wire: Any, vg: Any, folded: set[str], pos: dict[str, tuple[float, float]],
               sizes: dict[str, tuple[float, float]], bends: dict[tuple[str, str], list[list[float]]]) -> Layout:
    """An engine's positions in the form `layout_graph` returns (the fields the metrics read)."""
    nodes = {e: {"x": pos[e][0], "y": pos[e][1], "parent": vg.parent[e], "w": sizes[e][0], "h": sizes[e][1]}
             for e in vg.elements}
    edges = [{"source": a, "target": b, "bends": bends.get((a, b), [])} for a, b in vg.edges]
    return {"collapsed": sorted(folded), "nodes": nodes, "boxes": dict(vg.boxes), "edges": edges,
            "box_labels": {b: box_label(wire, b) for b in vg.boxes}}


ENGINES: dict[str, Callable[[Any, Iterable[str]], Layout]] = {"own": own, "dot": dot, "grandalf": grandalf}


# ---------------------------------------------------------------------------- metrics
def crossings(layout: Layout) -> int:
    """Pairs of edge segments that cross, as drawn (edges sharing an end do not count)."""
    nodes = layout["nodes"]
    segs, owner = [], []
    for e in layout["edges"]:
        s, t = nodes[e["source"]], nodes[e["target"]]
        pts = [[s["x"], s["y"]], *e.get("bends", []), [t["x"], t["y"]]]
        for p, q in zip(pts, pts[1:]):
            segs.append((*p, *q))
            owner.append((e["source"], e["target"]))
    if len(segs) < 2:
        return 0
    ends = {o for pair in owner for o in pair}
    index = {e: i for i, e in enumerate(ends)}
    s = np.asarray(segs, dtype=np.float64)
    ea = np.asarray([index[a] for a, _ in owner])
    eb = np.asarray([index[b] for _, b in owner])
    axis = 1 if np.ptp(s[:, [1, 3]]) > np.ptp(s[:, [0, 2]]) else 0  # sweep along the longer side
    lo = np.minimum(s[:, axis], s[:, axis + 2])
    hi = np.maximum(s[:, axis], s[:, axis + 2])
    order = np.argsort(lo)
    s, ea, eb, lo, hi = s[order], ea[order], eb[order], lo[order], hi[order]
    reach = np.searchsorted(lo, hi, side="right")  # segments j > i that may overlap i along the sweep
    total = 0
    for i in range(len(s)):
        j = np.arange(i + 1, reach[i])
        if not j.size:
            continue
        shared = (ea[j] == ea[i]) | (ea[j] == eb[i]) | (eb[j] == ea[i]) | (eb[j] == eb[i])
        j = j[~shared]
        total += int(_proper(s[i], s[j]).sum())
    return total


def _proper(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether segment `a` properly crosses each segment of `b` (touching ends do not count)."""
    def orient(px: Any, py: Any, qx: Any, qy: Any, rx: Any, ry: Any) -> Any:
        return np.sign((qx - px) * (ry - py) - (qy - py) * (rx - px))
    d1 = orient(a[0], a[1], a[2], a[3], b[:, 0], b[:, 1])
    d2 = orient(a[0], a[1], a[2], a[3], b[:, 2], b[:, 3])
    d3 = orient(b[:, 0], b[:, 1], b[:, 2], b[:, 3], a[0], a[1])
    d4 = orient(b[:, 0], b[:, 1], b[:, 2], b[:, 3], a[2], a[3])
    return (d1 * d2 < 0) & (d3 * d4 < 0)


def displacement(before: Layout, after: Layout, module: str, axis: int | None = None) -> float:
    """How far what was on screen around the clicked `module` moved, as the page shows it.

    On screen: the elements within a screen (`SCREEN`, model units) of the module. The page keeps the
    view where the median of those moves is zero (`assets/graph.js`, `G.refresh`): sideways over all of
    them, up and down over those above the module (what is below it must move down to make room). The
    figure is the mean distance that leaves for the elements not below the module; `axis=0`: the mean
    sideways move of all of them."""
    anchor = before["nodes"][f"m:{module}"]
    near = [e for e, b in before["nodes"].items() if e != f"m:{module}" and e in after["nodes"]
            and abs(b["x"] - anchor["x"]) <= SCREEN[0] / 2 and abs(b["y"] - anchor["y"]) <= SCREEN[1] / 2]
    if not near:
        return 0.0
    mx = {e: after["nodes"][e]["x"] - before["nodes"][e]["x"] for e in near}
    my = {e: after["nodes"][e]["y"] - before["nodes"][e]["y"] for e in near}
    above = [e for e in near if before["nodes"][e]["y"] < anchor["y"]]
    dx = statistics.median(mx.values())
    dy = statistics.median(my[e] for e in above) if above else 0.0
    if axis == 0:
        return statistics.fmean(abs(mx[e] - dx) for e in near)
    kept = [e for e in near if before["nodes"][e]["y"] <= anchor["y"]]
    return statistics.fmean(float(np.hypot(mx[e] - dx, my[e] - dy)) for e in kept) if kept else 0.0


# ---------------------------------------------------------------------------- in the browser
BROWSER_RUN = """
([elements, name]) => {
  const cy = document.getElementById('g')._cyreg.cy;
  cy.elements().remove();
  cy.add(elements);
  const opts = name === 'dagre' ? {name: 'dagre', rankDir: 'TB', nodeSep: 16, rankSep: 40}
                                : {name: 'klay', klay: {direction: 'DOWN', spacing: 16}};
  const t0 = performance.now();
  cy.layout(Object.assign({animate: false, fit: false}, opts)).run();
  const ms = performance.now() - t0;
  const pos = {};
  cy.nodes().filter(n => !n.isParent()).forEach(n => { pos[n.id()] = [n.position('x'), n.position('y')]; });
  return {ms: ms, pos: pos};
}
"""


class Browser:
    """dash-cytoscape's extra layouts (dagre, klay) run by cytoscape in headless Chromium."""

    def __init__(self) -> None:
        import dash
        import dash_cytoscape as cyto
        from playwright.sync_api import sync_playwright
        from ui import ARGS, serve

        cyto.load_extra_layouts()
        app = dash.Dash("layouts")
        style = [{"selector": "node", "style": {"width": "data(w)", "height": "data(h)", "shape": "round-rectangle"}},
                 {"selector": ":parent", "style": {"padding": 10}}]
        app.layout = dash.html.Div([cyto.Cytoscape(id="g", elements=[], layout={"name": "preset"}, stylesheet=style,
                                                   style={"width": "1400px", "height": "900px"})])
        self.url, _ = serve(app.server)
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        self.page = self._browser.new_page()
        self.page.set_default_timeout(600_000)
        self.page.goto(self.url)
        self.page.wait_for_function("document.getElementById('g') && document.getElementById('g')._cyreg")

    def engine(self, name: str) -> Callable[[Any, Iterable[str]], Layout]:
        def run(wire: Any, collapsed: Iterable[str]) -> Layout:
            folded = normalise(wire, collapsed)
            vg = collapse_graph(wire, folded, normalised=True)
            sizes = {e: element_size(wire, e, vg.members.get(e)) for e in vg.elements}
            els: list[dict[str, Any]] = [{"data": {"id": "g:" + b, **({"parent": "g:" + p} if p else {})}}
                                         for b, p in vg.boxes.items()]
            for e in vg.elements:
                parent = vg.parent[e]
                els.append({"data": {"id": e, "w": sizes[e][0], "h": sizes[e][1],
                                     **({"parent": "g:" + parent} if parent else {})}})
            els += [{"data": {"id": f"e{k}", "source": a, "target": b}} for k, (a, b) in enumerate(vg.edges)]
            got = self.page.evaluate(BROWSER_RUN, [els, name])
            out = _as_layout(wire, vg, folded, {e: tuple(p) for e, p in got["pos"].items()}, sizes, {})
            out["ms"] = got["ms"]
            return out
        return run

    def close(self) -> None:
        self._browser.close()
        self._pw.stop()


# ---------------------------------------------------------------------------- the views
def record(which: str, path: Path) -> Any:
    if which == "10k":
        model = residual_stages()
        with gradscape.Tracer(model, run="bench", sink=str(path), tensors="summary", thumb=4) as tr, tr.step(0):
            model(torch.randn(2, 4)).sum().backward()
    else:
        wl = build(which)
        with gradscape.Tracer(wl.model, run="bench", sink=str(path), thumb=4) as tr, tr.step(0):
            wl.loss(wl.model, wl.batch()).backward()
    return gradscape.TraceStore(str(path)).read_graph("bench", 0, 0)


def timed(engine: Callable[[Any, Iterable[str]], Layout], wire: Any, collapsed: Iterable[str],
          repeat: int = 3) -> tuple[Layout, float]:
    """The layout and the best of `repeat` times (this machine is shared: the best is the least disturbed;
    no engine caches anything between calls, so each call lays the view out afresh)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = engine(wire, collapsed)
        took = time.perf_counter() - t0
        best = min(best, out.pop("ms") / 1e3 if "ms" in out else took)
    return out, best


def views(name: str, engine: Callable[[Any, Iterable[str]], Layout], wire: Any, expands: str,
          full: bool) -> dict[str, Any]:
    """Every figure of one engine on one trace."""
    opening = sorted(default_collapse(wire))
    before, t_open = timed(engine, wire, opening)
    modules = [c for c in opening]
    if expands != "all":
        modules = modules[::max(1, len(modules) // max(1, int(expands)))]
    times, cross, over, moved, sideways = [], [], [], [], []
    for m in modules:
        after, t = timed(engine, wire, view.expand_one_level(wire, opening, m))
        times.append(t)
        cross.append(crossings(after))
        over.append(len(box_overlaps(after)))
        moved.append(displacement(before, after, m))
        sideways.append(displacement(before, after, m, axis=0))
    out = {"engine": name, "open_s": t_open, "open_cross": crossings(before), "open_over": len(box_overlaps(before)),
           "expands": len(modules), "exp_p50": statistics.median(times), "exp_p95": _p95(times), "exp_max": max(times),
           "exp_cross": sum(cross), "exp_over": sum(over), "moved": statistics.fmean(moved),
           "sideways": statistics.fmean(sideways)}
    if full:
        whole, t_full = timed(engine, wire, [])
        out.update(full_s=t_full, full_cross=crossings(whole), full_over=len(box_overlaps(whole)))
    return out


def _p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else xs[0]


def show(trace: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{trace}: engine | open: s, crossings, overlaps | first expands (n): p50/p95/max s, crossings, "
          "overlaps, moved | full: s, crossings, overlaps")
    for r in rows:
        full = (f" | {r['full_s']:.3f} s, {r['full_cross']}, {r['full_over']}" if "full_s" in r else "")
        print(f"  {r['engine']:8} | {r['open_s']:.3f} s, {r['open_cross']}, {r['open_over']} | ({r['expands']}) "
              f"{r['exp_p50']:.3f}/{r['exp_p95']:.3f}/{r['exp_max']:.3f} s, {r['exp_cross']}, {r['exp_over']}, "
              f"{r['moved']:.0f} px ({r['sideways']:.0f} sideways){full}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="own,dot,grandalf,dagre,klay")
    ap.add_argument("--traces", default="W4,10k")
    ap.add_argument("--expands", default="all", help="'all' or how many folded modules to open, spread evenly")
    ap.add_argument("--full", action="store_true", help="also lay out W4 with every node drawn")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    print(f"gradscape layout benchmark: loadavg {os.getloadavg()}")
    wanted = args.engines.split(",")
    engines = {k: ENGINES[k] for k in wanted if k in ENGINES}
    if "dot" in engines and shutil.which("dot") is None:
        print("  dot: Graphviz is not installed (apt-get install graphviz); skipped")
        engines.pop("dot")
    if "grandalf" in engines:
        try:
            import grandalf  # noqa: F401
        except ImportError:
            print("  grandalf: not installed (pip install grandalf); skipped")
            engines.pop("grandalf")
    browser = Browser() if {"dagre", "klay"} & set(wanted) else None
    for k in ("dagre", "klay"):
        if browser and k in wanted:
            engines[k] = browser.engine(k)
    tmp = Path(tempfile.mkdtemp(prefix="gradscape-layout-"))
    figures: dict[str, list[dict[str, Any]]] = {}
    for trace in args.traces.split(","):
        wire = record(trace, tmp / f"{trace}.sqlite")
        rows = figures[trace] = []
        for name, engine in engines.items():
            rows.append(views(name, engine, wire, args.expands, args.full and trace != "10k"))
            show(f"{trace} ({len(wire['nodes'])} nodes)", rows[-1:])
        show(f"{trace} ({len(wire['nodes'])} nodes)", rows)
    if browser:
        browser.close()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
