"""Recording one traced step: the `Tracer` a training loop holds (tracer.py) and, per traced step, the
`StepRecorder` (recorder.py), which owns the step's state and its parts:

    model_index   the model's module and parameter names
    forward       forward attribution: module calls and source lines (with global_hooks, sources)
    walk          the graph walk of each backward
    node_hooks    the hook on every walked node, and what the hooks record
    handles       the one owner of every hook of the step
    params        the parameters' gradients (`st.params`)
    module_sums   module-level gradients (lazy_modules: a natively recorded step's, made when read)
    structure     labels and schemas from the graph's structure, cached per Tracer (labels, derivatives)
    assemble      the plain `NodeTrace`s once the hooks are gone
    native        the native recorder (native_step, tables, slot_rows: its step as flat tables)
    view          what the debugger and the problem finder read of a running step
"""
