"""The library a training loop imports (installed as `gradscape.tracer`, from this folder: pyproject.toml's
package-dir). Its public names are re-exported by `gradscape` (gradscape/__init__.py); import them from
there. The layers these run in, and which way their imports go: docs/architecture.md.

One concern per folder:

    record/    recording one traced step: the step recorder, its hooks, the graph walk, attribution,
               the native recorder (C++, csrc/) and its tables, live breakpoints and the problem finder
               (record/debug/, which run inside the recorder)
    summary/   gradient statistics and thumbnails (and the optional C kernel)
    monitor/   the every-step monitor: a history row for every step, and triggers that trace a step
    wire/      the serialised step (its column document; earlier releases' maps, read only), its index,
               the history rows
    protocol/  the socket messages between a tracer, the server and the page
    sinks/     where finished steps go: memory, a SQLite file, a live server
    data/      torch's derivatives table, read by record/derivatives.py

and at the top:

    tracing.py        `Tracer` and `trace()`: the recorder, the monitor and the sinks put together
    compare_step.py   `Tracer.compare_compiled`: a step run compiled, then eager and traced
    _model.py         the data model (`StepTrace` and its parts)
    report.py         a text account of a step (`StepTrace.summary()`, `gradscape show`)
    frames.py         a step as Apache Arrow tables (`st.nodes_table()`, `gradients_table()`, `params_table()`)
    store.py          the SQLite trace file (`TraceStore`, `load`), with its rooms: store_tables.py (the
                      tables and their migration), step_doc.py (a step's document and index row),
                      index_store.py (the step index), history_store.py (the run's history) and
                      blobs.py (compressed msgpack rows)
    collector.py      the garbage collector's policy, its one owner (pauses, freezes, thresholds)
    environment.py    what `gradscape doctor` reports of this machine
    _compat.py        every private torch API gradscape uses
"""
