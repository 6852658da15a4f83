"""What a running server holds and who may reach it, below the page's data, the JSON API, the Dash callbacks and
the server that puts them together (app/server/, docs/architecture.md):

    state     `ServerState` (the store, the tracers connected, the steps half received) and `DebugState`
    security  who may connect: loopback by default, the Host header, the token, the origin of a write
    notifier  the `/ui` pushes, coalesced and sent from one thread
"""
