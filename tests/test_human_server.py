"""The labeling API: every bad input is a 4xx in one shape (``{"error": ...}``) that writes nothing;
the token guards every route and, without one, only this machine's host names are answered (DNS
rebinding); a labeler's name obeys one rule on the page and the server; many labelers at once; a
killed server loses nothing and its restart resumes the queue; the CLI refuses what is not a label
store, or not a run, with one line and changes nothing."""

import concurrent.futures
import hashlib
import math
import os
import re
import signal
import subprocess
import sys
import time
import types
import unicodedata

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhp_jax.human.__main__ import main
from rlhp_jax.human.server import MAX_BODY, ServerThread, check_binding, create_app, free_port, render_instructions
from rlhp_jax.human.store import LabelStore, StoreError, check_labeler

LOCAL = "http://127.0.0.1"  # TestClient's default host name, "testserver", is not this machine's
STRONG = "k3y-of-24-characters_ok"


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
    return store, TestClient(create_app(store, instructions="Prefer <b>up</b>.\n\n- keep it up"), base_url=LOCAL)


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
    check_binding("0.0.0.0", STRONG)
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
    make_store(tmp_path, n=6)  # six open pairs, in the run directory the server is started on

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


# ----------------------------------------------------------------------------- the lease


@pytest.mark.parametrize("lease_s", [math.nan, math.inf, -1.0, 0.0, 2 * 86400.0])
def test_a_lease_is_a_finite_positive_number_of_seconds(tmp_path, lease_s):
    store = make_store(tmp_path)
    with pytest.raises(ValueError, match="lease"):
        store.lease("ann", lease_s)
    with pytest.raises(ValueError, match="lease"):
        create_app(store, lease_s=lease_s)
    assert store._conn().execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0


@pytest.fixture
def served(monkeypatch):
    """The stores ``main(["serve", ...])`` would serve (nothing is served: the test goes on)."""
    stores = []
    monkeypatch.setattr("rlhp_jax.human.__main__.serve_forever", lambda store, env, args: stores.append(store.path))
    return stores


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e9", "soon"])
def test_the_lease_flag_is_checked_when_parsed(tmp_path, capsys, served, value):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--run", str(tmp_path), "--lease", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --lease: " in err and "Traceback" not in err
    assert served == [] and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


# ----------------------------------------------------------------------------- host names, tokens


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost", "LocalHost:80", "[::1]", "[::1]:8000",
                                  "127.5.6.7:1"])
def test_without_a_token_this_machine_s_names_are_answered(tmp_path, host):
    c = TestClient(create_app(make_store(tmp_path)), base_url=LOCAL)
    assert c.get("/api/status", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil",
                                  "0.0.0.0", "192.168.1.5:8000", "[::1", "[::1]:x", "::1", ""])
def test_without_a_token_other_host_names_are_refused(tmp_path, host):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 must get nothing."""
    store = make_store(tmp_path)
    c = TestClient(create_app(store), base_url=LOCAL)
    for r in (c.get("/", headers={"Host": host}), c.get("/api/next?labeler=ann", headers={"Host": host}),
              c.post("/api/label", json={"pair": "q0", "lease": "x", "choice": "left"}, headers={"Host": host})):
        assert r.status_code == 403 and list(r.json()) == ["error"] and "host" in r.json()["error"].lower()
    assert store._conn().execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
    # with a token any host name is fine: the token is the protection
    c = TestClient(create_app(store, token=STRONG), base_url="http://evil.example")
    assert c.get("/api/status", headers={"Authorization": f"Bearer {STRONG}", "Host": host}).status_code == 200


@pytest.mark.parametrize("headers", [{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},  # an <img>
                                     {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},  # another local port
                                     {"Origin": "https://evil.example"}, {"Origin": "null"},
                                     {"Origin": "http://localhost:3000"},  # an app on another local port
                                     # an iframe, or a window opened, on the API itself: a navigation
                                     {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}],
                         ids=["img", "other-port", "origin", "sandboxed", "other-port-origin", "navigate-api"])
def test_without_a_token_another_site_s_page_cannot_lease_or_answer(tmp_path, headers):
    """The Host header is this machine's when a page on evil.example makes the browser request
    http://127.0.0.1:PORT/api/next: it could lease every pair under made-up names, keeping them
    from the labelers for a lease each.  The browser says who asked (Sec-Fetch-Site, Origin)."""
    store = make_store(tmp_path)
    c = TestClient(create_app(store), base_url=LOCAL)
    for r in (c.get("/api/next?labeler=ann", headers=headers), c.get("/api/clip/q0/left", headers=headers),
              c.post("/api/label", json={"pair": "q0", "lease": "x", "choice": "left"}, headers=headers)):
        assert r.status_code == 403 and "another web site" in r.json()["error"]
    assert store._conn().execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
    # the page itself, its own requests, and a link followed to it from anywhere are answered
    own = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Origin": LOCAL}
    assert c.get("/api/next?labeler=ann", headers=own).status_code == 200
    assert c.get("/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}).status_code == 200
    assert c.get("/", headers={"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}).status_code == 200


def test_the_play_page_has_the_same_guard_and_error_shape():
    from rlhp_jax.human.play_server import create_play_app

    session = types.SimpleNamespace(env_name="Pong", fps=15.0, actions=("NOOP", "FIRE"), episodes_wanted=None,
                                    out=None)
    c = TestClient(create_play_app(session), base_url=LOCAL)
    assert c.get("/", follow_redirects=False).status_code == 303
    r = c.get("/", headers={"Host": "evil.example"})
    assert r.status_code == 403 and list(r.json()) == ["error"]
    for r in (c.get("/nowhere"), c.delete("/play"), c.post("/api/play/keys", content=b"\xff\xfe")):
        assert 400 <= r.status_code < 500 and list(r.json()) == ["error"], (r.status_code, r.text)


@pytest.mark.parametrize("token", ["x", " ", " " * 20, "short-token", "a" * 15, "has spaces in it, 24 chars",
                                   "semi;colon=cookie-breaker"])
def test_a_public_bind_needs_a_strong_token(token):
    with pytest.raises(ValueError, match="token"):
        check_binding("0.0.0.0", token)
    with pytest.raises(ValueError, match="token"):
        ServerThread(object(), "0.0.0.0", 0, token)


def test_strong_tokens_and_loopback_binds_are_accepted():
    for token in ("auto", "a" * 16, STRONG):
        check_binding("0.0.0.0", token)
    for token in (None, "", "x", "s3cret"):
        check_binding("127.0.0.1", token)  # on this machine a token is optional and may be short


# ----------------------------------------------------------------------------- one error shape, HEAD


@pytest.mark.parametrize("method, path, body", [
    pytest.param("POST", "/api/label", b"[" * 3000 + b"]" * 3000, id="nested-arrays"),  # deeply nested JSON
    pytest.param("POST", "/api/label", b'{"a": ' * 1200 + b"1" + b"}" * 1200, id="nested-objects"),
    pytest.param("POST", "/api/label", b'{"pair": "q0\xff", "lease": "x", "choice": "left"}', id="bad-utf8"),
    pytest.param("POST", "/api/release", b'\xc3\x28', id="bad-utf8-alone"),
    ("GET", "/nowhere", None),  # FastAPI's own 404
    ("GET", "/api/clip/q0", None),
    ("DELETE", "/", None),  # and its 405
    ("PUT", "/api/label", b"{}"),
    ("GET", "/api/label", None),
    ("OPTIONS", "/api/next", None),
])
def test_every_error_has_the_app_s_one_shape(api, method, path, body):
    store, c = api
    r = c.request(method, path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500 and list(r.json()) == ["error"], (r.status_code, r.text)
    assert nothing_written(store)


@pytest.mark.parametrize("range_", ["bytes=99999-", "bytes=5-1", "chars=0-3", "bytes"])
def test_a_range_the_clip_cannot_serve_is_an_error_in_the_one_shape(api, range_):
    """Starlette's FileResponse answers these in plain text by itself; the guard reshapes them."""
    store, c = api
    r = c.get("/api/clip/q0/left", headers={"Range": range_})
    assert r.status_code in (400, 416) and list(r.json()) == ["error"], r.text


def test_head_answers_for_the_page_and_the_clips(api):
    store, c = api
    page = c.head("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    clip = c.head("/api/clip/q0/left")
    assert clip.status_code == 200 and clip.headers["content-type"] == "video/mp4"
    assert int(clip.headers["content-length"]) == (store.root / "clips" / "0l.mp4").stat().st_size
    assert c.head("/api/clip/nope/left").status_code == 404
    assert nothing_written(store)


# ----------------------------------------------------------------------------- labelers' names


@pytest.mark.parametrize("typed, recorded", [
    ("ünïcode", "ünïcode"), ("名前", "名前"), ("  Ann Lee-2 ", "Ann Lee-2"), ("e\u0301va", "\u00e9va"),
    ("\U0001d49c" * 64, "\U0001d49c" * 64),  # 64 code points (128 UTF-16 units)
])
def test_unicode_names_are_recorded_in_nfc(api, typed, recorded):
    store, c = api
    pair = c.get("/api/next", params={"labeler": typed}).json()["pair"]
    r = c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "tie"})
    assert r.json()["recorded"] and [lab.labeler for lab in store.labels_since(0)] == [recorded]


NAMES = (st.text(st.characters(categories=("L", "N")) | st.sampled_from(list(" _.@-<>/'\t\n\u0301\u00a0\u212b")),
                 max_size=70)
         | st.text(max_size=70))


@settings(max_examples=400)
@given(NAMES)
def test_one_rule_for_labelers_names(name):
    """Python's rule, the character class the page gets, and this definition agree: NFC, spaces
    stripped, 1-64 code points, each a Unicode letter or number or one of space _ . @ -."""
    from rlhp_jax.human import store as store_lib

    nfc = unicodedata.normalize("NFC", name).strip(" ")
    allowed = 1 <= len(nfc) <= 64 and all(unicodedata.category(ch)[0] in "LN" or ch in " _.@-" for ch in nfc)
    assert (re.fullmatch(f"[{store_lib.labeler_chars()}]{{1,64}}", nfc) is not None) == allowed
    if allowed:
        assert check_labeler(name) == nfc
    else:
        with pytest.raises(StoreError):
            check_labeler(name)


# ----------------------------------------------------------------------------- the CLI on what is not a store


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _truncated_store(path):
    src = LabelStore(path.parent / "whole", path=path.parent / "whole.sqlite")
    src.set_meta(**{f"k{i}": "x" * 400 for i in range(100)})
    src.close()
    data = (path.parent / "whole.sqlite").read_bytes()
    path.write_bytes(data[: len(data) // 3])


BAD_STORES = {
    "garbage": lambda path: path.write_bytes(b"this is not a database\n" * 40),
    "truncated": _truncated_store,
    "directory": lambda path: path.mkdir(),
}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("cmd", ["serve", "stats", "export"])
@pytest.mark.parametrize("bad", list(BAD_STORES))
def test_a_bad_label_store_is_one_line_and_changes_nothing(tmp_path, capsys, served, bad, cmd):
    run = tmp_path / "run"
    run.mkdir()
    BAD_STORES[bad](run / "labels.sqlite")
    before = _tree(tmp_path)
    out = ["--out", str(tmp_path / "out.jsonl")] if cmd == "export" else []
    assert main([cmd, "--run", str(run), *out]) == 2
    assert "labels.sqlite" in _one_error_line(capsys)
    assert _tree(tmp_path) == before and served == []


def test_a_read_only_label_store_is_not_served(tmp_path, capsys, served, monkeypatch):
    make_store(tmp_path).close()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: mode != os.W_OK and access(p, mode, **kw))
    assert main(["serve", "--run", str(tmp_path)]) == 2
    assert "read-only" in _one_error_line(capsys) and served == []


@pytest.mark.parametrize("cmd", ["serve", "stats", "export"])
def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys, served, cmd):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8")
    out = ["--out", str(tmp_path / "out.jsonl")] if cmd == "export" else []
    assert main([cmd, "--run", str(d), *out]) == 2
    assert "not a run" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cat.jpg", "photos"] and served == []
    (d / "config.json").write_text("{}")  # the trainer's: a run, whose store may be made
    assert main(["serve", "--run", str(d)]) == 0 and served == [d / "labels.sqlite"]


@pytest.mark.parametrize("cmd", ["stats", "export"])
def test_reading_an_oracle_run_leaves_no_label_store_in_it(tmp_path, capsys, served, cmd):
    """``stats`` and ``export`` only read: on a run that never showed a pair to people (the
    synthetic oracle's) they made an empty labels.sqlite (and its -wal) in someone's run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"env": "CartPole-v1"}')
    out = ["--out", str(tmp_path / "out.jsonl")] if cmd == "export" else []
    assert main([cmd, "--run", str(run), *out]) == 2
    assert "has no label store" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "run"] and served == []
    queue = tmp_path / "q.jsonl"  # a queue file received without its store: nothing to read either
    queue.write_text("")
    assert main([cmd, "--queue", str(queue), *out]) == 2
    assert "no q.sqlite beside it" in _one_error_line(capsys)
    assert not (tmp_path / "q.sqlite").exists()


def test_stats_on_a_file_that_is_not_a_database_leaves_it_as_it_was(tmp_path):
    store = tmp_path / "labels.sqlite"
    store.write_bytes(b"SQLite format 2\x00" + bytes(range(256)) * 8)
    before = _tree(tmp_path)
    r = subprocess.run([sys.executable, "-m", "rlhp_jax.human", "stats", "--run", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not a label store" in lines[0], r.stderr
    assert _tree(tmp_path) == before
