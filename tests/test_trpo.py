"""Fast tests of TRPO: the trust region, conjugate gradient, probe tasks, invalid steps, defaults.

Compilation dominates: the file compiles two training scans (one per probe task), one update and
a few small helpers, all with ``fast_jit``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import fast_jit
from probes import ProbeEnv, probe_training
from rlhp_jax.agents.trpo import (
    TRPO,
    TRPOConfig,
    conjugate_gradient,
    merge_params,
    preset,
    split_params,
)

# A tiny config: compiles and trains in a few seconds on a 2-core CPU.  The probe's reward
# depends only on the current action, so a short discount keeps the advantages clean.
TINY = TRPOConfig(num_envs=4, num_steps=16, gamma=0.5, hidden_sizes=(16,), vf_minibatches=2)
TINY_KL = 1e-4  # the small trust region of the second agent
KL_TOL = 1e-6  # float32 slack on the measured KL


def _train_on_probe(continuous: bool, num_updates: int, seed: int = 0, config: TRPOConfig = TINY):
    """Train TRPO on a probe task in one jitted scan.

    Returns (agent, init_state, state, params_after_each_update, rollouts, metrics).
    """
    env = ProbeEnv(config.num_envs, continuous)
    agent = TRPO(env.spec, config, num_updates)
    k_init, k_reset, k_loop = jax.random.split(jax.random.PRNGKey(seed), 3)
    init_state = agent.init(k_init)

    state, params, rollouts, metrics = fast_jit(probe_training(agent, env, num_updates, k_reset))(init_state, k_loop)
    for name, m in metrics.items():
        assert np.all(np.isfinite(np.asarray(m))), name
    return agent, init_state, state, params, rollouts, metrics


@pytest.fixture(scope="module")
def continuous_probe():
    return _train_on_probe(continuous=True, num_updates=50)


@pytest.fixture(scope="module")
def discrete_probe():
    return _train_on_probe(continuous=False, num_updates=20)


def _measured_kls(agent, init_params, params, rollouts):
    """Mean KL(π_k ‖ π_{k+1}) over the obs of rollout k, for every update k (recomputed here,
    independently of the agent's own metric)."""
    before = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b[:-1]]), init_params, params)

    def one(p_old, p_new, obs):
        return jnp.mean(agent.pi.kl(agent.pi.forward(p_old, obs)[0], agent.pi.forward(p_new, obs)[0]))

    return np.asarray(fast_jit(jax.vmap(one))(before, params, rollouts.obs))


@pytest.fixture(scope="module")
def small_kl_agent():
    """The continuous probe's agent with a 100× smaller trust region, and its jitted pieces."""
    agent = TRPO(ProbeEnv(TINY.num_envs, True).spec, dataclasses.replace(TINY, max_kl=TINY_KL))
    return agent, fast_jit(agent.update)


# -- (a) the trust region --------------------------------------------------------------------
@pytest.mark.parametrize("probe", ["continuous_probe", "discrete_probe"])
def test_every_step_respects_the_kl_bound(probe, request):
    agent, init_state, _, params, rollouts, metrics = request.getfixturevalue(probe)
    kls = _measured_kls(agent, init_state.params, params, rollouts)
    accepted = np.asarray(metrics["step_accepted"]) > 0
    assert accepted.mean() > 0.9  # the line search rarely gives up on these tasks
    assert np.all(kls <= TINY.max_kl + KL_TOL), kls.max()
    assert np.all(kls[accepted] > 0.0)  # every accepted step moved the policy
    assert np.all(kls[~accepted] == 0.0)  # a rejected step keeps the old policy
    # the agent's own metric is the KL it stepped to
    np.testing.assert_allclose(np.asarray(metrics["kl"]), kls, rtol=1e-3, atol=1e-7)
    # ... and an accepted step improved the surrogate
    assert np.all(np.asarray(metrics["surrogate_improvement"])[accepted] > 0.0)


def test_smaller_trust_region_takes_a_smaller_step(continuous_probe, small_kl_agent):
    agent, init_state, _, params, rollouts, _ = continuous_probe
    small_agent, small_update = small_kl_agent
    first = jax.tree.map(lambda x: x[0], rollouts)
    key = jax.random.PRNGKey(7)
    state, metrics = small_update(init_state, first, first.true_reward, key)
    stacked = jax.tree.map(lambda x: x[None], state.params)
    one_rollout = jax.tree.map(lambda x: x[:1], rollouts)
    small_kl = _measured_kls(agent, init_state.params, stacked, one_rollout)[0]
    big_kl = _measured_kls(agent, init_state.params, params, rollouts)[0]
    assert float(metrics["step_accepted"]) == 1.0
    assert 0.0 < small_kl <= TINY_KL + 1e-8
    assert small_kl < 0.1 * big_kl  # the default region's first step went much further


def test_policy_step_moves_only_policy_params(continuous_probe, small_kl_agent):
    """The natural-gradient step touches pi_*/pi_out/log_std; the value fit only v_*."""
    _, init_state, _, _, rollouts, _ = continuous_probe
    agent, _ = small_kl_agent
    first = jax.tree.map(lambda x: x[0], rollouts)

    def policy_step(params, ro):
        return agent._policy_step(params, agent._prepare(ro, ro.true_reward))[0]

    new = fast_jit(policy_step)(init_state.params, first)
    pi_old, v_old = split_params(init_state.params)
    pi_new, v_new = split_params(new)
    assert set(pi_old["params"]) == {"pi_0", "pi_out", "log_std"}
    assert set(v_old["params"]) == {"v_0", "v_out"}
    jax.tree.map(np.testing.assert_array_equal, v_old, v_new)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), pi_old, pi_new))
    assert all(moved)
    # merge_params inverts split_params
    jax.tree.map(np.testing.assert_array_equal, merge_params(pi_old, v_old), init_state.params)


def test_rejected_step_keeps_the_old_policy(continuous_probe):
    """With only the full step to try (backtrack_iters=1) the line search rejects it on the
    continuous probe (shrinking the std costs more KL than the quadratic model predicts): the
    policy stays, the value function is still fitted."""
    _, init_state, _, _, rollouts, _ = continuous_probe
    agent = TRPO(ProbeEnv(TINY.num_envs, True).spec, dataclasses.replace(TINY, backtrack_iters=1))
    ro = jax.tree.map(lambda x: x[0], rollouts)
    state, metrics = fast_jit(agent.update)(init_state, ro, ro.true_reward, jax.random.PRNGKey(0))
    assert float(metrics["step_accepted"]) == 0.0
    assert float(metrics["linesearch_backtracks"]) == 1.0
    assert float(metrics["kl"]) == 0.0 and float(metrics["surrogate_improvement"]) == 0.0
    pi_old, v_old = split_params(init_state.params)
    pi_new, v_new = split_params(state.params)
    jax.tree.map(np.testing.assert_array_equal, pi_old, pi_new)
    assert float(metrics["value_loss"]) < float(metrics["value_loss_before"])
    assert int(state.step) == 1


def test_entropy_bonus_is_in_reward_units(continuous_probe):
    """A.1's bonus of 0.01 is against r̂ of std 1: with rewards (and values) k times larger, a
    k times larger bonus takes exactly the same step, and the same bonus a different one.  (With
    the bonus added to normalized advantages, the step would not see the rewards' scale.)"""
    _, init_state, _, _, rollouts, _ = continuous_probe
    ro = jax.tree.map(lambda x: x[0], rollouts)
    k = 10.0
    scaled = ro._replace(value=k * ro.value, last_value=k * ro.last_value)
    spec = ProbeEnv(TINY.num_envs, True).spec

    def step(ent_coef, rollout, rewards):
        agent = TRPO(spec, dataclasses.replace(TINY, ent_coef=ent_coef))
        f = lambda p, r, w: agent._policy_step(p, agent._prepare(r, w))[0]
        return jax.tree.leaves(fast_jit(f)(init_state.params, rollout, rewards))

    base = step(0.05, ro, ro.true_reward)
    same = step(0.05 * k, scaled, k * ro.true_reward)
    other = step(0.05, scaled, k * ro.true_reward)
    for a, b in zip(base, same):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(base, other)) > 1e-3


# -- (b) conjugate gradient ------------------------------------------------------------------
@fast_jit
def _cg_solve(a, b):
    n = b.shape[0]
    return conjugate_gradient(lambda v: a @ v, b, 3 * n, residual_tol=1e-14)


@given(n=st.integers(1, 8), seed=st.integers(0, 2**31 - 1), log_cond=st.floats(0.0, 2.0))
def test_conjugate_gradient_solves_spd_systems(n, seed, log_cond):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    eig = np.logspace(0.0, log_cond, n) * rng.uniform(0.1, 10.0)
    a = (q * eig) @ q.T
    a = (a + a.T) / 2
    b = rng.normal(size=n)
    x = np.asarray(_cg_solve(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)))
    expected = np.linalg.solve(a, b)
    assert np.linalg.norm(x - expected) <= 1e-3 * np.linalg.norm(expected) + 1e-5


def test_conjugate_gradient_stops_at_zero_rhs():
    x = _cg_solve(jnp.eye(3), jnp.zeros(3))
    np.testing.assert_array_equal(np.asarray(x), np.zeros(3))


# -- (c) probe tasks TRPO must solve -----------------------------------------------------------
def test_trpo_solves_continuous_probe(continuous_probe):
    agent, _, state, _, _, _ = continuous_probe
    mean_action = float(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0, 0])
    assert abs(mean_action - 0.5) < 0.1
    _, log_std = agent.pi.forward(state.params, jnp.ones((1, 1)))[0]
    assert float(log_std[0, 0]) < -0.5  # the exploration noise shrank


def test_trpo_solves_discrete_probe(discrete_probe):
    agent, _, state, _, _, _ = discrete_probe
    assert int(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0]) == 1
    actions, _, _ = agent.policy(state.params, jnp.ones((256, 1)), jax.random.PRNGKey(1))
    assert float(jnp.mean(actions == 1)) > 0.95


# -- (d) invalid steps ------------------------------------------------------------------------
def _with_invalid_steps(ro, invalid, junk):
    """``ro`` with ``valid=False`` where ``invalid`` and, if ``junk``, NaN / nonsense there."""
    ro = ro._replace(valid=ro.valid & ~invalid)
    if not junk:
        return ro
    nan = lambda x: jnp.where(invalid.reshape(invalid.shape + (1,) * (x.ndim - 2)), jnp.nan, x)
    return ro._replace(obs=nan(ro.obs), action=nan(ro.action), log_prob=nan(ro.log_prob), value=nan(ro.value),
                       true_reward=nan(ro.true_reward), boundary=ro.boundary | invalid)


def test_invalid_steps_do_not_influence_the_update(continuous_probe, small_kl_agent):
    _, init_state, _, _, rollouts, _ = continuous_probe
    _, update = small_kl_agent
    ro = jax.tree.map(lambda x: x[0], rollouts)
    invalid = jnp.asarray(np.random.default_rng(0).random(ro.valid.shape) < 0.3)
    clean = _with_invalid_steps(ro, invalid, junk=False)
    dirty = _with_invalid_steps(ro, invalid, junk=True)
    key = jax.random.PRNGKey(3)
    s_clean, m_clean = update(init_state, clean, clean.true_reward, key)
    s_dirty, m_dirty = update(init_state, dirty, dirty.true_reward, key)
    for name in m_clean:
        np.testing.assert_allclose(np.asarray(m_clean[name]), np.asarray(m_dirty[name]), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s_clean.params, s_dirty.params)
    assert float(m_clean["step_accepted"]) == 1.0
    # the same change on a valid step does change the update
    t, n = np.argwhere(~np.asarray(invalid))[0]
    s_other, _ = update(init_state, clean, clean.true_reward.at[t, n].add(5.0), key)
    diff = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), s_clean.params, s_other.params))
    assert max(diff) > 1e-6


def test_all_invalid_rollout_leaves_the_agent_unchanged(continuous_probe, small_kl_agent):
    _, init_state, _, _, rollouts, _ = continuous_probe
    _, update = small_kl_agent
    ro = jax.tree.map(lambda x: x[0], rollouts)
    ro = _with_invalid_steps(ro, jnp.ones_like(ro.valid), junk=True)
    state, metrics = update(init_state, ro, ro.true_reward, jax.random.PRNGKey(0))
    assert float(metrics["step_accepted"]) == 0.0
    assert float(metrics["linesearch_backtracks"]) == TINY.backtrack_iters
    jax.tree.map(np.testing.assert_array_equal, state.params, init_state.params)


# -- (d') the value function's level -----------------------------------------------------------
def test_recentering_moves_only_the_heads_bias_to_the_valid_mean_residual(continuous_probe):
    agent, init_state, _, _, rollouts, _ = continuous_probe
    ro = jax.tree.map(lambda x: x[0], rollouts)
    obs = ro.obs.reshape(-1, *ro.obs.shape[2:])
    policy, value = split_params(init_state.params)
    before = agent.pi.forward(init_state.params, obs)[1]
    valid = jnp.asarray(np.random.default_rng(1).random(before.shape) < 0.7)
    target = jnp.where(valid, before + 40.0 + jnp.sin(jnp.arange(before.shape[0])), 1e6)  # junk where invalid
    moved = agent._recentered(value, policy, obs, target, valid)
    after = agent.pi.forward(merge_params(policy, moved), obs)[1]
    residual = np.asarray(target - after)[np.asarray(valid)]
    assert abs(residual.mean()) < 1e-3
    assert abs(float(jnp.mean(after - before)) - 40.0) < 0.5  # a constant shift, not the junk's pull
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), value, moved)
    assert changed["params"].pop("v_out")["bias"]
    assert not any(jax.tree.leaves(changed))


def test_recentering_lets_the_value_fit_follow_a_reward_level_shift(continuous_probe):
    """A reward whose level jumps (a refitted r̂ renormalized): Adam alone leaves the value far off,
    the recentred fit lands near the targets."""
    _, init_state, _, _, rollouts, _ = continuous_probe
    ro = jax.tree.map(lambda x: x[0], rollouts)
    rewards = ro.true_reward + 25.0
    losses = {}
    for recenter in (False, True):
        agent = TRPO(ProbeEnv(TINY.num_envs, True).spec, dataclasses.replace(TINY, vf_recenter=recenter))
        _, metrics = fast_jit(agent.update)(init_state, ro, rewards, jax.random.PRNGKey(0))
        losses[recenter] = float(metrics["value_loss"])
    assert losses[True] < 0.1 * losses[False], losses


# -- (e) defaults -----------------------------------------------------------------------------
def test_defaults_follow_christiano_a1():
    cfg = TRPOConfig()
    assert (cfg.gamma, cfg.gae_lambda, cfg.ent_coef) == (0.995, 0.97, 0.01)
    assert (cfg.max_kl, cfg.cg_iters, cfg.cg_damping) == (0.01, 10, 0.1)
    assert (cfg.backtrack_iters, cfg.backtrack_ratio) == (10, 0.5)
    assert cfg.batch_size == 8 * 1024
    assert not cfg.vf_recenter
    for name in ("Swimmer", "Swimmer-v4", "swimmer"):
        assert preset(name).ent_coef == 0.001
        assert preset(name) == dataclasses.replace(cfg, ent_coef=0.001, vf_recenter=True)
    for name in ("Hopper", "HalfCheetah-v4", "pendulum"):
        assert preset(name) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_kl = 0.1  # type: ignore[misc]
