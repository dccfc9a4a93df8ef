"""Fast tests of A2C (Christiano et al. 2017, appendix A.2): probe tasks, n-step returns, the
learning-rate schedule, invalid steps and the Atari network."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_jit
from probes import ProbeEnv, probe_training

from rlhp_jax.agents.a2c import A2C, A2CConfig, preset
from rlhp_jax.core import EnvSpec
from rlhp_jax.core import Rollout

# A tiny config: few envs, a small MLP, a large constant lr (the probe rewards have no future).
TINY = A2CConfig(num_envs=4, num_steps=8, gamma=0.5, lr=1e-2, lr_decay_steps=None, hidden_sizes=(16,))


def _train_on_probe(continuous: bool, num_updates: int, seed: int = 0, config: A2CConfig = TINY):
    """Train A2C on a probe task in one jitted scan. Returns (agent, state, rollouts, metrics)."""
    env = ProbeEnv(config.num_envs, continuous)
    agent = A2C(env.spec, config, num_updates)
    k_init, k_reset, k_loop = jax.random.split(jax.random.PRNGKey(seed), 3)

    train = probe_training(agent, env, num_updates, k_reset)
    state, _, rollouts, metrics = fast_jit(lambda k: train(agent._init(k_init), k))(k_loop)
    for name, m in metrics.items():
        assert np.all(np.isfinite(np.asarray(m))), name
    return agent, state, rollouts, metrics


def _rollout(T, N, obs, action, value, boundary, valid, last_value):
    """A hand-built Rollout (the fields A2C never reads are zeros)."""
    z = jnp.zeros((T, N))
    return Rollout(obs=obs, action=action, log_prob=z, value=value, boundary=boundary, true_reward=z,
                   terminated=jnp.zeros((T, N), bool), raw_reward=z, valid=valid,
                   render=jnp.zeros((T, N, 0)), last_obs=obs[-1], last_value=last_value)


# -- probe tasks A2C must solve -------------------------------------------------------------
def test_a2c_solves_discrete_probe():
    agent, state, rollouts, _ = _train_on_probe(continuous=False, num_updates=60)
    assert int(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0]) == 1
    assert float(jnp.mean(rollouts.true_reward[-10:])) > 0.9  # reward 1 <=> action 1
    assert float(jnp.mean(rollouts.true_reward[0])) < 0.7  # ... and it had to learn it


def test_a2c_solves_continuous_probe():
    agent, state, rollouts, metrics = _train_on_probe(continuous=True, num_updates=150)
    mean_action = float(agent.act_deterministic(state.params, jnp.ones((1, 1)))[0, 0])
    assert abs(mean_action - 0.5) < 0.1
    assert abs(float(jnp.mean(rollouts.raw_reward[-10:])) - 0.5) < 0.1  # the actions sent
    assert float(metrics["entropy"][-1]) < float(metrics["entropy"][0])  # exploration narrowed


# -- n-step returns -------------------------------------------------------------------------
def test_n_step_returns_match_hand_computation_and_cut_at_boundary():
    gamma = 0.9
    agent = A2C(ProbeEnv(1, continuous=False).spec, dataclasses.replace(TINY, gamma=gamma))
    rewards = jnp.array([[1.0], [2.0], [3.0]])
    ro = _rollout(3, 1, obs=jnp.ones((3, 1, 1)), action=jnp.zeros((3, 1), jnp.int32),
                  value=jnp.full((3, 1), 0.5), boundary=jnp.array([[False], [True], [False]]),
                  valid=jnp.ones((3, 1), bool), last_value=jnp.array([1.0]))
    adv, ret = agent.targets(ro, rewards)
    # t=2: 3 + 0.9 * last_value(1.0) = 3.9
    # t=1: the episode ends here: no bootstrap, R = 2
    # t=0: 1 + 0.9 * 2 = 2.8
    np.testing.assert_allclose(np.asarray(ret[:, 0]), [2.8, 2.0, 3.9], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(adv[:, 0]), [2.3, 1.5, 3.4], rtol=1e-6)


# -- invalid steps and the learning-rate schedule (one compiled update) ----------------------
@pytest.fixture(scope="module")
def small_update():
    """A tiny discrete agent whose lr reaches 0 after 3 updates, its jitted update and a rollout."""
    spec = ProbeEnv(1, continuous=False).spec
    cfg = dataclasses.replace(TINY, num_envs=2, num_steps=4, gamma=0.9, lr=1e-2, lr_decay_steps=3 * 8)
    agent = A2C(spec, cfg)
    state = agent.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    T, N = cfg.num_steps, cfg.num_envs
    valid = np.ones((T, N), bool)
    valid[1, 0] = valid[3, 1] = valid[0, 1] = False  # mid-rollout, last step, first step
    data = dict(obs=rng.normal(size=(T, N, 1)).astype(np.float32), action=rng.integers(0, 2, (T, N)).astype(np.int32),
                value=rng.normal(size=(T, N)).astype(np.float32), rewards=rng.normal(size=(T, N)).astype(np.float32))
    update = fast_jit(lambda s, d: agent.update(
        s, _rollout(T, N, d["obs"], d["action"], d["value"], jnp.zeros((T, N), bool), valid,
                    jnp.array([0.3, -0.2])), d["rewards"], jax.random.PRNGKey(1)))
    return agent, state, update, data, valid


def test_invalid_steps_do_not_change_the_update(small_update):
    agent, state, update, data, valid = small_update

    def garbage(seed):
        rng = np.random.default_rng(seed)
        d = {k: v.copy() for k, v in data.items()}
        bad = ~valid
        d["obs"][bad] = rng.normal(size=(bad.sum(), 1)) * 100.0
        d["action"][bad] = rng.integers(0, 2, bad.sum())
        d["value"][bad] = rng.normal(size=bad.sum()) * 1e3
        d["rewards"][bad] = rng.normal(size=bad.sum()) * 1e3
        return d

    s1, m1 = update(state, garbage(1))
    s2, m2 = update(state, garbage(2))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.params, s2.params)
    for k in m1:
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-7, err_msg=k)
    # ... while the same garbage on a valid step does change it
    d = garbage(1)
    d["rewards"][2, 0] = 1e3
    s3, _ = update(state, d)
    assert not np.allclose(np.asarray(s1.params["params"]["pi_0"]["kernel"]),
                           np.asarray(s3.params["params"]["pi_0"]["kernel"]))


def test_lr_schedule_decays_linearly_in_env_steps(small_update):
    # The A.2 defaults: 7e-4 at the start, half at 40M env steps, 0 at 80M and after,
    # whatever the run's own length (total_updates).
    spec = ProbeEnv(1, continuous=False).spec
    for total in (None, 10, 1_000_000):
        agent = A2C(spec, A2CConfig(), total_updates=total)
        per_update = agent.config.batch_size  # 16 envs x 5 steps = 80 env steps per update
        assert per_update == 80
        lr = lambda env_steps: float(agent.lr_schedule(env_steps // per_update))
        assert lr(0) == pytest.approx(7e-4, rel=1e-6)
        assert lr(40_000_000) == pytest.approx(3.5e-4, rel=1e-5)
        assert lr(80_000_000) == 0.0
        assert lr(160_000_000) == 0.0
    # The optimizer follows the schedule: metrics["lr"] is the lr of each update, and once it
    # reaches 0 (here after 3 updates of 8 env steps) the parameters stop moving.
    agent, state, update, data, _ = small_update
    lrs = []
    for i in range(4):
        new, metrics = update(state, data)
        lrs.append(float(metrics["lr"]))
        moved = not np.array_equal(np.asarray(new.params["params"]["pi_0"]["kernel"]),
                                   np.asarray(state.params["params"]["pi_0"]["kernel"]))
        assert moved == (i < 3), i
        assert int(new.step) == i + 1
        state = new
    np.testing.assert_allclose(lrs, [1e-2, 1e-2 * 2 / 3, 1e-2 / 3, 0.0], rtol=1e-5)


# -- the Atari configuration ----------------------------------------------------------------
def test_atari_defaults_and_one_update_with_nature_cnn():
    cfg = preset("Pong")
    assert cfg == A2CConfig()
    assert (cfg.num_envs, cfg.num_steps, cfg.gamma, cfg.ent_coef, cfg.lr, cfg.lr_decay_steps) == (
        16, 5, 0.99, 0.01, 7e-4, 80_000_000)
    assert (cfg.vf_coef, cfg.max_grad_norm, cfg.optimizer, cfg.rms_decay, cfg.eps) == (0.5, 0.5, "rmsprop", 0.99, 1e-5)
    spec = EnvSpec(name="Pong", obs_shape=(84, 84, 4), discrete=True, num_actions=6, action_low=None,
                   action_high=None, horizon=10_000, terminal_penalty=0.0, segment_length=25, reward_std=0.05)
    agent = A2C(spec, cfg, total_updates=100)
    assert agent.pi.network == "cnn"
    T, N = cfg.num_steps, cfg.num_envs
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (T, N, 84, 84, 4), dtype=np.uint8)
    ro = _rollout(T, N, obs=obs, action=rng.integers(0, 6, (T, N)).astype(np.int32),
                  value=jnp.asarray(rng.normal(size=(T, N)), jnp.float32), boundary=jnp.zeros((T, N), bool),
                  valid=jnp.ones((T, N), bool), last_value=jnp.zeros(N))
    rewards = jnp.asarray(rng.normal(size=(T, N)) * 0.05, jnp.float32)

    @fast_jit  # init and update in one program: one compile
    def init_and_update(key, ro, rewards):
        state = agent._init(key)
        return state, agent.update(state, ro, rewards, key)

    init_state, (state, metrics) = init_and_update(jax.random.PRNGKey(0), ro, rewards)
    p = state.params["params"]
    convs = sorted((k for k in p if k.startswith("Conv")), key=lambda k: int(k.split("_")[1]))
    assert [p[k]["kernel"].shape for k in convs] == [(8, 8, 4, 32), (4, 4, 32, 64), (3, 3, 64, 64)]
    dense = [p[k]["kernel"].shape for k in p if k.startswith("Dense")]
    assert dense == [(7 * 7 * 64, 512)]
    assert p["pi_out"]["kernel"].shape == (512, 6) and p["v_out"]["kernel"].shape == (512, 1)
    assert set(metrics) >= {"policy_loss", "value_loss", "entropy", "grad_norm", "lr", "explained_var"}
    for k, v in metrics.items():
        assert np.isfinite(float(v)), k
    assert float(metrics["lr"]) == pytest.approx(7e-4)
    assert float(metrics["entropy"]) == pytest.approx(np.log(6), rel=1e-2)  # near-uniform initial policy
    assert int(state.step) == 1
    assert not np.array_equal(np.asarray(p["Conv_0"]["kernel"]),
                              np.asarray(init_state.params["params"]["Conv_0"]["kernel"]))
