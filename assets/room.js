/* gradscape: the room a person gives the graph (GS.room, in the page's one namespace, window.gradscape). The
 * timeline (a <details>) and the inspector's column fold away, and the page keeps the choice for the next
 * visit (localStorage). Both are set as the page's parts appear, before its first paint: a fold applied
 * later would move the graph under the person's pointer. Unchosen, the timeline starts folded on a window
 * under ROOMY px tall, where the graph would otherwise get too little height for its labels to be legible.
 * The split between the graph and the inspector drags (or moves by STEP px with ← →) and is kept the same way;
 * a double-click puts the columns back as the stylesheet shares them. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  const KEY = {timeline: "gradscape.timeline-open", inspector: "gradscape.inspector-shown",
               split: "gradscape.inspector-width"}, ROOMY = 800;
  const MIN_INSPECTOR = 380, MIN_GRAPH = 320, STEP = 40;  // px; .gs-right's min-width is MIN_INSPECTOR
  const R = GS.room = {};
  function read(key) { try { return window.localStorage.getItem(key); } catch (e) { return null; } }
  function store(key, v) { try { window.localStorage.setItem(key, v); } catch (e) { /* private mode */ } }
  function write(key, v) { store(key, v ? "1" : "0"); }
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
  // the inspector's width: a number of px kept as chosen, applied to <html> (outside what Dash renders)
  function setWidth(w) {
    const root = document.documentElement;
    if (w === null) {
      root.classList.remove("gs-split-set");
      root.style.removeProperty("--gs-inspector-w");
      return;
    }
    const main = document.querySelector(".gs-main"), split = document.getElementById(ID.SPLIT);
    // the graph keeps MIN_GRAPH px beside the split and its column's 1 px border
    const most = main && split ? main.getBoundingClientRect().width - split.getBoundingClientRect().width
                                 - MIN_GRAPH - 1 : w;
    w = Math.round(Math.max(MIN_INSPECTOR, Math.min(w, most)));
    root.style.setProperty("--gs-inspector-w", w + "px");
    root.classList.add("gs-split-set");
    return w;
  }
  R.inspectorWidth = function () { const v = parseFloat(read(KEY.split)); return isFinite(v) ? v : null; };
  function choose(w) { const got = setWidth(w); store(KEY.split, got === undefined ? "" : String(got)); }
  function rightWidth() { const r = document.querySelector(".gs-right"); return r ? r.getBoundingClientRect().width : 0; }
  function dragSplit(split) {
    split.addEventListener("pointerdown", function (evt) {
      evt.preventDefault();
      split.setPointerCapture(evt.pointerId);
      split.classList.add("gs-dragging");
      document.documentElement.classList.add("gs-dragging-split");
    });
    split.addEventListener("pointermove", function (evt) {
      if (!split.hasPointerCapture(evt.pointerId)) return;
      const main = document.querySelector(".gs-main").getBoundingClientRect();
      setWidth(main.right - evt.clientX);
    });
    function drop(evt) {
      if (!split.classList.contains("gs-dragging")) return;
      split.classList.remove("gs-dragging");
      document.documentElement.classList.remove("gs-dragging-split");
      if (split.hasPointerCapture(evt.pointerId)) split.releasePointerCapture(evt.pointerId);
      choose(rightWidth());
    }
    split.addEventListener("pointerup", drop);
    split.addEventListener("pointercancel", drop);
    split.addEventListener("keydown", function (evt) {
      const by = evt.key === "ArrowLeft" ? STEP : evt.key === "ArrowRight" ? -STEP : 0;
      if (by) { evt.preventDefault(); choose(rightWidth() + by); }
    });
    split.addEventListener("dblclick", function () { setWidth(null); store(KEY.split, ""); });
  }
  // apply the choices as the page's parts are inserted (Dash renders the layout after the scripts load)
  let timelineDone = false, inspectorDone = false, splitDone = false;
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
    const split = document.getElementById(ID.SPLIT);
    if (split && !splitDone && document.querySelector(".gs-main")) {
      splitDone = true;
      if (R.inspectorWidth() !== null) setWidth(R.inspectorWidth());
      dragSplit(split);
    }
    return timelineDone && inspectorDone && splitDone;
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
