"""Ibarz et al.'s protocol labeled by people (``--agent dqfd --teacher human``), end to end.

The command line accepts it and serves the labeling page from the training process (on Atari and
on MinAtar alike: one CLI).  A scripted person in a real browser (Debian's Chromium under
Playwright) labels each iteration's batch on that page, as the synthetic oracle would (larger
true clip return; equal returns tie) but with "can't tell" now and then; the trainer is killed
with SIGKILL while it waits for a batch, the person answers on a page served without it, and
``--resume`` finishes the run.  Every answer reaches the annotation buffer exactly once, in the
order given, no pair is posed twice, and the autolabels sit beside the people's labels.  With
``--no-wait-for-labels`` the run goes on without the later batches' answers.

Tiny budgets on Breakout-MinAtar (Ibarz's protocol tests use the same task): 16 labels, three
iterations of 1,000 actor steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import jax
import numpy as np
import pytest

from experiments import atari, classic
from experiments.minatar_demonstrator import minatar_tracker as tracker
from rlhp_jax import demos as D
from rlhp_jax.envs import make_env
from rlhp_jax.human.browser import CHROMIUM, SKIP_REASON, launch
from rlhp_jax.human.server import ServerThread, create_app, free_port
from rlhp_jax.human.store import MU, LabelStore
from rlhp_jax.ibarz import IbarzRun
from rlhp_jax.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--env", "Breakout-MinAtar", "--agent", "dqfd", "--steps", "3000", "--iteration-steps", "1000",
        "--labels", "16", "--bc-batches", "100", "--rm-pretrain-batches", "100", "--second-pretrain-batches", "50",
        "--rm-batches-per-iteration", "50", "--replay.capacity", "5000", "--no-progress"]
INITIAL = 1  # round(500 · 16 / 6800) pairs from the initial trajectories; then 5 per iteration (due: 6, 11, 16)


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    env = make_env("Breakout-MinAtar", 1)
    rec = D.record_policy(env, tracker, jax.random.PRNGKey(0), episodes=1, max_steps=600, source="tracker")
    return str(rec.save(tmp_path_factory.mktemp("demos") / "breakout.npz"))


def oracle_choice(store: LabelStore, pair: str) -> str:
    left, right = store.query(pair)["info"]["true_returns"]
    return "left" if left > right else "right" if right > left else "tie"


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("domain, env", [(atari, "Pong"), (classic, "Breakout-MinAtar")])
def test_dqfd_with_people_is_accepted_and_serves_the_page(domain, env, tmp_path, monkeypatch):
    """``--agent dqfd --teacher human`` builds a human Ibarz run and serves the labeling page
    from the training process while it runs (refused before: synthetic oracle only).  (No
    ``capsys`` where a page is served in this process: uvicorn's logging would keep its stream.)"""
    port, seen = free_port(), {}

    def run(self):
        seen["config"] = self.cfg
        seen["status"] = httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).json()
        return {"labels": 0}

    monkeypatch.setattr(IbarzRun, "run", run)
    out = tmp_path / "run"
    assert domain.main(["--env", env, "--agent", "dqfd", "--setup", "no_demos", "--teacher", "human",
                        "--no-wait-for-labels", "--out", str(out), "--port", str(port), "--no-progress"]) == 0
    cfg = seen["config"]
    assert (cfg.env, cfg.label_source, cfg.wait_for_labels) == (env, "human", False)
    assert seen["status"]["queries"] == 0  # the page answered, over the run's own label store
    assert (out / "labels.sqlite").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--setup", "imitation", "--demos", "DEMO"], "asks for no labels"),
    (["--setup", "no_demos", "--wait-for-initial-labels"], "--no-wait-for-labels"),
    (["--setup", "no_demos", "--max-pending-queries", "3"], "Christiano et al.'s human runs"),
])
def test_dqfd_with_people_refuses_what_it_cannot_do(extra, message, demo_file, tmp_path, capsys):
    out = tmp_path / "run"
    extra = [demo_file if x == "DEMO" else x for x in extra]
    assert classic.main(TINY + ["--teacher", "human", "--out", str(out)] + extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------ a person in the browser
class Person:
    """Answers whatever pair the page shows, by key, as the oracle would, "can't tell" every
    fourth pair; remembers what it answered, in order."""

    KEYS = {"left": "ArrowLeft", "right": "ArrowRight", "tie": "ArrowUp", "cant_tell": "ArrowDown"}

    def __init__(self, page, store: LabelStore):
        self.page, self.store = page, store
        self.given: list[tuple[str, str]] = []  # (pair, choice)
        self.pressed: dict[str, float] = {}

    def open(self, url: str, alive, timeout: float = 120) -> None:
        """Open the page once its server answers (the trainer serves it after building the run)."""
        deadline = time.monotonic() + timeout
        while True:
            assert alive(), "the trainer stopped before its page came up"
            assert time.monotonic() < deadline, f"no page at {url}"
            try:
                httpx.get(url + "api/status", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        self.page.goto(url)

    def answer_until(self, done, timeout: float = 240, most=lambda: None) -> None:
        """Answer pairs until ``done()``; once ``most()`` answers are given, answer no new pair
        (the page shows the next pair before the last answer is stored: without a cap a slow
        store lets one answer too many through while ``done`` waits for it)."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out; {len(self.given)} answers given"
            pair = self.page.evaluate("() => document.body.dataset.state === 'pair' ? document.body.dataset.pair : ''")
            # a key whose answer is not stored 2 s later is pressed again (a repeat is a no-op)
            stale = pair in self.pressed and time.monotonic() - self.pressed[pair] > 2 \
                and not self.store.labels_for(pair)
            cap = most()
            full = pair not in self.pressed and cap is not None and len(self.given) >= cap
            if not pair or full or (pair in self.pressed and not stale):
                time.sleep(0.05)
                continue
            if pair not in self.pressed:
                choice = "cant_tell" if len(self.given) % 4 == 3 else oracle_choice(self.store, pair)
                self.given.append((pair, choice))
            self.page.keyboard.press(self.KEYS[dict(self.given)[pair]])
            self.pressed[pair] = time.monotonic()

    def answers_stored(self) -> int:
        return len(self.store.labels_since(0))


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_people_label_each_batch_and_every_answer_is_used_once_across_a_kill(demo_file, tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "run"
    store = LabelStore(out)
    port = free_port()
    cmd = [sys.executable, "-m", "experiments.classic", *TINY, "--demos", demo_file,
           "--setup", "demos+prefs+autolabels", "--teacher", "human", "--out", str(out), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_iteration = out / "checkpoints" / "5" / "rlhp_commit.json"
    runs: list[IbarzRun] = []
    try:
        with sync_playwright() as pw:
            ctx = launch(pw, tmp_path / "profile")
            person = Person(ctx.new_page(), store)
            person.open(f"http://127.0.0.1:{port}/", lambda: proc.poll() is None)
            # 1. the initial batch and iteration 1's, then two of iteration 2's five pairs: the run
            #    waits for the other three, holding two answers no checkpoint has yet
            after_first: list[int] = []

            def two_into_iteration_2():
                if first_iteration.exists() and not after_first:
                    after_first.append(len(person.given))
                return bool(after_first) and len(person.given) >= after_first[0] + 2 \
                    and person.answers_stored() == len(person.given)

            person.answer_until(lambda: proc.poll() is not None or two_into_iteration_2(),
                                most=lambda: after_first[0] + 2 if after_first else None)
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            person.page.wait_for_function("() => ['left', 'right'].every((id) =>"
                                          " document.getElementById(id).readyState >= 2)")  # the clips play
            time.sleep(1.5)  # the trainer reads the store every 0.5 s while it waits
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            first_log = proc.stdout.read()
            assert not (out / "summary.json").exists()
            assert (out / "checkpoints" / "5").is_dir() and not (out / "checkpoints" / "6").exists()
            # 2. no trainer: the person answers two more open pairs on a page served without it
            down = ServerThread(create_app(store, poll_s=0.3), "127.0.0.1", 0).start()
            try:
                person.open(down.url, lambda: True)
                given = len(person.given)
                person.answer_until(lambda: person.answers_stored() == given + 2, most=lambda: given + 2)
                assert len(person.given) == given + 2
            finally:
                down.stop()
            # 3. --resume, in this process (to read its annotation buffer), serving the page again
            original, log = IbarzRun.run, []

            def keep(self):
                runs.append(self)
                self.log = log.append
                return original(self)

            monkeypatch.setattr(IbarzRun, "run", keep)
            port = free_port()
            result: dict = {}
            resumed = threading.Thread(target=lambda: result.update(code=classic.main(
                ["--resume", str(out), "--no-progress", "--port", str(port)])), daemon=True)
            resumed.start()
            person.open(f"http://127.0.0.1:{port}/", resumed.is_alive)
            person.answer_until(lambda: not resumed.is_alive())
            ctx.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    resumed.join(timeout=60)
    assert result.get("code") == 0, log

    # the run waited for people and said so; the resumed one continued after iteration 1
    assert "waiting for people: 1 pairs of the initial trajectories unanswered" in first_log
    assert "waiting for people:" in first_log.split("training the reward model")[1]
    assert any(line.startswith(f"resuming {out} after stage 5") for line in log)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["stage"] for r in rows] == list(range(1, 8))  # one history: nothing repeated or missing
    # every pair posed once: the budget, none again after the kill, every one answered
    queries = store.all_queries()
    assert len(queries) == 16 and not any(q["withdrawn"] for q in queries)
    answers = store.labels_since(0)
    assert [(a.query_id, a.choice) for a in answers] == person.given and len(answers) == 16
    trainable = [a for a in answers if a.choice != "cant_tell"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["labels"] == len(trainable) == rows[-1]["labels"] and summary["queries"] == 16
    assert rows[-1]["label_responses"] == 16 and rows[-1]["labels_pending"] == 0
    assert rows[-1]["label_cant_tell"] == 16 - len(trainable) > 0
    assert [r["labels_due"] for r in rows[4:]] == [6, 11, 16]
    assert [r["label_responses"] for r in rows[4:]] == [6, 11, 16]  # each iteration waited for its batch
    # the annotation buffer: the people's labels in the order given, each once, the autolabels
    # (demo clip preferred, 2 per initial pair) after the initial batch's
    buffer = runs[0].buffer
    initial_labels = rows[1]["initial_labels"]
    assert summary["autolabels"] == 2 * INITIAL
    assert int(buffer.count) == len(trainable) + 2 * INITIAL
    people = np.r_[0:initial_labels, initial_labels + 2 * INITIAL:int(buffer.count)]
    assert np.asarray(buffer.mu)[people].tolist() == [MU[a.choice] for a in trainable]
    returns = [store.query(a.query_id)["info"]["true_returns"] for a in trainable]
    np.testing.assert_allclose(np.asarray(buffer.true_reward)[people].sum(-1), returns, atol=1e-4)


def test_without_waiting_the_run_goes_on_with_the_reward_model_it_has(demo_file, tmp_path):
    """``--no-wait-for-labels``: the initial batch is awaited (the reward model is first trained
    on it); the later batches are posed, once each, and the run ends without their answers."""
    out = tmp_path / "run"
    store = LabelStore(out)
    stop = threading.Event()

    def person():  # answers the initial pair, and nothing after it
        while not stop.is_set():
            offer = store.lease("ann") if out.joinpath("labels.sqlite").exists() else None
            if offer is not None:
                store.submit(offer.query_id, offer.token, oracle_choice(store, offer.query_id))
                return
            time.sleep(0.1)

    helper = threading.Thread(target=person, daemon=True)
    helper.start()
    try:
        code = classic.main(TINY + ["--demos", demo_file, "--setup", "demos+prefs", "--teacher", "human",
                                    "--no-wait-for-labels", "--out", str(out), "--port", str(free_port())])
    finally:
        stop.set()
        helper.join(timeout=10)
    assert code == 0
    rows = read_jsonl(out / "metrics.jsonl")
    its = rows[4:]
    assert [r["label_responses"] for r in its] == [INITIAL] * 3
    assert [r["labels_pending"] for r in its] == [5, 10, 15]  # each iteration's batch posed, none again
    assert len(store.all_queries()) == 16 and len(store.open_queries()) == 15
    assert rows[-1]["labels"] == INITIAL and rows[-1]["queries"] == 16
    assert all(r.get("time_wait_s") is None for r in its)
    assert store.meta()["state"] == "finished"
