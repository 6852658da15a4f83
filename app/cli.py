"""`gradscape` command line (also `python -m app`).

    gradscape serve [--store FILE] [--host 127.0.0.1] [--port 8050] [--token T] [--keep-last N]
    gradscape demo  [--port 8050] [--model mlp|cnn|transformer] [--every 5]
    gradscape show FILE [--run R] [--step S]      print one recorded step
    gradscape runs FILE                           list runs and steps
    gradscape export FILE [--run R] [--step S] [--rank K] -o step.html   one offline HTML file of a step
    gradscape doctor [--url http://127.0.0.1:8050] versions, summariser, file locations, server check
    gradscape build-recorder [--force]            build the native step recorder for the installed torch
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from pathlib import Path

from gradscape.tracer.store import StoreError, TraceStore, load


def _server_args(p: argparse.ArgumentParser, store: str) -> None:
    p.add_argument("--store", default=store, help="SQLite trace file to write and read (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8050)
    p.add_argument("--token", default=None, help="require this token (generated when --host is not loopback)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gradscape", description="A visual debugger for the PyTorch backward pass.")
    sub = ap.add_subparsers(dest="command")
    srv = sub.add_parser("serve", help="run the web app and the tracer endpoint")
    _server_args(srv, "gradscape.sqlite")
    srv.add_argument("--keep-last", type=_positive, default=None, metavar="N",
                     help="keep only the newest N steps of each run and rank in the store (default: all)")
    demo = sub.add_parser("demo", help="the server plus a bundled training loop streaming into it")
    _server_args(demo, "runs/demo.sqlite")
    demo.add_argument("--model", choices=["mlp", "cnn", "transformer"], default="mlp")
    demo.add_argument("--every", type=int, default=5, help="trace every Nth training step")
    demo.add_argument("--steps", type=int, default=100_000)
    show = sub.add_parser("show", help="print one recorded step of a trace file")
    show.add_argument("path", help="a .sqlite trace file written by gradscape.Tracer(sink=...)")
    show.add_argument("--run", default=None, help="run name (default: the newest run)")
    show.add_argument("--step", type=int, default=None, help="step number (default: the last step)")
    show.add_argument("--nodes", type=int, default=60, help="at most this many nodes")
    sub.add_parser("runs", help="list the runs and steps of a trace file").add_argument("path")
    exp = sub.add_parser("export", help="write one step as a self-contained HTML file (no server, no network)")
    exp.add_argument("path", help="a .sqlite trace file")
    exp.add_argument("--run", default=None, help="run name (default: the newest run)")
    exp.add_argument("--step", type=int, default=None, help="step number (default: the last step)")
    exp.add_argument("--rank", type=int, default=0, help="rank (default: 0)")
    exp.add_argument("-o", "--output", required=True, help="the HTML file to write")
    doc = sub.add_parser("doctor", help="what gradscape runs on: versions, summariser, where files go, server check")
    doc.add_argument("--url", default=None, help="also check that a gradscape server answers here")
    doc.add_argument("--token", default=None, help="the server's token, if it wants one")
    bld = sub.add_parser("build-recorder", help="build the native step recorder (C++) for the installed torch")
    bld.add_argument("--force", action="store_true", help="build it again even when a build is there")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv or ["serve"])  # bare `gradscape` / `python -m app`: serve
    try:
        if args.command == "serve":
            return serve(args.store, args.host, args.port, args.token, keep_last=args.keep_last)
        if args.command == "demo":
            return demo_main(args)
        if args.command == "doctor":
            return doctor(args.url, args.token)
        if args.command == "build-recorder":
            return build_recorder(args.force)
        if args.command == "show":
            from gradscape.tracer.report import format_step

            print(format_step(load(args.path, args.run, args.step), max_nodes=args.nodes))
        elif args.command == "export":
            from gradscape.app.export.html import export_file

            print(f"wrote {export_file(args.path, args.run, args.step, args.rank, args.output)}")
        elif args.command == "runs":
            with TraceStore(args.path, readonly=True) as store:
                for r in store.runs():
                    print(f"{r['run']}: {r['steps']} steps (last {r['last_step']})")
    except StoreError as exc:
        print(f"gradscape: {exc}", file=sys.stderr)
        return 2
    return 0


def doctor(url: str | None, token: str | None = None) -> int:
    """Print what a problem report needs; 1 when a server was asked about and did not answer."""
    import platform
    from importlib import metadata

    import torch

    from gradscape.tracer.environment import environment

    try:
        version = metadata.version("gradscape")
    except metadata.PackageNotFoundError:
        version = "not installed (run from a source tree)"
    print(f"gradscape: {version} ({Path(sys.modules['gradscape'].__file__ or '').parent})")
    print(f"python: {platform.python_version()} ({sys.executable}) on {platform.platform()}")
    env = environment()
    print(f"torch: {torch.__version__} (gradscape is tested with torch {env.tested_torch})")
    if torch.cuda.is_available():
        names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count()))
        print(f"cuda: {torch.version.cuda}, {names}")
    else:
        print("cuda: no device")
    print(f"summariser: {env.summariser}")
    print(f"recorder: {env.recorder}")
    if env.kernel is not None:
        print(f"summary kernel: {env.kernel}")
    print(f"trace files: where Tracer(sink=FILE) says; `gradscape serve` reads {Path('gradscape.sqlite').resolve()} "
          f"unless --store says otherwise")
    print(f"spill files: {env.spill_dir} (steps a live sink could not send)")
    if url is None:
        return 0
    ok, what = _check_server(url, token)
    print(f"server: {url}: {what}")
    return 0 if ok else 1


def build_recorder(force: bool) -> int:
    """Build the native recorder (tracer/record/native_build.py); 1 with the compiler's words when it fails."""
    import torch

    from gradscape.tracer.record import native_build

    if native_build.target().exists() and not force:
        print(f"built already for torch {torch.__version__}: {native_build.target()}")
        return 0
    print(f"building the native recorder for torch {torch.__version__} (about a minute) ...", flush=True)
    try:
        path = native_build.build(force=force)
    except native_build.BuildError as exc:
        print(f"gradscape: {exc}\ngradscape records in Python without it.", file=sys.stderr)
        return 1
    print(f"built for torch {torch.__version__}: {path}")
    return 0


def _check_server(url: str, token: str | None) -> tuple[bool, str]:
    """(answered as gradscape does, what happened) for a GET of url's /api/runs."""
    import json
    import urllib.error
    import urllib.request
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False, "not an http://host:port URL"
    token = token or parse_qs(parts.query).get("token", [None])[0]
    req = urllib.request.Request(f"{parts.scheme}://{parts.netloc}/api/runs",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return False, "answers, but wants a token (--token, or the URL the server printed at start-up)"
        return False, f"answers HTTP {exc.code} at /api/runs: not a gradscape server of this version?"
    except (OSError, ValueError) as exc:
        return False, f"no answer ({getattr(exc, 'reason', exc)})"
    runs = body.get("runs") if isinstance(body, dict) else None
    if not isinstance(runs, list):
        return False, "answers, but /api/runs is not gradscape's run list"
    return True, f"a gradscape server answers ({len(runs)} run{'s' if len(runs) != 1 else ''})"


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of steps, got {text}")
    return n


def serve(store: str, host: str, port: int, token: str | None, ready: object = None,
          keep_last: int | None = None) -> int:
    from gradscape.app.server import ServerConfig, create_app, resolve_token

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # WS close frames read as bad requests
    Path(store).parent.mkdir(parents=True, exist_ok=True)
    from werkzeug.serving import make_server

    config = ServerConfig(host=host, port=port, token=resolve_token(host, token), keep_last=keep_last,
                          freeze_graphs=True)
    app, _socketio = create_app(store, config)
    # bound before the URL is printed: `--port 0` takes a free port and the line names it (tests read it)
    srv = make_server(host, port, app.server, threaded=True)
    config.port = srv.server_port
    print(f"gradscape serving {store} at {config.url()}", flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
    return 0


def demo_main(args: argparse.Namespace) -> int:
    """Start the server, then a training loop in a child process that streams into it."""
    import signal
    import threading

    from gradscape.app.server import resolve_token

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the child too when we are terminated
    token = resolve_token(args.host, args.token)
    url = f"http://127.0.0.1:{args.port}" + (f"?token={token}" if token else "")
    server = threading.Thread(target=serve, args=(args.store, args.host, args.port, token), daemon=True)
    server.start()
    _wait_http(f"http://127.0.0.1:{args.port}/api/runs", token)
    child = subprocess.Popen([sys.executable, "-m", "gradscape.app.demo", "--url", url, "--model", args.model,
                              "--every", str(args.every), "--steps", str(args.steps)])
    print(f"demo: training a {args.model} and streaming every {args.every}th step; open {url}", flush=True)
    try:
        while server.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        child.terminate()
        child.wait(10)
    return 0


def _wait_http(url: str, token: str | None, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
            with urllib.request.urlopen(req, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server did not answer at {url} within {timeout:.0f} s")
