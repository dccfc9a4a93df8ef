"""The papers' envpool environments behind the common protocol: MuJoCo (A.1) and Atari (A.2).

Rollouts use a uniformly random policy (no network to compile) and are shared per task
through module-scoped fixtures; every check reads real envpool transitions.
"""

from __future__ import annotations

import envpool
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax import queries
from rlhp_jax import tasks
from rlhp_jax.envpool_envs import EnvpoolVecEnv, healthy
from rlhp_jax.envs import make_env
from rlhp_jax.loop import per_episode
from rlhp_jax.rollout import collect_rollout, uniform_random_policy


def rollout(name, num_envs, steps, seed=0, **kw):
    env = make_env(name, num_envs, seed=seed, **kw)
    state, obs = env.reset(jax.random.key(0))
    _, _, ro = collect_rollout(env, uniform_random_policy(env.spec), None, state, obs, jax.random.key(seed), steps)
    return env, jax.tree.map(np.asarray, ro)


def lockstep(name, num_envs, steps, seed=1, twin_options=None, **kw):
    """The wrapper and a raw envpool twin fed the same random actions: (env, our StepOuts [T, N], the
    twin's outputs [T, N]).  The twin has the wrapper's options and seed, or — with ``twin_options`` —
    envpool's task with only those options changed from envpool's defaults."""
    env = EnvpoolVecEnv(name, num_envs, seed=seed, **kw)
    twin_kwargs = env.envpool_kwargs if twin_options is None else dict(
        env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, seed=seed, **twin_options)
    twin = envpool.make(env.envpool_id, **twin_kwargs)
    state, obs = env.reset()
    raw_obs, _ = twin.reset()
    if env.domain == "atari":
        np.testing.assert_array_equal(np.asarray(obs), np.transpose(np.where(env._mask, 0, raw_obs), (0, 2, 3, 1)))
    else:
        np.testing.assert_array_equal(np.asarray(obs), raw_obs.astype(np.float32))
    step = jax.jit(env.step)
    rng, spec = np.random.default_rng(seed), env.spec
    if spec.discrete:
        actions = rng.integers(0, spec.num_actions, (steps, num_envs)).astype(np.int32)
    else:
        actions = rng.uniform(spec.action_low, spec.action_high, (steps, num_envs, spec.num_actions)).astype(np.float32)
    ours, raw = [], []
    for a in actions:
        state, out = step(jax.random.key(0), state, a)
        ours.append(jax.tree.map(np.asarray, out))
        o, r, term, trunc, info = twin.step(a if spec.discrete else a.astype(np.float64))
        raw.append(dict(obs=o, reward=r, term=term, trunc=trunc, elapsed=info["elapsed_step"],
                        **{k: info[k] for k in ("lives", "reward_contact") if k in info}))
    stack = lambda xs: {k: np.stack([x[k] for x in xs]) for k in xs[0]}
    return env, jax.tree.map(lambda *xs: np.stack(xs), *ours), stack(raw)


# ------------------------------------------------------------------ MuJoCo (Christiano A.1)
@pytest.fixture(scope="module")
def hopper():
    return rollout("Hopper", 3, 1004, penalty_shape="range")


def test_mujoco_episodes_have_fixed_length_and_the_agent_sees_no_termination(hopper):
    env, ro = hopper
    assert env.spec.horizon == 1000 and env.spec.on_terminate == "continue"
    # the only boundary is the time limit, on every env at the same step
    np.testing.assert_array_equal(np.argwhere(ro.boundary)[:, 0], [999] * 3)
    # random Hopper falls early, yet the episode runs on to step 1000
    assert ro.terminated[:999].any(axis=0).all()
    # envpool's deferred reset right after the boundary: flagged, and no reward for the oracle
    np.testing.assert_array_equal(np.argwhere(~ro.valid)[:, 0], [1000] * 3)
    assert np.all(ro.true_reward[1000] == 0)


def test_mujoco_penalty_exactly_when_outside_the_healthy_range(hopper):
    env, ro = hopper
    steps = slice(0, 1000)
    out = ~healthy("Hopper", ro.obs[1:1001].reshape(-1, 11)).reshape(1000, 3)  # obs after each step
    penalty = ro.true_reward[steps] - ro.raw_reward[steps]
    np.testing.assert_allclose(penalty, np.where(out, env.spec.terminal_penalty, 0.0), atol=1e-6)
    assert out.mean() > 0.5  # random Hopper spends most of the episode fallen
    # `terminated` marks the step the original task would have ended: first step out of range
    first_out = out & ~np.concatenate([np.zeros((1, 3), bool), out[:-1]])
    np.testing.assert_array_equal(ro.terminated[steps], first_out)


@pytest.mark.parametrize("task", ["Hopper", "Ant"])
def test_height_penalty_pays_the_bonus_always_and_the_torso_height(task, hopper):
    """penalty_shape="height" (rl-teacher's run-on reward) against A.1's range penalty, on the same
    random rollout: the bonus withheld out of range comes back, the penalty goes, z − h0 comes in."""
    env, ro = hopper if task == "Hopper" else rollout(task, 3, 1004, penalty_shape="range")
    env_h, ro_h = rollout(task, 3, 1004, penalty_shape="height")
    np.testing.assert_array_equal(ro_h.obs, ro.obs)  # the reward's shape does not change the simulation
    steps = slice(0, 1000)
    z = ro.obs[1:1001, :, 0]  # the torso's height after each step
    out = ~healthy(task, ro.obs[1:1001].reshape(3000, -1)).reshape(1000, 3)
    assert out.any() and (~out).any()
    h0 = {"Hopper": 1.0, "Ant": 1.2}[task]
    expected = ro.raw_reward[steps] + np.where(out, 1.0, 0.0) + z - h0
    np.testing.assert_allclose(ro_h.true_reward[steps], expected, atol=1e-5)
    np.testing.assert_allclose(ro_h.true_reward[steps] - ro.true_reward[steps],
                               np.where(out, 1.0 - env.spec.terminal_penalty, 0.0) + z - h0, atol=1e-5)
    assert env_h.spec.terminal_penalty == 0.0 and env_h.options["penalty_shape"] == "height"
    assert np.all(ro_h.true_reward[1000] == 0)  # the deferred reset still pays nothing


def test_each_task_has_its_penalty_by_default():
    """The height reward where the range penalty was measured to fail (Hopper, Walker2d), the range
    penalty elsewhere; the default's refusal of a per-step penalty names the way to the range."""
    shape = lambda name, **kw: EnvpoolVecEnv(name, 1, **kw).options["penalty_shape"]
    assert [shape(t) for t in ("Hopper", "Walker2d", "HalfCheetah", "InvertedPendulum")] == \
        ["height", "height", "range", "range"]
    assert shape("Hopper", penalty_shape="range") == "range"
    assert EnvpoolVecEnv("Hopper", 1, penalty_shape="range", terminal_penalty=-2.0).spec.terminal_penalty == -2.0
    with pytest.raises(ValueError, match=r"Hopper's default\) has no per-step penalty: drop terminal_penalty, or "
                                         r"ask for the range penalty"):
        EnvpoolVecEnv("Hopper", 1, terminal_penalty=-2.0)


def test_height_penalty_is_refused_where_it_does_not_exist():
    with pytest.raises(ValueError, match="Hopper, Walker2d, Ant have one, Reacher has not"):
        EnvpoolVecEnv("Reacher", 1, penalty_shape="height")
    with pytest.raises(ValueError, match="drop terminal_penalty"):
        EnvpoolVecEnv("Hopper", 1, penalty_shape="height", terminal_penalty=-2.0)
    with pytest.raises(ValueError, match="penalty_shape must be one of"):
        EnvpoolVecEnv("Hopper", 1, penalty_shape="smooth")


def test_pendulum_episodes_end_at_their_own_time_limit_and_cut_the_clip():
    """InvertedPendulum's 25-step episodes (the paper's public code's): the boundary every 25 steps,
    the deferred reset right after it, the clip cut from 1.5 s (38 steps) to one episode; gym's 1000
    on request; bad values refused."""
    env, ro = rollout("InvertedPendulum", 2, 80)
    assert env.spec.horizon == 25 and env.spec.segment_length == 25 and env.options["episode_steps"] == 25
    assert tasks.TASKS["InvertedPendulum"].mujoco.clip_steps == 38  # what the clip is cut from
    long = EnvpoolVecEnv("InvertedPendulum", 1, episode_steps=1000)
    assert long.spec.horizon == 1000 and long.spec.segment_length == 38
    np.testing.assert_array_equal(np.unique(np.argwhere(ro.boundary)[:, 0]), [24, 50, 76])
    np.testing.assert_array_equal(np.unique(np.argwhere(~ro.valid)[:, 0]), [25, 51, 77])
    assert ro.terminated[:25].any()  # the random policy still drops the pole inside one episode
    # a return per episode counts the valid steps only: +1 on each of them is 25 per episode, not 24.06
    np.testing.assert_allclose(per_episode(np.where(ro.valid, 1.0, 0.0), ro.valid, 25), 25.0, rtol=1e-6)
    np.testing.assert_allclose(per_episode(ro.true_reward, ro.valid, 25),
                               ro.true_reward[ro.valid].mean() * 25, rtol=1e-5)
    double = EnvpoolVecEnv("InvertedDoublePendulum", 1).spec
    assert (double.horizon, double.segment_length) == (50, 30)  # 1.5 s fits in its 50 steps
    with pytest.raises(ValueError, match="from 2 to gym's 1000 for InvertedPendulum, got 1001"):
        EnvpoolVecEnv("InvertedPendulum", 1, episode_steps=1001)
    with pytest.raises(ValueError, match="got 2.5"):
        EnvpoolVecEnv("InvertedPendulum", 1, episode_steps=2.5)
    with pytest.raises(ValueError, match="never spans two episodes"):
        EnvpoolVecEnv("InvertedPendulum", 1, episode_steps=25, segment_length=26)


@pytest.mark.parametrize("backend", ["xla", "callback"])
def test_mujoco_true_reward_is_forward_progress_without_control_cost(backend):
    """HalfCheetah: reward = Δx / dt (x from the render data), whatever the torques; both backends."""
    env, ro = rollout("HalfCheetah", 2, 60, backend=backend)
    assert env.backend == backend
    x = ro.render[..., 0]
    dt = 0.01 * 5
    both_valid = ro.valid[1:] & ro.valid[:-1]
    np.testing.assert_allclose(ro.raw_reward[1:][both_valid], ((x[1:] - x[:-1]) / dt)[both_valid],
                               rtol=1e-3, atol=1e-3)
    assert np.abs(ro.action).mean() > 0.4  # large random torques, yet no control cost
    np.testing.assert_array_equal(ro.true_reward, ro.raw_reward)  # no healthy range: no penalty


# A.1: no control costs; A: leaving the healthy range is a penalty, not an episode end
A1_MODIFICATIONS = {"ctrl_cost_weight": 0.0, "terminate_when_unhealthy": False}
# the pendulums have no such switch: their envpool range is widened so that they never end
PENDULUM_RANGE_KEYS = {"healthy_z_min", "healthy_z_max"}


def test_mujoco_tasks_change_only_what_a1_changes():
    """A.1 removes the control costs and A replaces early termination by a penalty: nothing else of
    envpool's tasks (their contact costs included) is changed."""
    for name in tasks.names("mujoco"):
        options = tasks.TASKS[name].mujoco.options
        opts = dict(options)
        if name.startswith("Inverted"):
            assert set(opts) <= PENDULUM_RANGE_KEYS, name
        else:
            assert set(opts) <= set(A1_MODIFICATIONS), name
            assert all(A1_MODIFICATIONS[k] == v for k, v in options), name


def test_clips_last_one_and_a_half_seconds_of_each_tasks_own_time():
    """A.1 compares 1.5 s segments: the task table's step duration is the task's own (its XML's
    timestep × envpool's frame skip), and a clip is 1.5 s of it, or the whole episode when the
    episode is shorter (Reacher: 50 steps = 1 s)."""
    import mujoco

    from rlhp_jax.render.mujoco import mujoco_asset

    for name in tasks.names("mujoco"):
        task, model = tasks.TASKS[name], tasks.TASKS[name].mujoco
        spec = envpool.make_spec(task.envpool_id).config
        xml, frame_skip = mujoco_asset(name)
        assert frame_skip == model.frame_skip == spec.frame_skip, name
        assert mujoco.MjModel.from_xml_path(xml).opt.timestep == pytest.approx(model.model_timestep), name
        # gym's time limit, but the pendulums' (the paper's public code's: 25 and 50 steps)
        assert task.horizon == {"InvertedPendulum": 25, "InvertedDoublePendulum": 50}.get(name, spec.max_episode_steps)
        seconds = task.segment_length * model.control_timestep
        if task.horizon * model.control_timestep >= 1.5:
            assert abs(seconds - 1.5) <= model.control_timestep / 2 + 1e-9, (name, seconds)
        else:
            assert task.segment_length == task.horizon, name
    assert tasks.TASKS["Hopper"].segment_length == tasks.TASKS["Walker2d"].segment_length == 188
    assert make_env("Hopper", 1).spec.segment_length == 188


def test_ant_reward_keeps_the_tasks_contact_cost():
    """Ant's reward is envpool's Ant-v4 with only A.1's changes, contact cost as the task has it.  In gym
    v4's Ant (and envpool's) the contact cost weight is 5e-4 but contact forces are left out of the
    reward unless ``use_contact_force``: the term is exactly 0 on every step of these random rollouts."""
    defaults = envpool.make_spec("Ant-v4").config
    assert defaults.contact_cost_weight > 0 and not defaults.use_contact_force
    env, ours, raw = lockstep("Ant", 2, 100, twin_options=A1_MODIFICATIONS)
    assert "contact_cost_weight" not in env.envpool_kwargs
    np.testing.assert_array_equal(ours.raw_reward, raw["reward"].astype(np.float32))
    np.testing.assert_array_equal(raw["reward_contact"], 0.0)


def test_healthy_range_matches_envpool_termination():
    """Our healthy() says 'out' exactly when envpool's own terminating tasks end."""
    for task, dim in (("Hopper", 3), ("Walker2d", 6), ("InvertedPendulum", 1), ("InvertedDoublePendulum", 1)):
        e = envpool.make(f"{task}-v4", env_type="gymnasium", num_envs=4, seed=3)
        e.reset()
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(300):
            obs, _, term, trunc, info = e.step(rng.uniform(-1, 1, (4, dim)))
            live = np.asarray(info["elapsed_step"]) > 0
            np.testing.assert_array_equal(~healthy(task, obs)[live], term[live])
            ends += int(term.sum())
        assert ends > 0, task


@pytest.mark.parametrize("task", ["InvertedPendulum", "InvertedDoublePendulum"])
def test_pendulums_run_on_after_a_fall_with_a_penalty_per_step_out(task):
    """Appendix B's instructions show fallen pendulums on screen ("a lot of ties where the pendulum
    has fallen"; "if they fall down, the cart should try to swing them back up"): a fall does not
    reset the task.  The reward is envpool's own until the fall, and each step out of range
    scores minus the alive bonus.  (Gym's 1000-step episodes here, to watch the fallen pole stay.)"""
    env, ours, raw = lockstep(task, 2, 300, twin_options={}, episode_steps=1000)
    assert env.spec.on_terminate == "continue" and env.spec.horizon == 1000
    assert ours.valid.all() and not ours.boundary.any()  # no reset in 300 steps
    out = ~np.asarray(healthy(task, ours.obs.reshape(-1, ours.obs.shape[-1]))).reshape(300, 2)
    first = out.argmax(0)
    assert out.any(0).all() and (first < 100).all()  # a random cart drops the pole early
    np.testing.assert_array_equal(ours.terminated, out & ~np.concatenate([np.zeros((1, 2), bool), out[:-1]]))
    for n in range(2):  # the twin (envpool's terminating task) agrees up to and including the fall
        f = first[n]
        assert raw["term"][f, n] and not raw["term"][:f, n].any()
        np.testing.assert_allclose(ours.raw_reward[: f + 1, n], raw["reward"][: f + 1, n], rtol=1e-6)
    alive_bonus = {"InvertedPendulum": 1.0, "InvertedDoublePendulum": 10.0}[task]
    assert env.spec.terminal_penalty == -2 * alive_bonus
    np.testing.assert_allclose(ours.true_reward - ours.raw_reward, np.where(out, -2 * alive_bonus, 0.0))
    if task == "InvertedPendulum":  # the pole comes to rest at its hinge stop and stays out
        assert out[first.max():].all()
        assert np.abs(ours.obs[-1, :, 1]).min() > 1.4
        np.testing.assert_allclose(ours.true_reward[out], -1.0)


def test_segments_never_contain_the_deferred_reset_step():
    _, ro = rollout("Reacher", 2, 200)  # 50-step episodes: envpool's deferred reset after each
    length = 5
    starts = np.asarray(queries.valid_segment_starts(ro.boundary, length, excluded=~ro.valid))
    windows = np.lib.stride_tricks.sliding_window_view(~ro.valid, length, axis=0)  # [S, N, L]
    np.testing.assert_array_equal(starts, ~windows.any(-1))
    assert (~starts).any() and starts.any()


def test_bad_envpool_settings_raise():
    with pytest.raises(ValueError, match="Unknown environment 'Hoper'"):
        make_env("Hoper", 2)
    with pytest.raises(ValueError, match="backend must be"):
        EnvpoolVecEnv("Hopper", 2, backend="gpu")
    with pytest.raises(ValueError, match="Unknown MuJoCo options"):
        EnvpoolVecEnv("Hopper", 2, colour="red")
    with pytest.raises(ValueError, match="num_envs"):
        EnvpoolVecEnv("Hopper", 0)


# ------------------------------------------------------------------ Atari (Christiano A.2, Ibarz A.1)
@pytest.fixture(scope="module")
def breakout():
    return lockstep("Breakout", 2, 700)


def test_atari_frames_are_the_masked_envpool_frames_channel_last(breakout):
    env, ours, raw = breakout
    assert ours.obs.shape == (700, 2, 84, 84, 4) and ours.obs.dtype == np.uint8
    expected = np.transpose(np.where(env._mask, 0, raw["obs"]), (0, 1, 3, 4, 2))
    np.testing.assert_array_equal(ours.obs, expected)
    assert env._mask.any() and (raw["obs"][..., env._mask] > 0).any()  # the mask hides something real


def test_atari_life_loss_and_game_over_never_reach_the_agent(breakout):
    env, ours, raw = breakout
    lost_life = raw["lives"][1:] < raw["lives"][:-1]
    assert lost_life.sum() > raw["term"].sum() > 0  # several lives lost, and some games over
    assert not ours.boundary.any()  # one continuous episode
    np.testing.assert_array_equal(ours.terminated, raw["term"])  # game over only, never a life loss
    # the oracle: clipped game reward, plus the penalty exactly on game over (not Pong)
    assert env.spec.terminal_penalty < 0
    np.testing.assert_allclose(ours.true_reward,
                               np.clip(raw["reward"], -1, 1) + env.spec.terminal_penalty * raw["term"])
    # the deferred reset after each game over is flagged and kept out of segments
    np.testing.assert_array_equal(~ours.valid, raw["elapsed"] == 0)
    assert (~ours.valid).sum() >= raw["term"][:-1].sum()


def test_pong_game_over_carries_no_penalty():
    env, ours, raw = lockstep("Pong", 1, 1100, seed=0)
    assert env.spec.terminal_penalty == 0.0
    assert raw["term"].any()  # a random player loses 21-0 within ~1000 steps
    np.testing.assert_allclose(ours.true_reward, np.clip(raw["reward"], -1, 1))
    assert not ours.boundary.any()


def test_atari_options_follow_the_papers():
    christiano = EnvpoolVecEnv("Pong", 1)
    ibarz = EnvpoolVecEnv("PongNoFrameskip-v4", 1, noop_max=90, full_action_space=True)
    assert christiano.spec.num_actions == 6 and ibarz.spec.num_actions == 18
    for e, noops in ((christiano, 30), (ibarz, 90)):
        kw = e.envpool_kwargs
        assert kw["noop_max"] == noops and kw["frame_skip"] == 4 and kw["stack_num"] == 4
        assert kw["repeat_action_probability"] == 0.0 and not kw["episodic_life"] and kw["gray_scale"]
        # Mnih et al.'s wrappers (A.2, Ibarz A.1) press no FIRE at reset: the policy starts the game
        assert kw["use_fire_reset"] is False
    assert christiano.spec.segment_length == 25 and christiano.spec.reward_std == 0.05
    with pytest.raises(ValueError, match="Unknown Atari options"):
        EnvpoolVecEnv("Pong", 1, sticky=0.25)
