"""Atari and Ibarz et al. as the papers ran them: the settings of Christiano A.2 and Ibarz A.1-A.4
that the presets and the loop must carry out, each read where a run reads it.

* Ibarz's synthetic oracle compares the games' real scores (``config.IBARZ_ORACLE``); A.2's clips.
* The no_online_queries ablation keeps every label it asks up front (``RunParts.label_capacity``).
* A.2's first labels come from a rollout long enough for distinct candidate clips
  (``RunConfig.distinct_initial_clips``, ``RunParts.long_rollout``).
* A.2's RL baseline trains on the game's reward clipped to [-1, 1] (``baseline_reward="clipped_game"``).
* A.2's label rate is held for blocks of 5·10⁶ steps (``rate_step``).

Nothing here trains: the Atari checks build a run's parts (no compilation) or step the emulator
with random actions; the mechanics run on CartPole's small MLPs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax.config import IbarzConfig, RunConfig, with_ablation
from rlhp_jax.core import Rollout
from rlhp_jax.envs import make_env
from rlhp_jax.loop import MAX_INITIAL_STEPS, RunParts
from rlhp_jax.rollout import collect_rollout
from rlhp_jax.schedules import initial_rollout_steps


def random_steps(env, steps: int, seed: int = 0):
    """``steps`` uniformly random actions in every environment: the rollout, as NumPy."""
    spec = env.spec

    def policy(params, obs, key):
        n = obs.shape[0]
        return jax.random.randint(key, (n,), 0, spec.num_actions, jnp.int32), jnp.zeros(n), jnp.zeros(n)

    state, obs = env.reset(jax.random.key(seed))
    _, _, ro = collect_rollout(env, policy, None, state, obs, jax.random.key(seed), steps)
    return jax.tree.map(np.asarray, ro)


def small_cartpole(**changes) -> RunConfig:
    from rlhp_jax.agents.ppo import PPOConfig

    return RunConfig(env="CartPole-v1", total_steps=4 * 256, labels=12, segment_length=10, out="unused",
                     agent_config=PPOConfig(num_envs=4, num_steps=64, update_epochs=1, num_minibatches=2),
                     **changes)


# ------------------------------------------------------------------ 1. Ibarz's oracle: the real score
def test_ibarz_oracle_judges_the_games_real_score():
    """Ibarz's oracle "reflect[s] the true reward of the underlying Atari game" and its appendices
    weigh 10 vs 11 vs 100 points: its environment does not clip what the oracle sees, whatever
    other options a run sets; Christiano A.2's oracle still clips."""
    from rlhp_jax.ibarz import IbarzRun

    ibarz = IbarzConfig.paper("SpaceInvaders", setup="no_demos")
    assert ibarz.env_kwargs() == dict(full_action_space=True, noop_max=90, clip_oracle_reward=False)
    # env_options replace A.1's defaults, not the oracle's rule, unless they name it
    assert dataclasses.replace(ibarz, env_options=(("noop_max", 30),)).env_kwargs() == dict(
        noop_max=30, clip_oracle_reward=False)
    assert dataclasses.replace(ibarz, env_options=(("clip_oracle_reward", True),)).env_kwargs() == dict(
        clip_oracle_reward=True)
    assert IbarzConfig.paper("Breakout-MinAtar", setup="no_demos").env_kwargs() == {}  # gymnax: no such option
    # the environment Ibarz's run builds (its oracle labels clips by env.step's true_reward)
    env = IbarzRun(ibarz, progress=False).env
    assert env.options["clip_oracle_reward"] is False
    ro = random_steps(make_env("SpaceInvaders", 4, **ibarz.env_kwargs()), 400)
    assert (ro.raw_reward > 1).any()  # invaders are worth 5 to 30 points
    expected = np.where(ro.valid, ro.raw_reward + env.spec.terminal_penalty * ro.terminated, 0.0)
    np.testing.assert_array_equal(ro.true_reward, expected)
    # A.2 (Christiano's preset sets no option): the oracle's reward is clipped
    christiano = RunConfig.paper("SpaceInvaders")
    assert "clip_oracle_reward" not in dict(christiano.env_options)
    assert make_env("SpaceInvaders", 1, **dict(christiano.env_options)).options["clip_oracle_reward"] is True


# ------------------------------------------------------------------ 2. no_online_queries keeps its labels
def test_labels_asked_up_front_are_all_kept():
    """A.2's buffer keeps the last 3,000 labels; the no_online_queries ablation asks all 5,500 before
    RL, and none of them may be overwritten before the reward model has seen them."""
    pong = RunParts(RunConfig.paper("Pong"))
    assert (pong.label_capacity, pong.schedule.initial) == (3000, 500)
    offline = RunParts(RunConfig.paper("Pong", ablation="no_online_queries"))
    assert offline.schedule.initial == offline.label_capacity == 5500
    # the rule is the run's, whatever built the config
    cfg = with_ablation(small_cartpole(label_capacity=5), "no_online_queries")
    parts = RunParts(cfg)
    assert parts.schedule.initial == 12 and parts.label_capacity == 12
    assert parts.fresh(jax.random.key(0), reward_scale=False).buffer.capacity == 12
    assert RunParts(small_cartpole(label_capacity=5)).label_capacity == 5  # online: the last 5, as asked
    assert RunParts(small_cartpole(label_capacity=50)).label_capacity == 12  # never more than the budget


# ------------------------------------------------------------------ 3. A.2's first labels: a long rollout
def test_atari_first_labels_come_from_a_rollout_long_enough_for_distinct_clips():
    """A.2's 500 first queries are chosen from 5,000 candidate pairs: the untrained policy acts long
    enough (2 · 5,000 · 25 steps, Ibarz's rule) for their clips not to overlap, not one 4,000-step
    iteration from reset; the other domains keep one iteration's rollout."""
    pong = RunParts(RunConfig.paper("Pong"))
    block = pong.rollout_len * pong.env.num_envs
    assert block == 4000
    wanted = initial_rollout_steps(500 * 10, 25)
    assert wanted == 250_000
    assert wanted <= pong.initial_blocks * block < wanted + block
    # no_online_queries asks 5,500 up front: capped (the frames of 300,000 steps are 8.5 GB)
    offline = RunParts(RunConfig.paper("Pong", ablation="no_online_queries"))
    assert offline.initial_blocks * block <= MAX_INITIAL_STEPS < (offline.initial_blocks + 1) * block
    for task in ("HalfCheetah", "Hopper", "CartPole-v1", "Breakout-MinAtar"):
        assert RunParts(RunConfig.paper(task)).initial_blocks == 1, task
    assert RunParts(RunConfig.paper("Pong", baseline=True)).initial_blocks == 1  # no labels, no first rollout


def test_long_first_rollout_is_consecutive_iterations_laid_end_to_end():
    cfg = small_cartpole(distinct_initial_clips=True)
    parts = RunParts(cfg)
    per_block = parts.rollout_len * parts.env.num_envs  # 256
    assert parts.initial_blocks == -(-initial_rollout_steps(3 * 10, 10) // per_block) == 3
    state = parts.fresh(jax.random.key(1), reward_scale=False)
    after, rollout, member_r, _ = parts.initial_rollout(state)
    assert rollout.obs.shape[:2] == (3 * parts.rollout_len, 4)
    assert member_r.shape == (cfg.ensemble.num_members, 3 * parts.rollout_len, 4)
    # the same as three rollouts of one iteration each, one after the other, with the keys split from one
    _, k_roll, _, _ = jax.random.split(state.key, 4)
    env_state, obs, blocks = state.env_state, state.obs, []
    for k in jax.random.split(k_roll, 3):
        env_state, obs, ro, mr = jax.jit(parts.rollout_only)(state.agent, env_state, obs, state.ensemble, k)
        blocks.append((ro, mr))
    for f in ("obs", "action", "true_reward", "raw_reward", "boundary", "valid"):
        np.testing.assert_array_equal(getattr(rollout, f), np.concatenate([getattr(b[0], f) for b in blocks]), f)
    np.testing.assert_allclose(member_r, np.concatenate([b[1] for b in blocks], axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(rollout.last_obs, blocks[-1][0].last_obs)
    np.testing.assert_array_equal(after.obs, obs)  # the run goes on from where the rollout stopped
    # off (every preset but Atari's): one iteration's rollout, as before
    plain = RunParts(small_cartpole())
    assert plain.initial_blocks == 1
    _, rollout, _, _ = plain.initial_rollout(plain.fresh(jax.random.key(1), reward_scale=False))
    assert rollout.obs.shape[0] == plain.rollout_len


# ------------------------------------------------------------------ 4. A.2's RL baseline: the clipped game reward
def test_atari_baseline_trains_on_the_clipped_game_reward():
    """A.2's A2C baseline runs on Mnih et al.'s wrappers, which clip the game's reward to [-1, 1]:
    no random-policy shift or scale, and no game-over penalty (that is the oracle's, appendix A)."""
    assert RunConfig.paper("Pong", baseline=True).baseline_reward == "clipped_game"
    assert RunConfig.paper("HalfCheetah", baseline=True).baseline_reward == "raw"  # A.1's modified task
    assert RunConfig.paper("CartPole-v1", baseline=True).baseline_reward == "normalized"
    parts = RunParts(RunConfig.paper("Breakout", baseline=True))
    np.testing.assert_array_equal(np.asarray(parts.reward_scale(jax.random.key(0))), [0.0, 1.0])
    raw = np.array([[0.0, 4.0, 7.0], [1.0, -3.0, 0.5]], np.float32)
    terminated = np.array([[False, False, True], [False, False, False]])
    valid = np.array([[True, True, True], [True, False, True]])
    rollout = Rollout(obs=None, action=None, log_prob=None, value=None, boundary=np.zeros_like(valid),
                      true_reward=np.clip(raw, -1, 1) + parts.spec.terminal_penalty * terminated,
                      terminated=terminated, raw_reward=raw, valid=valid, render=None, last_obs=None,
                      last_value=None)
    np.testing.assert_array_equal(np.asarray(parts.baseline_rewards(rollout, parts.reward_scale(None))),
                                  [[0.0, 1.0, 1.0], [1.0, 0.0, 0.5]])


def test_the_baseline_agent_gets_what_baseline_rewards_gives():
    """In the iteration the agent updates on: CartPole's raw reward is 1 a step, its true reward
    adds the fall penalty; "clipped_game" trains on the former."""
    parts = RunParts(small_cartpole(reward_source="true", baseline_reward="clipped_game"))
    state = parts.fresh(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(state.reward_scale), [0.0, 1.0])
    out = jax.jit(parts.iteration)(state.agent, state.env_state, state.obs, state.ensemble, state.reward_scale,
                                   jax.random.key(1))
    rollout, rewards = out[3], out[4]
    assert (np.asarray(rollout.true_reward) != np.asarray(rollout.raw_reward)).any()  # falls were penalized
    np.testing.assert_array_equal(rewards, np.where(rollout.valid, np.clip(rollout.raw_reward, -1, 1), 0.0))


# ------------------------------------------------------------------ 5. A.2's label rate, held in blocks
def test_atari_label_rate_is_decreased_every_five_million_steps():
    pong = RunParts(RunConfig.paper("Pong"))
    assert (pong.schedule.rate_constant, pong.schedule.rate_step) == (5e6, 5_000_000)
    assert pong.schedule.rate(0) == pong.schedule.rate(4_999_999) == pytest.approx(2 * pong.schedule.rate(5e6))
    assert "held constant for blocks of 5,000,000 steps" in pong.schedule.describe()
    for task in ("HalfCheetah", "CartPole-v1"):
        assert RunParts(RunConfig.paper(task)).schedule.rate_step is None, task
