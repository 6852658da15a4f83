/* gradscape: live updates (clientside callbacks of app/ui/runs.py). A notification on the /ui socket only
 * says what changed; the run list with its step counts (`liveRuns`) and the step list of the rank shown (`liveSteps`) are read
 * again from the JSON API, the newest answer winning; `connection` shows the socket's state and the
 * tracer's counts. Everything here lives in the page's one namespace, window.gradscape. */
(function () {
  const GS = window.gradscape, ID = GS.ids;
  // the newest read's number; the run and rank it is for; whether the person picked a step (not following)
  GS.live = {runSeq: 0, stepSeq: 0, stepsOf: null, picked: false};
  // the lists' labels, worded as the server words them (app/step_flags.py `step_label`, `run_label`)
  GS.live.stepLabel = function (s) {
    const parts = ["step " + s.step];
    if (s.trigger) parts.push(s.trigger);
    if (s.problems) parts.push(s.problems + " problem" + (s.problems !== 1 ? "s" : ""));
    return parts.join(" · ");
  };
  GS.live.runLabel = function (r) {
    return r.run + " (" + r.steps + " steps" + (r.flagged ? " · " + r.flagged + " flagged)" : ")");
  };
  // When the page asked for a step's graph while following, until its order arrives (`drawn`, from
  // assets/player.js); an answer that never comes (an error) stops holding the follow after DRAW_WAIT_MS
  const DRAW_WAIT_MS = 10000;
  GS.live.askedAt = null;
  GS.live.drawing = function () {
    return GS.live.askedAt !== null && performance.now() - GS.live.askedAt < DRAW_WAIT_MS;
  };
  GS.live.ask = function (step) {
    GS.live.askedAt = performance.now();
    // the page's own step, marked in the same update (NOTE [Who changed the step] in app/ui/runs.py)
    window.dash_clientside.set_props(ID.STEP_SET_BY_PAGE, {data: {step: step}});
  };
  // "follow live" as the page shows it now (a deep link may have just turned it off), else as the follow
  // store held it (`follow`); a step the person picked a moment ago turns the box off once `stepPicked` answers
  GS.live.following = function (follow) {
    const box = document.querySelector("#" + ID.FOLLOW + " input");
    return !GS.link.pinned && !GS.live.picked && (box ? box.checked : !!(follow && follow.length));
  };
  // a step's graph drawn: a newer step that came meanwhile is asked for now, if the page still follows
  GS.live.drawn = function () {
    GS.live.askedAt = null;
    if (!GS.live.behind) return;
    GS.live.behind = false;
    // (the list open in front of the person: the next step moves it, once it is closed)
    if (!GS.live.following(GS.live.behindFollow) || GS.live.stepListOpen()) return;
    GS.live.ask(GS.live.newest);
    window.dash_clientside.set_props(ID.STEP_SELECT, {value: GS.live.newest});
  };
  // The step list open in front of the person: a list read meanwhile is held, and its options taken in when
  // it closes (the step shown moves to the newest with the next step, if the page still follows). Each new
  // step streamed while following set the list's options and the step shown, and Dash's dropdown scrolled
  // its open menu to that step: the list was pulled away from the older step the pointer was on
  // (tests/e2e/test_one_state.py)
  GS.live.stepListOpen = function () {
    const el = document.getElementById(ID.STEP_SELECT);
    return !!el && el.getAttribute("aria-expanded") === "true";
  };
  new MutationObserver(function (changes) {
    if (!GS.live.heldOptions || GS.live.stepListOpen()) return;
    if (!changes.some(function (c) { return c.target.id === ID.STEP_SELECT; })) return;
    const options = GS.live.heldOptions;
    GS.live.heldOptions = null;
    window.dash_clientside.set_props(ID.STEP_SELECT, {options: options});
  }).observe(document.documentElement, {subtree: true, attributes: true, attributeFilter: ["aria-expanded"]});
  const clientside = window.dash_clientside = window.dash_clientside || {};
  clientside.gradscape = Object.assign(clientside.gradscape || {}, {
    liveRuns: function (note, stepNote, current, shown) {
      // a new run → the run list from the JSON API (oldest update first, as the server lists them); the run
      // shown stays, or the newest one is shown when there was none. A new step → the same list again, for
      // its step counts ("r (59 steps)"): only the labels change then, never the run shown
      const trig = (dash_clientside.callback_context.triggered || []).map(function (t) { return t.prop_id; });
      let newRun = trig.indexOf(ID.SOCKET + ".data-run") >= 0;
      if (newRun ? !note : !stepNote) return window.dash_clientside.no_update;
      if (!newRun && stepNote.catchup) {
        // the catch-up a (re)connection brings names the server's runs: a run that began while the page was
        // being served, or while it was offline, was announced to nobody here. Read the list only then: a
        // page served with every run needs nothing
        const have = (shown || []).map(function (o) { return o.value; });
        if (!(stepNote.runs || []).some(function (r) { return have.indexOf(r) < 0; })) {
          return window.dash_clientside.no_update;
        }
        newRun = true;
      }
      const seq = ++GS.live.runSeq;
      fetch(new URL("/api/runs", window.location.origin), {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body || !body.runs || seq !== GS.live.runSeq) return;
          const runs = body.runs.slice().sort(function (a, b) { return (a.updated > b.updated) - (a.updated < b.updated); });
          if (!runs.length) return;
          const names = runs.map(function (r) { return r.run; });
          const options = runs.map(function (r) { return {label: GS.live.runLabel(r), value: r.run}; });
          if (newRun || names.indexOf(current) < 0) {
            window.dash_clientside.set_props(ID.RUN_SELECT, {
              options: options, value: names.indexOf(current) >= 0 ? current : names[names.length - 1]});
          } else if (JSON.stringify(options) !== JSON.stringify(shown || [])) {
            window.dash_clientside.set_props(ID.RUN_SELECT, {options: options});
          }
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
      GS.live.stepsOf = run + "\n" + r;  // another run or rank chosen: its step list comes from the server
      const trig = (dash_clientside.callback_context.triggered || []).map(function (t) { return t.prop_id; });
      if (trig.indexOf(ID.SOCKET + ".data-step") < 0) return nu;
      if (!note || !run || (!note.catchup && note.run !== run)) return nu;
      const seq = ++GS.live.stepSeq;
      fetch(new URL("/api/runs/" + encodeURIComponent(run) + "/steps" + (r ? "?rank=" + r : ""),
                    window.location.origin), {credentials: "same-origin"})
        .then(function (res) { return res.ok ? res.json() : null; })
        .then(function (body) {
          if (!body || !body.steps || seq !== GS.live.stepSeq || GS.live.stepsOf !== run + "\n" + r) return;
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
          const labels = body.steps.map(GS.live.stepLabel).join(",");
          const hadLabels = (shown || []).map(function (o) { return o.label; }).join(",");
          if (steps.join(",") === had.join(",") && labels === hadLabels) return;
          if (!steps.length) return;
          const props = {options: body.steps.map(function (s) { return {label: GS.live.stepLabel(s), value: s.step}; })};
          if (GS.live.stepListOpen()) {
            GS.live.heldOptions = props.options;
            return;
          }
          const following = GS.live.following(follow);
          // not following: the step shown stays; `current` may be stale by now (a deep link moved it), so
          // the value is set only when following or when the step shown is gone
          GS.live.newest = steps[steps.length - 1];
          GS.live.behind = false;
          if (following && GS.live.drawing()) {
            // the step followed before is not drawn yet: one graph in flight at a time (a Dash callback asked
            // again drops its answer in flight, and the player's keys wait on this one: they read the slider's
            // max, one of its outputs). The newest step is asked for once that graph is drawn (`GS.live.drawn`)
            GS.live.behind = true;
            GS.live.behindFollow = follow;
          } else if (following || steps.indexOf(current) < 0) {
            props.value = GS.live.newest;
            GS.live.ask(props.value);
          }
          window.dash_clientside.set_props(ID.STEP_SELECT, props);
        })
        .catch(function () { /* offline: the catch-up on reconnecting brings the list up to date */ });
      return seq;
    },
    stepPicked: function (step, options, follow, byPage) {
      // a step the person picked that is not the newest: the page stops following the live run. A step the
      // page set itself (marked in `byPage`: NOTE [Who changed the step] in app/ui/runs.py) is no pick,
      // whatever the step list holds yet
      const nu = window.dash_clientside.no_update;
      if (step === null || step === undefined || !options || !options.length || !(follow && follow.length)) return nu;
      if (byPage && byPage.step === step) return nu;
      if (options[options.length - 1].value === step) return nu;
      GS.live.picked = true;  // until the person ticks "follow live" again (the box may not show it yet)
      return [];
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
  });
  document.addEventListener("click", function (evt) {
    if (evt.target && evt.target.closest && evt.target.closest("#" + ID.FOLLOW)) GS.live.picked = false;
  });
  // The person's pick in the open step list, seen as the click lands (the capture phase: before the dropdown
  // closes and sets its value), not only when `stepPicked` answers: a step list read in between (`liveSteps`)
  // took the page for still following and put the newest step back over the pick, which was lost
  // (tests/e2e/test_one_state.py). Picking the newest step leaves the page following, as `stepPicked` does.
  document.addEventListener("click", function (evt) {
    const option = evt.target && evt.target.closest ? evt.target.closest("[role='option']") : null;
    if (!option || !GS.live.stepListOpen()) return;
    const step = parseInt((option.textContent || "").trim().slice(5), 10);
    const all = document.querySelectorAll("[role='option']");
    const last = all.length ? parseInt((all[all.length - 1].textContent || "").trim().slice(5), 10) : NaN;
    const newest = GS.live.newest !== undefined && GS.live.newest !== null ? Math.max(GS.live.newest, last) : last;
    if (isNaN(step) || step === newest) return;
    GS.live.picked = true;
    window.dash_clientside.set_props(ID.FOLLOW, {value: []});  // as `stepPicked` would, visibly
  }, true);
})();
