"""Recording demonstrations by playing in the browser (``rlhp_jax.human.play``).

The action table matches envpool's action sets; held keys choose the best matching action; the
game runs server-side at its own speed and every step is recorded: the file a session saves
loads with ``load_demos`` and holds exactly the frames, actions and rewards the environment
produced (checked by replaying the actions in a fresh environment with the same seed); a game
over ends the episode and envpool's deferred-reset step is not recorded; bad requests are
refused and write nothing; the page in a real browser (Debian's Chromium under Playwright)
plays, shows the game, pauses on losing focus and saves; the CLI saves on Ctrl-C.
"""

import itertools
import json
import signal
import subprocess
import sys
import time

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax import demos as demos_lib
from rlhp_jax.envpool_envs import EnvpoolVecEnv
from rlhp_jax.envs import make_env
from rlhp_jax.core import EnvSpec, StepOut
from rlhp_jax.human import play, play_server
from rlhp_jax.human.__main__ import main
from rlhp_jax.human.server import MAX_BODY, ServerThread
from rlhp_jax.tasks import TASKS, names

ATARI_GAMES = names("atari")
MINATAR_ACTION_SETS = {name: TASKS[name].play_actions for name in names("gymnax") if TASKS[name].play_actions}

SEED = 11
TOKEN = "play-Token_7"
PONG = {name: i for i, name in enumerate(TASKS["Pong"].play_actions)}  # NOOP FIRE RIGHT LEFT ...


# ----------------------------------------------------------------------------- the action tables


@pytest.mark.parametrize("game", ATARI_GAMES)
def test_action_tables_match_envpool(game):
    minimal = play.action_names(game)
    assert len(minimal) == EnvpoolVecEnv(game, 1).spec.num_actions
    # a minimal set is a subset of ALE's actions, in ALE's order, starting with NOOP
    assert minimal[0] == "NOOP" and list(minimal) == [a for a in play.ALE_ACTIONS if a in minimal]
    full = play.action_names(game, full_action_space=True)
    assert full == play.ALE_ACTIONS and len(full) == EnvpoolVecEnv(game, 1, full_action_space=True).spec.num_actions


def test_minatar_action_tables_match_gymnax():
    for name, actions in MINATAR_ACTION_SETS.items():
        assert len(actions) == make_env(name, 1).spec.num_actions, name
    with pytest.raises(ValueError, match="Atari games only"):
        play.action_names("Breakout-MinAtar", full_action_space=True)
    with pytest.raises(ValueError, match="cannot be played"):
        play.action_names("CartPole-v1")


@pytest.mark.parametrize("game, keys, expected", [
    ("Pong", [], "NOOP"),
    ("Pong", ["right"], "RIGHT"),
    ("Pong", ["left"], "LEFT"),
    ("Pong", ["fire"], "FIRE"),
    ("Pong", ["up"], "NOOP"),  # not in Pong's set: nothing rather than something not held
    ("Pong", ["up", "fire"], "FIRE"),
    ("Pong", ["fire", "right"], "RIGHTFIRE"),
    ("Pong", ["left", "right"], "RIGHT"),  # opposite directions: the newer press wins
    ("Pong", ["right", "left"], "LEFT"),
    ("Pong", ["right", "left", "fire"], "LEFTFIRE"),
    ("Breakout", ["up", "fire"], "FIRE"),
    ("Qbert", ["up", "fire"], "UP"),  # no UPFIRE: the direction before FIRE
    ("Qbert", ["up", "right"], "RIGHT"),  # no diagonal: the newer press
    ("Qbert", ["right", "up"], "UP"),
    ("BeamRider", ["up", "right"], "UPRIGHT"),
    ("Enduro", ["down", "left", "fire"], "DOWNLEFT"),  # no DOWNLEFTFIRE: both directions before FIRE
    ("Seaquest", ["up", "fire"], "UPFIRE"),
    ("Seaquest", ["down", "left", "fire"], "DOWNLEFTFIRE"),
    ("Breakout-MinAtar", ["fire"], "NOOP"),
    ("Breakout-MinAtar", ["left", "fire"], "LEFT"),
    ("Freeway-MinAtar", ["up"], "UP"),
])
def test_held_keys_choose_the_best_matching_action(game, keys, expected):
    actions = play.action_names(game)
    assert actions[play.action_for_keys(keys, actions)] == expected
    full = play.action_names("Pong", full_action_space=True)
    assert full[play.action_for_keys(["up", "fire"], full)] == "UPFIRE"
    assert full[play.action_for_keys(["left", "up", "fire"], full)] == "UPLEFTFIRE"


# ----------------------------------------------------------------------------- fixtures and helpers


class FakeAtari:
    """An envpool-like game with a known script: the frame at step t of an episode is filled with
    t (stacked 4 deep), RIGHT earns 1, the game is over after ``length`` steps and the step after
    a game over is envpool's deferred reset (``valid`` False, the next game's first frame)."""

    domain, num_envs, score_mask, fps = "atari", 1, None, 15.0

    def __init__(self, length: int = 5):
        self.length = length
        self.spec = EnvSpec(name="Pong", obs_shape=(84, 84, 4), discrete=True, num_actions=6, action_low=None,
                            action_high=None, horizon=10**6, terminal_penalty=0.0, segment_length=25, reward_std=1.0,
                            on_terminate="reset")

    @staticmethod
    def obs(t):
        frames = jnp.maximum(jnp.asarray(t) - 3 + jnp.arange(4), 0).astype(jnp.uint8)
        return jnp.broadcast_to(frames, (1, 84, 84, 4))

    def reset(self, key):
        return (jnp.zeros((), jnp.int32), jnp.zeros((), bool)), self.obs(0)

    def step(self, key, state, action):
        t, over = state
        t_next = jnp.where(over, 0, t + 1)
        terminated = ~over & (t_next == self.length)
        reward = jnp.where(over, 0.0, (action == 2).astype(jnp.float32))
        one = lambda x: jnp.reshape(x, (1,))
        out = StepOut(obs=self.obs(t_next), true_reward=reward, terminated=one(terminated),
                      boundary=one(jnp.zeros((), bool)), raw_reward=reward, valid=one(~over),
                      render=jnp.zeros((1, 0), jnp.float32))
        return (t_next, terminated), out


@pytest.fixture
def serve():
    """``serve(session, token=None)``: the play app on a free port; sessions and servers closed after."""
    started = []

    def start(session: play.PlaySession, token: str | None = TOKEN) -> httpx.Client:
        server = ServerThread(play_server.create_play_app(session, token=token), "127.0.0.1", 0, token).start()
        session.start()
        started.append((session, server))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=headers, timeout=10)
        client.server = server
        return client

    yield start
    for session, server in started:
        session.close()
        server.stop()


def wait_status(client, pred, timeout=10.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while True:
        s = client.get("/api/play/status").json()
        if pred(s):
            return s
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {s}"
        time.sleep(0.03)


def hold(client, keys, more_steps):
    """Hold ``keys`` (the game starts if paused) until ``more_steps`` more steps are recorded."""
    n = client.get("/api/play/status").json()["steps"]
    r = client.post("/api/play/keys", json={"keys": keys})
    assert r.status_code == 200, r.text
    return wait_status(client, lambda s: s["steps"] >= n + more_steps, what=f"{more_steps} steps holding {keys}")


def runs(actions):
    return [(int(a), len(list(g))) for a, g in itertools.groupby(actions)]


# ----------------------------------------------------------------------------- the API


def test_keys_held_are_the_actions_recorded_and_the_file_replays_exactly(serve, tmp_path):
    session = play.PlaySession("Pong", tmp_path / "pong.npz", seed=SEED)
    c = serve(session)
    assert c.get("/play").status_code == 200 and "Save demos" in c.get("/play").text
    s = c.get("/api/play/status").json()
    assert s["paused"] and s["pause_reason"] == "not started" and s["actions"] == list(PONG)
    time.sleep(0.3)
    assert c.get("/api/play/status").json()["env_steps"] == 0, "the game must wait for a key"

    t0 = time.monotonic()
    hold(c, ["right"], 6)
    hold(c, ["left"], 6)
    s = hold(c, ["up", "fire"], 6)  # Pong has no UPFIRE and no UP: FIRE
    rate = s["env_steps"] / (time.monotonic() - t0)
    assert 5 < rate < 40, f"{rate:.1f} steps/s: the game must run at about its normal 15 steps/s"
    assert s["action_name"] == "FIRE" and not s["paused"]
    frame = c.get("/api/play/frame", params={"after": -1}).json()
    assert (frame["width"], frame["height"], frame["channels"]) == (84, 84, 1)
    assert frame["steps"] >= 18

    r = c.post("/api/play/pause", json={"paused": True})
    assert r.status_code == 200 and r.json()["paused"]
    n = r.json()["steps"]
    time.sleep(0.3)
    assert c.get("/api/play/status").json()["steps"] == n, "paused, yet steps were recorded"
    # a new frame is waited for (up to ``wait``) while paused, and none comes
    f0 = c.get("/api/play/frame").json()
    t = time.monotonic()
    assert c.get("/api/play/frame", params={"after": f0["seq"], "wait": 0.3}).json()["seq"] == f0["seq"]
    assert time.monotonic() - t >= 0.25

    r = c.post("/api/play/episode").json()
    assert r["ended"] and r["episodes"] == 1 and r["paused"] and r["pause_reason"] == "episode ended"
    assert c.post("/api/play/episode").json()["ended"] is False  # nothing to end: no empty episode
    hold(c, ["left"], 5)
    hold(c, [], 3)  # nothing held while playing: NOOP
    saved = c.post("/api/play/save")
    assert saved.status_code == 200, saved.text
    saved = saved.json()
    assert saved["path"] == str(tmp_path / "pong.npz") and saved["episodes"] == 2
    assert saved["status"]["finished"]
    assert c.post("/api/play/keys", json={"keys": ["left"]}).status_code == 409  # saved: the session is over

    d = demos_lib.load_demos(saved["path"], session.env)
    assert d.num_episodes == 2 and d.num_steps == saved["steps"] == int(d.episode_lengths.sum())
    ep1 = d.actions[:d.episode_lengths[0]]
    ep2 = d.actions[d.episode_lengths[0]:]
    assert [a for a, _ in runs(ep1)] == [PONG["RIGHT"], PONG["LEFT"], PONG["FIRE"]], runs(ep1)
    assert all(n >= 6 for _, n in runs(ep1)), runs(ep1)
    assert [a for a, _ in runs(ep2)] == [PONG["LEFT"], PONG["NOOP"]], runs(ep2)
    assert d.meta["fps"] == 15.0 and d.meta["env"] == "Pong"

    # replay in a fresh environment with the same seed: the same frames and rewards, step by step
    env = make_env("Pong", 1, seed=SEED)
    step = jax.jit(env.step)
    key = jax.random.PRNGKey(0)
    obs_seen, rewards = [], []
    for start, length in zip(d.episode_starts, d.episode_lengths):
        state, obs = env.reset(key)
        for t in range(start, start + length):
            obs_seen.append(np.asarray(obs)[0])
            state, out = step(key, state, jnp.full((1,), d.actions[t], jnp.int32))
            assert bool(out.valid[0])
            rewards.append(float(out.raw_reward[0]))
            obs = out.obs
    np.testing.assert_array_equal(d.obs(np.arange(d.num_steps)), np.stack(obs_seen))
    np.testing.assert_array_equal(d.rewards, np.asarray(rewards, np.float32))
    assert np.unique(d.frames[-1]).size > 2, "the frames are blank"


def test_game_over_ends_the_episode_and_the_deferred_reset_is_not_recorded(serve, tmp_path):
    session = play.PlaySession("Pong", tmp_path / "fake", env=FakeAtari(length=5), fps=60, episodes=2)
    c = serve(session)
    c.post("/api/play/keys", json={"keys": ["right"]})
    s = wait_status(c, lambda s: s["paused"] and s["episodes"] == 1, what="game over")
    assert s["pause_reason"] == "game over" and s["steps"] == 5 and s["score"] == 0 and s["returns"] == [5.0]
    assert s["env_steps"] == 5 and not s["finished"]
    time.sleep(0.1)
    assert c.get("/api/play/status").json()["env_steps"] == 5, "the game goes on after a game over"
    c.post("/api/play/keys", json={"keys": ["fire"]})  # the next game: its first step is the deferred reset
    s = wait_status(c, lambda s: s["finished"], what="the second game over")
    assert s["env_steps"] == 11 and s["steps"] == 10 and s["returns"] == [5.0, 0.0]
    assert s["saved"]["path"] == str(tmp_path / "fake.npz"), "the episode limit saves by itself"
    assert c.post("/api/play/pause", json={"paused": False}).status_code == 409

    d = demos_lib.load_demos(tmp_path / "fake.npz", session.env)
    assert d.episode_lengths.tolist() == [5, 5]
    assert d.actions.tolist() == [PONG["RIGHT"]] * 5 + [PONG["FIRE"]] * 5
    assert d.rewards.tolist() == [1.0] * 5 + [0.0] * 5
    expected = np.concatenate([np.asarray(FakeAtari.obs(t)) for t in range(5)] * 2)
    np.testing.assert_array_equal(d.obs(np.arange(10)), expected)
    assert d.frames.shape[0] == 2 * (4 + 4), "each episode's frames are stored once"


def test_a_minatar_game_is_played_and_saved(serve, tmp_path):
    session = play.PlaySession("Breakout-MinAtar", tmp_path / "breakout.npz", seed=3, fps=60)
    c = serve(session, token=None)
    frame = c.get("/api/play/frame").json()
    assert (frame["width"], frame["height"], frame["channels"]) == (10, 10, 3)
    assert len(frame["data"]) > 0 and frame["score"] == 0
    s = hold(c, ["left", "fire"], 3)  # MinAtar Breakout has no FIRE: LEFT
    assert s["action_name"] == "LEFT"
    saved = c.post("/api/play/save").json()
    d = demos_lib.load_demos(saved["path"], session.env)
    assert d.num_steps == saved["steps"] >= 3 and set(d.actions.tolist()) == {1}
    assert d.meta["obs_dtype"] == "float32" and d.meta["fps"] == 60



def test_a_file_written_at_out_meanwhile_is_kept_and_the_demos_saved_beside_it(tmp_path):
    """Two sessions given one --out (two terminals, a command run again) both pass the check that
    it is new when they start; the one that saves second used to replace the other's demos, a
    person's whole session.  Now the file found there is kept, the demos go beside it under the
    first free name, which the session reports, and its later saves replace only that file."""
    def record(session, steps):
        session.set_keys(["right"])
        deadline = time.monotonic() + 10
        while session.status()["steps"] < steps:
            assert time.monotonic() < deadline, session.status()
            time.sleep(0.02)

    link = tmp_path / "link.npz"  # and where only a link to nothing is, no session starts
    link.symlink_to(tmp_path / "nowhere.npz")
    with pytest.raises(ValueError, match="already exists"):
        demos_lib.new_demo_path(link)
    link.unlink()
    out = tmp_path / "pong.npz"
    session = play.PlaySession("Pong", out, env=FakeAtari(length=10**6), fps=60, stop_after_save=False)
    session.start()
    try:
        record(session, 3)
        out.write_bytes(b"another session's demos")  # saved by a second session meanwhile
        saved = session.save()
        assert out.read_bytes() == b"another session's demos"
        assert saved["path"] == str(tmp_path / "pong-2.npz") and saved["path"] in session.summary()
        assert demos_lib.load_demos(saved["path"], session.env).num_steps == saved["steps"] >= 3
        record(session, saved["steps"] + 3)
        again = session.save()
        assert again["path"] == saved["path"] and again["steps"] >= saved["steps"] + 3
        assert demos_lib.load_demos(again["path"], session.env).num_steps == again["steps"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["pong-2.npz", "pong.npz"]
    finally:
        session.close()

def test_a_silent_page_pauses_the_game(serve, tmp_path):
    session = play.PlaySession("Pong", tmp_path / "idle.npz", env=FakeAtari(length=10**6), fps=30,
                               idle_pause_s=0.3)
    c = serve(session)
    c.post("/api/play/keys", json={"keys": ["right"]})
    time.sleep(0.8)  # no request from the page meanwhile
    s = c.get("/api/play/status").json()
    assert s["paused"] and s["pause_reason"] == "no contact from the page" and s["keys"] == []
    assert 0 < s["steps"] < 20


def test_bad_requests_are_refused_and_change_nothing(serve, tmp_path):
    out = tmp_path / "bad.npz"
    session = play.PlaySession("Pong", out, env=FakeAtari(length=10**6), fps=30)
    c = serve(session)
    base = str(c.base_url)
    # no token, or a wrong one: 401 everywhere
    for method, path in (("GET", "/play"), ("GET", "/api/play/status"), ("GET", "/api/play/frame"),
                         ("POST", "/api/play/keys"), ("POST", "/api/play/save"), ("POST", "/api/play/episode")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, base + path, headers=headers, json={"keys": ["right"]})
            assert r.status_code == 401, (method, path, headers)
    bad = [
        ("/api/play/keys", {"keys": ["jump"]}, 422, "unknown key"),
        ("/api/play/keys", {"keys": "left"}, 422, "keys"),
        ("/api/play/keys", {"keys": ["left", "left"]}, 422, "twice"),
        ("/api/play/keys", {"keys": ["left"] * 9}, 422, "keys"),
        ("/api/play/keys", {"keys": [1]}, 422, "keys"),
        ("/api/play/keys", {"keys": ["left"], "path": "/etc/passwd"}, 422, "path"),
        ("/api/play/keys", {}, 422, "keys"),
        ("/api/play/pause", {"paused": "maybe"}, 422, "paused"),
        ("/api/play/pause", {"paused": False, "reason": "boss"}, 422, "reason"),
        ("/api/play/save", None, 409, "nothing recorded"),
    ]
    for path, body, status, message in bad:
        r = c.post(path, json=body) if body is not None else c.post(path)
        assert r.status_code == status and message in r.json()["error"], (path, body, r.status_code, r.text)
    r = c.post("/api/play/keys", content=b'{"keys": [', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "malformed JSON"
    r = c.post("/api/play/keys", content=b"x" * (MAX_BODY + 1), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    for params in ({"after": "abc"}, {"after": -5}, {"wait": 5}, {"wait": -1}):
        assert c.get("/api/play/frame", params=params).status_code == 422, params
    time.sleep(0.1)
    s = c.get("/api/play/status").json()
    assert s["paused"] and s["pause_reason"] == "not started" and s["env_steps"] == 0 and s["steps"] == 0
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # the same requests, well formed, are accepted (the refusals were the input's doing)
    assert c.post("/api/play/keys", json={"keys": ["left"]}).status_code == 200
    wait_status(c, lambda s: s["steps"] >= 2)
    assert c.post("/api/play/save").status_code == 200 and out.exists()


def test_cli_records_until_ctrl_c_and_saves(tmp_path):
    out = tmp_path / "demos" / "pong.npz"
    proc = subprocess.Popen([sys.executable, "-m", "rlhp_jax.human", "play", "--env", "Pong", "--out", str(out),
                             "--port", "0", "--token", TOKEN, "--seed", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        for line in proc.stdout:  # the first line names the URL
            if line.startswith("play page:"):
                break
        assert line.startswith("play page: http://127.0.0.1:"), line
        url = line.split()[2]
        assert url.endswith(f"/play?token={TOKEN}")
        c = httpx.Client(base_url=url.split("/play")[0], headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert c.get("/play").status_code == 200
        assert httpx.get(url.split("?")[0]).status_code == 401
        hold(c, ["right"], 5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # it ignored Ctrl-C: fail without leaving a server behind
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, rest
    assert "saved to" in rest and str(out) in rest, rest
    d = demos_lib.load_demos(out, EnvpoolVecEnv("Pong", 1))
    assert d.num_episodes == 1 and d.num_steps >= 5 and (d.actions == PONG["RIGHT"]).sum() >= 5


def test_cli_refuses_to_overwrite_and_unknown_games(tmp_path, capsys):
    existing = tmp_path / "old.npz"
    existing.write_bytes(b"precious")
    assert main(["play", "--env", "Pong", "--out", str(existing), "--port", "0"]) == 2
    assert "already exists" in capsys.readouterr().err and existing.read_bytes() == b"precious"
    assert main(["play", "--env", "CartPole-v1", "--out", str(tmp_path / "x.npz"), "--port", "0"]) == 2
    assert "cannot be played" in capsys.readouterr().err
    assert main(["play", "--env", "Pong", "--out", str(tmp_path / "y.npz"), "--host", "0.0.0.0"]) == 2
    assert "access token" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()


# ----------------------------------------------------------------------------- in a real browser

from rlhp_jax.human.browser import CHROMIUM, SKIP_REASON, launch  # noqa: E402

needs_browser = pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = launch(pw, tmp_path_factory.mktemp("chromium-profile"), 10_000)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def page(browser, serve):  # ``serve`` first: the page closes before its server stops
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    browser.clear_cookies()
    assert not errors, f"uncaught errors in the page: {errors}"


def wait_state(page, state):
    page.wait_for_function("s => document.body.dataset.state === s", arg=state)


_CANVAS = """() => { const c = document.getElementById('screen');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const values = new Set(); for (let i = 0; i < d.length; i += 4) values.add(d[i]);
  const r = c.getBoundingClientRect();
  return {width: c.width, height: c.height, shown: r.width, distinct: values.size,
          rendering: getComputedStyle(c).imageRendering}; }"""


@needs_browser
def test_playing_in_the_browser_records_the_keys_and_saves(page, serve, tmp_path):
    session = play.PlaySession("Pong", tmp_path / "browser.npz", seed=SEED)
    c = serve(session)
    assert page.goto(play_server.play_url(c.server)).status == 200
    wait_state(page, "paused")
    assert "Ready" in page.inner_text("#overlay")
    page.wait_for_timeout(300)
    assert session.status()["env_steps"] == 0, "the game must wait for Start or a key"

    page.click("#btn-start")
    wait_state(page, "running")
    page.keyboard.down("ArrowRight")
    page.wait_for_function("() => Number(document.body.dataset.steps) > 0")
    s0, t0 = int(page.evaluate("document.body.dataset.steps")), time.monotonic()
    page.wait_for_timeout(2000)
    s1, t1 = int(page.evaluate("document.body.dataset.steps")), time.monotonic()
    assert (s1 - s0) / (t1 - t0) > 5, f"{s1 - s0} steps in {t1 - t0:.1f} s: the game is not running at speed"
    assert int(page.inner_text("#steps")) >= s1
    canvas = page.evaluate(_CANVAS)
    assert (canvas["width"], canvas["height"]) == (84, 84) and canvas["distinct"] > 2, canvas  # the game, not blank
    assert canvas["shown"] >= 4 * 84 and canvas["rendering"] in ("pixelated", "crisp-edges"), canvas  # scaled up, crisp
    assert session.status()["action_name"] == "RIGHT"
    page.keyboard.up("ArrowRight")

    page.evaluate("window.dispatchEvent(new Event('blur'))")  # the page loses focus: the game pauses
    wait_state(page, "paused")
    assert session.status()["pause_reason"] == "page lost focus"
    assert "lost focus" in page.inner_text("#overlay")

    page.click("#btn-save")
    wait_state(page, "finished")
    assert str(tmp_path / "browser.npz") in page.inner_text("#overlay")
    d = demos_lib.load_demos(tmp_path / "browser.npz", session.env)
    assert d.num_steps == session.status()["steps"] >= s1
    assert (d.actions == PONG["RIGHT"]).sum() >= 10, runs(d.actions)


@needs_browser
def test_the_keyboard_alone_plays_pauses_ends_and_saves(page, serve, tmp_path):
    session = play.PlaySession("Pong", tmp_path / "keys.npz", seed=SEED)
    c = serve(session, token=None)
    page.goto(play_server.play_url(c.server))
    wait_state(page, "paused")
    page.keyboard.down("ArrowLeft")  # a game key starts the game
    wait_state(page, "running")
    page.wait_for_function("() => Number(document.body.dataset.steps) >= 5")
    page.keyboard.up("ArrowLeft")
    page.keyboard.press("p")
    wait_state(page, "paused")
    page.keyboard.press("p")
    wait_state(page, "running")
    page.focus("#btn-episode")
    page.keyboard.down("Space")  # FIRE; Space must not click the focused button
    page.wait_for_function("n => Number(document.body.dataset.steps) >= n", arg=session.status()["steps"] + 4)
    page.keyboard.up("Space")
    page.wait_for_timeout(200)
    assert session.status()["episodes"] == 0 and page.inner_text("#episodes") == "0"
    page.keyboard.press("e")
    page.wait_for_function("() => document.getElementById('episodes').textContent === '1'")
    wait_state(page, "paused")
    page.keyboard.down("ArrowRight")
    page.wait_for_function("n => Number(document.body.dataset.steps) >= n", arg=session.status()["steps"] + 3)
    page.keyboard.up("ArrowRight")
    page.keyboard.press("s")
    wait_state(page, "finished")
    d = demos_lib.load_demos(tmp_path / "keys.npz", session.env)
    assert d.num_episodes == 2
    ep1 = [a for a, _ in runs(d.actions[:d.episode_lengths[0]])]
    assert PONG["LEFT"] in ep1 and PONG["FIRE"] in ep1 and ep1.index(PONG["LEFT"]) < ep1.index(PONG["FIRE"]), ep1
    assert PONG["RIGHT"] in d.actions[d.episode_lengths[0]:].tolist()
    assert json.loads(str(np.load(tmp_path / "keys.npz")["meta"]))["source"] == "human (browser)"


def test_the_play_routes_join_the_labeling_app_behind_its_token(tmp_path):
    from fastapi.testclient import TestClient

    from rlhp_jax.human.server import create_app
    from rlhp_jax.human.store import LabelStore

    store = LabelStore(tmp_path)
    session = play.PlaySession("Pong", tmp_path / "joined.npz", env=FakeAtari(), fps=30)
    app = play_server.add_play_routes(create_app(store, token=TOKEN), session)
    with TestClient(app) as c:
        assert c.get("/play").status_code == 401 and c.get("/api/play/status").status_code == 401
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        assert c.get("/").status_code == 200 and c.get("/api/status").status_code == 200  # labeling still there
        assert c.get("/play").status_code == 200
        assert c.get("/api/play/status").json()["env"] == "Pong"
        r = c.post("/api/play/keys", json={"keys": "up"})
        assert r.status_code == 422 and r.json()["error"].startswith("invalid request")  # the app's own handler
        assert c.post("/api/play/save").status_code == 409
    store.close()
