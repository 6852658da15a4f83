"""`gradscape` command line. The web server and the demo arrive with the server issue; until then
`gradscape show FILE` prints a recorded step."""

from __future__ import annotations

import argparse
import sys

import tracer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gradscape", description="A visual debugger for the PyTorch backward pass.")
    sub = ap.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print one recorded step of a trace file")
    show.add_argument("path", help="a .sqlite trace file written by tracer.Tracer(sink=...)")
    show.add_argument("--run", default=None, help="run name (default: the newest run)")
    show.add_argument("--step", type=int, default=None, help="step number (default: the last step)")
    show.add_argument("--nodes", type=int, default=60, help="at most this many nodes")
    sub.add_parser("runs", help="list the runs and steps of a trace file").add_argument("path")
    args = ap.parse_args(argv)
    try:
        if args.command == "show":
            from tracer._report import format_step

            print(format_step(tracer.load(args.path, args.run, args.step), max_nodes=args.nodes))
        elif args.command == "runs":
            with tracer.TraceStore(args.path, readonly=True) as store:
                for r in store.runs():
                    print(f"{r['run']}: {r['steps']} steps (last {r['last_step']})")
    except tracer.StoreError as exc:
        print(f"gradscape: {exc}", file=sys.stderr)
        return 2
    return 0
