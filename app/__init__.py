"""gradscape's server and web app: the Dash page, the Socket.IO endpoint the tracer streams to, the
JSON API, and the `gradscape` command (`app.cli`)."""
