"""End to end: the entry point, the full loop learning CartPole, and the errors a user can cause."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from experiments import classic
from rlhp_jax.agents.common import evaluate
from rlhp_jax.agents.ppo import PPO, preset
from rlhp_jax.envs import make_env
from rlhp_jax.metrics import read_jsonl


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """One small preference-learning run through the CLI, shared by the tests below."""
    out = tmp_path_factory.mktemp("cartpole")
    rc = classic.main(["--env", "CartPole-v1", "--labels", "60", "--steps", "12288", "--seed", "0",
                       "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def test_entry_point_writes_metrics_plot_and_summary(cartpole_run):
    rows = read_jsonl(cartpole_run / "metrics.jsonl")
    assert len(rows) == 12288 // preset("CartPole-v1").batch_size
    for key in ("env_steps", "true_return", "predicted_return", "labels", "val_accuracy", "steps_per_s"):
        assert key in rows[-1], key
    # PPO's own update metrics ride along on every row, so a stalled agent shows in the metrics
    for key in ("agent_approx_kl", "agent_clip_frac", "agent_value_loss", "agent_policy_loss"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert all(0 <= r["agent_clip_frac"] <= 1 for r in rows)
    # CartPole penalizes a fall: the first row and every validated one (with the evaluations) say how
    # often the agent fell and what r̂ made of it; the rows between carry no fall columns
    with_falls = [r for r in rows if "fall_out_of_range" in r]
    assert [r["iteration"] for r in with_falls] == [r["iteration"] for r in rows if "val_accuracy" in r]
    assert with_falls[0]["iteration"] == 1 and len(with_falls) >= 2
    assert all(0 <= r["fall_out_of_range"] <= 1 and 0 <= r["fall_candidate_falls"] <= 1 for r in with_falls)
    assert all(r["fall_rhat_healthy"] is not None for r in with_falls)
    assert [r["env_steps"] for r in rows] == sorted(r["env_steps"] for r in rows)
    assert (cartpole_run / "metrics.csv").read_text().startswith("iteration,env_steps")
    png = (cartpole_run / "learning_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    summary = json.loads((cartpole_run / "summary.json").read_text())
    assert summary["labels"] == 60 == rows[-1]["labels"]
    # labels follow the schedule: a quarter up front, the rest spread over the run
    assert rows[0]["labels"] >= 15 and rows[0]["labels"] < 60
    # the oracle's labels are replayed from the seed on a resume: checkpoints after the initial labels (0),
    # every checkpoint_every (10) iterations and at the end (6 here), not on every iteration that added
    # labels (which would keep the newest 3: 4, 5, 6)
    steps = sorted(int(p.name) for p in (cartpole_run / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [0, len(rows)] and len(rows) == 6, steps


def test_a_finished_run_resumed_writes_its_summary_last_and_refuses_lost_rows(cartpole_run, tmp_path, monkeypatch,
                                                                            capsys):
    """``summary.json`` marks a run finished, so it is written after the learning curve: it came first,
    and a kill between the two left a "finished" run without a curve that nothing drew again.  And a
    run whose metrics.jsonl lost rows its checkpoint covers resumed on the gap (its summary then said
    ``env_steps`` 2048 for a 12,288-step run): refused, nothing changed."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    (run / "summary.json").unlink()
    (run / "learning_curve.png").unlink()

    def no_curve(*a, **k):
        raise OSError("killed while drawing")

    monkeypatch.setattr("rlhp_jax.driver.plot_learning_curve", no_curve)
    assert classic.main(["--resume", str(run), "--no-progress"]) == 2
    assert "killed while drawing" in capsys.readouterr().err
    assert not (run / "summary.json").exists()
    monkeypatch.undo()
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(rows[:1]) + "\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert classic.main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "lacks 5 of them (2–6) but the run's checkpoint covers iterations 1–6" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_full_loop_beats_random_policy_on_true_return(cartpole_run):
    env = make_env("CartPole-v1", 8)
    agent = PPO(env.spec, preset("CartPole-v1"))
    untrained = agent.init(jax.random.PRNGKey(0))
    random_return = float(evaluate(env, agent, untrained.params, jax.random.PRNGKey(1), 10, env.spec.horizon))
    summary = json.loads((cartpole_run / "summary.json").read_text())
    assert random_return < 60
    # 12k steps and 60 labels are early days: best evaluations of seeds 0–4 are 83, 144, 157, 24 and 190
    # (2026-11-25; before the clip-start draws changed stream, seeds 0–2 gave 107, 91 and 126, and 129, 79
    # and 92 when disagreement was measured on the normalized members); the untrained policy ~13.  One
    # seed in five has not learned yet at this budget: the claim is seed 0's, at 6x the random return
    assert summary["best_eval_return"] > random_return + 50
    rows = read_jsonl(cartpole_run / "metrics.jsonl")
    # the oracle-judged training return (fixed 500-step episodes, penalty per fall) rises too
    assert rows[-1]["true_return"] > rows[0]["true_return"]



def test_raw_baseline_trains_on_the_true_reward_as_it_is():
    """baseline_reward="raw" (the MuJoCo preset, A.1): the agent's reward is the task's true reward exactly,
    in the driver's pieces and the compiled loop alike; "normalized" shifts and scales it by the random
    policy's statistics."""
    import lanes_check
    from rlhp_jax.compiled import CompiledRun
    from rlhp_jax.loop import RunParts

    cfg = dataclasses.replace(lanes_check.test_config(), reward_source="true", baseline_reward="raw")
    parts = RunParts(cfg)
    k_scale, k_agent, k_ens, k_env, k_it = jax.random.split(jax.random.key(0), 5)
    scale = parts.reward_scale(k_scale)
    np.testing.assert_array_equal(np.asarray(scale), [0.0, 1.0])
    env_state, obs = parts.env.reset(k_env)
    out = jax.jit(parts.iteration)(parts.agent.init(k_agent), env_state, obs, parts.ensemble.init(k_ens), scale, k_it)
    rollout, rewards = out[3], out[4]
    assert np.asarray(rollout.true_reward).std() > 0  # CartPole's falls are penalized
    np.testing.assert_array_equal(np.asarray(rewards), np.asarray(rollout.true_reward))
    compiled = CompiledRun(cfg)
    np.testing.assert_array_equal(np.asarray(compiled.fresh(k_scale, compiled.hyper()).reward_scale), [0.0, 1.0])
    normalized = RunParts(dataclasses.replace(cfg, baseline_reward="normalized")).reward_scale(k_scale)
    assert np.asarray(normalized).tolist() != [0.0, 1.0]
    with pytest.raises(ValueError, match="baseline_reward must be"):
        dataclasses.replace(cfg, baseline_reward="clipped")

@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "NoSuchEnv-v0"], "Unknown environment 'NoSuchEnv-v0'"),
        (["--labels", "0"], "--labels must be at least 1"),
        (["--steps", "-5"], "--steps must be positive"),
        (["--ensemble.num-members", "0"], "num_members must be >= 1"),
        (["--teacher.mistake-rate", "1.5"], "mistake_rate must be in [0, 1]"),
        (["--agent-config", "learning_rate=1"], "--agent-config expects FIELD=VALUE with FIELD one of: num_envs"),
    ],
)
def test_bad_input_gives_clear_error(argv, message, capsys, tmp_path):
    rc = classic.main(argv + ["--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
