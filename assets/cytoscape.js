/* gradscape: set up before dash-cytoscape draws (assets load before the page's renderer starts).
 * dash-cytoscape always hands cytoscape its own default wheelSensitivity (1), and cytoscape warns about
 * a "custom" wheel sensitivity whenever the option is present at all: that one message is dropped, so
 * the console shows only what needs attention. */
(function () {
  const warn = console.warn;
  console.warn = function (msg) {
    if (typeof msg === "string" && msg.indexOf("You have set a custom wheel sensitivity") === 0) return;
    return warn.apply(console, arguments);
  };
})();
