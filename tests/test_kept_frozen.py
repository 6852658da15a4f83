"""NOTE [Kept frozen] (tracer/collector.py): the page's decoded graphs are frozen out of the collector's
reach where the server's process is its own (`gradscape serve`), reference counting still frees them,
and nothing is frozen in a notebook's or a training script's process.

Freezing is process-wide, so each check runs in a fresh Python process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradscape.app import cli
from gradscape.app.server import ServerConfig

_CHILD = r'''
import gc, json, sys
import torch
import gradscape
from gradscape import TraceStore
from gradscape.app.data import PageData

path, freeze, tests = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
sys.path.insert(0, tests)
from zoo import loop_model, loop_step

torch.manual_seed(0)
store = TraceStore(path)
tr = gradscape.Tracer(loop_model())
for i in range(3):
    store.write_step(loop_step(tr, i, 100))
tr.close()
run = store.runs()[0]["run"]
data = PageData(store, freeze=freeze, size=1)  # one graph kept: each read lets the one before go


def tracked(obj):
    return any(o is obj for o in gc.get_objects())


g = data.graph(run, 0)
out = {"nodes": len(g["nodes"]), "equal": g == store.read_graph(run, 0),  # every node decoded (lazily read)
       "nodes_tracked": tracked(g["nodes"]), "node_tracked": tracked(g["nodes"][len(g["nodes"]) // 2]),
       "frozen_first": gc.get_freeze_count()}
del g
for step in (1, 2, 0, 1, 2, 0, 1, 2):
    data.graph(run, step)
out["frozen_last"] = gc.get_freeze_count()
print(json.dumps(out))
'''


def _child(tmp_path: Path, freeze: bool) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "t.sqlite"), "1" if freeze else "0",
                          str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["nodes"] > 1000
    assert out["equal"]  # frozen or not, the graph is the stored one
    return out


def test_a_kept_graph_is_frozen_and_freed_when_let_go(tmp_path: Path) -> None:
    out = _child(tmp_path, freeze=True)
    assert not out["nodes_tracked"]  # out of every generation the collector traverses
    assert not out["node_tracked"]  # the nodes too, decoded all at once after the read (`decode_all_with`)
    assert out["frozen_first"] > 10 * out["nodes"]  # the graph's containers (~20 per node) with it
    # eight more graphs decoded, each frozen, each let go by the next: had reference counting not freed
    # them, the permanent generation would have grown by eight graphs
    assert out["frozen_last"] < out["frozen_first"] + 2 * out["nodes"]


def test_without_freeze_the_graph_stays_with_the_collector(tmp_path: Path) -> None:
    out = _child(tmp_path, freeze=False)
    assert out["nodes_tracked"] and out["node_tracked"]
    assert out["frozen_first"] == out["frozen_last"] == 0


def test_only_gradscape_serve_freezes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gradscape serve` asks for it; the default (the server a notebook or a script starts) does not."""
    from gradscape.app import server

    assert ServerConfig().freeze_graphs is False
    seen: list[ServerConfig] = []

    class Stop(Exception):
        pass

    def capture(store: str, config: ServerConfig) -> Any:
        seen.append(config)
        raise Stop

    monkeypatch.setattr(server, "create_app", capture)
    with pytest.raises(Stop):
        cli.serve(str(tmp_path / "s.sqlite"), "127.0.0.1", 0, None)
    assert seen[0].freeze_graphs is True
