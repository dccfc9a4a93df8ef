"""``python -m rlhp_jax.human``: a saved queue labeled with no trainer, exported, summarized and
used to train a reward model offline; and the entry points' human-teacher flags."""

import json
import signal
import subprocess
import sys
import time

import httpx
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import classic
from rlhp_jax.human import exchange
from rlhp_jax.human.__main__ import fit_offline, main, make_queue
from rlhp_jax import envs, rollout
from rlhp_jax.human.server import free_port
from rlhp_jax.human.store import LabelStore
from rlhp_jax.human.teacher import read_segments


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    return make_queue("CartPole-v1", 24, tmp_path_factory.mktemp("q") / "pairs", seed=1)


def test_a_saved_queue_is_labeled_by_every_labeler_without_a_trainer(queue, tmp_path, capsys):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlhp_jax.human", "label", "--queue", str(queue), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(url + "/api/status", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        for name, choice in (("ann", "left"), ("bob", "right")):
            for _ in range(3):
                pair = httpx.get(url + "/api/next", params={"labeler": name}).json()["pair"]
                r = httpx.post(url + "/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": choice})
                assert r.json()["recorded"]
        status = httpx.get(url + "/api/status", params={"labeler": "bob"}).json()
        assert status["labels"] == 6 and status["queued_for_me"] == 21  # every labeler sees every pair
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # it ignored Ctrl-C: fail without leaving a server behind
            proc.kill()
            proc.communicate()
            raise
    assert "6 answers from 2 labeler(s) on 24 pairs" in out

    exported = tmp_path / "labels.jsonl"
    assert main(["export", "--queue", str(queue), "--out", str(exported), "--labeled-only"]) == 0
    lines = exchange.read_jsonl(exported)
    assert len(lines) == 3 and all(len(d["labels"]) == 2 for d in lines)  # ann and bob answered the same 3
    capsys.readouterr()
    assert main(["stats", "--file", str(exported)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["between_labelers"]["ann vs bob"] == {"shared": 3, "agreement": 0.0}
    # an existing file is never replaced by an export (it may be the only copy of other labels)
    before = exported.read_bytes()
    assert main(["export", "--queue", str(queue), "--out", str(exported)]) == 2
    assert "labels.jsonl already exists: choose another --out, or pass --overwrite" in capsys.readouterr().err
    assert exported.read_bytes() == before
    assert main(["export", "--queue", str(queue), "--out", str(exported), "--overwrite"]) == 0
    assert len(exchange.read_jsonl(exported)) == 24  # every pair this time, answered or not


def test_a_labeled_set_trains_a_reward_model_offline(queue, tmp_path):
    """Label the queue as the oracle would, export it, train a fresh ensemble on the file."""
    store = LabelStore(queue.parent, path=tmp_path / "oracle.sqlite")
    exchange.import_jsonl(store, queue, wanted=1)
    for q in store.open_queries():
        left, right = store.query(q)["info"]["true_returns"]
        store.add_label(q, "oracle", "left" if left > right else "right" if right > left else "tie")
    exported = tmp_path / "oracle.jsonl"
    exchange.export_jsonl(store, exported)
    result = fit_offline(str(exported), members=2, steps=300)
    assert result["answers"] == 24 and result["labels_agree_with_oracle"] == 1.0
    assert result["train_agreement"] >= 0.8  # the model learned the labels it was given


class _DeferredReset:
    """A gymnax task whose step after each episode's end is no real transition (``valid`` False),
    as envpool's deferred reset is."""

    def __init__(self, env):
        self.env, self.spec, self.num_envs = env, env.spec, env.num_envs

    def reset(self, key):
        state, obs = self.env.reset(key)
        return (state, jnp.zeros(self.num_envs, bool)), obs

    def step(self, key, state, action):
        inner, ended = state
        inner, out = self.env.step(key, inner, action)
        return (inner, out.boundary), out._replace(valid=~ended)


def test_a_queued_clip_never_crosses_an_episode_end_or_an_invalid_step(tmp_path, monkeypatch):
    """``queue`` draws its clips where the trainer would (``queries``): within one episode of the
    rollout (CartPole's 25-step clips, 40-step episodes here) and never over a step that is no
    real transition."""
    make_env, collect = envs.make_env, rollout.collect_rollout
    seen = []
    monkeypatch.setattr(envs, "make_env", lambda name, n: _DeferredReset(make_env(name, n, horizon=40)))
    monkeypatch.setattr(rollout, "collect_rollout", lambda *a: seen.append(collect(*a)) or seen[-1])
    out = make_queue("CartPole-v1", 4, tmp_path / "q", seed=0)
    (_, _, ro), = seen
    boundary, valid, obs = (np.asarray(x) for x in (ro.boundary, ro.valid, ro.obs))
    assert boundary.any() and not valid.all()  # the rollout holds both
    clips = [c for f in sorted((out.parent / "segments").glob("*.npz")) for c in read_segments(f)["obs"]]
    assert len(clips) == 8
    for clip in clips:
        (t0, env), = np.argwhere((obs == clip[0]).all(-1))  # where the clip starts in the rollout
        steps = slice(t0, t0 + len(clip))
        np.testing.assert_array_equal(obs[steps, env], clip)
        assert not boundary[t0:t0 + len(clip) - 1, env].any() and valid[steps, env].all()


def test_bad_queue_and_commands_fail_clearly(tmp_path, capsys):
    assert main(["label", "--queue", str(tmp_path / "none.jsonl"), "--port", "0"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["serve", "--run", str(tmp_path / "nope")]) == 2
    assert main(["fit", "--file", str(tmp_path / "none.jsonl")]) == 2
    # the ensemble's size under the training commands' name (a parse error would raise SystemExit)
    assert main(["fit", "--file", str(tmp_path / "none.jsonl"), "--ensemble.num-members", "2"]) == 2
    assert main(["queue", "--env", "CartPole-v1", "--pairs", "0", "--out", str(tmp_path / "q")]) == 2
    (tmp_path / "file").write_text("mine")  # a file where the queue's directory would go
    capsys.readouterr()
    assert main(["queue", "--env", "CartPole-v1", "--pairs", "2", "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("argv, message", [
    (["--teacher", "human", "--baseline"], "cannot use --teacher human"),
    (["--teacher", "human", "--ablation", "target"], "preferences, not returns"),
    (["--teacher", "human", "--host", "0.0.0.0"], "token"),
])
def test_human_teacher_flag_errors(tmp_path, capsys, argv, message):
    assert classic.main(argv + ["--out", str(tmp_path / "run"), "--steps", "1000"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing written
