"""What r̂ reads and what the agent is paid, beyond the paper's r̂(o_t, a_t) (ours; BUILD_NOTES, Swimmer).

r̂ of the transition (``--ensemble.next-obs``): each step's observation beside the next.

* ``rollout.transition_obs`` pairs o_t with o_{t+1} (``last_obs`` after the last step) and with
  o_t itself where an episode ends, on any shapes (property test);
* the task's reflection acts on both halves (``reward_models.transition_mirror``), and tasks with
  image observations refuse the option;
* a run with the option stores the transition in its clips and scores its rollouts on it: the
  second half of each clip step is the first half of the next one.

And two diagnosis options: r̂ of the observation alone (``--ensemble.no-use-action``), and the
``true_at_rhat_scale`` arm, whose agent is paid the true reward on r̂'s least-squares line, and the
``shuffled_residual`` arm, paid that line plus r̂'s residual from it moved to other steps.
"""

from __future__ import annotations

import dataclasses

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from rlhp_jax.core import EnvSpec, Rollout
from rlhp_jax.reward_models import mirror_step, reward_model_spec_for, transition_mirror
from rlhp_jax.rollout import transition_obs
from rlhp_jax.tasks import find


def rollout_of(obs, last_obs, boundary, terminated) -> Rollout:
    t, n = boundary.shape
    zeros = np.zeros((t, n), np.float32)
    return Rollout(obs=obs, action=np.zeros((t, n), np.int32), log_prob=zeros, value=zeros, boundary=boundary,
                   true_reward=zeros, terminated=terminated, raw_reward=zeros, valid=np.ones((t, n), bool),
                   render=np.zeros((t, n, 0), np.float32), last_obs=last_obs, last_value=np.zeros(n, np.float32))


def spec_of(dim: int, on_terminate: str) -> EnvSpec:
    return EnvSpec(name="test", obs_shape=(dim,), discrete=True, num_actions=2, action_low=None, action_high=None,
                   horizon=10, terminal_penalty=0.0, segment_length=3, reward_std=1.0, on_terminate=on_terminate)


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 6), n=st.integers(1, 3), d=st.integers(1, 4), seed=st.integers(0, 2**16),
       on_terminate=st.sampled_from(["reset", "continue"]))
def test_transition_obs_pairs_each_step_with_the_next(t, n, d, seed, on_terminate):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(t, n, d)).astype(np.float32)
    last = rng.normal(size=(n, d)).astype(np.float32)
    boundary, terminated = rng.random((t, n)) < 0.3, rng.random((t, n)) < 0.3
    out = np.asarray(transition_obs(spec_of(d, on_terminate), rollout_of(obs, last, boundary, terminated)))
    chex.assert_shape(out, (t, n, 2 * d))
    ends = boundary | (terminated if on_terminate == "reset" else False)
    for i in range(t):
        for j in range(n):
            nxt = obs[i, j] if ends[i, j] else (obs[i + 1, j] if i + 1 < t else last[j])
            np.testing.assert_array_equal(out[i, j], np.concatenate([obs[i, j], nxt]))


@pytest.mark.parametrize("task", ["CartPole-v1", "Swimmer"])
def test_the_reflection_acts_on_both_halves(task):
    mirror = find(task).mirror
    m2 = transition_mirror(mirror)
    d = len(mirror.obs_sign)
    rng = np.random.default_rng(0)
    o, o_next = rng.normal(size=(5, d)).astype(np.float32), rng.normal(size=(5, d)).astype(np.float32)
    action = jnp.zeros(5, jnp.int32) if task == "CartPole-v1" else jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
    both, a_both = mirror_step(m2, jnp.concatenate([o, o_next], -1), action)
    first, a_first = mirror_step(mirror, jnp.asarray(o), action)
    second, _ = mirror_step(mirror, jnp.asarray(o_next), action)
    np.testing.assert_array_equal(np.asarray(both), np.concatenate([first, second], -1))
    np.testing.assert_array_equal(np.asarray(a_both), np.asarray(a_first))


def test_the_spec_doubles_vector_observations_and_refuses_images():
    from rlhp_jax.envs import make_env

    spec = make_env("CartPole-v1", 1).spec
    plain, both = reward_model_spec_for(spec), reward_model_spec_for(spec, next_obs=True)
    assert plain.obs_shape == (4,) and both.obs_shape == (8,)
    assert both.mirror == transition_mirror(plain.mirror)
    image = dataclasses.replace(spec, name="Pong", obs_shape=(84, 84, 4))
    with pytest.raises(ValueError, match="needs vector observations"):
        reward_model_spec_for(image, next_obs=True)


def test_a_run_stores_and_scores_the_transition():
    """CartPole with the option: every clip step of the chosen pairs is [o_t, o_{t+1}] of the
    rollout it came from (its first half the plain run's clip), and the members score the
    rollout on those features."""
    import lanes_check
    from rlhp_jax.loop import RunParts

    base = lanes_check.test_config()
    cfg = dataclasses.replace(base, ensemble=dataclasses.replace(base.ensemble, next_obs=True))
    parts = RunParts(cfg)
    assert parts.ensemble.spec.obs_shape == (8,)
    state = parts.fresh(jax.random.key(0))
    state, rollout, member_r, _ = parts.initial_rollout(state)
    features = np.asarray(transition_obs(parts.spec, rollout))
    flat = features.reshape(-1, 8)
    act = np.asarray(rollout.action).reshape(-1)
    expected = np.asarray(parts.ensemble.member_rewards(state.ensemble, jnp.asarray(flat), jnp.asarray(act)))
    np.testing.assert_allclose(np.asarray(member_r).reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)

    q = 4
    pairs, _ = jax.jit(parts.candidates, static_argnums=4)(member_r, rollout, jax.random.key(1), q, q)
    clips = np.asarray(pairs.obs).reshape(2 * q, cfg.segment_length, 8)
    ends = np.asarray(parts.episode_ends(rollout))
    # each clip is a window of one environment's rollout: find it and compare step by step
    for clip in clips:
        hits = [(t, e) for e in range(features.shape[1]) for t in range(features.shape[0] - cfg.segment_length + 1)
                if np.array_equal(features[t:t + cfg.segment_length, e], clip)]
        assert hits, "a clip that is no window of the rollout's transitions"
        t, e = hits[0]
        np.testing.assert_array_equal(clip[:, :4], np.asarray(rollout.obs)[t:t + cfg.segment_length, e])
        inner = ~ends[t:t + cfg.segment_length - 1, e]
        np.testing.assert_array_equal(clip[:-1, 4:][inner], clip[1:, :4][inner])
    assert not np.array_equal(clips[:, :, :4], clips[:, :, 4:])  # the next observation is not the same one


def test_a_run_written_before_the_option_still_reads(tmp_path):
    """A config.json without ``ensemble.next_obs`` (every run before the option) reads as the
    paper's r̂ of (o_t, a_t), so it resumes; a file lacking any other field is still refused."""
    import json

    import lanes_check
    from rlhp_jax.config import config_to_json
    from rlhp_jax.runs import read_run_config

    saved = config_to_json(lanes_check.test_config())
    del saved["ensemble"]["next_obs"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = read_run_config(tmp_path)
    assert cfg.ensemble.next_obs is False and cfg.ensemble == lanes_check.test_config().ensemble
    del saved["ensemble"]["mirror"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="lacks mirror"):
        read_run_config(tmp_path)


def test_without_the_action_r_hat_reads_the_observation_alone():
    from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
    from rlhp_jax.envs import make_env

    spec = reward_model_spec_for(make_env("Pendulum-v1", 1).spec)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)
    a1, a2 = jnp.full((6, 1), -1.5), jnp.full((6, 1), 1.5)
    for use_action in (True, False):
        ens = RewardEnsemble(spec, EnsembleConfig(num_members=2, use_action=use_action))
        state = ens.init(jax.random.key(0))
        r1, r2 = (np.asarray(ens.member_rewards(state, obs, a)) for a in (a1, a2))
        assert np.array_equal(r1, r2) == (not use_action)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), slope=st.floats(-3, 3), offset=st.floats(-2, 2))
def test_the_true_reward_on_r_hats_line(seed, slope, offset):
    """``affine_true`` returns r̂ itself where r̂ is affine in the true reward, and otherwise the true
    reward on r̂'s least-squares line: same mean as r̂ over the valid steps, correlation ±1 with the
    true reward."""
    from rlhp_jax.loop import RunParts

    rng = np.random.default_rng(seed)
    true = rng.normal(size=(8, 3)).astype(np.float32)
    valid = rng.random((8, 3)) < 0.8
    valid[0, 0] = valid[1, 1] = True
    ro = rollout_of(np.zeros((8, 3, 1), np.float32), np.zeros((3, 1), np.float32), np.zeros((8, 3), bool),
                    np.zeros((8, 3), bool))._replace(true_reward=true, valid=valid)
    exact = slope * true + offset
    np.testing.assert_allclose(np.asarray(RunParts.affine_true(jnp.asarray(exact), ro))[valid], exact[valid],
                               rtol=1e-4, atol=1e-4)
    noisy = exact + rng.normal(size=exact.shape).astype(np.float32)
    out = np.asarray(RunParts.affine_true(jnp.asarray(noisy), ro))
    np.testing.assert_allclose(out[valid].mean(), noisy[valid].mean(), rtol=1e-4, atol=1e-4)
    fit = np.polyfit(true[valid], noisy[valid], 1)
    np.testing.assert_allclose(out, np.polyval(fit, true), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("ablation", ["true_at_rhat_scale", "shuffled_residual"])
def test_the_diagnosis_arms_pay_their_agent_the_true_reward_on_r_hats_line(ablation):
    """``--ablation true_at_rhat_scale``: the learned arm's iteration, its agent's reward exactly
    affine in the rollout's true reward; the ensemble, labels and everything else as the learned arm.
    ``--ablation shuffled_residual``: the same line plus r̂'s residual from it, the residuals the
    same set of numbers but moved to other steps."""
    import lanes_check
    from rlhp_jax.config import with_ablation
    from rlhp_jax.loop import RunParts

    cfg = with_ablation(lanes_check.test_config(), ablation)
    parts = RunParts(cfg)
    assert parts.learn and (parts.true_at_rhat_scale, parts.shuffled_residual) == (
        ablation == "true_at_rhat_scale", ablation == "shuffled_residual")
    assert parts.updates_per_iter == 1  # one rollout an iteration: one line over all its steps
    state = parts.fresh(jax.random.key(0))
    out = jax.jit(parts.iteration)(state.agent, state.env_state, state.obs, state.ensemble, state.reward_scale,
                                   jax.random.key(1))
    rollout, rewards, member_r = out[3], np.asarray(out[4]), out[5]
    valid = np.asarray(rollout.valid)
    true = np.asarray(rollout.true_reward)
    assert true[valid].std() > 0 and member_r.shape[0] == 2
    r_hat = np.asarray(parts.agent_rewards(state.ensemble, member_r))
    line = np.asarray(RunParts.affine_true(jnp.asarray(r_hat), rollout))
    assert not np.allclose(rewards, r_hat)
    if ablation == "true_at_rhat_scale":
        assert abs(np.corrcoef(rewards[valid], true[valid])[0, 1]) > 0.9999
        np.testing.assert_allclose(rewards, line, rtol=1e-5, atol=1e-6)
    else:
        residual, own = rewards - line, r_hat - line
        np.testing.assert_allclose(np.sort(residual[valid]), np.sort(own[valid]), rtol=1e-5, atol=1e-6)
        assert not np.allclose(residual[valid], own[valid])
        # the residual is no longer what r̂ had at that step, but as large: correlation with r̂ drops
        assert np.corrcoef(rewards[valid], r_hat[valid])[0, 1] < 0.99
        np.testing.assert_allclose(residual[valid].std(), own[valid].std(), rtol=1e-4)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_a_shuffle_over_the_valid_steps_moves_only_valid_values_among_valid_steps(seed):
    from rlhp_jax.loop import RunParts

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    valid = rng.random((8, 3)) < 0.7
    out = np.asarray(RunParts.shuffled_over_valid(jnp.asarray(x), jnp.asarray(valid), jax.random.key(seed)))
    np.testing.assert_array_equal(out[~valid], x[~valid])
    np.testing.assert_array_equal(np.sort(out[valid]), np.sort(x[valid]))
    if valid.sum() >= 8:  # 8! orders: the identity would be a broken shuffle, not chance
        assert not np.array_equal(out[valid], x[valid])
