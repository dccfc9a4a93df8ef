"""Ibarz et al. 2018's protocol end to end on CPU (Breakout-MinAtar, a tiny budget): the stages of
Algorithm 1, autolabels, checkpoints, a SIGKILL and --resume that continues the same run, the
diagnostics plots, demo recording from the trained run, and the errors a user can cause."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from experiments import classic
from experiments import ibarz_diagnostics as diag
from experiments.minatar_demonstrator import minatar_tracker as tracker
from rlhp_jax import demos as D
from rlhp_jax import demos_cli
from rlhp_jax.envs import make_env
from rlhp_jax.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--env", "Breakout-MinAtar", "--agent", "dqfd", "--steps", "3000", "--iteration-steps", "1000",
        "--labels", "40", "--bc-batches", "100", "--rm-pretrain-batches", "100", "--second-pretrain-batches", "50",
        "--rm-batches-per-iteration", "50", "--replay.capacity", "5000", "--no-progress"]




@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    env = make_env("Breakout-MinAtar", 1)
    rec = D.record_policy(env, tracker, jax.random.PRNGKey(0), episodes=2, max_steps=1200, source="tracker")
    return str(rec.save(tmp_path_factory.mktemp("demos") / "breakout.npz"))


@pytest.fixture(scope="module")
def full_run(demo_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("ibarz") / "run"
    code = classic.main(TINY + ["--demos", demo_file, "--setup", "demos+prefs+autolabels", "--out", str(out)])
    assert code == 0
    return out


def test_protocol_stages_labels_and_outputs(full_run):
    rows = read_jsonl(full_run / "metrics.jsonl")
    assert [r["phase"] for r in rows] == ["bc", "initial", "reward_model", "second_pretraining",
                                          "iteration", "iteration", "iteration"]
    assert [r["stage"] for r in rows] == list(range(1, 8))
    init = rows[1]["initial_labels"]
    assert init == 3  # round(500 · 40 / 6800): the schedule scaled like the paper's reduced ones
    assert rows[1]["autolabels"] == 2 * init  # every clip of every initial pair against a demo clip
    assert rows[-1]["labels"] == 40 and rows[-1]["queries"] == 40  # the whole budget, by the schedule
    assert rows[0]["demo_action_accuracy"] is not None and rows[0]["margin_loss"] > 0
    its = rows[4:]
    assert [r["env_steps"] for r in its] == [ rows[1]["env_steps"] + 1000 * i for i in (1, 2, 3)]
    for r in its:
        assert r["demo_fraction"] > 0  # demos stay in every batch's draw
        assert r["label_entropy_bound"] <= r["rm_loss"] + 1e-6  # no model beats the bound on the same labels
        assert r["model_reward_per_1000"] is not None and r["true_reward_per_1000"] is not None
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["labels"] == 40 and summary["autolabels"] == 6 and summary["setup"] == "demos+prefs+autolabels"
    for f in ("learning_curve.png", "metrics.csv", "config.json"):
        assert (full_run / f).is_file()
    assert list((full_run / "tensorboard").iterdir())
    assert (full_run / "checkpoints" / "7").is_dir() and (full_run / "models" / "7").is_dir()


def _comparable(rows):
    keys = ("stage", "env_steps", "labels", "queries", "autolabels", "episode_return", "rm_loss", "td_loss",
            "margin_loss", "model_reward_per_1000", "true_reward_per_1000")
    return [{k: r.get(k) for k in keys} for r in rows]


def test_sigkill_then_resume_continues_the_same_run(full_run, demo_file, tmp_path, capsys):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "experiments.classic", *TINY, "--demos", demo_file,
           "--setup", "demos+prefs+autolabels", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    commit = out / "checkpoints" / "5" / "rlhp_commit.json"  # the first iteration is saved
    deadline = time.monotonic() + 240
    while not commit.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert commit.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "timed out"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()  # killed mid-run
    labels_before = json.loads((out / "checkpoints" / "5" / "rlhp_commit.json").read_text())
    assert labels_before  # a committed checkpoint survived the kill
    assert classic.main(["--resume", str(out), "--no-progress"]) == 0
    assert f"resuming {out} after stage " in capsys.readouterr().out
    _assert_same_run(out, full_run)
    # resumed again, the finished run says so, trains nothing and ends as before
    assert classic.main(["--resume", str(out), "--no-progress"]) == 0
    assert f"{out} had finished (stage 7: iteration 3 of 3): nothing left to train" in capsys.readouterr().out
    _assert_same_run(out, full_run)
    # a resume reads the demo file config.json names: other bytes there (re-recorded, or a relative path
    # read from another directory) would mix two sets of demonstrations in one run
    record = json.loads((out / D.DEMOS_RECORD).read_text())
    assert record["sha256"] == D.fingerprint(demo_file)["sha256"]
    (out / D.DEMOS_RECORD).write_text(json.dumps(dict(record, sha256="f" * 64)))
    assert classic.main(["--resume", str(out), "--no-progress"]) == 2
    assert "a resume would mix two sets of demonstrations" in capsys.readouterr().err


def _assert_same_run(got_dir, want_dir):
    got = read_jsonl(got_dir / "metrics.jsonl")
    want = read_jsonl(want_dir / "metrics.jsonl")
    assert [r["stage"] for r in got] == list(range(1, 8))  # nothing repeated, nothing missing
    a, b = _comparable(got), _comparable(want)
    for ra, rb in zip(a, b):
        for k in ra:
            if isinstance(rb[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), (ra["stage"], k)
            else:
                assert ra[k] == rb[k], (ra["stage"], k)


def test_resume_before_the_first_checkpoint_starts_the_run_again(full_run, tmp_path, capsys):
    """A run killed before its first checkpoint (here: during the first pretraining) resumes from
    its config.json as a fresh start, and ends as the uninterrupted run."""
    out = tmp_path / "early"
    out.mkdir()
    (out / "config.json").write_text((full_run / "config.json").read_text())
    (out / "metrics.jsonl").write_text('{"stage": 1, "phase": "bc"}\n')  # a stray row of the killed attempt
    assert classic.main(["--resume", str(out), "--no-progress"]) == 0
    assert f"{out} has no checkpoint yet" in capsys.readouterr().out
    _assert_same_run(out, full_run)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requested_steps"] == 3000 and summary == {**json.loads((full_run / "summary.json").read_text()),
                                                               "wall_s": summary["wall_s"]}


def test_steps_rounded_up_to_whole_iterations_are_reported(full_run, tmp_path):
    from rlhp_jax.config import ibarz_config_from_json
    from rlhp_jax.ibarz import IbarzRun

    saved = ibarz_config_from_json(json.loads((full_run / "config.json").read_text()))
    run = IbarzRun(dataclasses.replace(saved, total_steps=2500, out=str(tmp_path)), progress=False)
    assert run.steps_note == (
        "the run's budget of 2500 steps (--steps) is not a multiple of the 1000 steps of an iteration: rounded up to 3000")


def test_epsilon_anneals_over_the_iterations_actor_steps_only(full_run, tmp_path):
    """A.3's ε schedule starts with the iterations: the initial trajectories (before learning) are
    run at its first ε and do not advance it."""
    from rlhp_jax.agents.dqfd import linear_epsilon
    from rlhp_jax.config import ibarz_config_from_json
    from rlhp_jax.ibarz import IbarzRun

    saved = ibarz_config_from_json(json.loads((full_run / "config.json").read_text()))
    agent = dataclasses.replace(saved.agent_config, eps_decay_steps=600)
    run = IbarzRun(dataclasses.replace(saved, total_steps=1000, agent_config=agent, out=str(tmp_path)),
                   progress=False, log=lambda *_: None)
    used = []
    act_step = run.act_step

    def recording(params, env_state, obs, key, epsilon):
        used.append(float(epsilon))
        return act_step(params, env_state, obs, key, epsilon)

    run.act_step = recording
    run.run()
    initial = run.initial_steps  # one actor: one call per step
    assert initial > 0 and len(used) == initial + 1000
    want = [float(linear_epsilon(k, agent.eps_start, agent.eps_end, 600)) for k in range(1000)]
    assert used[:initial] == pytest.approx([agent.eps_start] * initial)
    assert used[initial:] == pytest.approx(want)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["epsilon"] == pytest.approx(agent.eps_end)


def test_diagnostics_alignment_loss_and_frozen(full_run, tmp_path):
    res = diag.alignment(str(full_run), steps=1100, epsilon=0.01)
    data = json.loads((full_run / "alignment.json").read_text())
    assert data["windows_25"]["count"] >= 40 and data["windows_1000"]["count"] == 1
    assert res["correlation_25"] is not None and (full_run / "alignment.png").stat().st_size > 10_000
    res = diag.loss_plot(str(full_run))
    assert res["final_ratio"] >= 1.0 and (full_run / "reward_model_loss.png").is_file()
    res = diag.frozen(str(full_run), str(tmp_path / "frozen"), steps=1000, progress=False)
    assert diag.main(["compare", "--runs", str(full_run), str(tmp_path / "frozen"),
                      "--out", str(tmp_path / "setups.png")]) == 0
    both = json.loads((tmp_path / "setups.json").read_text())
    assert [v["setup"] for v in both.values()] == ["demos+prefs+autolabels"] * 2
    rows = read_jsonl(tmp_path / "frozen" / "metrics.jsonl")
    assert rows[-1]["labels"] == 0 and rows[-1].get("rm_train_loss") is None  # fixed: never relabeled or trained
    assert (tmp_path / "frozen" / "reward_hacking.png").is_file()
    hack = json.loads((tmp_path / "frozen" / "reward_hacking.json").read_text())
    assert len(hack["model_reward_per_1000"]) == 1 and hack["model_reward_per_1000"][0] is not None


def test_label_noise_runs_one_protocol_per_rate(demo_file, tmp_path):
    flags = TINY.copy()
    flags[flags.index("--steps") + 1] = "1000"
    res = diag.label_noise([0.0, 0.25], str(tmp_path), flags + ["--demos", demo_file], progress=False)
    assert set(res) == {"0.0", "0.25"}
    for rate in ("0", "0.25"):
        cfg = json.loads((tmp_path / f"mistakes-{rate}" / "config.json").read_text())
        assert cfg["teacher"]["mistake_rate"] == float(rate)
    assert (tmp_path / "label_noise.png").is_file()


def test_recording_demos_from_the_trained_run(full_run, tmp_path):
    out = tmp_path / "from_run.npz"
    assert demos_cli.main(["record", "--run", str(full_run), "--episodes", "50", "--max-steps", "150", "--out", str(out)]) == 0
    d = D.load_demos(out, make_env("Breakout-MinAtar", 1))
    # the barely trained agent loses balls quickly: several game overs, each ending an episode
    assert d.num_steps == 150 and 1 <= d.num_episodes < 50 and d.meta["source"].startswith("policy:")


@pytest.mark.parametrize("extra, message", [
    (["--setup", "demos+prefs"], "give --demos PATH"),
    (["--setup", "no_demos", "--demos", "DEMO"], "drop --demos"),
    (["--setup", "demos+prefs", "--demos", "ASTERIX"], "demonstrations of Asterix-MinAtar"),
    (["--setup", "demos+prefs", "--demos", "MISSING"], "does not exist"),
    (["--setup", "demos+prefs", "--demos", "DEMO", "--ablation", "random_queries"], "choose a --setup"),
    (["--setup", "imitation", "--demos", "DEMO", "--frozen-reward", "RUN"], "uses none"),
])
def test_bad_input_is_refused_clearly(extra, message, demo_file, tmp_path, capsys):
    if "ASTERIX" in extra:
        env = make_env("Asterix-MinAtar", 1)
        rec = D.record_policy(env, lambda o, k: np.zeros(1, np.int32), jax.random.PRNGKey(0), episodes=1,
                              max_steps=30, source="noop")
        extra = [str(rec.save(tmp_path / "asterix.npz")) if x == "ASTERIX" else x for x in extra]
    extra = [demo_file if x == "DEMO" else str(tmp_path / "missing.npz") if x == "MISSING"
             else str(tmp_path) if x == "RUN" else x for x in extra]
    out = tmp_path / "out"
    assert classic.main(TINY + extra + ["--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "checkpoints").exists()


def test_ibarz_flags_need_dqfd_and_continuous_tasks_are_refused(demo_file, tmp_path, capsys):
    assert classic.main(["--env", "CartPole-v1", "--demos", demo_file, "--out", str(tmp_path / "a")]) == 2
    assert "add --agent dqfd" in capsys.readouterr().err
    assert classic.main(["--env", "Pendulum-v1", "--agent", "dqfd", "--setup", "no_demos",
                         "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert "discrete actions" in capsys.readouterr().err


def test_atari_path_with_frames_stored_once(tmp_path):
    """Pong through envpool (all 18 actions, 0-90 no-ops: Ibarz A.1): stacked frames leave the
    replay stack-first and reach the Q-network and the reward CNN channel-last."""
    from experiments import atari
    from rlhp_jax.envpool_envs import EnvpoolVecEnv

    env = EnvpoolVecEnv("Pong", 1, full_action_space=True, noop_max=90)
    rec = D.record_policy(env, lambda o, k: np.asarray(jax.random.randint(k, (1,), 0, 18)), jax.random.PRNGKey(0),
                          episodes=1, max_steps=120, source="random")
    demo = rec.save(tmp_path / "pong.npz")
    minimal = EnvpoolVecEnv("Pong", 1)  # the 6-action set: refused, with the reason
    with pytest.raises(D.DemoError, match="18 actions and this environment has 6"):
        D.load_demos(demo, minimal)
    out = tmp_path / "run"
    code = atari.main(["--agent", "dqfd", "--demos", str(demo), "--setup", "demos+prefs+autolabels", "--steps", "100",
                       "--iteration-steps", "100", "--labels", "4", "--bc-batches", "3", "--rm-pretrain-batches", "3",
                       "--second-pretrain-batches", "3", "--rm-batches-per-iteration", "3", "--replay.capacity", "1000",
                       "--agent-config", "batch_size=4",  # shapes are what this checks: 4 frames, not A.3's 32 (-10 s)
                       "--out", str(out), "--no-progress"])
    assert code == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows[-1]["phase"] == "iteration" and rows[-1]["labels"] == 4 and rows[-1]["autolabels"] == 2
    assert rows[-1]["td_loss"] is not None and rows[-1]["model_reward_per_1000"] is not None
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["setup"] == "demos+prefs+autolabels" and cfg["reward_dropout"] == 0.2


def test_no_clip_in_the_latest_trajectories_asks_nothing_and_says_so():
    """A stage whose trajectories hold no whole clip poses no pairs and returns no initial pairs
    (it returned a tuple, which the initial stage then took for pairs to autolabel)."""
    from types import SimpleNamespace

    from rlhp_jax.ibarz import IbarzRun

    run = IbarzRun.__new__(IbarzRun)  # only what _label_recent reads
    run.replay = SimpleNamespace(recent_segment_starts=lambda since, length: [np.zeros(0, np.int64)] * 2)
    run.cfg = SimpleNamespace(segment_length=25)
    run.teacher = SimpleNamespace(ask=lambda *a: pytest.fail("asked with no clips"))
    said = []
    run.log = said.append
    assert run._label_recent(np.zeros(2, np.int64), 5, jax.random.PRNGKey(0)) is None
    assert said == ["no clip fits in the latest trajectories: no labels this time"]
