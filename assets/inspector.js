/* gradscape: the inspector's scroll (GS.scroll, in the page's one namespace, window.gradscape).
 * The inspector's scroll position holds while its content is rendered again for a new step: the new
 * content can briefly stand shorter than the old, which pulls the scroll up; once it has grown back, the
 * position the person chose is put back. Shorter content only ever pulls the scroll up, and only when
 * content is replaced or the scroll sits at the new bottom; every other move is the person's (a wheel, a
 * drag, find-in-page, a script) and becomes the position to keep. The content's changes are seen (a
 * MutationObserver) before the scroll events they cause. A new node starts at the top (`focus` sets
 * `want` to 0).
 * And the gate between the selection and the inspector (`inspectGate`, app/ui/inspector.py): one render
 * asked of the server at a time; a selection made meanwhile waits for it, and only the newest is sent. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  const S = GS.scroll = {want: null, pulled: false, input: -1e9};
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
  // the inspector's gate: `busy` since when a render was asked for (null: none in flight), `pending` the
  // newest selection that came meanwhile. Each render sets the inspector's `data-rendered` (a new number),
  // which frees it; a render that never answers (a server error) frees it after BUSY_MS
  const BUSY_MS = 5000;
  const gate = GS.inspect = {busy: null, pending: undefined, timer: null};
  const send = function () {
    if (gate.pending === undefined) return false;
    const next = gate.pending;
    gate.pending = undefined;
    gate.busy = performance.now();
    clearTimeout(gate.timer);
    gate.timer = setTimeout(function () { gate.rendered(); }, BUSY_MS);
    gate.sent = next;
    return true;
  };
  gate.rendered = function () {
    gate.busy = null;
    clearTimeout(gate.timer);
    if (send()) window.dash_clientside.set_props(ID.INSPECTED, {data: gate.sent});
  };
  const clientside = window.dash_clientside = window.dash_clientside || {};
  clientside.gradscape = Object.assign(clientside.gradscape || {}, {
    inspectGate: function (selected) {
      gate.pending = selected;
      if (gate.busy !== null) return window.dash_clientside.no_update;
      send();
      return gate.sent;
    },
  });
  const wait = setInterval(function () {
    const ins = document.getElementById(ID.INSPECTOR);
    if (!ins) return;
    clearInterval(wait);
    for (const t of ["wheel", "keydown", "pointerdown", "touchmove"]) ins.addEventListener(t, used, {passive: true});
    ins.addEventListener("scroll", function () { moved(ins); });
    new MutationObserver(function (records) {
      keep(ins, records.some(function (r) { return r.removedNodes.length > 0; }));
      if (records.some(function (r) { return r.target === ins && r.attributeName === "data-rendered"; })) gate.rendered();
    }).observe(ins, {childList: true, subtree: true, attributes: true});
  }, 50);
})();
