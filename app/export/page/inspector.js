/* gradscape offline page: the selection, the inspector (each slot's heatmap, label and statistics),
 * the problems panel, `#node=<id>` links, and start-up (reading the step's data out of this file). */
(function () {
  "use strict";
  const GS = window.gradscapeExport = window.gradscapeExport || {};
  // The colour scale the live page's heatmaps are drawn with (plotly.js's RdBu: blue < 0 < red), and
  // the fixed colours of NaN, +Inf and -Inf cells (app/view/heatmaps.py NONFINITE_COLORS).
  const SCALE = [[0, [5, 10, 172]], [0.35, [106, 137, 247]], [0.5, [190, 190, 190]], [0.6, [220, 170, 132]],
                 [0.7, [230, 145, 90]], [1, [178, 10, 28]]];
  const NONFINITE = {nan: [0, 0, 0], pos_inf: [255, 0, 255], neg_inf: [0, 192, 0]};
  const NONFINITE_NAMES = {nan: "NaN", pos_inf: "+Inf", neg_inf: "−Inf"};  // (NONFINITE_NAMES there)

  function h(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "text") e.textContent = attrs[k]; else e.setAttribute(k, attrs[k]);
    }
    for (const c of children || []) if (c) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }

  function colour(f) {
    for (let i = 1; i < SCALE.length; i++) {
      if (f <= SCALE[i][0]) {
        const [a, ca] = SCALE[i - 1], [b, cb] = SCALE[i], t = (f - a) / (b - a);
        return ca.map((c, k) => Math.round(c + (cb[k] - c) * t));
      }
    }
    return SCALE[SCALE.length - 1][1];
  }

  // A heatmap on a canvas, one pixel per cell, scaled up by CSS; the hover names the cell's indices.
  function heatmapCanvas(hm) {
    const C = GS.data.codes, codes = GS.codes.subarray(hm.offset, hm.offset + hm.rows * hm.cols);
    const canvas = h("canvas", {class: "gs-heatmap-canvas", width: hm.cols, height: hm.rows});
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(hm.cols, hm.rows);
    for (let i = 0; i < codes.length; i++) {
      const q = codes[i];
      let rgb = null;
      if (q <= C.levels) rgb = colour(q / C.levels);
      else if (q === C.nan) rgb = NONFINITE.nan;
      else if (q === C.pos_inf) rgb = NONFINITE.pos_inf;
      else if (q === C.neg_inf) rgb = NONFINITE.neg_inf;
      if (rgb) { img.data.set(rgb, 4 * i); img.data[4 * i + 3] = 255; }
    }
    ctx.putImageData(img, 0, 0);
    const tall = Math.max(hm.rows, hm.cols / 24);  // a 1×n strip still gets some height
    canvas.style.aspectRatio = `${hm.cols} / ${tall}`;
    canvas.style.maxWidth = `${Math.round(320 * hm.cols / tall)}px`;  // at most 320 px high, as on the live page
    canvas.addEventListener("mousemove", e => {
      const r = canvas.getBoundingClientRect();
      const j = Math.min(hm.cols - 1, Math.floor((e.clientX - r.left) / r.width * hm.cols));
      const i = Math.min(hm.rows - 1, Math.floor((e.clientY - r.top) / r.height * hm.rows));
      canvas.title = cellWords(hm, i, j, codes[i * hm.cols + j]);
    });
    return canvas;
  }

  function span(edges, i, what) {
    if (!edges) return `${what} ${i}`;
    const a = edges[i], b = edges[i + 1] - 1;
    return b > a ? `${what}s ${a}–${b}` : `${what} ${a}`;
  }

  function cellWords(hm, i, j, q) {
    const C = GS.data.codes;
    const where = hm.ticks ? `${span(hm.y, i, "row")}, ${span(hm.x, j, "col")}` : `view row ${i}, col ${j}`;
    if (q === C.pad) return `${where}: no value here (padding)`;
    if (q === C.nan) return `${where}: NaN`;
    if (q === C.pos_inf) return `${where}: +Inf`;
    if (q === C.neg_inf) return `${where}: −Inf`;
    return `${where}: ≈ ${(((q / C.levels) * 2 - 1) * hm.m).toPrecision(3)} (the colour's value; statistics below are exact)`;
  }

  function statsTable(rows) {
    return h("table", {class: "gs-stats"}, [h("tr", {}, rows.map(r => h("th", {text: r[0]}))),
                                           h("tr", {}, rows.map(r => h("td", {text: r[1]})))]);
  }

  function slotView(slot) {
    const hm = slot.tensor === null ? null : GS.data.heatmaps[slot.tensor];
    const parts = [h("div", {class: "gs-slot-title", text: slot.title})];
    if (hm && hm.rows !== undefined) {
      parts.push(h("div", {class: "gs-slot-note", text: `${hm.view} · ${hm.source}`}));
      parts.push(heatmapCanvas(hm));
      if (hm.key && hm.key.length) {  // NaN/Inf cells: colours outside the map's scale, named as on the live page
        parts.push(h("div", {class: "gs-nan-key"}, ["cells outside the scale: "].concat(hm.key.map(k =>
          h("span", {class: "gs-key-item"}, [h("span", {class: "gs-swatch", style: `background: rgb(${NONFINITE[k]})`}),
                                             NONFINITE_NAMES[k]])))));
      }
      parts.push(h("div", {class: "gs-slot-note", text: `colour: −${hm.m.toPrecision(3)} … 0 … +${hm.m.toPrecision(3)}`
        + ` (${hm.y_title} × ${hm.x_title})`}));
    }
    const note = slot.note || (hm && hm.note);
    if (note) parts.push(h("div", {class: "gs-slot-note", text: note}));
    const rows = slot.tensor === null ? null : GS.data.stats[slot.tensor];
    if (rows && rows.length) parts.push(statsTable(rows));
    return h("div", {class: "gs-slot", "data-tensor": slot.tensor === null ? "" : slot.tensor}, parts);
  }

  GS.inspector = {
    render(id) {
      const n = GS.data.nodes[id], box = document.getElementById("inspector");
      box.textContent = "";
      const meta = [["op", n.name], ["module", n.module], ["parameter", n.param], ["source", n.source],
                    ["schema", n.schema], ["order", n.order === null ? "did not run" : String(n.order)],
                    ["time", n.time_us === null ? null : `${n.time_us.toFixed(1)} µs`]];
      box.appendChild(h("h2", {text: `${n.name} (n${n.id})`}));
      box.appendChild(h("div", {class: "gs-meta"}, meta.filter(m => m[1] !== null).map(m =>
        h("div", {}, [m[0] + ": ", h("code", {text: m[1]})]))));
      box.appendChild(h("div", {class: "gs-explain", text: n.explain}));
      for (const [kind, title] of [["grad_outputs", GS.data.titles.grad_outputs], ["grad_inputs", GS.data.titles.grad_inputs]]) {
        box.appendChild(h("h3", {text: title}));
        const list = h("div", {class: "gs-slots", "data-kind": kind}, n[kind].map(slotView));
        if (!n[kind].length) list.appendChild(h("div", {class: "gs-slot-note", text: "none"}));
        box.appendChild(list);
      }
    },
  };

  GS.select = {
    id: null,
    // select node `id`: open the view that draws it when it is folded away, show it in the inspector
    node(id, fromPlayer) {
      const D = GS.data;
      if (!(id >= 0 && id < D.nodes.length)) return;
      this.id = id;
      if (!GS.graph.drawn["n" + id] && D.show[id] !== undefined && D.show[id] !== GS.graph.state) {
        GS.graph.show(D.show[id]);
      }
      GS.inspector.render(id);
      this.paint();
      if (!fromPlayer) {
        history.replaceState(null, "", "#node=" + id);
        GS.graph.centre(GS.graph.elementOf(id));
      }
    },
    paint() {
      const eid = this.id === null ? null : GS.graph.elementOf(this.id);
      for (const k in GS.graph.drawn) GS.graph.drawn[k].classList.toggle("selected", k === eid);
    },
  };

  function problems() {
    const lines = GS.data.problems, box = document.getElementById("problems");
    const badge = lines.length ? `${lines.length} problem${lines.length > 1 ? "s" : ""}` : "no problems found";
    box.appendChild(h("div", {class: "gs-problems-head"}, ["problems ",
      h("span", {class: "gs-problems-count" + (lines.length ? " gs-problems-some" : ""), text: badge})]));
    const list = h("div", {class: "gs-problems-list"});
    for (const p of lines) {
      const body = [h("span", {class: `gs-problem-kind gs-kind-${p.kind}`, text: p.label + ":"}), " ",
                    h("span", {class: "gs-problem-text", text: p.message})];
      const line = h(p.node === null ? "div" : "button", {class: "gs-problem" + (p.node === null ? "" : " gs-problem-node")}, body);
      if (p.node !== null) line.addEventListener("click", () => GS.select.node(p.node, false));
      list.appendChild(line);
    }
    box.appendChild(list);
  }

  function fromHash() {
    const m = /node=(\d+)/.exec(location.hash);
    return m ? +m[1] : null;
  }

  // The page data and the heatmaps' cell codes are each one deflated, base64 blob (DecompressionStream:
  // every current browser).
  async function inflated(b64) {
    const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  async function start() {
    const text = new TextDecoder().decode(await inflated(document.getElementById("gs-data").textContent.trim()));
    const D = GS.data = JSON.parse(text);
    GS.codes = await inflated(document.getElementById("gs-cells").textContent.trim());
    document.getElementById("legend").appendChild(h("span", {}, [D.legend.title + " ", D.legend.min_label + " ",
      h("span", {class: "bar", style: `background: ${D.legend.css_gradient}`}), " " + D.legend.max_label]));
    problems();
    GS.graph.init();
    GS.player.init();
    GS.graph.show("");
    GS.graph.fit();
    const id = fromHash();
    if (id !== null) GS.select.node(id, false);
    else document.getElementById("inspector").appendChild(h("p", {class: "gs-hint", text: "click a node to inspect it"}));
    window.addEventListener("hashchange", () => { const k = fromHash(); if (k !== null) GS.select.node(k, false); });
    document.body.setAttribute("data-ready", "1");
  }

  start().catch(err => {
    document.body.setAttribute("data-error", String(err));
    document.getElementById("inspector").textContent = "this page could not read its data: " + err;
  });
})();
