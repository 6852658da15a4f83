/* gradscape: the overview of a graph bigger than its panel (GS.minimap, in the page's one namespace,
 * window.gradscape). A small canvas in the graph's bottom-right corner draws every node of the graph as
 * it is laid out (module boxes as outlines) and, over them, the box the panel shows; a click or a drag
 * there centres the panel on that place. It shows only while some of the graph is out of the panel.
 * The nodes are drawn to an image of their own when the graph changes (10k nodes: one pass), so moving
 * the view redraws the image and the box, not every node. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  const M = GS.minimap = {};
  let image = null, frame = null, stale = true, scale = 1, origin = {x: 0, y: 0};

  function canvas() { return document.getElementById(ID.MINIMAP); }
  function whole(cy) { return cy.elements().boundingBox(); }

  // the graph's nodes, to an offscreen image at the minimap's scale
  function drawNodes(cy, c) {
    const bb = whole(cy), pad = 4;
    scale = Math.min((c.width - 2 * pad) / Math.max(bb.w, 1), (c.height - 2 * pad) / Math.max(bb.h, 1));
    origin = {x: bb.x1 - (c.width / scale - bb.w) / 2, y: bb.y1 - (c.height / scale - bb.h) / 2};
    image = document.createElement("canvas");
    image.width = c.width;
    image.height = c.height;
    const g = image.getContext("2d");
    cy.nodes().forEach(function (n) {
      const b = n.boundingBox({includeLabels: false});
      const x = (b.x1 - origin.x) * scale, y = (b.y1 - origin.y) * scale;
      const w = Math.max(1, b.w * scale), h = Math.max(1, b.h * scale);
      if (n.isParent()) { g.strokeStyle = "#c9c9c9"; g.strokeRect(x, y, w, h); }
      else { g.fillStyle = n.hasClass("nan") ? "#d00000" : "#7a8aa0"; g.fillRect(x, y, w, h); }
    });
    stale = false;
  }

  // is any of the graph out of the panel?
  function overflows(cy) {
    const bb = whole(cy), ex = cy.extent();
    return bb.w > 0 && (bb.x1 < ex.x1 - 1 || bb.y1 < ex.y1 - 1 || bb.x2 > ex.x2 + 1 || bb.y2 > ex.y2 + 1);
  }

  function draw() {
    frame = null;
    const cy = window.cy, c = canvas();
    if (!cy || !c) return;
    const show = cy.nodes().length > 0 && overflows(cy);
    c.classList.toggle("gs-shown", show);
    if (!show) return;
    if (stale || !image) drawNodes(cy, c);
    const g = c.getContext("2d"), ex = cy.extent();
    g.clearRect(0, 0, c.width, c.height);
    g.drawImage(image, 0, 0);
    g.strokeStyle = "#1f77b4";
    g.lineWidth = 2;
    g.strokeRect((ex.x1 - origin.x) * scale, (ex.y1 - origin.y) * scale, ex.w * scale, ex.h * scale);
  }
  M.redraw = function (changed) {
    if (changed) stale = true;
    if (frame === null) frame = window.requestAnimationFrame(draw);
  };

  // where a point of the graph is drawn on the minimap, in px from its top-left corner
  M.place = function (x, y) { return {x: (x - origin.x) * scale, y: (y - origin.y) * scale}; };

  // a place on the minimap, in the graph's coordinates: the panel centred there
  function goTo(evt) {
    const cy = window.cy, c = canvas();
    if (!cy || !c) return;
    const r = c.getBoundingClientRect();
    const x = origin.x + (evt.clientX - r.left) / scale, y = origin.y + (evt.clientY - r.top) / scale;
    const z = cy.zoom();
    cy.pan({x: cy.width() / 2 - z * x, y: cy.height() / 2 - z * y});
  }

  function attach(cy, c) {
    cy.on("viewport resize", function () { M.redraw(false); });
    cy.on("add remove position layoutstop", function () { M.redraw(true); });
    c.addEventListener("pointerdown", function (evt) { c.setPointerCapture(evt.pointerId); goTo(evt); });
    c.addEventListener("pointermove", function (evt) { if (c.hasPointerCapture(evt.pointerId)) goTo(evt); });
    c.addEventListener("pointerup", function (evt) {
      if (c.hasPointerCapture(evt.pointerId)) c.releasePointerCapture(evt.pointerId);
    });
    M.redraw(true);
  }
  const ready = setInterval(function () {
    const cy = window.cy, c = canvas();
    if (!cy || !c) return;
    clearInterval(ready);
    attach(cy, c);
  }, 50);
})();
