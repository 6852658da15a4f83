"""The library a training loop imports (installed as `gradscape.tracer`): the graph walk and hooks of a
traced step, summaries, the data model, the wire form, the trace file and the sinks.

Its public names are re-exported by `gradscape` (gradscape/__init__.py); import them from there.
"""
