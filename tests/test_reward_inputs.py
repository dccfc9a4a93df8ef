"""experiments.reward_inputs: how much of a task's per-step reward each input set can explain."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from experiments import reward_inputs as ri


@given(st.integers(0, 2**31 - 1))
def test_r_squared_is_one_for_what_the_inputs_span_and_never_falls_as_inputs_are_added(seed):
    rng = np.random.default_rng(seed)
    x, z = rng.normal(size=(200, 3)), rng.normal(size=(200, 2))
    linear = x @ np.array([1.0, -2.0, 0.5]) + 3.0
    assert ri.r_squared(linear, x) == pytest.approx(1.0)
    y = x[:, 0] ** 2 + x[:, 1] * z[:, 0] + 0.1 * rng.normal(size=200)
    alone, more = ri.r_squared(y, x), ri.r_squared(y, x, z)
    assert 0.0 <= alone <= more + 1e-12 <= 1.0 + 1e-12
    assert ri.r_squared(y, x, z, quadratic=True) > 0.95 > more  # a product and a square: quadratic only
    assert np.isnan(ri.r_squared(np.ones(200), x))  # a constant reward: nothing to explain


def test_pendulum_s_reward_is_a_function_of_the_step_s_own_state(capsys):
    """Pendulum pays −(θ² + 0.1 θ̇² + 0.001 u²) on the state the step starts from: (o_t, a_t) explain
    it quadratically, and the next observation adds little; nested input sets never explain less."""
    got = ri.probe("Pendulum-v1", steps=60, num_envs=4)
    assert got["steps"] == 240
    for kind in ("linear", "quadratic"):
        r = got[kind]
        assert r["o_t"] <= r["o_t,a_t"] + 1e-9 <= r["o_t,a_t,o_t+1"] + 2e-9 <= 1.0 + 2e-9
        assert r["o_t+1"] <= r["o_t,a_t,o_t+1"] + 1e-9
    assert got["quadratic"]["o_t,a_t"] > 0.9
    assert got["quadratic"]["o_t,a_t,o_t+1"] - got["quadratic"]["o_t,a_t"] < 0.05


def test_the_command_prints_one_row_per_task_and_refuses_what_it_cannot_fit(capsys):
    assert ri.main(["--tasks", "Pendulum-v1", "--steps", "30", "--envs", "2"]) == 0
    out = capsys.readouterr().out
    assert "| Pendulum-v1 | 60 |" in out and out.count("| Pendulum-v1 |") == 1
    assert ri.main(["--tasks", "Pendulum-v1", "Nope"]) == 2
    captured = capsys.readouterr()
    assert "error: Unknown environment 'Nope'" in captured.err and "stepping" not in captured.out
    assert ri.main(["--tasks", "Breakout-MinAtar", "--steps", "2"]) == 2
    assert "this probe fits vector observations only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ri.main(["--tasks", "Pendulum-v1", "--steps", "1"])
    with pytest.raises(SystemExit):  # the MLP is fitted for a policy's states only
        ri.main(["--tasks", "Pendulum-v1", "--mlp", "2"])
    assert "--mlp SEEDS" in capsys.readouterr().err


def test_fits_scored_on_other_states_show_which_inputs_extrapolate():
    """A reward of the next observation: fitted where the states lie near 0, scored where they
    lie near 2 (a policy's gait, far from random flailing), the fits that see o_t+1 get the mean
    and every step right; the one of o_t alone cannot."""
    rng = np.random.default_rng(0)

    def steps(centre):
        obs = rng.normal(centre, 1.0, size=(500, 2))
        action = rng.uniform(-1, 1, size=(500, 1))
        next_obs = obs + 0.5 * action + 0.3 * rng.normal(size=(500, 2))
        return dict(obs=obs, action=action, next_obs=next_obs, reward=next_obs[:, 0] - 0.5 * next_obs[:, 1])

    got = ri.transfer(steps(0.0), steps(2.0))
    assert got["steps"] == 500 and got["true_mean"] == pytest.approx(1.0, abs=0.2)
    for name in ("o_t+1", "o_t,a_t,o_t+1"):
        assert got["linear"][name]["r2"] == pytest.approx(1.0)
        assert got["linear"][name]["mean"] == pytest.approx(got["true_mean"])
    assert got["linear"]["o_t"]["r2"] < 0.95


def test_the_reward_mlp_fitted_per_seed_reports_each_input_set():
    """``mlp_transfer``: A.1's MLP, one fit per seed and input set, scored on the other states; on a
    reward of the next observation the fit that sees it follows the scored steps."""
    rng = np.random.default_rng(1)

    def steps(centre):
        obs = rng.normal(centre, 1.0, size=(400, 2))
        action = rng.uniform(-1, 1, size=(400, 1))
        next_obs = obs + 0.5 * action
        return dict(obs=obs, action=action, next_obs=next_obs, reward=next_obs[:, 0])

    got = ri.mlp_transfer(steps(0.0), steps(0.5), discrete=False, num_actions=1, seeds=2, steps=400, batch=64,
                          lr=3e-3)
    assert set(got) == set(ri.INPUT_SETS) and all(len(v) == 2 for rows in got.values() for v in rows.values())
    assert min(got["o_t+1"]["r2"]) > 0.9 and min(got["o_t+1"]["fit_r2"]) > 0.9
    assert max(got["o_t"]["fit_r2"]) < min(got["o_t,a_t"]["fit_r2"])  # the action explains the rest
