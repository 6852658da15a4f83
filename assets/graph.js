/* gradscape graph view: the first viewport of a graph (labels legible), the full label on hover,
 * and the graph's "fit" and "zoom to selection" buttons (GS.graph, in the page's one namespace,
 * window.gradscape). dash-cytoscape's graph is window.cy.
 * Labels are 12 px in model units; LEGIBLE is the least zoom at which they are 9 px on screen. */
(function () {
  const GS = window.gradscape, ID = GS.ids;  // the page's one namespace (its ids written into the page by the server)
  const LEGIBLE = 9 / 12, MAX_OPEN = 1.5, PAD = 12;
  const G = GS.graph = GS.graph || {};

  // A new graph: the whole of it when that keeps labels legible, else as much of it as legible labels
  // allow (never a zoom that fits its width only: a tall graph became a narrow column of unreadable
  // labels), from the top (the loss end), centred on the root when wider than the panel.
  G.open = function (cy) {
    G.opened = true;
    const eles = cy.elements();
    if (!eles.length) return;
    const bb = eles.boundingBox(), W = cy.width(), H = cy.height();
    const whole = Math.min((W - 2 * PAD) / bb.w, (H - 2 * PAD) / bb.h);
    if (whole >= LEGIBLE) {
      const z = Math.min(whole, MAX_OPEN);
      cy.viewport({zoom: z, pan: {x: W / 2 - z * (bb.x1 + bb.w / 2), y: H / 2 - z * (bb.y1 + bb.h / 2)}});
      return;
    }
    const z = LEGIBLE;
    let cx = bb.x1 + bb.w / 2;
    if (bb.w * z > W - 2 * PAD) {
      const root = cy.nodes(".root");
      cx = root.length ? root.position().x : cx;
    }
    cy.viewport({zoom: z, pan: {x: W / 2 - z * cx, y: PAD - z * bb.y1}});
  };

  // The same step again (a module folded or opened, another colouring): keep the view. After a click
  // on a module, keep the zoom and keep what was on screen where it was: the pan that leaves the nodes
  // shown before (the median of their moves; sideways all of them, up and down those above the module,
  // as what is below it must move down to make room), then moved only as far as needed to show the
  // module's top and as much of it as fits.
  G.refresh = function (cy) {
    const id = G.tapped, at = G.tappedAt, shown = G.shownBefore || {};
    G.tapped = G.tappedAt = G.shownBefore = null;
    if (!id) return;  // a new colouring, or a search hit revealed (the focus brings it into view)
    // a folded call (`c:cell#17`), the calls not drawn yet (`c:cell#more`) or a run of ops (`o:scan#0.3`) open
    // inside their module's box
    const name = id.startsWith("c:") || id.startsWith("o:") ? id.slice(2, id.lastIndexOf("#")) : id.slice(2);
    let el = cy.getElementById("g:" + name);
    if (!el.length) el = cy.getElementById("m:" + name);
    if (!el.length) return;
    const z = Math.max(cy.zoom(), LEGIBLE), bb = el.boundingBox(), W = cy.width(), H = cy.height();
    const px = [], py = [];
    for (const key in shown) {
      const n = cy.getElementById(key);
      if (!n.length || n.isParent() || key === id) continue;
      const p = n.position(), was = shown[key];
      px.push(was.x - z * p.x);
      if (at && was.y < at.y) py.push(was.y - z * p.y);
    }
    const anchor = at || {x: W / 2, y: PAD};
    let x = px.length ? median(px) : anchor.x - z * (bb.x1 + bb.w / 2);
    let y = py.length ? median(py) : anchor.y - z * bb.y1;
    const top = z * bb.y1 + y, bottom = top + z * bb.h, left = z * bb.x1 + x, right = left + z * bb.w;
    if (bottom > H - PAD) y -= Math.min(bottom - (H - PAD), top - PAD);
    if (top < PAD) y += PAD - top;
    if (z * bb.w > W - 2 * PAD) x = W / 2 - z * (bb.x1 + bb.w / 2);
    else if (left < PAD) x += PAD - left;
    else if (right > W - PAD) x -= right - (W - PAD);
    cy.viewport({zoom: z, pan: {x: x, y: y}});
  };

  function median(xs) {
    const s = xs.slice().sort((a, b) => a - b), m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  }

  // where the nodes on screen are drawn now (rendered positions), for G.refresh
  function onScreen(cy) {
    const out = {}, W = cy.width(), H = cy.height();
    cy.nodes().forEach(function (n) {
      if (n.isParent()) return;
      const p = n.renderedPosition();
      if (p.x >= 0 && p.x <= W && p.y >= 0 && p.y <= H) out[n.id()] = {x: p.x, y: p.y};
    });
    return out;
  }

  // a view the person asks for wins over the page's own recentring (assets/player.js), which animates:
  // stop that first, or its later frames would move the view away again
  G.fit = function (cy) { cy.stop(true, false); cy.fit(undefined, PAD); };

  G.zoomToSelection = function (cy) {
    let el = cy.elements(":selected");
    const current = GS.player && GS.player.current;
    if (!el.length && current && current.element) {
      el = cy.getElementById(current.element);
    }
    if (!el.length) return;
    cy.stop(true, false);
    cy.fit(el, 80);
    if (cy.zoom() > MAX_OPEN) cy.zoom({level: MAX_OPEN, position: el.position ? el.boundingBox() && {
      x: (el.boundingBox().x1 + el.boundingBox().x2) / 2, y: (el.boundingBox().y1 + el.boundingBox().y2) / 2} : undefined});
  };

  // hover: the element's full label (and what it is), wherever the label is cut or too small to read
  function tip() {
    let el = document.getElementById("graph-hover");
    if (!el) {
      el = document.createElement("div");
      el.id = "graph-hover";
      el.className = "gs-graph-hover";
      document.body.appendChild(el);
    }
    return el;
  }

  function attach(cy) {
    if (cy.__gsGraph) return;
    cy.__gsGraph = true;
    cy.on("mouseover mousemove", "node", function (evt) {
      const d = evt.target.data(), t = tip();
      t.textContent = (d.label || d.id) + (d.title ? "\n" + d.title : "");
      const box = cy.container().getBoundingClientRect(), p = evt.renderedPosition || {x: 0, y: 0};
      t.style.left = (box.left + window.scrollX + p.x + 14) + "px";
      t.style.top = (box.top + window.scrollY + p.y + 14) + "px";
      t.style.display = "block";
    });
    cy.on("mouseout", "node", function () { tip().style.display = "none"; });
    cy.on("viewport", function () { tip().style.display = "none"; });
    cy.on("tap", "node", function (evt) {
      const id = evt.target.id();
      if (!["m:", "g:", "c:", "o:"].some(function (p) { return id.startsWith(p); })) return;  // app/view/ids.py
      const r = evt.target.renderedBoundingBox();
      G.tapped = id;
      // the click is answered at once, in words, while the server lays the graph out (a fold of a
      // 100k-node loop takes a moment): the graph's answer replaces the line
      const label = (evt.target.data("label") || id).split("\n");  // a run: its module and which ops
      const what = id.startsWith("g:") ? "folding " + (id.indexOf("#") >= 0 ? label[0] : id.slice(2))
        : "opening " + (id.startsWith("o:") ? label.join(" · ") : label[0]);
      window.dash_clientside.set_props(ID.GRAPH_INFO, {children: what + "…"});
      G.tappedAt = {x: (r.x1 + r.x2) / 2, y: r.y1};  // where the module is on screen (G.refresh keeps it)
      G.shownBefore = onScreen(cy);
    });
  }

  document.addEventListener("click", function (evt) {
    const cy = window.cy;
    if (!cy || !evt.target || !evt.target.closest) return;
    if (evt.target.closest("#" + ID.GRAPH_FIT)) G.fit(cy);
    else if (evt.target.closest("#" + ID.GRAPH_ZOOM_SELECTION)) G.zoomToSelection(cy);
  });

  // which graph an execution order belongs to: "run/step", with the rank after it on any rank but 0
  G.keyOf = function (order) { return order.run + "/" + order.step + (order.rank ? "/rank " + order.rank : ""); };

  // called by the player when a graph arrives: a fold or an expansion (same step) keeps the zoom and
  // shows what was tapped; a new step or another rank of the same run (a live run streaming) keeps the
  // view as the person left it (node ids are stable for the same model); another run opens afresh
  G.shown = function (cy, order) {
    attach(cy);
    const key = order ? G.keyOf(order) : "";
    const run = order ? order.run : null;
    if (key && key === G.key) G.refresh(cy);
    else if (run !== null && run === G.run && G.opened) G.tapped = null;
    else G.open(cy);
    G.key = key;
    G.run = run;
  };

  // the first load's graph (drawn from the page's own layout, before any callback)
  const wait = setInterval(function () {
    const cy = window.cy;
    if (!cy || !cy.nodes().length) return;
    clearInterval(wait);
    attach(cy);
    if (!G.opened) G.open(cy);
  }, 50);
})();
