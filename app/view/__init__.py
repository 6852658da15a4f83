"""The UI's data layer: pure functions from a step's wire form to what the Dash views draw.

No Dash here (only numpy, networkx for the layers' cycles, and plain dicts that plotly and dash-cytoscape accept), so
each callback is a few lines over these functions and everything is testable on real traces without a browser:

    wire = store.read_graph(run, step)
    layout = layout_graph(wire, collapsed)             # positions; None → default_collapse(wire)
    elements = cytoscape_elements(wire, layout, "norm")
    panel = slot_figures(wire, node, store.read_arrays(run, step, node_tensors(wire, node)))

The rooms: `ids` (the graph's element ids, made and read there only), `layout` and `collapse` (positions,
folded modules; no networkx model of the step: docs/graph-view.md says why; the layout's steps: `layers`,
`layered`, `ordering` with `crossings`, `x_coordinates`, and `boxes` for the module boxes), `timeline` (the
run's history as figures), `elements` (cytoscape elements) with `colours` and `marks` (what they show of
each node, once per step), `search` (the find box), `calls` (which nodes each call of a module made) with
`call_folds` (a module opened into its calls), `op_runs` (a box's ops in runs, past a thousand) and `folds`
(what a click on a fold does), `heatmaps` over `grid` (a tensor as a 2-D grid), `flow` (gradient flow),
`order` (the player's order), `modules` (the module tab), `compare`, `problems`, and `compiled` (what a step
says of torch.compile: its notes, the compiled-against-eager table and the colouring by that difference);
`step_fields` reads the fields of a step (its wire form) for all of them. The collector's threshold is
raised while a layout runs (`raised_gc_threshold`, NOTE [Raised threshold] in tracer/collector.py). See
docs/graph-view.md.
"""

from gradscape.app.view.collapse import (
    MAX_DRAWN,
    collapse_module,
    default_collapse,
    expand_module,
    expand_one_level,
    reveal,
    visible_count,
    visible_element,
)
from gradscape.app.view.colours import COLOR_BY, legend
from gradscape.app.view.compiled import COMPARE_COLUMNS, DIFF, DIFF_LABEL, compare_rows, has_comparison, step_notes
from gradscape.app.view.elements import cytoscape_elements
from gradscape.app.view.flow import flow_rows, gradient_flow, norm_over_rows, norm_over_steps
from gradscape.app.view.folds import after_tap, open_module, reveal_node
from gradscape.app.view.heatmaps import explain, node_tensors, slot_figures, stats_rows
from gradscape.app.view.layout import count_crossings, layout_graph
from gradscape.app.view.marks import StepMarks, step_marks
from gradscape.app.view.modules import backward_hook_note, module_detail, module_table, module_tensors, param_rows
from gradscape.app.view.order import exec_order, order_name
from gradscape.app.view.search import (
    SEARCH_ALL,
    SEARCH_HITS,
    SearchTable,
    find,
    search,
    search_index,
    searched_on_server,
)

__all__ = [
    "MAX_DRAWN",
    "StepMarks",
    "after_tap",
    "COLOR_BY",
    "COMPARE_COLUMNS",
    "DIFF",
    "DIFF_LABEL",
    "SEARCH_ALL",
    "SEARCH_HITS",
    "SearchTable",
    "backward_hook_note",
    "collapse_module",
    "compare_rows",
    "count_crossings",
    "cytoscape_elements",
    "default_collapse",
    "expand_module",
    "expand_one_level",
    "exec_order",
    "explain",
    "find",
    "flow_rows",
    "gradient_flow",
    "has_comparison",
    "layout_graph",
    "legend",
    "module_detail",
    "module_table",
    "module_tensors",
    "node_tensors",
    "norm_over_rows",
    "norm_over_steps",
    "open_module",
    "order_name",
    "param_rows",
    "reveal",
    "reveal_node",
    "search",
    "search_index",
    "searched_on_server",
    "slot_figures",
    "stats_rows",
    "step_marks",
    "step_notes",
    "visible_count",
    "visible_element",
]
