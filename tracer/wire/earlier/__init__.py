"""The maps form of earlier releases, read and never written.

NOTE [Maps of earlier releases]
    Releases before the column document (NOTE [Column document] in tracer/wire/columns.py) sent and stored a
    step as maps: a map per node and per tensor (`WireNode`, `WireTensor` in tracer/wire/types.py), files of
    schema versions 2 to 4 all so, version-5 files for a step built by hand and for a step an earlier tracer
    sent. This release writes every step as its column document (the store, the socket sink, `st.to_html()`)
    and refuses one the columns cannot hold (NOTE [Columns of any step] in tracer/wire/trace_columns.py). It
    still reads the maps: a file of any of those versions opens (`tracer.step_doc.read_trace`,
    `read_indexed`), and a server takes an earlier tracer's maps step, checked, and stores it as columns.
    A sink of this release does not send to an earlier release's server (its hello names no "columns"
    form): it warns once and keeps the steps in its spill file. The maps writer lives on only in the tests
    (tests/earlier_release.py), to write the files and messages these readers are tested on.

    maps_step   an earlier release's maps → `StepTrace`, every field checked (`step_from_wire`)
    fast_nodes  its node maps in their common form, read quickly (NOTE [Fast read] in tracer/wire/fast_read.py)
    spans       its stored document read lazily: the node and tensor maps at their spans (`read_lazily`)

The page still reads a node or a tensor as a map (`WireNode`): a column document's are made from its columns
when read (`tracer.wire.columns.StepColumns.node`), and its index from its columns (`column_index`); an earlier
release's maps step's index is made from its maps (`step_index.index_from_wire`) when its file holds none.
"""
