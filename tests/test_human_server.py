"""The labeling API: every bad input is a 4xx that writes nothing; the token guards every route;
many labelers at once; a killed server loses nothing and its restart resumes the queue."""

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from rlhp_jax.human.server import MAX_BODY, ServerThread, check_binding, create_app, free_port, render_instructions
from rlhp_jax.human.store import LabelStore


def make_store(root, n=3, wanted=1):
    store = LabelStore(root)
    (root / "clips").mkdir(exist_ok=True)
    for i in range(n):
        for side in "lr":
            (root / "clips" / f"{i}{side}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes([i]) * 64)
        store.add_query(root / "clips" / f"{i}l.mp4", root / "clips" / f"{i}r.mp4", wanted=wanted, query_id=f"q{i}",
                        info={"true_returns": [float(i), 0.0]})
    return store


@pytest.fixture
def api(tmp_path):
    store = make_store(tmp_path)
    return store, TestClient(create_app(store, instructions="Prefer <b>up</b>.\n\n- keep it up"))


def nothing_written(store):
    return store.labels_since(0) == []


def test_a_full_exchange(api):
    store, c = api
    page = c.get("/")
    assert page.status_code == 200 and "Prefer &lt;b&gt;up&lt;/b&gt;." in page.text  # user text is escaped
    nxt = c.get("/api/next", params={"labeler": "ann"}).json()
    pair = nxt["pair"]
    assert pair["id"] == "q0" and nxt["status"]["queued_for_me"] == 3
    clip = c.get(pair["left"])
    assert clip.status_code == 200 and clip.headers["content-type"] == "video/mp4"
    part = c.get(pair["right"], headers={"Range": "bytes=0-3"})  # browsers seek with byte ranges
    assert part.status_code == 206 and part.content == b"\x00\x00\x00\x18"
    r = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "left"}).json()
    assert r["recorded"] and r["status"]["mine"] == 1
    dup = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "right"}).json()
    assert not dup["recorded"] and dup["choice"] == "left"  # idempotent
    assert [(lab.labeler, lab.choice) for lab in store.labels_since(0)] == [("ann", "left")]
    assert c.get("/api/next", params={"labeler": "ann"}).json()["pair"]["id"] == "q1"


@pytest.mark.parametrize("body, status", [
    ({"pair": "nope", "lease": "x", "choice": "left"}, 404),  # unknown pair
    ({"pair": "q0", "lease": "forged", "choice": "left"}, 409),  # not offered with that lease
    ({"pair": "q0", "lease": "LEASE", "choice": "up"}, 422),  # wrong choice value
    ({"pair": "q0", "lease": "LEASE", "choice": 1}, 422),
    ({"pair": "q0", "lease": "LEASE"}, 422),  # missing field
    ({"pair": "q0", "lease": "LEASE", "choice": "left", "extra": 1}, 422),  # unknown field
    ({"pair": "q0" * 40, "lease": "LEASE", "choice": "left"}, 422),  # oversized field
    (b"{not json", 400),  # malformed JSON
    (b"[1, 2]", 422),
    (b"", 422),
])
def test_bad_answers_are_4xx_and_write_nothing(api, body, status):
    store, c = api
    lease = c.get("/api/next", params={"labeler": "ann"}).json()["pair"]["lease"]
    if isinstance(body, dict):
        body = {k: (lease if v == "LEASE" else v) for k, v in body.items()}
        r = c.post("/api/label", json=body)
    else:
        r = c.post("/api/label", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and "error" in r.json()
    assert nothing_written(store)


def test_withdrawn_pair_is_410(api):
    store, c = api
    pair = c.get("/api/next", params={"labeler": "ann"}).json()["pair"]
    store.withdraw([pair["id"]])
    r = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "left"})
    assert r.status_code == 410 and nothing_written(store)


def test_oversized_bodies_are_refused_before_reading(api):
    store, c = api
    big = b'{"pair": "q0", "lease": "' + b"x" * MAX_BODY + b'", "choice": "left"}'
    assert c.post("/api/label", content=big, headers={"content-type": "application/json"}).status_code == 413

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(4):
            yield b"x" * MAX_BODY

    assert c.post("/api/label", content=chunks(), headers={"content-type": "application/json"}).status_code == 413
    assert nothing_written(store)


def test_bad_labeler_and_clip_requests(api, tmp_path):
    store, c = api
    assert c.get("/api/next", params={"labeler": "<script>"}).status_code == 400
    assert c.get("/api/clip/q0/up").status_code == 422
    assert c.get("/api/clip/nope/left").status_code == 404
    assert c.get("/api/clip/..%2F..%2Fetc%2Fpasswd/left").status_code == 404
    # a tampered database cannot make the server read outside the run directory
    secret = tmp_path.parent / "secret.mp4"
    secret.write_bytes(b"secret")
    store._conn().execute("UPDATE queries SET left_clip = '../secret.mp4' WHERE id = 'q1'")
    r = c.get("/api/clip/q1/left")
    assert r.status_code == 404 and b"secret" not in r.content


def test_the_token_guards_every_route(tmp_path):
    store = make_store(tmp_path)
    c = TestClient(create_app(store, token="s3cret"))
    for path in ("/", "/api/next", "/api/status", "/api/clip/q0/left"):
        assert c.get(path).status_code == 401
    assert c.post("/api/label", json={"pair": "q0", "lease": "x", "choice": "left"}).status_code == 401
    assert c.get("/api/next", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/?token=wrong").status_code == 401
    pair = c.get("/api/next", headers={"Authorization": "Bearer s3cret"}).json()["pair"]
    assert c.get("/?token=s3cret").status_code == 200  # sets the cookie the page's own requests carry
    assert c.get(pair["left"]).status_code == 200
    r = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "tie"})
    assert r.status_code == 200 and r.json()["recorded"]
    assert [lab.choice for lab in store.labels_since(0)] == ["tie"]


def test_serving_beyond_localhost_needs_a_token():
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("localhost", None)
    check_binding("0.0.0.0", "tok")
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        with pytest.raises(ValueError, match="token"):
            check_binding(host, None)
    with pytest.raises(ValueError):
        ServerThread(object(), "0.0.0.0", 0, None)


def test_instructions_become_escaped_paragraphs_and_lists():
    html = render_instructions("One <i>two</i>\nthree.\n\n- a & b\n- c")
    assert html == "<p>One &lt;i&gt;two&lt;/i&gt; three.</p>\n<ul><li>a &amp; b</li><li>c</li></ul>"


def test_many_labelers_at_once_over_http(tmp_path):
    store = make_store(tmp_path, n=120)
    with ServerThread(create_app(store), "127.0.0.1", 0) as server:
        def labeler(name):
            done = []
            with httpx.Client(base_url=server.url, timeout=30) as c:
                while True:
                    pair = c.get("/api/next", params={"labeler": name}).json()["pair"]
                    if pair is None:
                        return done
                    r = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "left"})
                    assert r.status_code == 200
                    if r.json()["recorded"]:
                        done.append(pair["id"])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(labeler, [f"p{i}" for i in range(8)]))
    acknowledged = [q for r in results for q in r]
    stored = [lab.query_id for lab in store.labels_since(0)]
    assert sorted(acknowledged) == sorted(stored) == sorted(f"q{i}" for i in range(120))
    assert sum(1 for r in results if r) > 1


def test_killed_server_loses_nothing_and_restart_resumes_the_queue(tmp_path):
    store = make_store(tmp_path, n=6)

    def start():
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "rlhp_jax.human", "serve", "--run", str(tmp_path), "--port",
                                 str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/api/status", timeout=1)
                return proc, url
            except httpx.TransportError:
                time.sleep(0.1)
        proc.kill()
        raise AssertionError(proc.communicate()[0])

    proc, url = start()
    acked = []
    for _ in range(3):
        pair = httpx.get(url + "/api/next", params={"labeler": "ann"}).json()["pair"]
        r = httpx.post(url + "/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "right"})
        assert r.json()["recorded"]
        acked.append(pair["id"])
    leased = httpx.get(url + "/api/next", params={"labeler": "bob"}).json()["pair"]  # bob is mid-pair
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [lab.query_id for lab in LabelStore(tmp_path).labels_since(0)] == acked

    proc, url = start()
    try:
        again = httpx.get(url + "/api/next", params={"labeler": "bob"}).json()["pair"]
        assert again["id"] == leased["id"] and again["lease"] == leased["lease"]  # bob's lease survived
        r = httpx.post(url + "/api/label", json={"pair": leased["id"], "lease": leased["lease"], "choice": "tie"})
        assert r.json()["recorded"]
        status = httpx.get(url + "/api/status").json()
        assert status["labels"] == 4 and status["open"] == 2
    finally:
        proc.kill()
        proc.wait()
