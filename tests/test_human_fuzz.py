"""Fuzzing the labeling API in-process (Starlette's TestClient: no network, no server thread).

Hypothesis draws sequences of requests: random methods, paths (the real routes, their prefixes,
random segments, ``..``, percent-encodings, very long ones), query strings, headers (Host,
Content-Type, lying Content-Lengths, Range, cookies, Authorization) and bodies (answers carrying
a real lease, random JSON, JSON nested thousands deep, invalid UTF-8, bodies over the cap),
interleaved with real lease-and-answer cycles so that answers are recorded while the fuzzing
goes on; once with no access token and once with one.

After every request: no 5xx, and every error is JSON ``{"error": "..."}``.  After every
sequence: the store passes ``PRAGMA integrity_check``; the labels in it are exactly the answers
the API acknowledged with ``recorded: true`` (none lost, none invented), at most one per pair
and labeler.
"""

from __future__ import annotations

import itertools
import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhp_jax.human.server import MAX_BODY, TOKEN_COOKIE, create_app
from rlhp_jax.human.store import LabelStore

TOKEN = "fuzz-Token_0123456789"
LOCAL = "http://127.0.0.1:8000"
PAIRS = 4
LABELERS = ("ann", "名前", "Bob Lee-2")
CHOICES = ("left", "right", "tie", "cant_tell")
ROUTES = ["/", "/api/next", "/api/label", "/api/release", "/api/status", "/api/clip/q0/left",
          "/api/clip/q1/right", "/api/clip/q9/left", "/play", "/api/play/status", "/docs", "/openapi.json"]
PREFIXES = ["/api", "/api/", "/api/clip", "/api/clip/", "/api/clip/q0", "/api/clip/q0/", "//", "/./", "/api/./next"]

# ----------------------------------------------------------------------------- strategies

_SEGMENT_CHARS = st.characters(codec="ascii", exclude_characters="?#%/\\", min_codepoint=0x21, max_codepoint=0x7e)
_percent = st.integers(0, 255).map(lambda b: f"%{b:02X}")
segment = st.one_of(
    st.sampled_from(["..", ".", "%2e%2e", "%2E%2E%2F", "%2F", "%00", "%FF", "q0", "left", "right", "api", "clip",
                     "名前", "%E5%90%8D", "a" * 3000, ""]),
    st.lists(st.one_of(_SEGMENT_CHARS, _percent), max_size=12).map("".join),
)
path = st.one_of(
    st.sampled_from(ROUTES[:7]),  # the real routes, drawn most often
    st.sampled_from(ROUTES + PREFIXES),
    st.tuples(st.sampled_from(ROUTES + PREFIXES), st.lists(segment, max_size=4)).map(
        lambda t: "/".join([t[0].rstrip("/"), *t[1]])),
    st.lists(segment, min_size=1, max_size=6).map(lambda segs: "/" + "/".join(segs)),
).map(lambda p: "/" + p.lstrip("/"))  # never "//host/...": every request stays with the app

_query_text = st.one_of(st.sampled_from(["ann", "名前", "<b>", "", " ", "x" * 70, "%FF", "%00", "a+b", "1", "-1",
                                         "nan", "1e999", TOKEN, "wrong"]),
                        st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12))
query = st.lists(st.tuples(st.sampled_from(["labeler", "token", "after", "wait", "x", ""]), _query_text), max_size=4)

_header_value = st.one_of(st.text(st.characters(codec="ascii", min_codepoint=0x20, max_codepoint=0x7e), max_size=40),
                          st.binary(max_size=20).map(lambda b: bytes(c for c in b if c not in b"\r\n\x00")))
headers = st.fixed_dictionaries({}, optional={
    "Host": st.one_of(st.sampled_from(["127.0.0.1", "127.0.0.1:8000", "localhost:1", "[::1]:80", "127.9.9.9"]),
                      st.sampled_from(["evil.example", "evil.example:8000", "localhost.evil", "0.0.0.0", "", "[::1",
                                       "::1", "127.0.0.1:99999999"]), _header_value),
    "Content-Type": st.one_of(st.sampled_from(["application/json", "application/json; charset=latin-1",
                                               "text/plain", "application/x-www-form-urlencoded",
                                               "multipart/form-data; boundary=x", "application/json; charset=utf-16"]),
                              _header_value),
    "Content-Length": st.one_of(st.integers(-5, 4 * MAX_BODY).map(str), st.sampled_from(["abc", " 5", "1e3", "0x10"]),
                                st.just(b"\xb2")),
    "Range": st.one_of(st.sampled_from(["bytes=0-3", "bytes=99999-", "bytes=5-1", "bytes=-0", "bytes=-5", "chars=1-2",
                                        "bytes=0-1,2-3", "bytes=0-1,0-1,5-9", "bytes", "bytes=", "bytes=-", "=",
                                        "bytes=a-b", "bytes=1-" + "9" * 30]), _header_value),
    "Cookie": st.one_of(st.sampled_from([f"{TOKEN_COOKIE}={TOKEN}", f"{TOKEN_COOKIE}=wrong", f"{TOKEN_COOKIE}=",
                                         "a=b; c", "=;=;", f'{TOKEN_COOKIE}="{TOKEN}"']), _header_value),
    "Authorization": st.one_of(st.sampled_from([f"Bearer {TOKEN}", "Bearer wrong", "Bearer", "Bearer  ", "Basic eA==",
                                                f"bearer {TOKEN}", f"Bearer {TOKEN} extra"]), _header_value),
    "If-Range": st.sampled_from(["W/x", '"etag"', "Mon, 01 Jan 2024 00:00:00 GMT"]),
})

json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _answer(draw_lease: int, pair: str | None, choice, extra: dict):
    """A body built when the request is sent: an answer carrying the ``draw_lease``-th real
    lease handed out so far (or a made-up one), to its own pair or to another."""
    def build(leases: list[tuple[str, str]]) -> bytes:
        lease, own = leases[draw_lease % len(leases)] if leases else ("made-up", "q0")
        return json.dumps(dict(pair=own if pair is None else pair, lease=lease, choice=choice, **extra)).encode()
    return build


answer_body = st.builds(
    _answer, st.integers(0, 50), st.one_of(st.none(), st.none(), st.sampled_from(["q0", "q1", "nope", ""])),
    st.one_of(st.sampled_from(CHOICES), json_value),
    st.one_of(st.just({}), st.just({}), st.dictionaries(st.sampled_from(["extra", "labeler"]), json_value, max_size=1)))
body = st.one_of(
    st.none(),
    answer_body,
    st.builds(lambda i: (lambda leases: json.dumps({"lease": leases[i % len(leases)][0] if leases else "x"}).encode()),
              st.integers(0, 50)),  # a release of a real lease
    json_value.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.integers(1, 4000), st.sampled_from("[{")).map(  # nested deeper than any parser recurses
        lambda t: (b"[" * t[0] + b"]" * t[0]) if t[1] == "[" else (b'{"a":' * t[0] + b"1" + b"}" * t[0])),
    st.binary(max_size=60).map(lambda b: b'{"pair": "q0", "lease": "' + b + b'", "choice": "left"}'),  # bad UTF-8
    st.sampled_from([b"\xff\xfe", b'"\xc3\x28"', b"\xed\xa0\x80", b"{", b"", b"null", b"NaN", b"1e99999"]),
    st.integers(MAX_BODY - 2, 3 * MAX_BODY).map(lambda n: b"x" * n),  # around the cap, and over it
    st.binary(max_size=200),
)
method = st.one_of(st.sampled_from(["GET", "POST", "HEAD"]),
                   st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
request = st.tuples(method, path, query, headers, body, st.booleans())  # last: start from the right credentials
answer = st.tuples(st.just("POST"), st.just("/api/label"), st.just([]), headers, answer_body, st.just(True))
cycle = st.tuples(st.just("cycle"), st.sampled_from(LABELERS), st.sampled_from(CHOICES))
actions = st.lists(st.one_of(request, answer, cycle), min_size=1, max_size=25)

# ----------------------------------------------------------------------------- the run


class Run:
    """One sequence against a fresh store; keeps the model of what the API acknowledged."""

    def __init__(self, root, token: str | None):
        self.store = LabelStore(root)
        (root / "clips").mkdir()
        for i in range(PAIRS):
            for side in "lr":
                (root / "clips" / f"{i}{side}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes([i]) * 64)
            # pair 0 is for every labeler (agreement studies), the others for one each
            self.store.add_query(root / "clips" / f"{i}l.mp4", root / "clips" / f"{i}r.mp4", query_id=f"q{i}",
                                 wanted=0 if i == 0 else 1)
        self.token = token
        self.client = TestClient(create_app(self.store, token=token), base_url=LOCAL)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.leases: list[tuple[str, str]] = []  # (lease, pair) as handed out
        self.acknowledged: list[tuple[str, str, str]] = []  # (pair, labeler, choice) answered "recorded"

    def send(self, method, url, params=(), headers=None, content=None):
        r = self.client.request(method, url, params=list(params), headers=headers, content=content)
        assert r.status_code < 500, (method, url, params, headers, content, r.status_code, r.text)
        if r.status_code >= 400 and (method != "HEAD" or r.content):
            assert r.headers["content-type"] == "application/json", (method, url, r.status_code, r.text)
            error = r.json()
            assert isinstance(error, dict) and set(error) == {"error"} and isinstance(error["error"], str), r.text
        self.note(r, content)
        return r

    def note(self, r, content) -> None:
        """Remember leases handed out and answers acknowledged."""
        if r.status_code != 200 or r.headers.get("content-type") != "application/json" or not r.content:
            return
        data = r.json()
        path = r.request.url.path
        if path == "/api/next" and isinstance(data, dict) and data.get("pair"):
            self.leases.append((data["pair"]["lease"], data["pair"]["id"]))
        if path == "/api/label" and data.get("recorded"):
            answer = json.loads(content)
            row = self.store._conn().execute("SELECT labeler FROM leases WHERE token = ? AND query_id = ?",
                                             (answer["lease"], answer["pair"])).fetchone()
            assert row is not None, ("recorded an answer to an offer never made", answer)
            assert dict(self.leases).get(answer["lease"]) == answer["pair"], "a lease the API never handed out"
            self.acknowledged.append((answer["pair"], row["labeler"], answer["choice"]))

    def cycle(self, labeler: str, choice: str) -> None:
        pair = self.send("GET", "/api/next", [("labeler", labeler)], self.auth).json()["pair"]
        if pair is not None:
            body = json.dumps(dict(pair=pair["id"], lease=pair["lease"], choice=choice)).encode()
            r = self.send("POST", "/api/label", (), {**self.auth, "Content-Type": "application/json"}, body)
            assert r.status_code == 200, r.text

    def fuzz(self, method, path_, params, headers_, body_, credentials: bool) -> None:
        content = body_(self.leases) if callable(body_) else body_
        self.send(method, path_, params, {**(self.auth if credentials else {}), **headers_}, content)

    def check(self) -> None:
        db = self.store._conn()
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = [(lab.query_id, lab.labeler, lab.choice) for lab in self.store.labels_since(0)]
        assert len({(q, who) for q, who, _ in stored}) == len(stored), "two labels from one labeler for one pair"
        assert sorted(stored) == sorted(self.acknowledged)  # none lost, none invented, none acknowledged twice
        self.client.close()
        self.store.close()


_runs = itertools.count()


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                  HealthCheck.data_too_large])
@given(steps=actions)
def test_the_api_under_fuzzing(tmp_path, token, steps):
    root = tmp_path / f"run{next(_runs)}"
    root.mkdir()
    run = Run(root, token)
    for step in steps:
        if step[0] == "cycle":
            run.cycle(*step[1:])
        else:
            run.fuzz(*step)
    run.check()
