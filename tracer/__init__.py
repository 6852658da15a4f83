"""The library a training loop imports (installed as `gradscape.tracer`). Its public names are
re-exported by `gradscape` (gradscape/__init__.py); import them from there.

One concern per folder:

    record/    recording a traced step: `Tracer`, the step recorder, graph walk, hooks, attribution
    summary/   gradient statistics and thumbnails (and the optional C kernel)
    wire/      the serialised step, its one schema
    sinks/     where finished steps go: memory, a SQLite file, a live server
    debug/     live breakpoints and the problem finder

and at the top: `_model.py` (the data model, `StepTrace`), `store.py` (the SQLite trace file),
`protocol.py` (the socket messages), `report.py` (a text account of a step) and `_compat.py` (every
private torch API gradscape uses).
"""
