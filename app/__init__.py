"""The server and web app (installed as `gradscape.app`, from this folder): the Dash page, the Socket.IO
endpoint the tracer streams to, the JSON API, and the `gradscape` command.

    view/     pure functions from a step's wire form to what the page draws (no Dash)
    data.py   `PageData`: the stored steps the page's callbacks read, decoded once and cached
    step_flags.py  which stored steps a trigger traced or hold problems (the step and run lists' marks)
    export/   the offline page of one step (one HTML file) and the notebook's inline display
    serving/  what a running server holds (its state), who may reach it (security) and its `/ui` pushes
    server/   the Flask and Socket.IO server put together from them: its namespaces and `create_app`
    api/      the JSON API (runs, steps, nodes, tensors, history, the debugger)
    ui/       the Dash layout and callbacks (the page's scripts and styles are in assets/)
    notebook.py  `gradscape.show(x)`: the page inside a notebook
    demo.py   the demo's training loop (`gradscape demo`)
    cli.py    the `gradscape` command line
"""
