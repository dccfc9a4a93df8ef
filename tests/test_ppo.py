"""Fast tests of the rollout collector and PPO (probe tasks, GAE, shapes, action bounds)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax.agents.common import compute_gae, evaluate
from rlhp_jax.agents.ppo import PPO, PPOConfig
from probes import ProbeEnv, probe_training
from rlhp_jax.envs import make_env
from rlhp_jax.rollout import collect_rollout
from rlhp_jax.core import Rollout

# A tiny config: compiles and trains in a few seconds on a 2-core CPU.
TINY = PPOConfig(
    num_envs=4, num_steps=16, gamma=0.5, lr=3e-2, anneal_lr=False, update_epochs=4,
    num_minibatches=2, hidden_sizes=(16,),
)


def _train_on_probe(continuous: bool, num_updates: int, seed: int = 0, config: PPOConfig = TINY):
    """Train PPO on a probe task in one jitted scan. Returns (env, agent, init_state, state, rollouts)."""
    env = ProbeEnv(config.num_envs, continuous)
    agent = PPO(env.spec, config, num_updates)
    k_init, k_reset, k_loop = jax.random.split(jax.random.PRNGKey(seed), 3)
    init_state = agent.init(k_init)

    state, _, rollouts, metrics = jax.jit(probe_training(agent, env, num_updates, k_reset))(init_state, k_loop)
    assert np.all(np.isfinite(np.asarray(metrics["policy_loss"])))
    return env, agent, init_state, state, rollouts


@pytest.fixture(scope="module")
def discrete_probe():
    return _train_on_probe(continuous=False, num_updates=30)


@pytest.fixture(scope="module")
def continuous_probe():
    # lr 1e-2: at TINY's 3e-2 the Gaussian policy overshoots once its std has shrunk (the final
    # mean ranged 0.36-0.72 over seeds 0-2); at 1e-2 it lands at 0.497-0.499.
    return _train_on_probe(continuous=True, num_updates=60, config=dataclasses.replace(TINY, lr=1e-2))


# -- (a) probe tasks PPO must solve ---------------------------------------------------------
def test_ppo_solves_discrete_probe(discrete_probe):
    _, agent, _, state, _ = discrete_probe
    assert int(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0]) == 1
    actions, _, _ = agent.policy(state.params, jnp.ones((256, 1)), jax.random.PRNGKey(1))
    assert float(jnp.mean(actions == 1)) > 0.95


def test_ppo_solves_continuous_probe(continuous_probe):
    _, agent, _, state, _ = continuous_probe
    mean_action = float(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0, 0])
    assert abs(mean_action - 0.5) < 0.1
    # The exploration noise shrinks once the optimum is found.
    _, log_std = agent.pi.forward(state.params, jnp.ones((1, 1)))[0]
    assert float(log_std[0, 0]) < 0.0


# -- (b) GAE ------------------------------------------------------------------------------
def test_gae_matches_hand_computation_and_cuts_at_boundary():
    gamma, lam = 0.9, 0.8
    rewards = jnp.array([[1.0], [2.0], [3.0]])
    values = jnp.full((3, 1), 0.5)
    boundary = jnp.array([[False], [True], [False]])
    last_value = jnp.array([1.0])
    adv, targets = compute_gae(rewards, values, boundary, last_value, gamma, lam)
    # t=2: 3 + 0.9*1.0 - 0.5 = 3.4
    # t=1: boundary -> no bootstrap, no trace: 2 - 0.5 = 1.5
    # t=0: delta = 1 + 0.9*0.5 - 0.5 = 0.95; A = 0.95 + 0.9*0.8*1.5 = 2.03
    np.testing.assert_allclose(np.asarray(adv[:, 0]), [2.03, 1.5, 3.4], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(targets), np.asarray(adv + values), rtol=1e-6)


def test_gae_makes_invalid_steps_transparent():
    """An invalid step (envpool's deferred reset) is as if it were not there, whatever it holds."""
    gamma, lam = 0.9, 0.8
    rewards = jnp.array([[1.0], [2.0], [3.0]])
    values = jnp.array([[0.5], [0.25], [0.75]])
    boundary = jnp.zeros((3, 1), bool)
    last_value = jnp.array([1.0])
    ref_adv, ref_t = compute_gae(rewards, values, boundary, last_value, gamma, lam)
    # the same trajectory with a garbage invalid step inserted after step 0
    ins = lambda x, v: jnp.concatenate([x[:1], jnp.full((1, 1), v, x.dtype), x[1:]])
    valid = jnp.array([[True], [False], [True], [True]])
    adv, t = compute_gae(ins(rewards, jnp.nan), ins(values, jnp.nan), ins(boundary, True), last_value, gamma, lam, valid)
    np.testing.assert_allclose(np.asarray(adv)[[0, 2, 3]], np.asarray(ref_adv), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(t)[[0, 2, 3]], np.asarray(ref_t), rtol=1e-6)
    assert float(adv[1, 0]) == 0.0 and float(t[1, 0]) == 0.0


# -- (c) rollout shapes, dtypes and boundaries on the real tasks -----------------------------
@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])
def task_rollout(request):
    num_envs = 3
    env = make_env(request.param, num_envs)
    agent = PPO(env.spec, PPOConfig(hidden_sizes=(8,)))
    params = agent.init(jax.random.PRNGKey(0)).params
    state, obs = env.reset(jax.random.PRNGKey(1))
    num_steps = 2 * env.spec.horizon + 3
    _, next_obs, ro = collect_rollout(env, agent.policy, params, state, obs, jax.random.PRNGKey(2), num_steps)
    return env, agent, params, ro, next_obs, num_steps


def test_rollout_shapes_and_dtypes(task_rollout):
    env, _, _, ro, next_obs, T = task_rollout
    spec, N = env.spec, env.num_envs
    assert isinstance(ro, Rollout)
    assert ro.obs.shape == (T, N, *spec.obs_shape) and ro.obs.dtype == jnp.float32
    assert ro.action.shape == (T, N, *spec.action_shape)
    assert ro.action.dtype == (jnp.int32 if spec.discrete else jnp.float32)
    for name in ("log_prob", "value", "boundary", "true_reward", "terminated", "raw_reward", "valid"):
        assert getattr(ro, name).shape == (T, N), name
    assert ro.valid.all()  # gymnax resets in the same step: every step is a real transition
    assert ro.boundary.dtype == jnp.bool_ and ro.terminated.dtype == jnp.bool_
    assert ro.last_obs.shape == (N, *spec.obs_shape) and ro.last_value.shape == (N,)
    np.testing.assert_array_equal(np.asarray(ro.last_obs), np.asarray(next_obs))
    assert np.all(np.isfinite(np.asarray(ro.log_prob)))


def test_boundary_every_horizon_steps(task_rollout):
    env, _, _, ro, _, T = task_rollout
    h = env.spec.horizon
    expected = (np.arange(T) + 1) % h == 0
    np.testing.assert_array_equal(np.asarray(ro.boundary), np.repeat(expected[:, None], env.num_envs, 1))


def test_evaluate_on_unmodified_task(task_rollout):
    env, agent, params, _, _, _ = task_rollout
    ret = float(evaluate(env, agent, params, jax.random.PRNGKey(3), 4, env.spec.horizon))
    if env.spec.name == "CartPole-v1":
        assert 1.0 <= ret < 200.0  # an untrained policy drops the pole early; the episode ends there
    else:
        assert -2000.0 < ret < 0.0


# -- (d) continuous actions are clipped only when sent to the env ----------------------------
def test_invalid_steps_do_not_enter_the_ppo_loss():
    """What sits on a deferred-reset step (valid=False) cannot change the loss or its gradient."""
    agent = PPO(ProbeEnv(2, continuous=False).spec, TINY)
    params = agent.init(jax.random.PRNGKey(0)).params
    rng = np.random.default_rng(0)
    n = 16
    valid = rng.random(n) < 0.7
    batch = [rng.normal(size=(n, 1)).astype(np.float32), rng.integers(0, 2, n).astype(np.int32),
             rng.normal(size=n).astype(np.float32) - 1.0, rng.normal(size=n).astype(np.float32),
             rng.normal(size=n).astype(np.float32), valid]
    junk = [b.copy() for b in batch]
    junk[0][~valid] = 100.0
    junk[1][~valid] = 1 - junk[1][~valid]
    for i in (2, 3, 4):
        junk[i][~valid] = 1e3
    grad = jax.jit(jax.grad(lambda p, b: agent._loss(p, b)[0]))
    loss = jax.jit(lambda p, b: agent._loss(p, b)[0])
    np.testing.assert_allclose(loss(params, tuple(batch)), loss(params, tuple(junk)), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grad(params, tuple(batch)), grad(params, tuple(junk)))
    # and the same junk on a valid step does change it
    junk[3][valid.argmax()] = 1e3
    assert not np.isclose(loss(params, tuple(batch)), loss(params, tuple(junk)))


def test_continuous_actions_clipped_when_sent_to_env(continuous_probe):
    _, agent, init_state, _, rollouts = continuous_probe
    first = jax.tree.map(lambda x: x[0], rollouts)  # collected by the initial policy (std = 1)
    sent = np.asarray(first.raw_reward)  # the probe reports the action it received
    assert sent.min() >= -1.0 and sent.max() <= 1.0
    assert np.abs(np.asarray(first.action)).max() > 1.0  # the stored sample is unclipped ...
    dist, _ = agent.pi.forward(init_state.params, first.obs)
    np.testing.assert_allclose(  # ... and log_prob refers to it
        np.asarray(first.log_prob), np.asarray(agent.pi.log_prob(dist, first.action)), rtol=1e-5, atol=1e-5
    )
