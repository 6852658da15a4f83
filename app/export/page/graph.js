/* gradscape offline page: the graph (SVG) and the backward player. Everything it draws was laid out by
 * the view layer when the file was written (app/export/views.py): `D.states[key]` is one view of the
 * graph (key "" the first one, folded by module; another keyed by the fold clicked to open it), its
 * `opens` the view each fold and box in it shows, `D.elements` how each element looks. No network, no
 * library: this file and inspector.js are the page's code. */
(function () {
  "use strict";
  const GS = window.gradscapeExport = window.gradscapeExport || {};
  const SVG = "http://www.w3.org/2000/svg";
  const BOX_FILL = "#2b5d9c", PAD = 24, CHAR = 0.58;
  const INFO = "click a fold to open it, a box to fold it; drag to pan, wheel to zoom";

  function el(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function fitText(text, width, font) {
    const max = Math.max(3, Math.floor((width - 4) / (font * CHAR)));
    return text.length <= max ? text : text.slice(0, max - 1) + "…";
  }

  GS.graph = {
    state: null, view: {k: 1, x: 0, y: 0}, drawn: {}, looks: {}, bounds: null,

    // Draw state `key` (a view laid out in Python); keeps the selection when it is drawn there.
    show(key) {
      const D = GS.data, st = D.states[key];
      if (!st) return;
      this.state = key;
      const svg = document.querySelector("#graph svg"), vp = svg.querySelector(".gs-viewport");
      vp.textContent = "";
      this.drawn = {};
      this.looks = {};
      const boxes = el("g", {class: "gs-boxes"}, vp), edges = el("g", {class: "gs-edges"}, vp);
      const nodes = el("g", {class: "gs-nodes"}, vp);
      let x1 = Infinity, y1 = Infinity, x2 = -Infinity, y2 = -Infinity;
      const grow = (a, b, c, d) => { x1 = Math.min(x1, a); y1 = Math.min(y1, b); x2 = Math.max(x2, c); y2 = Math.max(y2, d); };
      for (const [module, bx1, by1, bx2, by2] of st.boxes) {
        const look = D.elements["g:" + module] || {label: module};
        const g = el("g", {class: "gs-box", "data-id": "g:" + module, "data-module": module}, boxes);
        el("rect", {x: bx1, y: by1, width: bx2 - bx1, height: by2 - by1, rx: 6, fill: BOX_FILL,
                    "fill-opacity": 0.06, stroke: BOX_FILL}, g);
        const t = el("text", {x: (bx1 + bx2) / 2, y: by1 - 4, "text-anchor": "middle", class: "gs-box-label"}, g);
        t.textContent = look.label;
        el("title", {}, g).textContent = look.label + " (click to fold)";
        grow(bx1, by1 - 16, bx2, by2);
      }
      const at = {};
      for (const [id, x, y, w, h] of st.nodes) at[id] = {x, y, w, h};
      for (const [src, dst, classes, bends] of st.edges) {
        const a = at[src], b = at[dst];
        if (!a || !b) continue;
        const down = b.y >= a.y, pts = [[a.x, a.y + (down ? a.h / 2 : -a.h / 2)]];
        for (let i = 0; i + 1 < bends.length; i += 2) pts.push([bends[i], bends[i + 1]]);
        pts.push([b.x, b.y + (down ? -b.h / 2 - 3 : b.h / 2 + 3)]);
        const p = el("polyline", {points: pts.map(q => q.join(",")).join(" "), class: "gs-edge " + classes,
                                  "data-source": src, "data-target": dst, "marker-end": "url(#gs-arrow)"}, edges);
        const label = D.edge_labels[src + ">" + dst];
        if (label) el("title", {}, p).textContent = label;
      }
      for (const [id, x, y, w, h, here] of st.nodes) {
        // the calls not drawn yet look different in each view (how many are left): `here` says how
        const look = this.looks[id] = here ? Object.assign({}, D.elements[id], here) : D.elements[id];
        const g = el("g", {class: "gs-node " + (look.classes || ""), "data-id": id,
                           transform: `translate(${x - w / 2},${y - h / 2})`}, nodes);
        el("rect", {width: w, height: h, rx: 6, fill: look.fill}, g);
        const lines = look.label.split("\n"), font = look.kind === "module" ? 13 : 12;
        lines.forEach((line, i) => {
          const t = el("text", {x: w / 2, y: h / 2 + (i - (lines.length - 1) / 2) * (font + 2),
                                "text-anchor": "middle", "dominant-baseline": "central", fill: look.text}, g);
          t.textContent = fitText(line, w, font);
        });
        el("title", {}, g).textContent = look.title;
        this.drawn[id] = g;
        grow(x - w / 2, y - h / 2, x + w / 2, y + h / 2);
      }
      this.bounds = isFinite(x1) ? {x1, y1, x2, y2} : {x1: 0, y1: 0, x2: 1, y2: 1};
      GS.player && GS.player.paint();
      GS.select.paint();
    },

    // the element that draws node `id` in the current state: itself, or the folded module holding it
    elementOf(id) {
      const key = "n" + id;
      if (this.drawn[key]) return key;
      for (const eid in this.drawn) {
        const look = this.looks[eid];
        if (look.members && look.members.indexOf(id) >= 0) return eid;
      }
      return null;
    },

    // a click on a fold (a module, a call, the calls not drawn yet) or a box: the view it shows, laid out
    // when the file was written; one past the file's budget says so (never a click that does nothing)
    go(eid) {
      const target = GS.data.states[this.state].opens[eid], info = document.getElementById("graph-info");
      if (target === undefined) {
        info.textContent = "this fold was not laid out in this file (its views' budget is spent): " +
          "gradscape serve opens every fold";
        info.classList.add("gs-left-out");
        return;
      }
      info.classList.remove("gs-left-out");
      info.textContent = INFO;
      this.show(target);
      this.centre(this.drawn[eid] ? eid : (eid.startsWith("g:") ? "m:" + eid.slice(2) : "g:" + eid.slice(2).split("#")[0]));
    },

    apply() {
      const v = this.view;
      document.querySelector("#graph .gs-viewport").setAttribute("transform", `translate(${v.x},${v.y}) scale(${v.k})`);
    },
    fit() {
      const box = document.querySelector("#graph").getBoundingClientRect(), b = this.bounds;
      const k = Math.min((box.width - 2 * PAD) / (b.x2 - b.x1), (box.height - 2 * PAD) / (b.y2 - b.y1), 1.5);
      this.view = {k, x: box.width / 2 - k * (b.x1 + b.x2) / 2, y: PAD - k * b.y1};
      this.apply();
    },
    // bring element `eid` (or its box) into the middle, at a zoom where labels read
    centre(eid) {
      const g = this.drawn[eid] || document.querySelector(`#graph [data-id="${CSS.escape(eid)}"]`);
      if (!g) return;
      const bb = g.getBBox(), m = g.transform.baseVal.consolidate(), box = document.querySelector("#graph")
        .getBoundingClientRect(), k = Math.max(this.view.k, 0.85);
      const cx = bb.x + bb.width / 2 + (m ? m.matrix.e : 0), cy = bb.y + Math.min(bb.height / 2, 60) + (m ? m.matrix.f : 0);
      this.view = {k, x: box.width / 2 - k * cx, y: box.height / 2 - k * cy};
      this.apply();
    },

    init() {
      const host = document.querySelector("#graph");
      const svg = el("svg", {width: "100%", height: "100%"}, host);
      const defs = el("defs", {}, svg), m = el("marker", {id: "gs-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
                                                         markerWidth: 6, markerHeight: 6, orient: "auto"}, defs);
      el("path", {d: "M0,0 L10,5 L0,10 z", fill: "#999"}, m);
      el("g", {class: "gs-viewport"}, svg);
      let drag = null;
      svg.addEventListener("pointerdown", e => { drag = {x: e.clientX, y: e.clientY, vx: this.view.x, vy: this.view.y, moved: false}; });
      svg.addEventListener("pointermove", e => {
        if (!drag) return;
        const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) { this.view.x = drag.vx + dx; this.view.y = drag.vy + dy; this.apply(); }
      });
      svg.addEventListener("pointerup", e => {
        const moved = drag && drag.moved;
        drag = null;
        if (moved) return;
        const node = e.target.closest(".gs-node"), box = e.target.closest(".gs-box");
        if (node) {
          const id = node.getAttribute("data-id");
          if (id.startsWith("n")) GS.select.node(+id.slice(1), false);
          else this.go(id);
        } else if (box) this.go(box.getAttribute("data-id"));
      });
      svg.addEventListener("wheel", e => {
        e.preventDefault();
        const r = svg.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
        const k = Math.min(Math.max(this.view.k * Math.exp(-e.deltaY / 400), 0.05), 4), f = k / this.view.k;
        this.view = {k, x: px - f * (px - this.view.x), y: py - f * (py - this.view.y)};
        this.apply();
      }, {passive: false});
      document.getElementById("graph-fit").addEventListener("click", () => this.fit());
    },
  };

  // The play button's look and name while stopped and while playing: the live page's (app/ui/player.py
  // PLAY_CLASS, PAUSE_CLASS, PLAY_TITLE, PAUSE_TITLE), its icons drawn by assets/icons.css.
  const PLAY = {className: "gs-btn gs-icon gs-icon-play", title: "play (space)"};
  const PAUSE = {className: "gs-btn gs-icon gs-icon-pause", title: "pause (space)"};

  // The backward player: a slider over the order autograd ran the nodes; lit what ran, outline the current.
  GS.player = {
    at: 0, timer: null,
    init() {
      const s = document.getElementById("player-slider");
      s.max = GS.data.order.length;
      s.value = this.at = GS.data.order.length;
      s.addEventListener("input", () => this.go(+s.value));
      document.getElementById("player-prev").addEventListener("click", () => this.go(this.at - 1));
      document.getElementById("player-next").addEventListener("click", () => this.go(this.at + 1));
      document.getElementById("player-play").addEventListener("click", () => this.toggle());
      document.addEventListener("keydown", e => {
        if (e.target.closest("input, select, textarea")) return;
        if (e.key === "ArrowLeft") this.go(this.at - 1);
        else if (e.key === "ArrowRight") this.go(this.at + 1);
        else if (e.key === " ") { e.preventDefault(); this.toggle(); }
        else if (e.key === "f") GS.graph.fit();
      });
    },
    toggle() {
      if (this.timer) { clearInterval(this.timer); this.timer = null; this.showPlaying(false); return; }
      if (this.at >= GS.data.order.length) this.go(0);
      this.showPlaying(true);
      this.timer = setInterval(() => { if (this.at >= GS.data.order.length) this.toggle(); else this.go(this.at + 1); }, 400);
    },
    showPlaying(on) {
      const b = document.getElementById("player-play"), look = on ? PAUSE : PLAY;
      b.className = look.className;
      b.title = look.title;
    },
    current() { return this.at > 0 ? GS.data.order[this.at - 1] : null; },
    go(k) {
      const order = GS.data.order;
      this.at = Math.min(Math.max(k, 0), order.length);
      document.getElementById("player-slider").value = this.at;
      const cur = this.current();
      document.getElementById("player-info").textContent = cur === null ? `0 of ${order.length} nodes run`
        : `${this.at} of ${order.length}: ${GS.data.nodes[cur].name}`;
      if (cur !== null && this.at < order.length) GS.select.node(cur, true);
      this.paint();
    },
    paint() {
      const D = GS.data, ran = new Set(D.order.slice(0, this.at)), all = this.at >= D.order.length;
      const cur = all ? null : this.current(), curEl = cur === null ? null : GS.graph.elementOf(cur);
      for (const eid in GS.graph.drawn) {
        const look = GS.graph.looks[eid], members = look.members || (look.node !== undefined ? [look.node] : []);
        const g = GS.graph.drawn[eid];
        g.classList.toggle("pending", !all && !members.some(m => ran.has(m)));
        g.classList.toggle("current", eid === curEl);
      }
      document.querySelectorAll("#graph .gs-edge").forEach(p => {
        p.classList.toggle("incoming", curEl !== null && p.getAttribute("data-target") === curEl);
        p.classList.toggle("outgoing", curEl !== null && p.getAttribute("data-source") === curEl);
      });
    },
  };
})();
