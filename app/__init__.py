"""The server and web app (installed as `gradscape.app`): the Dash page, the Socket.IO endpoint the
tracer streams to, the JSON API, and the `gradscape` command (`gradscape.app.cli`)."""
