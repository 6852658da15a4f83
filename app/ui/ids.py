"""Element ids. The first six are public: tests and bookmarks rely on them, so they do not change."""

GRAPH = "graph"
INSPECTOR = "inspector"
PLAYER = "backward-player"
STEP_SELECT = "step-select"
RUN_SELECT = "run-select"
CONNECTION = "connection-status"

URL = "url"
SOCKET = "ui-socket"
DEEP_LINK = "deep-link"
LINK_USED = "deep-link-used"  # the deep link whose node has been selected
SELECTED = "selected-node"
INSPECTED = "inspected-node"  # what the inspector is asked to show: the selection, one request at a time
COLLAPSED = "collapsed-modules"
EXEC_ORDER = "exec-order"
COLOR_BY = "color-by"
STEP_NOTES = "step-notes"  # what the step says of torch.compile (app/ui/compiled.py)
COMPILED_COMPARE = "compiled-compare"  # the compiled-against-eager table (app/ui/compiled.py)
SEARCH = "search"
LEGEND = "legend"
SLIDER = "player-slider"
PLAY = "player-play"
PREV = "player-prev"
NEXT = "player-next"
SPEED = "player-speed"
TICKER = "player-ticker"
PLAYER_INFO = "player-info"
FOLLOW = "follow-live"
NEXT_PROBLEM = "next-problem"
SAMPLE = "sample-select"
TABS = "inspector-tabs"
INSPECTOR_NOTE = "inspector-note"  # the hint, or why a node cannot be shown, in place of the tabs
NODE_TAB = "node-tab"  # the bodies under the inspector's tabs (the tab strip itself is laid out once)
MODULE_TAB = "module-tab"
MODULE_TAB_BODY = "module-tab-body"
FLOW_TAB = "flow-tab"
FLOW = "flow-chart"
FLOW_STEPS = "flow-over-steps"
GRAPH_INFO = "graph-info"
LIVE_STEPS = "live-steps"
STEP_SET_BY_PAGE = "step-set-by-page"  # {"step": s}: the step the page itself last showed (NOTE [Who changed the step])
LIVE_RUNS = "live-runs"
GRAPH_FIT = "graph-fit"
GRAPH_ZOOM_SELECTION = "graph-zoom-selection"
INSPECTOR_TOGGLE = "inspector-toggle"  # folds the inspector's column away (assets/room.js)
MINIMAP = "minimap"  # the overview of a graph bigger than its panel (assets/minimap.js)
SPLIT = "split"  # the draggable split between the graph and the inspector (assets/room.js)

# breakpoints (app/ui/debugger.py); `bp-step` and `bp-continue` are public: tests and bookmarks rely on them
BP_STEP = "bp-step"
BP_CONTINUE = "bp-continue"
BP_KIND = "bp-kind"
BP_ABOVE = "bp-above"
BP_SET = "bp-set"
BP_CLEAR = "bp-clear"
BP_LIST = "bp-list"
BP_BANNER = "bp-banner"
BP_WHERE = "bp-where"
BP_NODES = "bp-nodes"
BP_STATE = "bp-state"
BP_SENT = "bp-sent"
BP_PICK = "bp-pick"  # the paused node whose heatmaps are shown: {run, step, executed, node, order, at}
BP_HEATMAPS = "bp-heatmaps"

PROBLEMS = "problems"
PROBLEM_PICK = "problem-pick"  # the problem line last clicked: {run, rank, step, node, at}

# ranks and the compare view (app/ui/compare.py)
RANK_SELECT = "rank-select"
RANK_FIELD = "rank-field"
COMPARE_OPEN = "compare-open"
COMPARE = "compare-view"
COMPARE_AGAINST = "compare-against"
COMPARE_OTHER = "compare-other"
COMPARE_TARGET = "compare-target"
COMPARE_RESULT = "compare-result"
COMPARE_STATUS = "compare-status"


# the timeline panel (app/ui/timeline.py)
TIMELINE = "timeline"
TIMELINE_GRAPH = "timeline-graph"
TIMELINE_HEATMAP = "timeline-heatmap"
TIMELINE_INFO = "timeline-info"


def table() -> dict[str, str]:
    """Every id by its name: what the server writes into the page for its scripts (`window.gradscape.ids`)."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str)}
