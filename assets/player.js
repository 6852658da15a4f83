/* gradscape: the backward player (clientside callbacks of app/ui/player.py): `advance` moves it (the
 * ticker, the buttons, the keys), `player` follows a new graph or step and selects the node the person
 * steps to, `paint` marks what has run, the current node and its edges on the graph, and `focus` selects
 * and brings into view the selected node (a click on a node selects it here too); the player's node is
 * brought into view as it moves, unless the person is moving the graph (`P.reveal`). The graph is
 * dash-cytoscape's, reachable as window.cy; classes change in place, so stepping through thousands of
 * elements never round-trips through Python. Everything here lives in the page's one namespace,
 * window.gradscape (GS.player: where the player is, GS.player.current). */
(function () {
  const GS = window.gradscape, ID = GS.ids, E = GS.elements;
  const P = GS.player = {current: null, clicks: {prev: 0, next: 0}, hold: undefined, focused: undefined,
                         picked: null};  // picked: the browser's last pick (`P.pick`), {run, node, pick}
  // Someone moving the graph by hand (a drag, held down; a wheel turn, for HANDS_OFF_MS after it): the page
  // does not recentre the graph under them (`P.reveal`)
  const HANDS_OFF_MS = 800, MARGIN = 8;
  P.holding = false;
  P.handled = -Infinity;
  P.handsOn = function () { return P.holding || performance.now() - P.handled < HANDS_OFF_MS; };
  function watchHands(cy) {
    if (cy.__gsHands) return;
    cy.__gsHands = true;
    const box = cy.container(), opts = {capture: true, passive: true};
    const down = function () { P.holding = true; };
    const up = function () { if (P.holding) { P.holding = false; P.handled = performance.now(); } };
    box.addEventListener("mousedown", down, opts);
    box.addEventListener("touchstart", down, opts);
    box.addEventListener("wheel", function () { P.handled = performance.now(); }, opts);
    window.addEventListener("mouseup", up, opts);
    window.addEventListener("touchend", up, opts);
  }
  // Bring `el` (the player's node, or the one selected) into view when it is not, unless someone is moving
  // the graph. An earlier recentring still animating is stopped first (quick steps would queue them, and the
  // view would trail behind the player)
  P.reveal = function (cy, el) {
    if (!cy || !el || !el.length || P.handsOn()) return;
    const b = el.renderedBoundingBox({includeLabels: false}), W = cy.width(), H = cy.height();
    if (b.x1 >= MARGIN && b.y1 >= MARGIN && b.x2 <= W - MARGIN && b.y2 <= H - MARGIN) return;
    cy.stop(true, false);
    cy.animate({center: {eles: el}}, {duration: 150, queue: false});
  };
  // The drawn element of each executed node, for the graph as drawn now (`elements`: dash-cytoscape's): the
  // node itself, or the outermost folded module around it (as the layout folds, app/view/collapse.py). The
  // step's order (app/view/order.py `exec_order`) comes once per step, with each node's module; a fold or an
  // expand sends only the elements, and this runs again over them
  function drawnElements(order, elements) {
    const drawn = new Set(), inCall = {};  // node id -> the folded call that holds it (app/view/call_folds.py)
    (elements || []).forEach(function (e) {
      // dash-cytoscape hands back its elements as {data, position} after a node is dragged or tapped (no
      // `group`): a node is then an element with no edge's `source`
      if (!e.data || (e.group ? e.group !== "nodes" : e.data.source !== undefined)) return;
      drawn.add(e.data.id);
      (e.data.ranges || []).forEach(function (r) { for (let n = r[0]; n <= r[1]; n++) inCall[n] = e.data.id; });
    });
    const hiding = {};  // module index -> its folded element, or null
    const folded = function (m) {
      if (!(m in hiding)) {
        const parts = order.modules[m].split(".");
        hiding[m] = null;
        for (let i = 1; i <= parts.length; i++) {
          const id = E.module + parts.slice(0, i).join(".");
          if (drawn.has(id)) { hiding[m] = id; break; }
        }
      }
      return hiding[m];
    };
    const modOf = order.module_of || [];
    return order.nodes.map(function (n, k) {
      const id = E.node + n;
      return drawn.has(id) ? id : (inCall[n] || (modOf[k] >= 0 ? folded(modOf[k]) : null));
    });
  }
  // A selection made here, in the browser (the player, a click on a node). Noted at once, not when `focus`
  // sees it: a server's answer for a new step arriving in the same moment can replace it in the store
  // before any callback reads it, and `focus` puts it back (see `kept` there)
  P.seq = 0;
  P.pick = function (sel) {
    P.picked = {run: sel.run, node: sel.node, pick: ++P.seq};
    dash_clientside.set_props(ID.SELECTED, {data: Object.assign({}, sel, {pick: P.seq})});
  };
  const clientside = window.dash_clientside = window.dash_clientside || {};
  clientside.gradscape = Object.assign(clientside.gradscape || {}, {
    advance: function (ticks, prev, next, value, max) {
      const trig = (dash_clientside.callback_context.triggered[0] || {}).prop_id || "";
      let v = value || 0;
      // clicks (or ←/→ keys) quicker than the page can answer arrive as one call with a count several higher:
      // each one moves the player
      const seen = P.clicks;
      const by = function (key, now) { const d = Math.max(1, (now || 0) - seen[key]); seen[key] = now || 0; return d; };
      if (trig.startsWith(ID.PREV + ".")) v = Math.max(0, v - by("prev", prev));
      else if (trig.startsWith(ID.NEXT + ".")) v = Math.min(max || 0, v + by("next", next));
      else if (trig.startsWith(ID.TICKER + ".")) v = v >= (max || 0) ? 0 : v + 1;
      return v;
    },
    player: function (value, stepOrder, elements, max) {
      const cy = window.cy;
      if (!stepOrder || !stepOrder.nodes || !stepOrder.nodes.length) return "";
      const last = stepOrder.nodes.length - 1;
      let v = Math.min(value || 0, last);
      const trig = dash_clientside.callback_context.triggered.map(function (t) { return t.prop_id; });
      const fresh = trig.indexOf(ID.EXEC_ORDER + ".data") >= 0;  // a new step (its order comes once per step)
      const redrawn = fresh || trig.indexOf(ID.GRAPH + ".elements") >= 0;  // that, or a fold or an expand
      if (fresh && GS.live) GS.live.drawn();  // the live follow asks for the next step only now (assets/live.js)
      if (redrawn || !P.order || P.order.nodes !== stepOrder.nodes || P.drawnFrom !== elements) {
        P.order = Object.assign({}, stepOrder, {elements: drawnElements(stepOrder, elements)});
        P.drawnFrom = elements;
      }
      const order = P.order;  // the step's order with each node's drawn element
      const prev = P.current;
      // the slider moved by the player itself (below, on an earlier call: `P.hold`), not by the person; seen
      // whatever else changed in the same call (a new step's order may arrive with it)
      const slid = trig.indexOf(ID.SLIDER + ".value") >= 0;
      const held = slid && P.hold !== undefined && P.hold === (value || 0);
      if (slid) P.hold = undefined;
      // which graph this is (its run and backward order), worked out once per new order, not per tick
      const sig = fresh || !prev ? order.run + "|" + order.nodes.join(",") : prev.sig;
      if (fresh && prev) {
        // a new step of the same graph (a run streaming, a fold, the person picking another step) keeps the
        // player's place in the backward order; another graph opens fully executed
        const want = prev.sig === sig ? v : last;
        if (want !== (value || 0)) {
          P.hold = want;  // the slider is set below: that change is not the person moving it
          dash_clientside.set_props(ID.SLIDER, {value: want});
        }
        v = want;
      }
      // the person moved it: also when a new step of the same graph arrives in the same call (Dash merges
      // the two), which dropped their step before
      const moved = slid && !held && !(fresh && (!prev || prev.sig !== sig));
      // a new graph: its first view (assets/graph.js); the first load's graph is shown by graph.js itself
      if (cy && redrawn) GS.graph.shown(cy, order);
      else if (!GS.graph.key) {
        GS.graph.key = GS.graph.keyOf(order);
        GS.graph.run = order.run;
      }
      if (moved) {  // the user moved the player: the graph shows its node and the inspector follows it
        if (cy) P.reveal(cy, cy.getElementById(order.elements[v]));
        P.pick({run: order.run, rank: order.rank || 0, step: order.step, node: order.nodes[v]});
      }
      window.dash_clientside.gradscape.paintWhenReady(v, order, 200);
      P.current = {position: v, node: order.nodes[v], element: order.elements[v], run: order.run,
                                rank: order.rank || 0, step: order.step, sig: sig};
      if (cy) watchHands(cy);
      if (cy && !cy.__gsTap) {
        // a click on a node selects it here, in the browser: a server answer may be dropped when a streamed
        // step changes an input of the same callback while it is in flight, and the click would be lost
        cy.__gsTap = true;
        cy.on("tap", "node", function (evt) {
          const id = evt.target.id(), p = P.current;
          if (p && id.startsWith(E.node) && /^[0-9]+$/.test(id.slice(E.node.length))) {
            P.pick({run: p.run, rank: p.rank, step: p.step, node: parseInt(id.slice(E.node.length), 10)});
          }
        });
      }
      return "#" + v + " of " + order.nodes.length + ": " + order.names[order.name_of[v]] + " (n" + order.nodes[v] + ")";
    },
    paintWhenReady: function (v, order, tries) {
      // on first paint this runs before dash-cytoscape has mounted the graph: wait for it
      const self = window.dash_clientside.gradscape;
      if (window.cy && window.cy.nodes().length) self.paint(v, order);
      else if (tries > 0) setTimeout(function () { self.paintWhenReady(v, order, tries - 1); }, 50);
    },
    paint: function (v, order) {
      const cy = window.cy;
      if (cy) {
        cy.batch(function () {
          cy.elements().removeClass("executed current pending incoming outgoing");
          const done = new Set();
          for (let k = 0; k <= v; k++) if (order.elements[k]) done.add(order.elements[k]);
          cy.nodes().forEach(function (n) {
            if (n.isParent() || n.hasClass("module")) return;
            n.addClass(done.has(n.id()) ? "executed" : "pending");
          });
          const cur = order.elements[v] ? cy.getElementById(order.elements[v]) : null;
          if (cur && cur.length) {
            cur.removeClass("pending").addClass("current");
            cur.incomers("edge").addClass("incoming");
            cur.outgoers("edge").addClass("outgoing");
          }
        });
      }
    },
    focus: function (selected, _stepOrder) {
      const cy = window.cy, order = P.order;
      // a server's answer for a new step keeps the node its request held (`kept`), from the state of the
      // browser's pick number `pick`; when the person picked again since (the player, a click: `P.pick`),
      // their newer pick stays, in the new step
      const picked = P.picked;
      if (selected && selected.kept && picked && picked.run === selected.run && (selected.pick || 0) < picked.pick
          && selected.node !== picked.node) {
        dash_clientside.set_props(ID.SELECTED, {data: {run: selected.run, rank: selected.rank || 0,
                                                       step: selected.step, node: picked.node, pick: picked.pick}});
        return window.dash_clientside.no_update;
      }
      // a node chosen through the server (the find box, a deep link, the page's first node) is the newest
      // pick from now on: a new step's answer from a state before it must not take it back
      if (selected && !selected.kept && !(picked && picked.run === selected.run && picked.node === selected.node
                                         && picked.pick === selected.pick)) {
        P.picked = {run: selected.run, node: selected.node, pick: ++P.seq};
      }
      if (cy && selected) {
        let el = cy.getElementById(E.node + selected.node);
        if (!el.length && order) {
          const k = order.nodes.indexOf(selected.node);
          if (k >= 0 && order.elements[k]) el = cy.getElementById(order.elements[k]);
        }
        if (el.length) {
          cy.elements(":selected").unselect();
          el.select();
          // another node chosen: bring it into view and show its inspector from the top; the same node in
          // a new step (a run streaming) leaves the view and the inspector's scroll as the person left them
          const key = selected.run + "/" + selected.node;
          // the page's first node (the player's, as served) keeps the first view (assets/graph.js)
          if (key !== P.focused && P.focused !== undefined) {
            const ins = document.getElementById(ID.INSPECTOR);
            if (ins) ins.scrollTop = 0;
            if (GS.scroll) { GS.scroll.want = 0; GS.scroll.pulled = false; }
            P.reveal(cy, el);
          }
          P.focused = key;
        }
      }
      return "gs-graph";
    },
  });
})();
