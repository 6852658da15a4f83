/* gradscape: what runs in the browser (clientside callbacks): the backward player and focus, the
 * deep-link parser and the connection badge.
 * The graph is dash-cytoscape's, reachable as window.cy; classes change in place, so stepping
 * through thousands of elements never round-trips through Python. */
/* dash-cytoscape always hands cytoscape its own default wheelSensitivity (1), and cytoscape warns about
 * a "custom" wheel sensitivity whenever the option is present at all: that one message is dropped, so
 * the console shows only what needs attention. Runs before the graph is created (assets load first). */
(function () {
  const warn = console.warn;
  console.warn = function (msg) {
    if (typeof msg === "string" && msg.indexOf("You have set a custom wheel sensitivity") === 0) return;
    return warn.apply(console, arguments);
  };
})();

/* the page's element ids, from app/ui/ids.py (the server writes them into the page before the assets) */
var ID = window.gradscapeIds;

/* the address the page was opened with: only that one can pin a step (the page writes each selection
 * into the address later on, and those are not links someone opened) */
window.__gsOpenedWith = window.location.search;

window.dash_clientside = Object.assign({}, window.dash_clientside, {
  gradscape: {
    deepLink: function (search, selected) {
      // "?run=r&rank=1&step=3&node=12" → {run: "r", rank: 1, step: 3, node: 12} set on ID.DEEP_LINK; nothing
      // without a link (set here, not returned: app/ui/callbacks.py says why). No rank: rank 0 (the page writes rank= only for another rank, app/ui/address.py). Nothing
      // either for the address the page wrote itself for the selection it shows (read back as a link, it
      // took the step list back to the selection's step while a run streamed on)
      const q = new URLSearchParams(search || "");
      const out = {};
      if (q.get("run")) out.run = q.get("run");
      ["rank", "step", "node"].forEach(function (key) {
        const v = q.get(key);
        if (v && /^-?[0-9]+$/.test(v)) out[key] = parseInt(v, 10);
      });
      if (selected && window.__gsLinkRead && out.run === selected.run && (out.rank || 0) === (selected.rank || 0) &&
          out.step === selected.step && out.node === selected.node) return;
      // a link that names a step pins it: "follow live" goes off (visibly). Only the address the page
      // was opened with: the page itself writes the selection into the address later on
      if (!window.__gsLinkRead) {
        window.__gsLinkRead = true;
        if (out.step !== undefined && (search || "") === window.__gsOpenedWith) {
          window.__gsPinned = true;  // until the person ticks "follow live" again (the box may not show it yet)
          window.dash_clientside.set_props(ID.FOLLOW, {value: []});
        }
      }
      if (Object.keys(out).length) window.dash_clientside.set_props(ID.DEEP_LINK, {data: out});
    },
    liveRuns: function (note, current) {
      // a new run → the run list from the JSON API (oldest update first, as the server lists them);
      // the run shown stays, or the newest one is shown when there was none
      if (!note) return window.dash_clientside.no_update;
      const seq = (window.__gsRunSeq = (window.__gsRunSeq || 0) + 1);
      fetch(new URL("/api/runs", window.location.origin), {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body || !body.runs || seq !== window.__gsRunSeq) return;
          const runs = body.runs.slice().sort(function (a, b) { return (a.updated > b.updated) - (a.updated < b.updated); });
          if (!runs.length) return;
          const names = runs.map(function (r) { return r.run; });
          window.dash_clientside.set_props(ID.RUN_SELECT, {
            options: runs.map(function (r) { return {label: r.run + " (" + r.steps + " steps)", value: r.run}; }),
            value: names.indexOf(current) >= 0 ? current : names[names.length - 1]});
        })
        .catch(function () { /* offline: the next notification brings the list up to date */ });
      return seq;
    },
    liveSteps: function (note, run, rank, current, shown, follow, rankOptions) {
      // a step notification for this run (of any rank), or the server's catch-up on (re)connecting → read
      // the steps of the rank shown from the JSON API and set the step list; the newest answer wins (a
      // sequence number), and only while that run and rank are still shown
      const nu = window.dash_clientside.no_update;
      const r = rank || 0;
      window.__gsStepsOf = run + "\n" + r;  // another run or rank chosen: its step list comes from the server
      const trig = (dash_clientside.callback_context.triggered || []).map(function (t) { return t.prop_id; });
      if (trig.indexOf(ID.SOCKET + ".data-step") < 0) return nu;
      if (!note || !run || (!note.catchup && note.run !== run)) return nu;
      const seq = (window.__gsStepSeq = (window.__gsStepSeq || 0) + 1);
      fetch(new URL("/api/runs/" + encodeURIComponent(run) + "/steps" + (r ? "?rank=" + r : ""),
                    window.location.origin), {credentials: "same-origin"})
        .then(function (res) { return res.ok ? res.json() : null; })
        .then(function (body) {
          if (!body || !body.steps || seq !== window.__gsStepSeq || window.__gsStepsOf !== run + "\n" + r) return;
          // a rank that started storing steps after the page loaded joins the rank select (shown from two)
          const ranks = body.ranks || [];
          const hadRanks = (rankOptions || []).map(function (o) { return o.value; });
          if (ranks.length && ranks.join(",") !== hadRanks.join(",")) {
            window.dash_clientside.set_props(ID.RANK_SELECT, {
              options: ranks.map(function (k) { return {label: "rank " + k, value: k}; }), disabled: ranks.length < 2});
            window.dash_clientside.set_props(ID.RANK_FIELD, {style: ranks.length < 2 ? {display: "none"} : {}});
          }
          const steps = body.steps.map(function (s) { return s.step; });
          const had = (shown || []).map(function (o) { return o.value; });
          // nothing new (the catch-up, or another rank's step) leaves the page where it is (a deep link may
          // have moved it)
          if (steps.join(",") === had.join(",")) return;
          if (!steps.length) return;
          // "follow live" as the page shows it now (a deep link may have just turned it off), else as it was
          const box = document.querySelector("#" + ID.FOLLOW + " input");
          const following = !window.__gsPinned && (box ? box.checked : !!(follow && follow.length));
          const props = {options: steps.map(function (s) { return {label: "step " + s, value: s}; })};
          // not following: the step shown stays; `current` may be stale by now (a deep link moved it), so
          // the value is set only when following or when the step shown is gone
          if (following || steps.indexOf(current) < 0) props.value = steps[steps.length - 1];
          window.dash_clientside.set_props(ID.STEP_SELECT, props);
        })
        .catch(function () { /* offline: the catch-up on reconnecting brings the list up to date */ });
      return seq;
    },
    problemPick: function (_clicks, run, step, rank) {
      // a click on a problem line (its id names the node) → {run, rank, step, node, at}; new lines (a step
      // change) also fire this, with no click: nothing then
      const t = (dash_clientside.callback_context.triggered || [])[0];
      if (!t || !t.value || !run || step === null || step === undefined) return window.dash_clientside.no_update;
      let id;
      try { id = JSON.parse(t.prop_id.slice(0, t.prop_id.lastIndexOf("."))); } catch (e) { return window.dash_clientside.no_update; }
      return {run: run, rank: rank || 0, step: step, node: id.node, at: Date.now()};
    },
    connection: function (connected, tracer) {
      // the /ui socket's state, and the tracer's own counts when it reports them
      if (connected === false) return ["offline: no connection to the server", "gs-connection offline"];
      if (!connected) return ["connecting…", "gs-connection"];
      let text = "live";
      if (tracer && typeof tracer === "object" && !Array.isArray(tracer)) {
        const get = function (k, d) { const v = k in tracer ? tracer[k] : d; return v === null || v === undefined ? "None" : v; };
        text += " · tracer " + get("run") + " " + get("state") + " · sent " + get("sent", 0) + ", spilled " +
          get("spilled", 0) + ", dropped " + get("dropped", 0);
      }
      return [text, "gs-connection live"];
    },
    advance: function (ticks, prev, next, value, max) {
      const trig = (dash_clientside.callback_context.triggered[0] || {}).prop_id || "";
      let v = value || 0;
      // clicks (or ←/→ keys) quicker than the page can answer arrive as one call with a count several higher:
      // each one moves the player
      const seen = window.__gsClicks || (window.__gsClicks = {prev: 0, next: 0});
      const by = function (key, now) { const d = Math.max(1, (now || 0) - seen[key]); seen[key] = now || 0; return d; };
      if (trig.startsWith(ID.PREV + ".")) v = Math.max(0, v - by("prev", prev));
      else if (trig.startsWith(ID.NEXT + ".")) v = Math.min(max || 0, v + by("next", next));
      else if (trig.startsWith(ID.TICKER + ".")) v = v >= (max || 0) ? 0 : v + 1;
      return v;
    },
    player: function (value, order, _elements, max) {
      const cy = window.cy;
      if (!order || !order.nodes || !order.nodes.length) return "";
      const last = order.nodes.length - 1;
      let v = Math.min(value || 0, last);
      const trig = dash_clientside.callback_context.triggered.map(function (t) { return t.prop_id; });
      const fresh = trig.indexOf(ID.EXEC_ORDER + ".data") >= 0;
      const prev = window.gradscapePlayer;
      // which graph this is (its run and backward order), worked out once per new order, not per tick
      const sig = fresh || !prev ? order.run + "|" + order.nodes.join(",") : prev.sig;
      if (fresh && prev) {
        // a new step of the same graph (a run streaming, a fold, the person picking another step) keeps the
        // player's place in the backward order; another graph opens fully executed
        const want = prev.sig === sig ? v : last;
        if (want !== (value || 0)) {
          window.__gsHold = want;  // the slider is set below: that change is not the person moving it
          dash_clientside.set_props(ID.SLIDER, {value: want});
        }
        v = want;
      }
      const held = !fresh && window.__gsHold === v;
      if (!fresh) window.__gsHold = undefined;
      const moved = trig.indexOf(ID.SLIDER + ".value") >= 0 && !fresh && !held;  // the person moved it
      // a new graph: its first view (assets/graph.js); the first load's graph is shown by graph.js itself
      if (cy && fresh) window.gradscapeGraph.shown(cy, order);
      else if (!window.gradscapeGraph.key) {
        window.gradscapeGraph.key = window.gradscapeGraph.keyOf(order);
        window.gradscapeGraph.run = order.run;
      }
      if (moved) {  // the user moved the player: the inspector follows its current node
        dash_clientside.set_props(ID.SELECTED, {data: {run: order.run, rank: order.rank || 0, step: order.step,
                                                           node: order.nodes[v]}});
      }
      window.dash_clientside.gradscape.paintWhenReady(v, order, 200);
      window.gradscapePlayer = {position: v, node: order.nodes[v], element: order.elements[v], run: order.run,
                                rank: order.rank || 0, step: order.step, sig: sig};
      if (cy && !cy.__gsTap) {
        // a click on a node selects it here, in the browser: a server answer may be dropped when a streamed
        // step changes an input of the same callback while it is in flight, and the click would be lost
        cy.__gsTap = true;
        cy.on("tap", "node", function (evt) {
          const id = evt.target.id(), p = window.gradscapePlayer;
          if (p && /^n[0-9]+$/.test(id)) {
            dash_clientside.set_props(ID.SELECTED, {data: {run: p.run, rank: p.rank, step: p.step,
                                                               node: parseInt(id.slice(1), 10)}});
          }
        });
      }
      return "#" + v + " of " + order.nodes.length + ": " + order.names[v] + " (n" + order.nodes[v] + ")";
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
    focus: function (selected, order) {
      const cy = window.cy;
      if (cy && selected) {
        let el = cy.getElementById("n" + selected.node);
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
          if (key !== window.__gsFocused && window.__gsFocused !== undefined) {
            const ins = document.getElementById(ID.INSPECTOR);
            if (ins) ins.scrollTop = 0;
            if (window.gradscapeScroll) { window.gradscapeScroll.want = 0; window.gradscapeScroll.pulled = false; }
            const ext = cy.extent(), p = el.position();
            if (p.x < ext.x1 || p.x > ext.x2 || p.y < ext.y1 || p.y > ext.y2) cy.animate({center: {eles: el}}, {duration: 200});
          }
          window.__gsFocused = key;
        }
      }
      return "gs-graph";
    },
  },
});

/* The inspector's scroll position holds while its content is rendered again for a new step: the new
 * content can briefly stand shorter than the old, which pulls the scroll up; once it has grown back, the
 * position the person chose is put back. Shorter content only ever pulls the scroll up, and only when
 * content is replaced or the scroll sits at the new bottom; every other move is the person's (a wheel, a
 * drag, find-in-page, a script) and becomes the position to keep. The content's changes are seen (a
 * MutationObserver) before the scroll events they cause. A new node starts at the top (`focus` sets
 * `want` to 0). */
(function () {
  const S = window.gradscapeScroll = {want: null, pulled: false, input: -1e9};
  const used = function () { S.input = performance.now(); };
  const touched = function () { return performance.now() - S.input < 1000; };
  function keep(ins, replaced) {  // after a change of the content
    const top = ins.scrollTop, bottom = ins.scrollHeight - ins.clientHeight;
    if (S.want === null || top > S.want || touched()) { S.want = top; S.pulled = false; return; }
    if (top === S.want) { S.pulled = false; return; }
    if (S.pulled || replaced || top >= bottom - 1) {
      S.pulled = bottom < S.want;
      if (!S.pulled) ins.scrollTop = S.want;
    } else {
      S.want = top;
    }
  }
  function moved(ins) {  // a scroll event
    const top = ins.scrollTop;
    if (S.pulled && !touched() && top >= ins.scrollHeight - ins.clientHeight - 1) return;  // held at the bottom
    S.want = top;
    S.pulled = false;
  }
  const wait = setInterval(function () {
    const ins = document.getElementById(ID.INSPECTOR);
    if (!ins) return;
    clearInterval(wait);
    for (const t of ["wheel", "keydown", "pointerdown", "touchmove"]) ins.addEventListener(t, used, {passive: true});
    ins.addEventListener("scroll", function () { moved(ins); });
    new MutationObserver(function (records) {
      keep(ins, records.some(function (r) { return r.removedNodes.length > 0; }));
    }).observe(ins, {childList: true, subtree: true, attributes: true});
  }, 50);
})();

document.addEventListener("click", function (evt) {
  if (evt.target && evt.target.closest && evt.target.closest("#" + ID.FOLLOW)) window.__gsPinned = false;
});

/* Keys: left/right step the player, space plays or pauses, f fits the graph, Esc clears the selection.
 * Not while typing (the find box or any other field). */
document.addEventListener("keydown", function (evt) {
  if (evt.ctrlKey || evt.metaKey || evt.altKey) return;
  const t = evt.target;
  if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) return;
  const click = function (id) { const b = document.getElementById(id); if (b) b.click(); };
  const cy = window.cy;
  if (evt.key === "ArrowLeft") click(ID.PREV);
  else if (evt.key === "ArrowRight") click(ID.NEXT);
  else if (evt.key === " ") click(ID.PLAY);
  else if (evt.key === "f" && cy && window.gradscapeGraph && window.gradscapeGraph.fit) window.gradscapeGraph.fit(cy);
  else if (evt.key === "Escape") {
    if (cy) cy.elements(":selected").unselect();
    window.__gsFocused = undefined;
    window.dash_clientside.set_props(ID.SELECTED, {data: null});
  } else return;
  evt.preventDefault();
});
