/* gradscape: the inspector's scroll (GS.scroll, in the page's one namespace, window.gradscape).
 * The inspector's scroll position holds while its content is rendered again for a new step: the new
 * content can briefly stand shorter than the old, which pulls the scroll up; once it has grown back, the
 * position the person chose is put back. Shorter content only ever pulls the scroll up, and only when
 * content is replaced or the scroll sits at the new bottom; every other move is the person's (a wheel, a
 * drag, find-in-page, a script) and becomes the position to keep. The content's changes are seen (a
 * MutationObserver) before the scroll events they cause. A new node starts at the top (`focus` sets
 * `want` to 0). */
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
