"""The full training system (issue 4): entry points end to end, ablations, resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_outputs_ok
from experiments import atari, classic, mujoco
from experiments.cli import build_parser, config_from_args
from rlhp_jax.checkpoint import Checkpointer
from rlhp_jax.config import ABLATIONS
from rlhp_jax.driver import PreferenceRun
from rlhp_jax.loop import RunParts
from rlhp_jax.metrics import TensorBoardWriter, read_jsonl

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ entry points, tiny budgets
def test_mujoco_entry_point_trpo_end_to_end(tmp_path, kept_compiles):
    out = tmp_path / "cheetah"
    argv = ["--env", "HalfCheetah", "--labels", "12", "--steps", "2048", "--agent-config", "num_envs=2",
            "num_steps=512", "--no-progress"]
    rc = mujoco.main([*argv, "--out", str(out)])
    assert rc == 0
    # run again: envpool's steps cannot be loaded into another process (its calls carry the address of
    # the process's own environment object), so the acting compiles again, one program for the first
    # rollout and every update; everything else, the agent's learning included, is loaded from the
    # cache, and the run computes the same
    kept_compiles.clear()
    assert mujoco.main([*argv, "--out", str(tmp_path / "again")]) == 0
    assert kept_compiles == ["collect"]
    numbers = lambda run: [{k: v for k, v in r.items() if not k.startswith("time_") and k not in ("wall_s", "steps_per_s")}
                           for r in read_jsonl(run / "metrics.jsonl")]
    assert numbers(tmp_path / "again") == numbers(out)
    rows, summary = run_outputs_ok(out, 2)
    assert summary["agent"] == "trpo" and summary["labels"] == 12 == rows[-1]["labels"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rate_constant"] == 2e6 and cfg["agent_config"]["gamma"] == 0.995
    # A.1: no pretraining beyond what the asynchronous predictor does while the first batch is collected
    assert cfg["pretrain_steps"] is None and cfg["pretrain_epochs"] is None
    assert np.isfinite(rows[0]["rm_train_loss"])
    assert all(np.isfinite(r["true_return"]) for r in rows)


# ------------------------------------------------------------------ ablations change what they claim
def _cfg(domain, argv):
    return config_from_args(build_parser(domain).parse_args(argv), domain)


def test_each_ablation_changes_what_it_claims():
    base = _cfg(mujoco.DOMAIN, ["--env", "Hopper"])
    assert base.selection == "disagreement" and base.ensemble.num_members == 3
    got = {name: _cfg(mujoco.DOMAIN, ["--env", "Hopper", "--ablation", name]) for name in ABLATIONS}
    assert got["random_queries"].selection == "random" and got["random_queries"].ensemble.num_members == 3
    assert got["no_ensemble"].ensemble.num_members == 1 and got["no_ensemble"].selection == "random"
    assert got["no_ensemble"].ensemble.bootstrap is False and base.ensemble.bootstrap is True
    assert got["no_online_queries"].initial_label_fraction == 1.0
    assert got["no_regularization"].ensemble.adaptive_l2 is False and base.ensemble.adaptive_l2 is True
    assert got["no_segments"].segment_length == 1
    assert got["target"].ensemble.loss == "target" and base.ensemble.loss == "preferences"
    for name, cfg in got.items():
        assert cfg.ablation == name
    run = PreferenceRun(got["no_ensemble"], progress=False)
    assert run.ensemble.config.num_members == 1
    run = PreferenceRun(got["no_online_queries"], progress=False)
    assert run.schedule.initial == run.schedule.total == 700
    run = PreferenceRun(got["no_segments"], progress=False)
    assert run.seg_len == 1



def test_presets_pretrain_and_baseline_as_their_appendix_says():
    """A.1 (MuJoCo): no predictor pretraining before RL (A.2's 200 epochs are Atari's) beyond one
    iteration's share of fitting — what A.1's asynchronous predictor has done when the first batch is
    scored, so the first update never reads an untrained network (Hopper seeds 1 and 2 did, corr(r̂,
    true) −0.3/−0.5, and never stood up: BUILD_NOTES) — and a baseline on the modified task's true
    reward as it is; --pretrain-steps / --pretrain-epochs still choose pretraining.  The classic tasks
    keep their baseline on the true reward scaled by the random policy's statistics."""
    cheetah = _cfg(mujoco.DOMAIN, ["--env", "HalfCheetah"])
    assert cheetah.pretrain_steps is None and cheetah.pretrain_epochs is None
    parts = RunParts(cheetah)
    assert parts.pretrain_steps == parts.fit_steps == math.ceil(parts.steps_per_iter * 0.1 / 16) > 0
    assert _cfg(mujoco.DOMAIN, ["--env", "HalfCheetah", "--pretrain-steps", "300"]).pretrain_steps == 300
    assert _cfg(mujoco.DOMAIN, ["--env", "HalfCheetah", "--pretrain-epochs", "5"]).pretrain_epochs == 5
    assert _cfg(mujoco.DOMAIN, ["--env", "HalfCheetah", "--baseline"]).baseline_reward == "raw"
    pong = _cfg(atari.DOMAIN, ["--pretrain-steps", "300"])  # replaces the preset's 200 epochs
    assert pong.pretrain_steps == 300 and pong.pretrain_epochs is None
    assert _cfg(atari.DOMAIN, []).pretrain_epochs == 200
    assert _cfg(classic.DOMAIN, ["--baseline"]).baseline_reward == "normalized"
    with pytest.raises(ValueError, match="--pretrain-steps and --pretrain-epochs"):
        _cfg(mujoco.DOMAIN, ["--pretrain-steps", "3", "--pretrain-epochs", "5"])

def test_no_online_queries_collects_every_label_before_rl(tmp_path, capsys):
    out = tmp_path / "offline"
    # (--steps 5000 is no whole number of 2048-step iterations: the run says so, and runs 4096.  The
    # label budget is RESUME_ARGS', so the agent's, the label set's and the fit's programs are theirs)
    rc = classic.main(["--env", "CartPole-v1", "--labels", "60", "--steps", "5000", "--ablation", "no_online_queries",
                       "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["labels"] for r in rows] == [60, 60]
    assert "the run's budget of 5000 steps (--steps) is not a multiple of the 2048 steps of an iteration: rounded down to 4096" \
        in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requested_steps"] == 5000 and summary["env_steps"] == 4096


def test_fewer_steps_than_one_iteration_runs_one_iteration_and_says_so():
    args = build_parser(classic.DOMAIN).parse_args(["--env", "CartPole-v1", "--steps", "1000"])
    run = PreferenceRun(config_from_args(args, classic.DOMAIN), progress=False)
    assert run.parts.steps_note == "the run's budget of 1000 steps (--steps) is less than one iteration (2048 steps): running 2048"
    args = build_parser(classic.DOMAIN).parse_args(["--env", "CartPole-v1", "--steps", "4096"])
    assert PreferenceRun(config_from_args(args, classic.DOMAIN), progress=False).parts.steps_note is None


# ------------------------------------------------------------------ resume after SIGKILL
RESUME_ARGS = ["--env", "CartPole-v1", "--labels", "60", "--steps", "12288", "--seed", "0", "--checkpoint-every", "1"]


def _start(out: Path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "experiments.classic", *RESUME_ARGS, "--out", str(out),
                             "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_resume_after_sigkill_continues_the_same_run(tmp_path, capsys, cartpole_run):
    out = tmp_path / "killed"
    proc = _start(out)
    ckpt = Checkpointer(out / "checkpoints")
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        step = ckpt.latest_step()
        if step is not None and step >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stdout.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ckpt.latest_step()
    assert killed_at is not None and killed_at < 6
    before = read_jsonl(out / "metrics.jsonl")[:killed_at]  # rows the checkpoint covers

    rc = classic.main(["--resume", str(out), "--no-progress"])
    assert rc == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(1, 7))  # the step counter continues, no row twice
    assert rows[:killed_at] == before and rows[-1]["labels"] == 60
    # the resumed run is the same run: its rows are the uninterrupted one's (same seed, same config)
    assert_same_rows(rows, read_jsonl(cartpole_run / "metrics.jsonl"))
    # resumed once more, the finished run says so and trains nothing: its rows and summary stay as they are
    summary = (out / "summary.json").read_text()
    capsys.readouterr()
    assert classic.main(["--resume", str(out), "--no-progress"]) == 0
    assert f"{out} had finished (iteration 6 of 6): nothing left to train" in capsys.readouterr().out
    assert read_jsonl(out / "metrics.jsonl") == rows and (out / "summary.json").read_text() == summary


WALL_CLOCK = ("wall_s", "steps_per_s")  # and every time_*_s


def _without_wall_clock(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in WALL_CLOCK and not k.startswith("time_")}


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    """The same metrics rows, key for key, timings aside (floats to float32 round-off)."""
    assert len(got) == len(want)
    for g, w in zip(map(_without_wall_clock, got), map(_without_wall_clock, want)):
        assert sorted(g) == sorted(w), (g.get("iteration"), set(g) ^ set(w))
        for k, v in w.items():
            if isinstance(v, float):
                assert g[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (w.get("iteration"), k)
            else:
                assert g[k] == v, (w.get("iteration"), k)


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_again(tmp_path, capsys, cartpole_run):
    """--resume works for a run killed at any moment: one stopped before its first checkpoint (here:
    during its first save) is started again from its config.json, and ends as the uninterrupted run."""
    run = tmp_path / "early"
    run.mkdir()
    (run / "config.json").write_text((cartpole_run / "config.json").read_text())
    checkpoints = run / "checkpoints"  # what a kill in the middle of the first save leaves
    checkpoints.mkdir()
    (checkpoints / "RLHP_CHECKPOINTS").write_text("rlhp_jax checkpoints, format 1\n")
    (checkpoints / "0.orbax-checkpoint-tmp").mkdir()
    (checkpoints / "0").mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 1, "env_steps": 2048, "labels": 3}\n')  # a stray row
    with TensorBoardWriter(run / "tensorboard") as tb:  # and its event, from the killed attempt
        tb.scalars(2048, {"iteration": 99})
    config_before = (run / "config.json").read_bytes()

    assert classic.main(["--resume", str(run), "--no-progress"]) == 0
    assert f"{run} has no checkpoint yet" in capsys.readouterr().out
    assert (run / "config.json").read_bytes() == config_before
    assert_same_rows(read_jsonl(run / "metrics.jsonl"), read_jsonl(cartpole_run / "metrics.jsonl"))
    assert_same_rows(*([json.loads((d / "summary.json").read_text())] for d in (run, cartpole_run)))
    assert Checkpointer(checkpoints).latest_step() == 6
    # TensorBoard, as its own reader sees both attempts' event files: each row once (the killed
    # attempt's events are purged from the step the new attempt starts at)
    from test_metrics import read_scalars

    rows = read_jsonl(run / "metrics.jsonl")
    assert read_scalars(run / "tensorboard")["iteration"] == [(r["env_steps"], float(r["iteration"])) for r in rows]


def test_pause_at_stops_at_a_checkpoint_and_resume_finishes_the_same_run(tmp_path, capsys, cartpole_run):
    """--pause-at N: the run stops once iteration N's checkpoint is written (here between the
    cadence's checkpoints), without a summary; it is the uninterrupted run up to N, and --resume
    continues it to the uninterrupted run's end.  A pause it is already past is refused."""
    out = tmp_path / "paused"
    every4 = RESUME_ARGS[:-1] + ["4"]  # checkpoints at 4 and 6: the pause writes its own
    capsys.readouterr()
    assert classic.main([*every4, "--out", str(out), "--pause-at", "3", "--no-progress"]) == 0
    assert f"paused at iteration 3 of 6 (its checkpoint is written); continue with: --resume {out}" \
        in capsys.readouterr().out
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3] and not (out / "summary.json").exists()
    assert Checkpointer(out / "checkpoints").latest_step() == 3
    uninterrupted = read_jsonl(cartpole_run / "metrics.jsonl")
    assert_same_rows(rows, uninterrupted[:3])

    assert classic.main(["--resume", str(out), "--pause-at", "2", "--no-progress"]) != 0
    assert f"--pause-at 2: {out} is at iteration 3 already; pause at a later one, up to 5" in capsys.readouterr().err
    assert read_jsonl(out / "metrics.jsonl") == rows
    assert classic.main(["--resume", str(out), "--no-progress"]) == 0
    assert_same_rows(read_jsonl(out / "metrics.jsonl"), uninterrupted)
    assert json.loads((out / "summary.json").read_text())["labels"] == 60

    for bad in ("0", "6"):  # the last iteration ends the run anyway; iterations count from 1
        assert classic.main([*every4, "--out", str(tmp_path / f"bad{bad}"), "--pause-at", bad, "--no-progress"]) != 0
        assert f"--pause-at {bad}: this run's iterations are 1 to 6" in capsys.readouterr().err
        assert not (tmp_path / f"bad{bad}").exists()


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """The same configuration as RESUME_ARGS, run without interruption."""
    out = tmp_path_factory.mktemp("uninterrupted")
    assert classic.main([*RESUME_ARGS, "--out", str(out), "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "module, argv, message",
    [
        (atari, ["--env", "Hopper"], "Unknown environment 'Hopper' for python -m experiments.atari"),
        (mujoco, ["--env", "Pong"], "Unknown environment 'Pong' for python -m experiments.mujoco: Pong runs with "
                                    "python -m experiments.atari"),
        (classic, ["--env", "Hoper"], "Unknown environment 'Hoper' for python -m experiments.classic. Supported:"),
        (atari, ["--agent", "trpo", "--steps", "1000"], "TRPO runs on vector-observation tasks"),
        (atari, ["--ablation", "no_segments"], "defined for the robotics tasks only"),
        (mujoco, ["--baseline", "--ablation", "target"], "cannot be combined with --ablation"),
        (mujoco, ["--agent-config", "cg_iters"], "--agent-config expects FIELD=VALUE"),
    ],
)
def test_bad_input_gives_clear_error(module, argv, message, capsys, tmp_path):
    rc = module.main(argv + ["--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("module, spelling, name", [(mujoco, "hopper-v4", "Hopper"), (atari, "PongNoFrameskip-v4", "Pong"),
                                                   (classic, "cartpole-v1", "CartPole-v1")])
def test_a_task_is_taken_in_any_spelling_the_registry_reads(module, spelling, name):
    """README and tasks.resolve promise ``Hopper-v4``, ``pong``…: the training commands took only the
    registry's own names, and the run's config keeps that name, whatever the spelling."""
    args = build_parser(module.DOMAIN).parse_args(["--env", spelling])
    assert config_from_args(args, module.DOMAIN).env == name


def test_resume_from_missing_or_corrupt_checkpoint_is_refused_and_overwrites_nothing(tmp_path, capsys, cartpole_run):
    assert classic.main(["--resume", str(tmp_path / "nowhere"), "--no-progress"]) == 2
    assert "no config.json" in capsys.readouterr().err

    # a run directory whose checkpoints are all garbage
    run = tmp_path / "corrupt"
    run.mkdir()
    (run / "config.json").write_text((cartpole_run / "config.json").read_text())
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    ckdir = run / "checkpoints"
    ckdir.mkdir()
    (ckdir / "3").mkdir()
    (ckdir / "3" / "garbage").write_bytes(b"\x00" * 64)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert classic.main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "checkpoint" in err.lower() and "Traceback" not in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before

    # resuming with other flags, and a fresh run into a directory that holds a run
    assert classic.main(["--resume", str(cartpole_run), "--labels", "5", "--no-progress"]) == 2
    assert "drop --labels" in capsys.readouterr().err
    assert classic.main([*RESUME_ARGS, "--out", str(cartpole_run), "--no-progress"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_default_output_directory_never_reuses_a_run(tmp_path):
    from experiments.cli import _fresh_dir

    base = tmp_path / "runs" / "CartPole-v1-ppo-200labels-seed0"
    assert _fresh_dir(str(base)) == str(base)
    (base / "checkpoints").mkdir(parents=True)
    assert _fresh_dir(str(base)) == f"{base}-2"
    (tmp_path / "runs" / "CartPole-v1-ppo-200labels-seed0-2" / "checkpoints").mkdir(parents=True)
    assert _fresh_dir(str(base)) == f"{base}-3"


def test_demonstrations_recorded_from_a_finished_run_use_its_newest_checkpoint(tmp_path, cartpole_run):
    """``python -m rlhp_jax.demos_cli record --run DIR`` on a Christiano run: the greedy policy of its
    newest checkpoint (``trained.load_policy``, through ``PreferenceRun.restore_latest``) plays; a
    run without a checkpoint is refused."""
    from rlhp_jax import demos, demos_cli, trained
    from rlhp_jax.envs import make_env

    out = tmp_path / "cartpole.npz"
    assert demos_cli.main(["record", "--run", str(cartpole_run), "--episodes", "2", "--max-steps", "60",
                       "--out", str(out)]) == 0
    d = demos.load_demos(out, make_env("CartPole-v1", 1))
    assert d.num_steps == 60 and d.meta["source"].startswith("policy:")
    empty = tmp_path / "no_checkpoint"
    empty.mkdir()
    (empty / "config.json").write_text((cartpole_run / "config.json").read_text())
    with pytest.raises(demos.DemoError, match="no checkpoint to record a policy from"):
        trained.load_policy(empty, make_env("CartPole-v1", 1), 0.0)


def test_reward_inputs_scores_its_fits_on_a_runs_policy(cartpole_run, tmp_path, capsys):
    """``reward_inputs --policy RUN``: the random-action fits scored on RUN's newest policy's steps
    (CartPole pays 1 on every kept step: the means are 1, the R² undefined)."""
    from experiments import reward_inputs

    assert reward_inputs.main(["--policy", str(cartpole_run), "--steps", "8", "--envs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"scored on {cartpole_run}'s policy" in out and "true reward per step there 1)" in out
    assert "| o_t,a_t,o_t+1 | 1 | – |" in out and out.count(" | – |") == 8
    assert reward_inputs.main(["--policy", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_reward_diagnostics_score_a_runs_policy_with_a_runs_reward_model(cartpole_run, capsys):
    from experiments import reward_diagnostics

    assert reward_diagnostics.main([str(cartpole_run), "--rm", str(cartpole_run), "--steps", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [r[1] for r in rows] == ["sampled", "greedy"]
    for r in rows:
        true_return, r_hat, corr = float(r[2]), float(r[3]), float(r[4])
        assert np.isfinite(true_return) and true_return <= 500 and np.isfinite(r_hat)
        assert np.isnan(corr) or -1 <= corr <= 1  # nan: a policy that never falls earns a constant true reward
        assert float(r[7]) > 0  # three members fitted on their own resamples disagree somewhere
    assert reward_diagnostics.main([str(cartpole_run), "--rm", str(cartpole_run / "missing")]) == 2
    baseline = SimpleNamespace(parts=SimpleNamespace(learn=False), cfg=SimpleNamespace(out="runs/baseline"))
    with pytest.raises(ValueError, match="trained on the true reward: it has no r̂"):
        reward_diagnostics.score(baseline, {}, baseline, {}, greedy=False, steps=60)
    # the spread is the members' disagreement: members made one (member 0 everywhere) have none
    import jax
    import jax.numpy as jnp

    run, state = reward_diagnostics.load(str(cartpole_run))
    ens = state["ensemble"]
    first = lambda x: jnp.broadcast_to(x[:1], x.shape)
    same = ens.replace(params=jax.tree.map(first, ens.params), norm_mean=first(ens.norm_mean), norm_std=first(ens.norm_std))
    row = reward_diagnostics.score(run, {**state, "ensemble": same}, run, state, greedy=False, steps=60)
    assert row["spread"] == pytest.approx(0.0, abs=1e-6)
    assert reward_diagnostics.score(run, state, run, state, greedy=False, steps=60)["spread"] > 0


def test_reward_diagnostics_obs_features_describe_each_policys_states(cartpole_run, capsys):
    """``--obs-features``: each scored row gains the mean ± std of the named observation features over
    the policy's own steps, the same numbers as the rollout's observations give; indices the task lacks
    are refused with the range it has."""
    from experiments import reward_diagnostics

    run, state = reward_diagnostics.load(str(cartpole_run))
    row = reward_diagnostics.score(run, state, run, state, greedy=True, steps=60, seed=2)
    obs = reward_diagnostics.policy_steps(run, run, state, greedy=True, steps=60, seed=2)["obs"]
    np.testing.assert_allclose(row["obs_mean"], obs.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(row["obs_std"], obs.std(axis=0), rtol=1e-6)
    assert row["obs_std"][2] > 0  # the pole's angle moves: the column reads the steps, not a constant
    assert reward_diagnostics.main([str(cartpole_run), "--rm", str(cartpole_run), "--steps", "60", "--seed", "2",
                                    "--obs-features", "2,0,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-3:] == ["spread", "obs[2]", "obs[0]"]  # a repeated index is one column
    greedy = lines[3].split()
    assert greedy[1] == "greedy"
    mean, std = greedy[-2].split("±")
    assert float(mean) == pytest.approx(row["obs_mean"][2], abs=0.006) and float(std) == pytest.approx(row["obs_std"][2], abs=0.006)
    assert reward_diagnostics.main([str(cartpole_run), "--rm", str(cartpole_run), "--obs-features", "4"]) == 2
    assert "have 4 features (0 to 3)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reward_diagnostics.main([str(cartpole_run), "--rm", str(cartpole_run), "--obs-features", "1,x"])
    assert "such as 0,1,8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reward_diagnostics.main(["--rm", str(cartpole_run), "--labels", "--obs-features", "1"])
    with pytest.raises(SystemExit):
        reward_diagnostics.main(["--rm", str(cartpole_run), "--attribute", str(cartpole_run), str(cartpole_run),
                                 "--obs-features", "1"])
    assert "already prints every feature" in capsys.readouterr().err


def test_reward_diagnostics_attribute_finds_the_inputs_r_hat_reads(cartpole_run, capsys):
    """``--attribute``: r̂ on A's steps with one input given B's values.  An input whose first-layer
    weights are zero in every member is worth exactly nothing; the unmodified r̂ reads some input;
    A's r̂ per step is the scoring table's."""
    import jax
    from experiments import reward_diagnostics

    run, state = reward_diagnostics.load(str(cartpole_run))
    at = reward_diagnostics.attribute(run, state, run, state, run, state, steps=60, seed=3)
    assert len(at["features"]) == 4 and np.isfinite(at["action"])
    assert any(abs(d) > 1e-4 for d in at["features"])
    assert at["r_hat_a"] == pytest.approx(reward_diagnostics.score(run, state, run, state, greedy=False, steps=60,
                                                                   seed=3)["r_hat"], abs=1e-5)
    ens = state["ensemble"]
    blind = jax.tree_util.tree_map_with_path(  # every member's weights on feature 2 (θ) set to zero
        lambda path, x: x.at[:, 2].set(0.0) if "Dense_0" in jax.tree_util.keystr(path) and x.ndim == 3 else x,
        ens.params)
    blind_state = {**state, "ensemble": ens.replace(params=blind)}
    at = reward_diagnostics.attribute(run, blind_state, run, state, run, state, steps=60, seed=3)
    assert at["features"][2] == 0.0 and any(abs(d) > 1e-4 for d in at["features"])
    # the CLI prints one row per feature and one for the action; it needs exactly two runs
    assert reward_diagnostics.main(["--rm", str(cartpole_run), "--attribute", str(cartpole_run), str(cartpole_run),
                                    "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert all(f"[{j}]" in out for j in range(4)) and "action" in out
    with pytest.raises(SystemExit) as e:
        reward_diagnostics.main(["--rm", str(cartpole_run), "--attribute", str(cartpole_run)])
    assert e.value.code == 2


def test_reward_diagnostics_labels_counts_ties_and_the_actions_share(cartpole_run, capsys):
    from experiments import reward_diagnostics

    assert reward_diagnostics.main(["--rm", str(cartpole_run), "--labels"]) == 0
    out = capsys.readouterr().out
    run, state = reward_diagnostics.load(str(cartpole_run))
    rep = reward_diagnostics.label_report(run, state)
    buffer = state["buffer"]
    filled = np.asarray(buffer.filled)
    mu, true = np.asarray(buffer.mu)[filled], np.asarray(buffer.true_reward)[filled]
    assert rep["labels"] == int(buffer.count) == run.cfg.labels and rep["initial"] == int(run.schedule.initial)
    assert rep["ties"] == int((mu == 0.5).sum()) and rep["initial_ties"] == int((mu[:rep["initial"]] == 0.5).sum())
    # CartPole pays +1 a step and a penalty at a fall: a tie of two clips without a fall is "still"
    no_fall = (true == 1.0).all(axis=(1, 2))
    assert rep["still_ties"] == int(((mu == 0.5) & no_fall).sum()) > 0
    assert -1 <= rep["corr"] <= 1 and -1 <= rep["corr_shuffled"] <= 1
    assert rep["action_std"] > 0  # the A.1 MLP reads the action: shuffling the actions moves r̂
    assert rep["healthy"] is None  # CartPole resets at a fall: no run-on healthy range to weigh
    assert f"labels of {cartpole_run}: {rep['labels']} ({rep['initial']} initial" in out
    assert f"decisive: {rep['labels'] - rep['ties']}" in out
    assert len(rep["weights"]["r_hat"]) == len(rep["weights"]["true"]) == 4  # CartPole's four features
    assert "r̂ per observation feature" in out and f"[3] {rep['weights']['r_hat'][3]:+.3f}" in out
    assert rep["probe"].shape == (4, 2 * len(reward_diagnostics.PROBE_STDS)) and np.isfinite(rep["probe"]).all()
    np.testing.assert_allclose(rep["obs_std"], np.asarray(buffer.obs)[filled].reshape(-1, 4).std(0), rtol=1e-5)
    assert "with one feature moved by k stds" in out and f"{rep['probe'][2][0]:+6.2f}" in out
    # CartPole's reward model is mirror-invariant and its start states lie about 0: ±k stds read alike
    np.testing.assert_allclose(rep["probe"], rep["probe"][:, ::-1], atol=0.05)


def test_feature_probe_moves_one_feature_at_a_time():
    """r̂ = 2·x0 − x1² (x2 ignored), from start states s: moving x0 by k·σ0 adds 2kσ0; moving x1 by
    kσ1 adds −(2·s1·kσ1 + k²σ1²), on average over the states; moving x2 adds nothing."""
    from experiments.reward_diagnostics import feature_probe

    start = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32) * 0.1
    scale, calls = np.array([0.5, 2.0, 3.0]), []

    def r_hat(obs):
        calls.append(len(obs))
        return 2 * obs[:, 0] - obs[:, 1] ** 2

    got = feature_probe(r_hat, start, scale, stds=(1.0, 4.0))
    ks = np.array([-4.0, -1.0, 1.0, 4.0])
    assert got.shape == (3, 4) and calls == [64 * (1 + 3 * 4)]  # every moved copy in one call
    np.testing.assert_allclose(got[0], 2 * ks * 0.5, rtol=1e-5)
    np.testing.assert_allclose(got[1], -(2 * start[:, 1].mean() * ks * 2 + (ks * 2) ** 2), rtol=1e-4)
    np.testing.assert_allclose(got[2], 0.0, atol=1e-6)


def test_feature_weights_read_what_each_reward_pays_per_feature():
    """r̂ = 3 × true + 0.5 × x2, x2 orthogonal to the true reward: in true-reward units (÷ 3) r̂ pays
    x0 and x1 what the true reward pays, per std of each, and x2 a sixth of its std."""
    from experiments.reward_diagnostics import feature_weights

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 3)) * np.array([1.0, 2.0, 0.5])
    x -= x.mean(0)
    x[:, 2] -= x[:, :2] @ np.linalg.lstsq(x[:, :2], x[:, 2], rcond=None)[0]  # x2 ⟂ x0, x1
    true = 2 * x[:, 0] - x[:, 1]
    w = feature_weights(x, 3 * true + 0.5 * x[:, 2] + 7.0, true)
    sd = x.std(0)
    np.testing.assert_allclose(w["true"], [2 * sd[0], -sd[1], 0.0], atol=1e-9)
    np.testing.assert_allclose(w["r_hat"], [2 * sd[0], -sd[1], 0.5 * sd[2] / 3], atol=1e-9)
    assert w["slope"] == pytest.approx(3.0)
    assert feature_weights(x, 3 * true, np.ones(len(x))) is None  # a constant true reward: nothing to compare


@settings(max_examples=30, deadline=None)
@given(a=st.floats(0.1, 3.0), b=st.floats(-3.0, 3.0), c=st.floats(-2.0, 2.0), seed=st.integers(0, 2**16))
def test_healthy_weight_recovers_how_r_hat_weighs_the_range(a, b, c, seed):
    from experiments.reward_diagnostics import healthy_weight

    rng = np.random.default_rng(seed)
    h = (rng.random(400) < 0.2).astype(np.float32)
    h[:2] = 0.0, 1.0  # both kinds of step
    true = rng.normal(size=400) + 2.0 * h  # e.g. Hopper: speed, and 2 more a step in range
    got = healthy_weight(a * true + b * h + c, true, h)
    assert got["share"] == pytest.approx(h.mean())
    assert got["slope"] == pytest.approx(a, rel=1e-4) and got["extra"] == pytest.approx(b / a, abs=1e-4)
    # r̂ that is the true reward, rescaled: nothing extra; all in range or none: nothing to weigh
    assert healthy_weight(3.0 * true - 1.0, true, h)["extra"] == pytest.approx(0.0, abs=1e-5)
    assert healthy_weight(true, true, np.ones(400)) is None and healthy_weight(true, true, np.zeros(400)) is None
    assert healthy_weight(true, 2.0 * h - 1.0, h) is None  # a true reward that is the range alone


def test_reward_diagnostics_retrain_fresh_agents_on_a_frozen_reward(cartpole_run, tmp_path, capsys):
    import dataclasses

    import jax
    import jax.numpy as jnp

    from experiments import reward_diagnostics

    assert reward_diagnostics.main(["--rm", str(cartpole_run), "--retrain", "2048", "--retrain-seeds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fresh agents on the final r̂ of") and len(lines) == 3
    for seed, line in enumerate(lines[1:]):  # one iteration (2,048 steps), evaluated at its end
        name, steps, ret = line.split(": ")
        assert name == f"seed {seed}" and steps == "2,048" and 0 < float(ret) <= 500
    run, state = reward_diagnostics.load(str(cartpole_run))
    assert run.parts.learn and run.parts.steps_per_iter == 2048
    fresh = reward_diagnostics.retrain(run, state, 2048, seed=0)  # the same agent as the CLI's seed 0
    (steps, ret), = fresh
    assert steps == 2048 and ret == pytest.approx(float(lines[1].split(": ")[2]), abs=0.5)
    assert reward_diagnostics.main(["--rm", str(cartpole_run), "--retrain", "1000"]) == 2
    assert "at least one iteration: 2048 steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # nothing asked: neither runs to score, --retrain nor --labels
        reward_diagnostics.main(["--rm", str(cartpole_run)])

    # --retrain-from, the swap behind the Swimmer diagnosis: agents start from a run's policy.
    # Starting from the agent a fresh start draws is the fresh start ...
    assert reward_diagnostics.retrain(run, state, 2048, seed=0,
                                      start_agent=run.parts.fresh(jax.random.PRNGKey(0)).agent) == fresh
    # ... and from the run's trained agent it is not; the CLI's --retrain-from is that start (its seed 0 is
    # the function's; it prints the return rounded)
    (_, from_run), = reward_diagnostics.retrain(run, state, 2048, seed=0, start_agent=state["agent"])
    assert from_run != ret
    assert reward_diagnostics.main(["--rm", str(cartpole_run), "--retrain", "2048", "--retrain-seeds", "1",
                                    "--retrain-from", str(cartpole_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"agents starting from the newest policy of {cartpole_run} on the final r̂ of")
    name, steps, printed = lines[1].split(": ")
    assert name == "seed 0" and steps == "2,048" and float(printed) == pytest.approx(from_run, abs=0.5)
    with pytest.raises(SystemExit):  # a start with nothing to train
        reward_diagnostics.main(["--rm", str(cartpole_run), "--retrain-from", str(cartpole_run)])
    assert "--retrain-from needs --retrain STEPS" in capsys.readouterr().err
    wider = state["agent"].replace(params=jax.tree.map(lambda x: jnp.zeros(x.shape + (2,)), state["agent"].params))
    with pytest.raises(ValueError, match="does not fit"):  # another task's or agent's shapes
        reward_diagnostics.retrain(run, state, 2048, seed=0, start_agent=wider)
    # --rm a true-reward run (here the run's config as RL's arm): no r̂ needed, another agent trained
    true_run = PreferenceRun(dataclasses.replace(run.cfg, reward_source="true", out=str(tmp_path / "rl")),
                             progress=False)
    on_true = reward_diagnostics.retrain(true_run, {}, 2048, seed=0)
    assert [s for s, _ in on_true] == [2048] and 0 < on_true[0][1] <= 500 and on_true != fresh
