"""Where a traced step goes once it is complete: `base` (the `Sink` interface and `resolve_sinks`),
`memory`, `file` (a SQLite trace file), `socket` (a live server, with its byte-bounded `queue` and a
spill file under `paths`' per-user data directory)."""
