"""The labeling page in a real browser: Playwright driving Debian's Chromium (headless).

What a person does is what is tested: the two clips load and play (muted, looping, as long as
the encoded clip), every key and every button records the answer it names for the pair on
screen and nothing else, the page waits for pairs and shows one without a reload when it
arrives, the access token works from the URL and its absence is refused, the name typed in
the box is the labeler recorded (in any script: the page checks names by the server's own rule),
and the answer keys are inert while the name box has focus.

One queue of random-policy CartPole clips and one browser serve the whole module; every test
gets its own label store (over those clips), its own server and its own page.  Playwright's
own browser download is never used: ``executable_path`` is Debian's ``chromium``.
"""

from __future__ import annotations

import random
import sys
import time

import pytest

from rlhp_jax.human.browser import CHROMIUM, SKIP_REASON, launch

if CHROMIUM is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402

from rlhp_jax.render.video import probe_mp4  # noqa: E402
from rlhp_jax.human.__main__ import make_queue  # noqa: E402
from rlhp_jax.human.server import ServerThread, create_app  # noqa: E402
from rlhp_jax.human.store import LabelStore, StoreError, check_labeler  # noqa: E402

QUEUE_PAIRS = 8
POLL_S = 0.5  # the page's polling period while it waits for pairs
TIMEOUT_MS = 10_000
KEYS = {"ArrowLeft": "left", "ArrowRight": "right", "ArrowUp": "tie", "ArrowDown": "cant_tell"}
CHOICES = ["left", "right", "tie", "cant_tell"]

_VIDEO_STATE = """() => ['left', 'right'].map((id) => {
  const v = document.getElementById(id);
  return {src: v.currentSrc, readyState: v.readyState, duration: v.duration, currentTime: v.currentTime,
          paused: v.paused, ended: v.ended, muted: v.muted, loop: v.loop, width: v.videoWidth,
          height: v.videoHeight, frames: v.getVideoPlaybackQuality().totalVideoFrames,
          error: v.error && v.error.code};
})"""


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """A saved queue of CartPole pairs: ``(directory, [(left_clip, right_clip, segments), ...])``."""
    out = tmp_path_factory.mktemp("browser") / "queue"
    make_queue("CartPole-v1", QUEUE_PAIRS, out, seed=0)
    store = LabelStore(out, path=out / "queue.sqlite")
    rows = store._conn().execute("SELECT left_clip, right_clip, segments FROM queries ORDER BY rowid").fetchall()
    store.close()
    assert len(rows) == QUEUE_PAIRS
    return out, [tuple(r) for r in rows]


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    """One headless Chromium (Debian's) for the module."""
    with sync_playwright() as pw:
        ctx = launch(pw, tmp_path_factory.mktemp("chromium-profile"), TIMEOUT_MS)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def store_with(queue, tmp_path):
    """``store_with(n, wanted=1)``: a fresh label store holding the first ``n`` pairs of the queue."""
    root, rows = queue
    stores = []

    def make(n: int, wanted: int = 1) -> LabelStore:
        store = LabelStore(root, path=tmp_path / f"labels{len(stores)}.sqlite")
        for i in range(n):
            add_pair(store, rows, i, wanted)
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.close()


def add_pair(store: LabelStore, rows, i: int, wanted: int = 1) -> str:
    left, right, seg = rows[i]
    return store.add_query(left, right, seg, {"env": "CartPole-v1", "pair": i}, wanted=wanted)


@pytest.fixture
def serve():
    """``serve(store, token=None)``: a fresh server on a free port (stopped after the test)."""
    servers = []

    def start(store: LabelStore, token: str | None = None) -> ServerThread:
        app = create_app(store, token=token, title="CartPole-v1: which clip is better?",
                         instructions="Look at the two clips.\n\n- The pole should stay up.", poll_s=POLL_S)
        server = ServerThread(app, "127.0.0.1", 0, token).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def page(context, serve):  # ``serve`` first: the page closes before its server stops
    """A new tab; uncaught page errors fail the test.  Cookies and this origin's storage are
    cleared afterwards (ports, and so origins, can be reused by a later test)."""
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    try:
        if pg.url.startswith("http"):
            pg.evaluate("localStorage.clear()")
    finally:
        pg.close()
        context.clear_cookies()
    assert not errors, f"uncaught errors in the page: {errors}"


# ----------------------------------------------------------------------------- helpers


def open_page(page, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.status == 200, response and response.status


def wait_state(page, state: str) -> None:
    page.wait_for_function("s => document.body.dataset.state === s", arg=state)


def shown_pair(page) -> str:
    wait_state(page, "pair")
    pid = page.evaluate("document.body.dataset.pair")
    assert pid
    return pid


def wait_moved_on(page, pid: str) -> None:
    """The page has left pair ``pid`` and shows the next one (or the empty state)."""
    page.wait_for_function(
        "pid => document.body.dataset.pair !== pid && "
        "['pair', 'empty'].includes(document.body.dataset.state)", arg=pid)
    page.wait_for_timeout(150)  # time for a stray second answer, were one sent, to land


def wait_videos_ready(page) -> list[dict]:
    page.wait_for_function("() => ['left', 'right'].every((id) => document.getElementById(id).readyState >= 2)")
    return page.evaluate(_VIDEO_STATE)


def answer_and_check(page, store: LabelStore, how: str, choice: str, labeler: str = "labeler"):
    """Answer the pair on screen by key or button; exactly one new label, the right one."""
    pid = shown_pair(page)
    before = store.labels_since(0)
    if how == "key":
        page.keyboard.press({v: k for k, v in KEYS.items()}[choice])
    else:
        page.click(f"#btn-{choice}")
    wait_moved_on(page, pid)
    new = store.labels_since(before[-1].id if before else 0)
    assert [(lab.query_id, lab.choice, lab.labeler) for lab in new] == [(pid, choice, labeler)]
    return new[0]


# ----------------------------------------------------------------------------- tests


def test_both_clips_load_and_play_muted_and_looping(page, serve, store_with):
    store = store_with(1)
    server = serve(store)
    open_page(page, server.url)
    pid = shown_pair(page)
    q = store.query(pid)
    probes = {side: probe_mp4(store.resolve(q[f"{side}_clip"])) for side in ("left", "right")}
    videos = wait_videos_ready(page)
    for side, v in zip(("left", "right"), videos):
        p = probes[side]
        assert v["error"] is None, f"{side}: media error {v['error']}"
        assert v["src"].endswith(f"/api/clip/{pid}/{side}"), v["src"]
        assert v["readyState"] >= 2
        assert v["muted"] and v["loop"], f"{side} must be muted and looping: {v}"
        assert (v["width"], v["height"]) == (p["width"], p["height"])
        clip_s = p["frames"] / p["fps"]
        assert v["duration"] > 0
        assert v["duration"] == pytest.approx(clip_s, abs=1.5 / p["fps"]), (side, v["duration"], p)
        assert v["duration"] == pytest.approx(p["duration_s"], abs=0.03), (side, v["duration"], p)
    # both play: the position moves, no one pressed play, and they keep going past the end (loop)
    t0 = [v["currentTime"] for v in videos]
    page.wait_for_function(
        "t0 => ['left', 'right'].every((id, i) => { const v = document.getElementById(id);"
        "  return !v.paused && v.currentTime !== t0[i]; })", arg=t0)
    frames = max(p["frames"] for p in probes.values())
    page.wait_for_function(
        "n => ['left', 'right'].every((id) => document.getElementById(id).getVideoPlaybackQuality()"
        ".totalVideoFrames > n)", arg=int(1.5 * frames))
    after = page.evaluate(_VIDEO_STATE)
    assert not any(v["paused"] or v["ended"] for v in after), after
    # the bytes the page plays are the stored clips, left on the left
    for side in ("left", "right"):
        body = page.context.request.get(server.url.split("?")[0] + f"api/clip/{pid}/{side}").body()
        assert body == store.resolve(q[f"{side}_clip"]).read_bytes(), side


@pytest.mark.parametrize("how", ["key", "button"])
@pytest.mark.parametrize("choice", CHOICES)
def test_each_answer_records_its_choice_for_the_pair_shown(page, serve, store_with, how, choice):
    store = store_with(2)
    open_page(page, serve(store).url)
    first = shown_pair(page)
    label = answer_and_check(page, store, how, choice)
    assert label.query_id == first
    second = shown_pair(page)  # moved on to the other pair, which stays unanswered
    assert second != first and store.labels_for(second) == []


def test_all_four_keys_in_a_row(page, serve, store_with):
    """A labeler answering by keyboard alone: four pairs, four keys, four labels, then the wait."""
    store = store_with(4)
    open_page(page, serve(store).url)
    for key, choice in KEYS.items():
        answer_and_check(page, store, "key", choice)
    wait_state(page, "empty")
    assert [lab.choice for lab in store.labels_since(0)] == list(KEYS.values())
    assert len({lab.query_id for lab in store.labels_since(0)}) == 4


def test_empty_state_then_a_pair_arrives_without_reload(page, serve, store_with, queue):
    _, rows = queue
    store = store_with(0)
    open_page(page, serve(store).url)
    wait_state(page, "empty")
    assert page.is_visible("#empty") and page.is_hidden("#pair")
    assert "No clips right now: they are coming" in page.inner_text("#empty")
    assert page.evaluate("document.body.dataset.pair") == ""
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(int(2.5 * POLL_S * 1000))  # a few polls: still empty, nothing recorded
    assert page.evaluate("document.body.dataset.state") == "empty"

    pid = add_pair(store, rows, 0)
    t0 = time.monotonic()
    assert shown_pair(page) == pid
    assert time.monotonic() - t0 < 4 * POLL_S + 2, "the page did not pick the new pair up within a few polls"
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    assert page.is_visible("#pair") and page.is_hidden("#empty")
    wait_videos_ready(page)

    answer_and_check(page, store, "button", "left")  # every pair answered: waiting again
    wait_state(page, "empty")
    assert page.is_visible("#empty") and page.is_hidden("#pair")
    assert page.evaluate("window.__sameDocument === true")


def test_token_in_the_url_works_and_its_absence_is_refused(page, serve, store_with, context):
    token = "s3cret-Token_42"
    store = store_with(3)
    server = serve(store, token=token)
    base = server.url.split("?")[0]
    assert server.url == f"{base}?token={token}"

    open_page(page, server.url)
    pid = shown_pair(page)
    wait_videos_ready(page)  # the clips' URLs carry no token: the cookie the page got lets them load
    assert token not in page.evaluate("document.cookie"), "the token cookie must be HttpOnly"
    answer_and_check(page, store, "button", "right")
    assert store.labels_for(pid)[0].choice == "right"

    # without the token (no cookie, no ?token=, or a wrong one): 401 everywhere, nothing recorded
    context.clear_cookies()
    n_labels = len(store.labels_since(0))
    response = page.goto(base)
    assert response.status == 401
    assert "access token" in page.content()
    assert page.evaluate("document.body.dataset.state") is None
    offer = store.lease("mallory")  # a real pair and lease: only the missing token stands in the way
    assert offer is not None
    req = context.request
    assert req.get(f"{base}?token=wrong").status == 401
    assert req.get(f"{base}api/next?labeler=mallory").status == 401
    assert req.get(f"{base}api/status").status == 401
    assert req.get(f"{base}api/clip/{offer.query_id}/left").status == 401
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = req.post(f"{base}api/label", data={"pair": offer.query_id, "lease": offer.token, "choice": "left"},
                     headers=headers)
        assert r.status == 401, headers
    assert len(store.labels_since(0)) == n_labels
    # the same request with the token is accepted (so the 401s above were the token's doing)
    r = req.post(f"{base}api/label", data={"pair": offer.query_id, "lease": offer.token, "choice": "left"},
                 headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200 and r.json()["recorded"]


def test_typed_labeler_name_is_recorded_by_keyboard(page, serve, store_with):
    """Type a name, leave the box with Tab, answer with a key: the label is the typed name's."""
    store = store_with(3)
    url = serve(store).url
    open_page(page, url)
    shown_pair(page)
    assert page.input_value("#labeler") == "labeler"
    page.fill("#labeler", "Ann Lee-2")
    with page.expect_response(lambda r: "/api/next?labeler=Ann%20Lee-2" in r.url):
        page.keyboard.press("Tab")
    answer_and_check(page, store, "key", "tie", labeler="Ann Lee-2")
    # remembered: after a reload the box holds the name and answers are still recorded under it
    page.reload()
    shown_pair(page)
    assert page.input_value("#labeler") == "Ann Lee-2"
    answer_and_check(page, store, "button", "left", labeler="Ann Lee-2")
    assert {lab.labeler for lab in store.labels_since(0)} == {"Ann Lee-2"}


def test_typed_labeler_name_is_recorded_when_clicking_right_after_typing(page, serve, store_with):
    """Type a name, then click an answer at once (the click takes the focus from the box, which
    renames).  The server answers /api/release slowly, as it does while the trainer holds the
    store's write lock: the answer must still be recorded under the typed name."""
    store = store_with(3)
    release = store.release

    def slow_release(token):
        time.sleep(0.4)
        release(token)

    store.release = slow_release
    open_page(page, serve(store).url)
    shown_pair(page)
    page.fill("#labeler", "bob")
    page.click("#btn-right")
    deadline = time.monotonic() + 5
    while not store.labels_since(0) and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    page.wait_for_timeout(300)
    assert [(lab.labeler, lab.choice) for lab in store.labels_since(0)] == [("bob", "right")]


def test_answer_keys_do_nothing_while_the_name_box_has_focus(page, serve, store_with):
    store = store_with(2)
    open_page(page, serve(store).url)
    pid = shown_pair(page)
    page.focus("#labeler")
    page.keyboard.press("End")
    for key in KEYS:
        page.keyboard.press(key)
    page.keyboard.press("ArrowLeft")
    # the arrows still edit the text (the page did not swallow them): the caret moved left
    assert page.evaluate("document.activeElement.id") == "labeler"
    assert page.evaluate("document.getElementById('labeler').selectionStart") < len("labeler")
    page.wait_for_timeout(300)
    assert store.labels_since(0) == []
    assert page.evaluate("document.body.dataset.pair") == pid
    assert page.is_enabled("#btn-left")
    # out of the box (a click elsewhere on the page), the keys answer again
    page.click("h1")
    answer_and_check(page, store, "key", "cant_tell")
    assert store.labels_since(0)[0].query_id == pid


def test_modified_arrow_keys_are_not_answers(page, serve, store_with):
    """Alt+← is the browser's Back, Ctrl/Meta+arrows move the caret or switch tabs: never an answer."""
    store = store_with(1)
    open_page(page, serve(store).url)
    pid = shown_pair(page)
    page.click("h1")
    for mod in ("Control", "Meta", "Shift+Control"):
        for key in KEYS:
            page.keyboard.press(f"{mod}+{key}")
    page.wait_for_timeout(300)
    assert store.labels_since(0) == []
    assert page.evaluate("document.body.dataset.pair") == pid


def test_a_name_in_another_script_is_recorded(page, serve, store_with):
    store = store_with(2)
    open_page(page, serve(store).url)
    shown_pair(page)
    page.fill("#labeler", " 名前 ")
    with page.expect_response(lambda r: "/api/next?labeler=%E5%90%8D%E5%89%8D" in r.url):
        page.keyboard.press("Tab")
    assert page.inner_text("#name-error") == ""
    answer_and_check(page, store, "button", "left", labeler="名前")
    page.fill("#labeler", "e\u0301lodie")  # typed with a combining accent: recorded composed (NFC), as the server does
    with page.expect_response(lambda r: "/api/next?labeler=%C3%A9lodie" in r.url):
        page.keyboard.press("Tab")
    answer_and_check(page, store, "key", "tie", labeler="\u00e9lodie")


def _sample_names(n: int, seed: int = 0) -> list[str]:
    """Names to put to both rules: letters and numbers of many scripts (astral ones too), the
    allowed punctuation, marks, symbols, controls, code points this Python's Unicode tables may
    not know yet, lengths around 64."""
    rng = random.Random(seed)
    good = list("aZ09 _.@-\u00e9\u212b\u0664\u2460\u3007名前ünïÅ") + ["\U0001d49c", "\U0002a6d6"]
    other = list("<>'/\t\u00a0\u0301\U0001f600") + [
        "\U00031350", "\U0001e030", "\u08c9", "\u0cf3"]  # some assigned after Unicode 14: letters to a newer browser

    def char(bad_rate):
        if rng.random() >= bad_rate:
            return rng.choice(good)
        c = rng.choice(other) if rng.random() < 0.7 else chr(rng.randrange(sys.maxunicode + 1))
        return "x" if 0xD800 <= ord(c) < 0xE000 else c  # a lone surrogate is no text

    return ["".join(char(bad_rate) for _ in range(rng.choice([0, 1, 2, 5, 12, 63, 64, 65])))
            for bad_rate in (rng.choice([0.0, 0.0, 0.02, 0.1, 0.5]) for _ in range(n))]


def test_the_page_checks_names_by_the_server_s_rule(page, serve, store_with):
    """The page's check (the character class the server sends, NFC, spaces stripped, code points
    counted) accepts exactly the names the server accepts, and normalizes them alike."""
    store = store_with(1)
    open_page(page, serve(store).url)
    shown_pair(page)
    names = _sample_names(600)

    def server(name):
        try:
            return check_labeler(name)
        except StoreError:
            return None

    page_says = page.evaluate("names => names.map((n) => { const t = normalizeName(n);"
                              "  return NAME_OK.test(t) ? t : null; })", names)
    disagree = [(n, p, server(n)) for n, p in zip(names, page_says) if p != server(n)]
    assert not disagree, disagree[:5]
    assert 100 < sum(p is not None for p in page_says) < len(names) - 100  # both kinds were tried


@pytest.mark.parametrize("typed", ["O'Brien", "<b>", pytest.param("x" * 65, id="65-chars"), "a\tb"])
def test_a_name_the_server_would_refuse_is_not_taken(page, serve, store_with, typed):
    store = store_with(2)
    open_page(page, serve(store).url)
    shown_pair(page)
    page.fill("#labeler", typed)
    page.click("h1")
    assert "letters, digits" in page.inner_text("#name-error")
    assert page.input_value("#labeler") == "labeler"  # the last good name is back
    answer_and_check(page, store, "key", "left")  # and the page still works under it
    page.reload()
    shown_pair(page)
    assert page.input_value("#labeler") == "labeler"
