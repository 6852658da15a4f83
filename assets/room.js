/* gradscape: the room a person gives the graph (GS.room, in the page's one namespace, window.gradscape). The
 * timeline (a <details>) and the inspector's column fold away, and the page keeps the choice for the next
 * visit (localStorage). Both are set as the page's parts appear, before its first paint: a fold applied
 * later would move the graph under the person's pointer. Unchosen, the timeline starts folded on a window
 * under ROOMY px tall, where the graph would otherwise get too little height for its labels to be legible. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  const KEY = {timeline: "gradscape.timeline-open", inspector: "gradscape.inspector-shown"}, ROOMY = 800;
  const R = GS.room = {};
  function read(key) { try { return window.localStorage.getItem(key); } catch (e) { return null; } }
  function write(key, v) { try { window.localStorage.setItem(key, v ? "1" : "0"); } catch (e) { /* private mode */ } }
  R.timelineOpen = function () { const v = read(KEY.timeline); return v === null ? window.innerHeight >= ROOMY : v === "1"; };
  R.inspectorShown = function () { return read(KEY.inspector) !== "0"; };
  function showInspector(shown) {
    const page = document.querySelector(".gs-page"), btn = document.getElementById(ID.INSPECTOR_TOGGLE);
    if (page) page.classList.toggle("gs-no-inspector", !shown);
    if (btn) {
      btn.textContent = shown ? "hide inspector" : "show inspector";
      btn.title = shown ? "fold the inspector away: the graph takes its room" : "show the selected node's inspector";
    }
  }
  R.toggleInspector = function () {
    const shown = !R.inspectorShown();
    write(KEY.inspector, shown);
    showInspector(shown);
  };
  // apply the choices as the page's parts are inserted (Dash renders the layout after the scripts load)
  let timelineDone = false, inspectorDone = false;
  function apply() {
    const tl = document.getElementById(ID.TIMELINE);
    if (tl && !timelineDone) {
      timelineDone = true;
      tl.open = R.timelineOpen();
      tl.addEventListener("toggle", function () { write(KEY.timeline, tl.open); });
    }
    if (!inspectorDone && document.getElementById(ID.INSPECTOR_TOGGLE) && document.querySelector(".gs-page")) {
      inspectorDone = true;
      showInspector(R.inspectorShown());
    }
    return timelineDone && inspectorDone;
  }
  const watch = new MutationObserver(function () { if (apply()) watch.disconnect(); });
  watch.observe(document.documentElement, {childList: true, subtree: true});
  document.addEventListener("click", function (evt) {
    if (evt.target && evt.target.closest && evt.target.closest("#" + ID.INSPECTOR_TOGGLE)) R.toggleInspector();
  });
  // the graph's box changes size (a fold, the window): cytoscape draws into the new size
  const sized = setInterval(function () {
    const box = document.getElementById(ID.GRAPH);
    if (!box || !window.cy) return;
    clearInterval(sized);
    new ResizeObserver(function () { if (window.cy) window.cy.resize(); }).observe(box);
  }, 50);
})();
