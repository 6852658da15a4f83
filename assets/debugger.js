// The breakpoint panel (app/ui/debugger.py). Notifications on /ui say which run changed; the state is
// read from the JSON API (app/api/debugger.py) and written to the page with set_props.
window.dash_clientside = window.dash_clientside || {};
(function () {
  const GS = window.gradscape, ID = GS.ids, E = GS.elements;  // the page's one namespace
  const D = GS.debug = {paused: null, pick: null, seq: 0};  // the pause shown, the row picked, the newest read
  const MARK = "node.gs-bp-mark";  // a class no element has: it tags the stylesheet rules added here
  const api = function (run, rest) {
    return new URL("/api/runs/" + encodeURIComponent(run) + rest, window.location.origin);
  };
  const h = function (type, props, children) {
    return {type: type, namespace: "dash_html_components", props: Object.assign({children: children}, props || {})};
  };
  const num = function (v) {
    if (v === null || v === undefined) return "—";
    return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : (+v.toFixed(4)).toString();
  };
  const grads = function (ts) {
    return (ts || []).filter(function (t) { return t; }).map(function (t) {
      const s = t.stats || {};
      let txt = "[" + t.shape.join("×") + "] ‖·‖ " + num(s.norm) + " min " + num(s.min) + " max " + num(s.max);
      if (s.nan) txt += " NaN×" + s.nan;
      if (s.inf) txt += " Inf×" + s.inf;
      return txt;
    }).join("; ");
  };
  const bad = function (ts) {
    return (ts || []).some(function (t) { return t && t.stats && (t.stats.nan || t.stats.inf); });
  };
  const describe = function (bp) {
    if (bp.on === "node") return "id" in bp ? "node #" + bp.id : "node " + bp.name;
    if (bp.on === "module") return "module " + bp.name;
    if (bp.on === "norm") return "‖grad‖ > " + bp.above;
    return "non-finite gradient";
  };
  const sheet = function (base, nodes, current) {
    const kept = (base || []).filter(function (r) { return r.selector.indexOf(MARK) < 0; });
    if (!nodes) return kept;
    const ran = nodes.map(function (n) { return "node#" + E.node + n.id; });
    return kept.concat([
      {selector: "node, " + MARK, style: {"opacity": 0.3}},
      {selector: ran.concat([MARK]).join(", "), style: {"opacity": 1, "border-color": "#2a9d2a", "border-width": 3}},
      {selector: "node#" + E.node + current + ", " + MARK, style: {"opacity": 1, "border-color": "#1f4fd1", "border-style": "double", "border-width": 7,
                                                           "z-index": 20}},
    ]);
  };
  const pick = function (key, node, order) {
    // which paused node the heatmaps show (ids.BP_PICK: nothing streamed changes it, so Dash keeps the answer)
    const p = D.paused;
    D.pick = {key: key, node: node, order: order};
    window.dash_clientside.set_props(ID.BP_PICK, {data: {run: p.run, step: p.step, executed: p.executed, node: node,
                                                         order: order, at: Date.now()}});
  };
  document.addEventListener("click", function (e) {
    // a click on a row of the partial backward shows that node's gradients
    const tr = e.target && e.target.closest ? e.target.closest("#" + ID.BP_NODES + " tr[data-order]") : null;
    if (!tr || !D.paused || !D.pick) return;
    pick(D.pick.key, +tr.getAttribute("data-node"), +tr.getAttribute("data-order"));
    tr.parentNode.querySelectorAll("tr.gs-bp-picked").forEach(function (r) { r.classList.remove("gs-bp-picked"); });
    tr.classList.add("gs-bp-picked");
  });
  const getJson = function (url) {
    return fetch(url, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : null; });
  };

  window.dash_clientside.gradscapeDebug = {
    refresh: function (notePaused, noteBps, run, stylesheet) {
      const nu = window.dash_clientside.no_update;
      const trig = ((dash_clientside.callback_context.triggered || [])[0] || {}).prop_id || "";
      const note = trig.endsWith("data-paused") ? notePaused : trig.endsWith("data-breakpoints") ? noteBps : null;
      if (!run) return nu;
      const seq = ++D.seq;
      const set = window.dash_clientside.set_props;
      if (note && note.catchup && (note.runs || []).indexOf(run) < 0) {
        // the server's catch-up on connecting: nothing paused or set for this run, nothing to read
        if (D.paused) {
          set(ID.BP_BANNER, {style: {display: "none"}});
          set(ID.GRAPH, {stylesheet: sheet(stylesheet, null)});
          D.paused = null;
        }
        return seq;
      }
      if (note && !note.catchup && note.run !== run) return nu;
      Promise.all([getJson(api(run, "/paused")), getJson(api(run, "/breakpoints"))]).then(function (res) {
        const paused = res[0], bps = res[1];
        if (seq !== D.seq) return null;
        if (bps) {
          set(ID.BP_LIST, {children: bps.breakpoints.length ? "breaks on: " + bps.breakpoints.map(describe).join(", ")
                                                           : "no breakpoints"});
        }
        if (!paused || !paused.paused) {
          set(ID.BP_BANNER, {style: {display: "none"}});
          set(ID.GRAPH, {stylesheet: sheet(stylesheet, null)});
          if (D.paused) set(ID.BP_HEATMAPS, {children: null});  // not shown with the next pause's rows
          D.paused = null;
          return null;
        }
        return getJson(api(run, "/paused/nodes")).then(function (doc) {
          if (seq !== D.seq || !doc) return;
          const n = doc.node;
          D.paused = {run: run, step: doc.step, node: n.id, executed: doc.executed};
          // the heatmaps show the paused node, or the row last clicked during this same pause
          const key = run + "|" + doc.step + "|" + doc.executed + "|" + n.id;
          if (!D.pick || D.pick.key !== key) {
            const last = doc.nodes[doc.nodes.length - 1] || {id: n.id, order: doc.executed - 1};
            pick(key, last.id, last.order);
          }
          set(ID.BP_WHERE, {children: "paused in step " + doc.step + " at " + n.name + " #" + n.id +
                                     (n.module ? " (" + n.module + ")" : "") + (n.source ? " · " + n.source : "") +
                                     " · " + doc.executed + " nodes run"});
          const rows = doc.nodes.slice().reverse().map(function (x) {
            const sent = x.grad_inputs === null ? x.grad_outputs : x.grad_inputs;
            const cls = (x.order === doc.nodes.length - 1 ? "gs-bp-current" : "") +
              (x.order === D.pick.order ? " gs-bp-picked" : "");
            return h("Tr", {className: cls.trim(), "data-node": String(x.id), "data-order": String(x.order),
                            title: x.thumbs ? "" : "statistics only: its heatmap was not sent (over the pause's budget)"}, [
              h("Td", {}, String(x.order)), h("Td", {}, x.name + " #" + x.id),
              h("Td", {}, x.module || x.param || ""),
              h("Td", {className: bad(sent) ? "gs-bp-bad" : ""}, grads(sent))]);
          });
          set(ID.BP_NODES, {children: h("Table", {}, h("Tbody", {}, rows))});
          set(ID.BP_BANNER, {style: {display: "block"}});
          set(ID.GRAPH, {stylesheet: sheet(stylesheet, doc.nodes, n.id)});
        });
      }).catch(function () { /* offline: the next notification or reconnect reads the state again */ });
      return seq;
    },
    // the threshold box only for the breakpoint it applies to ("a gradient norm above")
    thresholdShown: function (kind) { return kind === "norm" ? {} : {display: "none"}; },
    write: function (setClicks, clearClicks, stepClicks, contClicks, kind, above, selected, run, step) {
      const trig = ((dash_clientside.callback_context.triggered || [])[0] || {}).prop_id || "";
      const set = window.dash_clientside.set_props;
      const fail = function (msg) { set(ID.BP_LIST, {children: h("Span", {className: "gs-bp-error"}, msg)}); };
      if (!run) { fail("no run to break in"); return null; }
      const send = function (method, rest, body) {
        return fetch(api(run, rest), {method: method, credentials: "same-origin",
                                      headers: {"Content-Type": "application/json"},
                                      body: body ? JSON.stringify(body) : undefined})
          .then(function (r) { return r.json().then(function (b) { if (!r.ok) fail(b.error || r.statusText); return b; }); })
          .catch(function (e) { fail(String(e)); });
      };
      if (trig.startsWith(ID.BP_STEP + ".") || trig.startsWith(ID.BP_CONTINUE + ".")) {
        send("POST", "/resume", {mode: trig.startsWith(ID.BP_STEP + ".") ? "step" : "continue"});
        return trig;
      }
      if (trig.startsWith(ID.BP_CLEAR + ".")) { send("DELETE", "/breakpoints"); return trig; }
      if (kind === "nonfinite") { send("POST", "/breakpoints", {on: "nonfinite"}); return trig; }
      if (kind === "norm") {
        if (typeof above !== "number") { fail("type a number for the norm threshold"); return null; }
        send("POST", "/breakpoints", {on: "norm", above: above});
        return trig;
      }
      if (!selected || selected.node === undefined || selected.node === null) {
        fail("select a node in the graph first");
        return null;
      }
      if (kind === "node-id") { send("POST", "/breakpoints", {on: "node", id: selected.node}); return trig; }
      getJson(api(selected.run || run, "/steps/" + (selected.step ?? step) + "/nodes/" + selected.node +
                  (selected.rank ? "?rank=" + selected.rank : ""))).then(function (n) {
        if (!n) { fail("cannot read node " + selected.node); return; }
        if (kind === "module") {
          const m = n.module || (n.param ? n.param.split(".").slice(0, -1).join(".") : null);
          if (!m) { fail(n.name + " belongs to no module"); return; }
          send("POST", "/breakpoints", {on: "module", name: m});
        } else {
          send("POST", "/breakpoints", {on: "node", name: n.name});
        }
      });
      return trig;
    },
  };
})();
