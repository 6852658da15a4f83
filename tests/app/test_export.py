"""The offline HTML file and the notebook's inline display, without a browser: what the file holds (the
page's ids, the step's data, no network reference, no path of the writer's machine), `gradscape export`,
and the inline SVG (tests/e2e/test_export.py opens the file in Chromium; tests/test_notebook.py runs a
real kernel)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from torch import nn
from zoo import build, loop_model, loop_step

import gradscape
from gradscape.app import cli
from gradscape.app.export.data import LEVELS, PAD_CODE, page_data
from gradscape.app.export.html import export_file, scrub_json, scrub_paths, write_html
from gradscape.app.view import default_collapse
from gradscape.tracer.record import native
from gradscape.tracer.step_doc import page_form
from gradscape.tracer.wire import TraceFormatError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _step(tmp_path: Path | None = None, **opts: Any) -> Any:
    torch.manual_seed(0)
    model = Net()
    sink = str(tmp_path / "t.sqlite") if tmp_path else None
    with gradscape.Tracer(model, sink=sink, run="r", **opts) as tr:
        for i in range(2):
            with tr.step(i) as st:
                model(torch.randn(4, 6)).pow(2).mean().backward()
    return st


def _parts(text: str) -> tuple[dict[str, Any], bytes]:
    data = re.search(r'<script type="text/plain" id="gs-data">(.*?)</script>', text, re.S)
    cells = re.search(r'<script type="text/plain" id="gs-cells">(.*?)</script>', text, re.S)
    assert data and cells
    return (json.loads(zlib.decompress(base64.b64decode(data.group(1))).decode("utf-8")),
            zlib.decompress(base64.b64decode(cells.group(1))))


def test_file_holds_the_step_and_refers_to_nothing_outside(tmp_path: Path) -> None:
    st = _step()
    path = st.to_html(tmp_path / "step.html")
    text = path.read_text(encoding="utf-8")
    for eid in ("graph", "inspector", "problems", "backward-player"):
        assert f'id="{eid}"' in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "the file loads something from a network"
    assert "@import" not in text and "url(http" not in text
    # the player's icons: assets/icons.css inlined, each mask a data: URL
    for name in ("prev", "play", "pause", "next"):
        assert f'.gs-icon-{name} {{ --gs-icon: url("data:image/svg+xml,' in text
    data, cells = _parts(text)
    assert (data["run"], data["step"]) == ("r", 1)
    assert [n["name"] for n in data["nodes"]] == [n.name for n in st.nodes]
    assert data["order"] == st.order
    # the first view draws every node of this small step, at the positions the view layer laid out
    assert sorted(e[0] for e in data["states"][""]["nodes"]) == sorted(f"n{n.id}" for n in st.nodes)
    # a slot's heatmap decodes back to its thumbnail (8-bit codes over the map's own symmetric range)
    node = next(n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc1")
    slot = next(s for s in data["nodes"][node.id]["grad_inputs"] if s["tensor"] is not None and
                s["label"].endswith("fc1.weight (transposed)"))
    hm = data["heatmaps"][str(slot["tensor"])]
    thumb = node.grad_inputs[[s["label"] for s in data["nodes"][node.id]["grad_inputs"]].index(slot["label"])].thumb
    codes = np.frombuffer(cells, np.uint8)[hm["offset"]:hm["offset"] + hm["rows"] * hm["cols"]].reshape(thumb.shape)
    assert (codes != PAD_CODE).all()
    back = (codes / LEVELS * 2 - 1) * hm["m"]
    assert hm["m"] == pytest.approx(float(np.abs(thumb).max()))
    np.testing.assert_allclose(back, thumb, atol=hm["m"] / LEVELS + 1e-12)


def test_no_path_of_the_writers_machine(tmp_path: Path) -> None:
    st = _step()
    home = "/home/alice/projects/secret-model"
    nodes = [dataclasses.replace(n, source=f"{home}/{n.source}") if n.source else n for n in st.nodes]
    assert any(n.source and n.source.startswith(home) for n in nodes)
    st = dataclasses.replace(st, nodes=nodes)  # NodeTraces are read-only: a changed copy, as a user makes one
    st.meta["script"] = f"{home}/train.py"
    st.meta["cwd"] = "C:\\Users\\alice\\work\\run1\\"
    st.problems.append(gradscape.Problem("no_grad", f"fc3.weight got no gradient ({home}/train.py:12)", None,
                                         "fc3.weight", f"{home}/train.py:12"))
    text = st.to_html(tmp_path / "send-me.html").read_text(encoding="utf-8")
    data, _ = _parts(text)
    text += json.dumps(data, ensure_ascii=False)  # the page data is deflated in the file: read it inflated too
    assert "alice" not in text and "/home/" not in text and "secret-model" not in text
    assert str(tmp_path) not in text
    sources = {n["source"] for n in data["nodes"] if n["source"]}
    assert sources and all(re.fullmatch(r"[\w.]+\.py:\d+", s) for s in sources), sources
    assert "(train.py:12)" in data["problems"][-1]["message"]


@pytest.mark.parametrize(("given", "kept"), [
    ("/home/a/b/train.py:41", "train.py:41"),
    ("at /opt/x/y.py:3 and /srv/z/w.py", "at y.py:3 and w.py"),
    ("~/proj/model.py:9", "model.py:9"),
    ("C:\\Users\\a\\m.py:2", "m.py:2"),
    ("train.py:41", "train.py:41"),
    ("http://127.0.0.1:8050/api/runs", "http://127.0.0.1:8050/api/runs"),
    ("mat2 → fc2.weight (transposed)", "mat2 → fc2.weight (transposed)"),
    ("1/2/3 of a [4/8] view", "1/2/3 of a [4/8] view"),
    ('said "go"\n/home/a/b/c.py:7', 'said "go"\nc.py:7'),
    ("∂L/∂output", "∂L/∂output"),
])
def test_scrub_paths(given: str, kept: str) -> None:
    assert scrub_paths({"k": [given]}) == {"k": [kept]}
    # the same cut on the page data's JSON text, a key and its neighbours untouched
    text = json.dumps({given: [1, given, {"n": 2.5, "s": "x"}], "after": "a\"b"}, ensure_ascii=False)
    assert json.loads(scrub_json(text)) == {kept: [1, kept, {"n": 2.5, "s": "x"}], "after": "a\"b"}


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = _step(tmp_path)
    out = tmp_path / "out.html"
    assert cli.main(["export", str(tmp_path / "t.sqlite"), "--run", "r", "--step", "0", "-o", str(out)]) == 0
    data, _ = _parts(out.read_text(encoding="utf-8"))
    assert (data["run"], data["step"], len(data["nodes"])) == ("r", 0, len(st.nodes))
    assert cli.main(["export", str(tmp_path / "t.sqlite"), "--step", "7", "-o", str(out)]) == 2
    assert "no step 7 of run 'r'" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["mlp", "transformer", "two_heads", "grabbag", "full", "loop"])
def test_a_stored_step_exports_as_the_step_read_back_does(tmp_path: Path, case: str) -> None:
    """`gradscape export` reads the stored document's maps and arrays (`read_graph`, `read_arrays`) and makes
    no `StepTrace`: its file is the one `write_html(gradscape.load(...))` writes, byte for byte."""
    path = tmp_path / "t.sqlite"
    if case == "loop":
        with gradscape.Tracer(loop_model(), sink=str(path), run="r") as tr:
            loop_step(tr, 0, 40)
    else:
        zoo_case = build("mlp" if case == "full" else case)
        with gradscape.Tracer(zoo_case.model, sink=str(path), run="r",
                              tensors="full" if case == "full" else "summary") as tr, tr.step(0):
            zoo_case.loss(zoo_case.model, zoo_case.batch).backward()
    exported, written = tmp_path / "export.html", tmp_path / "write.html"
    export_file(path, None, None, 0, exported)
    write_html(gradscape.load(path), written)
    assert exported.read_bytes() == written.read_bytes()
    data, cells = _parts(exported.read_text(encoding="utf-8"))
    assert data["nodes"] and (cells or case == "loop")


def test_inline_display_is_an_svg_of_the_graph_and_repr_is_short() -> None:
    st = _step()
    page = st._repr_html_()
    svg = re.search(r"<svg .*?</svg>", page, re.S)
    assert svg is not None
    for n in st.nodes:  # every node drawn (a small graph is not folded), with the page's colours
        assert f'data-id="n{n.id}"' in svg.group(0)
    assert "problems</b>: no problems found" in page
    assert "busiest nodes" in page and "mat2 → fc2.weight (transposed)" in page
    assert len(repr(st)) < 120 and repr(st).startswith("StepTrace(run='r', step=1")


def test_inline_display_of_a_big_step_is_folded_by_module() -> None:
    layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)) for _ in range(40))

    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = layers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = x + layer(x)
            return x

    model = Deep()
    with gradscape.Tracer(model) as tr, tr.step(0) as st:
        model(torch.randn(2, 4)).sum().backward()
    folded = default_collapse(step_to_wire(st))
    assert folded
    svg = st._repr_html_()
    assert all(f'data-id="m:{m}"' in svg for m in folded)
    assert svg.count("<g data-id=") < len(st.nodes) / 3


def test_show_serves_a_trace_file_on_loopback_reuses_and_stops_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.error
    import urllib.request

    from gradscape.app import notebook

    monkeypatch.setenv("GRADSCAPE_REMOTE", "0")
    _step(tmp_path)
    view = gradscape.show(str(tmp_path / "t.sqlite"), display=False)
    try:
        assert view.url.startswith("http://127.0.0.1:") and view.remote is None
        with urllib.request.urlopen(view.url + "api/runs", timeout=10) as resp:
            assert [r["run"] for r in json.loads(resp.read())["runs"]] == ["r"]
        assert gradscape.show(tmp_path / "t.sqlite", display=False).port == view.port  # reused
        assert '<iframe src="' + view.url + '"' in view._repr_html_()
    finally:
        notebook.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(view.url + "api/runs", timeout=5)
    with pytest.raises(FileNotFoundError, match="no trace file"):
        gradscape.show(tmp_path / "missing.sqlite", display=False)
    with pytest.raises(TypeError, match="StepTrace, a Tracer or a trace file"):
        gradscape.show(42, display=False)


@pytest.mark.parametrize(("env", "words"), [
    ({"SSH_CONNECTION": "10.1.1.1 5000 10.1.1.2 22"}, "ssh session"),
    ({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}, "JupyterHub"),
    ({"GRADSCAPE_REMOTE": "1"}, "GRADSCAPE_REMOTE=1"),
    ({"GRADSCAPE_REMOTE": "0", "SSH_CONNECTION": "10.1.1.1 5000 10.1.1.2 22"}, None),
    ({}, None),
])
def test_remote_kernel_guess(env: dict[str, str], words: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscape.app.notebook import forward_hint, remote_reason

    for var in ("GRADSCAPE_REMOTE", "SSH_CONNECTION", "JUPYTERHUB_API_URL", "CODESPACES", "COLAB_RELEASE_TAG",
                "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reason = remote_reason()
    assert (reason is None) if words is None else (words in (reason or ""))
    if reason and "SSH_CONNECTION" in env:
        assert "ssh -N -L 8123:127.0.0.1:8123 " in forward_hint(8123, reason) and "@10.1.1.2" in forward_hint(8123,
                                                                                                              reason)


def test_importing_gradscape_stays_cheap() -> None:
    import subprocess
    import sys

    code = ("import sys, gradscape; gradscape.show; "
            "print(sorted(m for m in ('torch', 'dash', 'IPython', 'flask') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_12_layer_gpt_step_fits_in_5_mb(tmp_path: Path) -> None:
    """The budget of issue 20 §3, on bench/'s W4 in summary mode (bench/export.py prints the parts)."""
    import sys

    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.workloads import gpt12

    w = gpt12()
    with gradscape.Tracer(w.model) as tr, tr.step(0) as st:
        w.loss(w.model, w.batch()).backward()
    path = st.to_html(tmp_path / "gpt12.html")
    data, cells = _parts(path.read_text(encoding="utf-8"))
    assert path.stat().st_size <= 5 * 1024 * 1024
    assert len(data["nodes"]) == len(st.nodes) and len(data["states"]) > 100  # every block can be opened
    assert len(cells) == sum(h["rows"] * h["cols"] for h in data["heatmaps"].values() if h and "rows" in h)


def test_pictures_and_views_past_the_files_budgets_are_left_out(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Export budgets] in app/export/views.py: heatmap cells up to a budget (each slot past it keeps its
    exact statistics and says why it has no picture), views laid out up to a budget of work."""
    import gradscape.app.export.data as export_data
    import gradscape.app.export.views as export_views
    from bench.workloads import residual_stages

    model = residual_stages(stages=4, blocks=8)  # a step that opens folded by module
    with gradscape.Tracer(model) as tr, tr.step(0) as st:
        model(torch.randn(2, 4)).pow(2).sum().backward()
    full, full_cells = _parts(st.to_html(tmp_path / "full.html").read_text(encoding="utf-8"))
    pictures = [h for h in full["heatmaps"].values() if h and "rows" in h]
    assert len(pictures) > 4 and len(full["states"]) > 1 and full["states_left_out"] == 0
    first = pictures[0]["rows"] * pictures[0]["cols"]
    monkeypatch.setattr(export_data, "CELL_BUDGET", first)  # room for the first picture only
    monkeypatch.setattr(export_views, "STATE_WORK", 1)  # the first view only
    data, cells = _parts(st.to_html(tmp_path / "small.html").read_text(encoding="utf-8"))
    kept = [h for h in data["heatmaps"].values() if h and "rows" in h]
    assert len(kept) == 1 and len(cells) == first == len(full_cells[:first])
    assert sum(1 for h in data["heatmaps"].values() if h == {"note": export_data.LEFT_OUT}) == len(pictures) - 1
    first = data["states"][""]
    folds = [e[0] for e in first["nodes"] if e[0].startswith("m:")] + [f"g:{b[0]}" for b in first["boxes"]]
    # drawn, but none opens a view: the page says so when one is clicked (tests/e2e/test_export.py)
    assert list(data["states"]) == [""] and first["opens"] == {} and data["states_left_out"] == len(folds) > 0
    assert data["nodes"] == full["nodes"]  # every node's statistics, still


@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles
def test_the_header_says_what_a_compiled_models_step_did(tmp_path: Path) -> None:
    """As the live page's header (app/view/compiled.py): a compiled model's traced step ran eagerly; an eager
    model's step says nothing."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 6)
    cm = torch.compile(model, backend="aot_eager")
    cm(x).sum().backward()  # compiled, untraced
    with gradscape.Tracer(cm, monitor=False) as tr, tr.step(0) as st:
        cm(x).sum().backward()
    header = re.search(r'<div class="gs-header">(.*?)</div>\s*<div class="gs-main">', st.to_html(tmp_path / "c.html")
                       .read_text(encoding="utf-8"), re.S)
    assert header and re.search(r'<span class="gs-step-note gs-note-compiled" title="[^"]+">ran eagerly for tracing '
                                r'\(compiled model\)</span>', header.group(1))
    plain = _step().to_html(tmp_path / "e.html").read_text(encoding="utf-8")
    assert '<div class="gs-step-notes"></div>' in plain and '<span class="gs-step-note' not in plain


def _trained_step(tmp_path: Path, recorder: str) -> Any:
    """A step with two backward passes, clipping and an SGD step, recorded by `recorder`, kept in a trace file."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradscape.Tracer(model, sink=str(tmp_path / "t.sqlite"), run="r", recorder=recorder) as tr, \
            tr.step(0) as st:
        for _ in range(2):
            model(torch.randn(4, 6)).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return st


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_step_in_memory_is_drawn_from_the_form_the_file_keeps(tmp_path: Path, recorder: str) -> None:
    """`st.to_html()` and the notebook's display draw the step from its column document, as the page and
    `gradscape export` read the stored step (`page_form`): the two files' data are
    equal (their pictures are not: the file keeps them in 8 bits, NOTE [Compact thumbnails] in
    tracer/wire/compact.py), and the page's data and pictures are those an earlier release's maps of the step give."""
    if recorder == "native" and not native.status()[0]:
        pytest.skip("the native recorder is not built here")
    st = _trained_step(tmp_path, recorder)
    wire, arrays = page_form(st)
    assert len(wire["nodes"]) == len(st.nodes) and len(wire["passes"]) == 2 and wire["optimizer_steps"]
    exported, written = tmp_path / "export.html", tmp_path / "write.html"
    export_file(tmp_path / "t.sqlite", "r", 0, 0, exported)
    st.to_html(written)
    assert "<svg" in st._repr_html_()
    from_file, from_memory = (_parts(p.read_text(encoding="utf-8"))[0] for p in (exported, written))
    assert from_memory == from_file
    assert page_data(wire, arrays) == page_data(step_to_wire(st))  # an earlier release's maps of it


def test_a_step_the_columns_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    """A step built by hand whose node time is not its first run's: the columns would derive it, so drawing
    it raises, naming the node, and writes no file (NOTE [Columns of any step] in
    tracer/wire/trace_columns.py)."""
    st = _step()
    k = next(k for k, n in enumerate(st.nodes) if n.runs and n.time_us is not None)
    nodes = list(st.nodes)
    nodes[k] = dataclasses.replace(nodes[k], time_us=nodes[k].time_us + 1.0)
    with pytest.raises(TraceFormatError, match=f"node {k}'s order, time or gradients are not its first run's"):
        dataclasses.replace(st, nodes=nodes).to_html(tmp_path / "f.html")
    assert not (tmp_path / "f.html").exists()
    st.to_html(tmp_path / "f.html")
