/* gradscape: deep links and picks, what selects a node from outside the graph (clientside callbacks of
 * app/ui/runs.py, app/ui/problems.py and app/ui/selection.py): the address the page was opened with
 * (`deepLink`; a link that names a step pins it: "follow live" goes off until the person ticks it again), a
 * click on a line of the problems panel (`problemPick`) and a node picked in the find box (`searchPick`).
 * Everything here lives in the page's one namespace, window.gradscape. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  /* the address the page was opened with: only that one can pin a step (the page writes each selection
   * into the address later on, and those are not links someone opened) */
  GS.link = {openedWith: window.location.search, read: false, pinned: false};
  const clientside = window.dash_clientside = window.dash_clientside || {};
  clientside.gradscape = Object.assign(clientside.gradscape || {}, {
    deepLink: function (search, selected) {
      // "?run=r&rank=1&step=3&node=12" → {run: "r", rank: 1, step: 3, node: 12} set on ID.DEEP_LINK; nothing
      // without a link (set here, not returned: app/ui/runs.py says why). No rank: rank 0 (the page writes rank= only for another rank, app/ui/address.py). Nothing
      // either for the address the page wrote itself for the selection it shows (read back as a link, it
      // took the step list back to the selection's step while a run streamed on)
      const q = new URLSearchParams(search || "");
      const out = {};
      if (q.get("run")) out.run = q.get("run");
      ["rank", "step", "node"].forEach(function (key) {
        const v = q.get(key);
        if (v && /^-?[0-9]+$/.test(v)) out[key] = parseInt(v, 10);
      });
      if (selected && GS.link.read && out.run === selected.run && (out.rank || 0) === (selected.rank || 0) &&
          out.step === selected.step && out.node === selected.node) return;
      // a link that names a step pins it: "follow live" goes off (visibly). Only the address the page
      // was opened with: the page itself writes the selection into the address later on
      if (!GS.link.read) {
        GS.link.read = true;
        if (out.step !== undefined && (search || "") === GS.link.openedWith) {
          GS.link.pinned = true;  // until the person ticks "follow live" again (the box may not show it yet)
          window.dash_clientside.set_props(ID.FOLLOW, {value: []});
        }
      }
      if (Object.keys(out).length) window.dash_clientside.set_props(ID.DEEP_LINK, {data: out});
    },
    searchPick: function (found) {
      // a node picked in the find box is the person's newest pick from this moment (`P.pick`, assets/player.js):
      // the server's answer (app/ui/selection.py `select_found`, which also unfolds what hides it) can arrive
      // merged with a new step's, and a step answered from the state before the pick must not take it back
      const E = GS.elements, p = GS.player && GS.player.current;
      if (!p || typeof found !== "string" || !found.startsWith(E.node)) return;
      const node = found.slice(E.node.length);
      if (/^[0-9]+$/.test(node)) GS.player.pick({run: p.run, rank: p.rank, step: p.step, node: parseInt(node, 10)});
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
  });

  document.addEventListener("click", function (evt) {
    if (evt.target && evt.target.closest && evt.target.closest("#" + ID.FOLLOW)) GS.link.pinned = false;
  });
})();
