"""Every JSON API route driven with hostile parameters against a real `gradscape serve` on a loopback port.

Every answer must be JSON with a 2xx/4xx status, and say nothing of where the server keeps its files nor
carry a traceback. A route added later (the debugger's breakpoint routes) is covered by adding it to ROUTES.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
from serving import Server, free_port
from zoo import build

import gradscape

# (method, path template): `{run}`, `{step}` and `{node}` are filled with good and hostile values.
ROUTES: list[tuple[str, str]] = [
    ("GET", "/api/runs"),
    ("GET", "/api/runs/{run}/steps"),
    ("GET", "/api/runs/{run}/steps/{step}"),
    ("GET", "/api/runs/{run}/steps/{step}/nodes/{node}"),
    # the debugger's routes (app/api/debugger.py)
    ("GET", "/api/runs/{run}/breakpoints"),
    ("POST", "/api/runs/{run}/breakpoints"),
    ("DELETE", "/api/runs/{run}/breakpoints"),
    ("GET", "/api/runs/{run}/paused"),
    ("GET", "/api/runs/{run}/paused/nodes"),
    ("GET", "/api/runs/{run}/paused/nodes/{node}"),
    ("POST", "/api/runs/{run}/resume"),
]

# what each route answers to good parameters (and this body): the run is not paused
GOOD_ANSWERS: dict[tuple[str, str], tuple[bytes | None, int]] = {
    ("POST", "/api/runs/{run}/breakpoints"): (b'{"on": "nonfinite"}', 201),
    ("GET", "/api/runs/{run}/paused/nodes"): (None, 409),
    ("GET", "/api/runs/{run}/paused/nodes/{node}"): (None, 409),
    ("POST", "/api/runs/{run}/resume"): (b'{"mode": "continue"}', 409),
}

GOOD = {"run": "fuzz-run", "step": "3", "node": "0"}

# Already as they travel in a request line (percent-encoded where a browser would encode).
HOSTILE = [
    "99999999999999999999999", "9223372036854775808", "9223372036854775807", "-1", "-0", "+1", "1e3", "0x10",
    "1.5", "abc", "nope", "%E0%A5%AF", "%20", "%201", "", "..", "../..", "..%2F..%2Fetc%2Fpasswd", "%2F", "%2e%2e",
    "%00", "a%00b", "%FF%FE", "%C3%28", "%ED%A0%80", "x" * 5000, "%41" * 3000, "%0A", "r%0D%0AX-Evil:%201",
    "%25", "%3F", "%23", "'%3B%20DROP%20TABLE%20steps%3B--", "%5C..%5C",
]

BODIES = [b"", b"{", b'{"mode": 1}', b"\xff\xfe", b"[]", b'{"node": 99999999999999999999999}']


def _urls() -> Iterator[str]:
    for _method, template in ROUTES:
        names = [k for k in GOOD if "{" + k + "}" in template]
        yield template.format(**GOOD)
        for name in names:
            for bad in HOSTILE:
                yield template.format(**{**GOOD, name: bad})
        for bad in ("-1", "99999999999999999999999", "%00", "x" * 3000):
            yield template.format(**GOOD) + f"?rank={bad}&step={bad}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz-store.sqlite"
    case = build("mlp")
    tr = gradscape.Tracer(case.model, sink=str(path), run=GOOD["run"])
    with tr.step(int(GOOD["step"])):
        case.loss(case.model, case.batch).backward()
    tr.close()
    srv = Server(path, free_port()).start()
    yield srv
    srv.stop()


def _request(srv: Server, method: str, url: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.putrequest(method, url, skip_accept_encoding=True)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def _check(srv: Server, method: str, url: str, body: bytes | None = None) -> int:
    status, ctype, raw = _request(srv, method, url, body)
    where = f"{method} {url[:120]} -> {status}: {raw[:300]!r}"
    assert 200 <= status < 500, where
    assert ctype.startswith("application/json"), where
    doc = json.loads(raw)
    text = raw.decode("utf-8", errors="replace")
    assert str(srv.store.parent) not in text and str(srv.store) not in text, where
    assert "Traceback" not in text and 'File "' not in text, where
    if status >= 400:
        assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"], where
    return status


def test_every_route_answers_json_4xx_for_hostile_parameters(served: Server) -> None:
    seen = set()
    for method, _template in ROUTES:
        for url in _urls():
            seen.add(_check(served, method, url, b'{"mode": "step"}' if method != "GET" else None))
    assert 400 in seen and 404 in seen and 200 in seen
    log = served.log.read_text()
    assert "Traceback" not in log, log[-3000:]


def test_good_parameters_answer_200(served: Server) -> None:
    for method, template in ROUTES:
        body, want = GOOD_ANSWERS.get((method, template), (None, 200))
        assert _check(served, method, template.format(**GOOD), body) == want, (method, template)


def test_hostile_bodies_on_the_write_routes_are_json_4xx(served: Server) -> None:
    for method, template in ROUTES:
        if method == "GET":
            continue
        for body in [*BODIES, b'{"on": "norm", "above": "x"}', b'{"on": "node"}', b'{"on": "teleport"}',
                     b'{"mode": "sideways"}', b"[" * 100000, b'{"on": "node", "name": "' + b"x" * 100000 + b'"}']:
            status = _check(served, method, template.format(**GOOD), body)
            assert status < 500, (method, template, body[:50])


@pytest.mark.parametrize("url", ["/api/runs/fuzz-run/steps/99999999999999999999999",
                                 "/api/runs/fuzz-run/steps/3/nodes/99999999999999999999999",
                                 "/api/runs/fuzz-run/steps/-1", "/api/runs/fuzz-run/steps/abc"])
def test_bad_numbers_are_400_naming_the_parameter(served: Server, url: str) -> None:
    status, _, raw = _request(served, "GET", url)
    assert status == 400, raw
    name = "node" if "/nodes/" in url else "step"
    assert json.loads(raw)["error"].startswith(f"{name} must be an integer")


@pytest.mark.parametrize("url", ["/api/nope", "/api/", "/api/runs/fuzz-run/nope", "/api/runs/fuzz-run/steps/3/x/y"])
def test_unknown_api_paths_are_404_json_not_the_page(served: Server, url: str) -> None:
    for method in ("GET", "POST", "DELETE"):
        status, ctype, raw = _request(served, method, url, b"{}")
        assert status == 404 and ctype.startswith("application/json"), (method, url, status, raw[:200])
        assert "no API route" in json.loads(raw)["error"]


def test_wrong_method_on_a_known_route_is_json(served: Server) -> None:
    for body in BODIES:
        status = _check(served, "POST", "/api/runs", body)
        assert status in (404, 405)


def test_missing_step_names_what_not_where(served: Server) -> None:
    status, _, raw = _request(served, "GET", "/api/runs/fuzz-run/steps/4")
    assert status == 404
    assert json.loads(raw) == {"error": "no step 4 in run 'fuzz-run'"}
    assert "sqlite" not in raw.decode()


def test_pages_outside_the_api_are_still_served(served: Server) -> None:
    status, ctype, _ = _request(served, "GET", "/")
    assert status == 200 and ctype.startswith("text/html")

