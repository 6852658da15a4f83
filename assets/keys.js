/* gradscape: keys. Everything here lives in the page's one namespace, window.gradscape. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
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
    else if (evt.key === "f" && cy && GS.graph && GS.graph.fit) GS.graph.fit(cy);
    else if (evt.key === "Escape") {
      if (cy) cy.elements(":selected").unselect();
      if (GS.player) { GS.player.focused = undefined; GS.player.picked = null; }
      window.dash_clientside.set_props(ID.SELECTED, {data: null});
    } else return;
    evt.preventDefault();
  });
})();
