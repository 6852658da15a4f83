"""Recording one traced step: the `StepRecorder` (recorder.py; the `Tracer` that makes one per traced step is
tracer/tracing.py), which owns the step's state and its parts:

    model_index   the model's module and parameter names
    forward       forward attribution: module calls and source lines (with global_hooks, sources)
    walk          the graph walk of each backward
    node_hooks    the hook on every walked node, and what the hooks record
    handles       the one owner of every hook of the step
    roots         a backward call's roots, read from its arguments
    params        the parameters' gradients (`st.params`)
    module_sums   module-level gradients (lazy_modules: a natively recorded step's, made when read)
    call_thumbs   each backward call's thumbnail size (a call that repeats one gets coarser pictures)
    structure     labels and schemas from the graph's structure, cached per Tracer (labels, derivatives)
    assemble      the Python recorder's step as the native recorder's tables, once the hooks are gone
    column_tables a stored column step's nodes read back as the same tables
    native        the native recorder (native_step, tables, slot_rows: its step as flat tables, the one form of
                  both recorders' steps)
    view          what the debugger and the problem finder read of a running step
    debug/        live breakpoints and the problem finder, which run inside the recorder
    global_hooks  torch's global module and optimizer hooks, the one registration of each (the monitor's too)
    patched_calls the backward calls and GradScaler's unscale of a monitored block, wrapped while it is open
    carry         a repeated forward's attribution, carried from one traced step to the next
    handoff       a traced step's backward calls handed to its recorder when no monitor sees them
    backward_by_name  a `torch.autograd.backward` taken by name, seen by the mode on releases where it does not
                  dispatch
    compiled      a compiled model's regions run eagerly on a traced step (or left opaque)
    replay        a loss trigger's step replayed eagerly from the state before its forward
    compare       a compiled step's gradients against the eager ones (the numbers; tracer/compare_step.py runs it)

The native recorder's step (NOTE [Native recorder] in native.py), by room:

    native_build  building the extension from csrc/ (the C++ sources) against the installed torch
    tensor_table  its gradient summaries (`TensorTable`), and arena_compact, a kept step's arena cut down
    lazy_tuples   `st.execution` and `st.edges` kept as columns until read
    lazy_traces   `st.params`, each optimizer step's gradients and the roots' kept as its rows until read
    thumb_stacks  its thumbnails gathered by shape for the store
    wire_columns  the step as the column document (what the store keeps, the socket sends and the page reads)
"""
