"""Deep Q-learning from demonstrations (agents/dqfd.py): the loss terms against hand-computed
values, the target-network schedule, ε-greedy acting, and behaviour cloning of a scripted
Breakout-MinAtar demonstrator through the prioritized replay (pretraining on demos only).

Every jitted function is compiled once per configuration, at module level, and called with
fixed shapes (B = 8 transitions of n = 3 steps on a 3-dimensional toy observation).
"""

from __future__ import annotations

import dataclasses
import time

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_jit
from hypothesis import given

from experiments.minatar_demonstrator import minatar_tracker as tracker
from rlhp_jax.agents.dqfd import (
    DQfD,
    DQfDConfig,
    double_q_value,
    large_margin_loss,
    linear_epsilon,
    n_step_return,
)
from rlhp_jax.core import EnvSpec

GAMMA = 0.9
B, N, A = 8, 3, 3
SPEC = EnvSpec(name="toy", obs_shape=(3,), discrete=True, num_actions=A, action_low=None, action_high=None,
               horizon=100, terminal_penalty=0.0, segment_length=5, reward_std=1.0)
CFG = DQfDConfig(gamma=GAMMA, n_step=N, hidden_sizes=(16, 16), network="mlp", lr=1e-2,
                 target_update_steps=12, update_every=4)  # target copied every 3 learning steps

agent = DQfD(SPEC, CFG)
agent_imitation = DQfD(SPEC, dataclasses.replace(CFG, td_weight=0.0))
init = fast_jit(agent.init)
q_values = fast_jit(agent.q_values)
loss = fast_jit(agent.loss)
loss_imitation = fast_jit(agent_imitation.loss)
update = fast_jit(agent.update)
act = fast_jit(agent.act)
greedy = fast_jit(agent.greedy)
nstep = fast_jit(n_step_return)

NSTEP_B = 5  # batch of the n_step_return tests (hand and property: one compilation)


# ---------------------------------------------------------------------------- the math
def test_n_step_return_hand_values():
    rewards = np.tile(np.array([1.0, 2.0, 3.0], np.float32), (NSTEP_B, 1))
    cont = np.array([[1, 1, 1],  # no end: 1 + .9·2 + .81·3, bootstrap γ³
                     [0, 0, 0],  # the episode ends at k = 0: r0 only, no bootstrap
                     [0, 1, 1],  # same, whatever follows the end
                     [1, 0, 0],  # ends at k = 1: r0 + γ r1
                     [1, 1, 0]], np.float32)  # ends at k = 2: all three rewards, no bootstrap
    total, disc = nstep(rewards, cont, GAMMA)
    np.testing.assert_allclose(total, [5.23, 1.0, 1.0, 2.8, 5.23], rtol=1e-6)
    np.testing.assert_allclose(disc, [0.729, 0.0, 0.0, 0.0, 0.0], rtol=1e-6)
    # the 1-step return is the first reward and γ·cont_0
    t1, d1 = n_step_return(jnp.asarray(rewards[:, :1]), jnp.asarray(cont[:, :1]), GAMMA)
    np.testing.assert_allclose(t1, np.ones(NSTEP_B))
    np.testing.assert_allclose(d1, GAMMA * cont[:, 0], rtol=1e-6)


@given(hnp.arrays(np.float32, (NSTEP_B, N), elements=st.floats(-10, 10, width=32)),
       hnp.arrays(np.float32, (NSTEP_B, N), elements=st.sampled_from([0.0, 1.0])),
       st.floats(0.0, 1.0))
def test_n_step_return_matches_loop(rewards, cont, gamma):
    total, disc = nstep(rewards, cont, gamma)
    for b in range(NSTEP_B):
        ref, discount = 0.0, 1.0
        for k in range(N):
            ref += discount * float(rewards[b, k])
            if not cont[b, k]:
                discount = 0.0
                break
            discount *= gamma
        np.testing.assert_allclose(total[b], ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(disc[b], discount, rtol=1e-5, atol=1e-7)


def test_double_q_value_uses_online_argmax_and_target_value():
    q_online = jnp.array([[1.0, 3.0, 2.0], [5.0, 1.0, 1.0]])
    q_target = jnp.array([[10.0, 0.0, 5.0], [-1.0, 7.0, 8.0]])
    # online argmax: 1 and 0; the target's own max would be 10 and 8
    np.testing.assert_allclose(double_q_value(q_online, q_target), [0.0, -1.0])
    # leading axes broadcast
    np.testing.assert_allclose(double_q_value(q_online[None], q_target[None]), [[0.0, -1.0]])


def test_large_margin_loss_hand_values():
    q = jnp.array([[3.0, 1.0, 0.5],  # expert action best by more than the margin: 0
                   [1.0, 1.5, 0.0],  # another action better: max(1, 2.5, 1) − 1 = 1.5
                   [2.0, 1.5, 0.0],  # best, but within the margin: max(2, 2.5, 1) − 2 = 0.5
                   [0.0, 0.0, 0.0]])  # a tie: the margin itself
    expert = jnp.array([0, 0, 0, 2])
    np.testing.assert_allclose(large_margin_loss(q, expert, 1.0), [0.0, 1.5, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(large_margin_loss(q[:1], expert[:1], 2.5), [0.5], rtol=1e-6)


def test_linear_epsilon():
    for step, eps in ((0, 0.1), (50_000, 0.055), (100_000, 0.01), (200_000, 0.01)):
        np.testing.assert_allclose(linear_epsilon(step, 0.1, 0.01, 100_000), eps, rtol=1e-5)
        np.testing.assert_allclose(agent.epsilon(step), eps, rtol=1e-5)  # the config's defaults


def test_continuous_actions_are_refused():
    spec = dataclasses.replace(SPEC, discrete=False, num_actions=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    with pytest.raises(ValueError, match="discrete"):
        DQfD(spec, CFG)


# ---------------------------------------------------------------------------- the loss
def make_batch(seed: int):
    rng = np.random.default_rng(seed)
    batch = dict(obs=rng.normal(size=(B, N + 1, 3)).astype(np.float32),
                 action=rng.integers(0, A, (B, N + 1)).astype(np.int32),
                 cont=np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]] * 2, np.float32),
                 is_demo=np.array([True, False, True, True, False, False, True, False]),
                 weight=rng.uniform(0.2, 1.0, B).astype(np.float32))
    rewards = rng.normal(size=(B, N)).astype(np.float32)
    return batch, rewards


def huber(x):
    return np.where(np.abs(x) <= 1.0, 0.5 * x ** 2, np.abs(x) - 0.5)


def hand_loss_terms(params, target_params, batch, rewards):
    """The DQfD loss terms from ``q_values`` and plain NumPy."""
    q = np.asarray(q_values(params, batch["obs"]), np.float64)  # [B, n+1, A]
    qt = np.asarray(q_values(target_params, batch["obs"]), np.float64)
    rows = np.arange(B)
    a0, c, r = batch["action"][:, 0], batch["cont"], rewards.astype(np.float64)
    q0 = q[rows, 0, a0]
    y1 = r[:, 0] + GAMMA * c[:, 0] * qt[rows, 1, q[:, 1].argmax(-1)]
    ret = r[:, 0] + GAMMA * c[:, 0] * r[:, 1] + GAMMA ** 2 * c[:, 0] * c[:, 1] * r[:, 2]
    yn = ret + GAMMA ** 3 * c.prod(1) * qt[rows, N, q[:, N].argmax(-1)]
    td1, tdn = y1 - q0, yn - q0
    w = batch["weight"]
    margin = (q[:, 0] + 1.0 - np.eye(A)[a0]).max(-1) - q0
    demo = batch["is_demo"].astype(np.float64)
    l2 = sum(float(np.sum(np.square(p))) for p in jax.tree.leaves(params) if p.ndim > 1)
    return dict(td1=td1, j_dq=np.mean(w * huber(td1)), j_n=np.mean(w * huber(tdn)),
                j_e=np.sum(demo * margin) / demo.sum(), l2=l2, q=q, qt=qt)


@pytest.fixture(scope="module")
def two_nets():
    """Online and target parameters from different seeds (their greedy actions differ)."""
    return init(jax.random.key(1)).params, init(jax.random.key(2)).params


def test_loss_matches_hand_computation(two_nets):
    params, target = two_nets
    batch, rewards = make_batch(0)
    total, (metrics, td_abs) = loss(params, target, batch, rewards)
    h = hand_loss_terms(params, target, batch, rewards)
    # the 1-step TD error: r0 + γ·cont0·Q_target(o1, argmax_a Q_online(o1, a)) − Q(o0, a0)
    np.testing.assert_allclose(td_abs, np.abs(h["td1"]), rtol=1e-5, atol=1e-6)
    # it is double Q: valuing with the target's own max would give other errors here
    assert (h["q"][:, 1].argmax(-1) != h["qt"][:, 1].argmax(-1)).any()
    rows = np.arange(B)
    plain = rewards[:, 0] + GAMMA * batch["cont"][:, 0] * h["qt"][:, 1].max(-1) - h["q"][rows, 0, batch["action"][:, 0]]
    assert not np.allclose(np.abs(plain), td_abs, atol=1e-4)
    np.testing.assert_allclose(metrics["td_loss"], h["j_dq"], rtol=1e-5)
    np.testing.assert_allclose(metrics["n_step_loss"], h["j_n"], rtol=1e-5)
    np.testing.assert_allclose(metrics["margin_loss"], h["j_e"], rtol=1e-5)
    np.testing.assert_allclose(total, h["j_dq"] + h["j_n"] + h["j_e"] + 1e-5 * h["l2"], rtol=1e-5)
    np.testing.assert_allclose(metrics["demo_fraction"], 0.5)
    # margin_on = 0 drops the supervised term
    total_off, _ = loss(params, target, batch, rewards, 0.0)
    np.testing.assert_allclose(total_off, h["j_dq"] + h["j_n"] + 1e-5 * h["l2"], rtol=1e-5)


def test_margin_counts_on_demos_only(two_nets):
    params, target = two_nets
    batch, rewards = make_batch(1)
    _, (m, _) = loss(params, target, batch, rewards)
    # another expert action on an agent sample: the margin term does not move
    agent_rows = ~batch["is_demo"]
    changed = {**batch, "action": batch["action"].copy()}
    changed["action"][agent_rows, 0] = (changed["action"][agent_rows, 0] + 1) % A
    _, (m2, _) = loss(params, target, changed, rewards)
    np.testing.assert_allclose(m2["margin_loss"], m["margin_loss"], rtol=1e-6)
    assert not np.allclose(m2["td_loss"], m["td_loss"])
    # on a demo sample it does
    changed = {**batch, "action": batch["action"].copy()}
    changed["action"][0, 0] = (changed["action"][0, 0] + 1) % A
    _, (m3, _) = loss(params, target, changed, rewards)
    assert not np.allclose(m3["margin_loss"], m["margin_loss"])
    # no demo in the batch: no margin term at all
    _, (m4, _) = loss(params, target, {**batch, "is_demo": np.zeros(B, bool)}, rewards)
    assert float(m4["margin_loss"]) == 0.0


def test_td_weight_zero_leaves_margin_and_l2(two_nets):
    params, target = two_nets
    batch, rewards = make_batch(2)
    h = hand_loss_terms(params, target, batch, rewards)
    total, _ = loss_imitation(params, target, batch, rewards)
    np.testing.assert_allclose(total, h["j_e"] + 1e-5 * h["l2"], rtol=1e-5)
    total2, _ = loss_imitation(params, target, batch, rewards + 5.0)  # rewards no longer matter
    np.testing.assert_allclose(total2, total, rtol=1e-6)
    full, _ = loss(params, target, batch, rewards)
    full2, _ = loss(params, target, batch, rewards + 5.0)
    assert not np.allclose(full, full2)


# ---------------------------------------------------------------------------- learning and acting
def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_target_network_copied_every_target_period():
    assert CFG.target_period == 3
    state = init(jax.random.key(3))
    first_target = state.target_params
    history = []
    for i in range(7):
        batch, rewards = make_batch(10 + i)
        state, metrics, td_abs = update(state, batch, rewards)
        history.append(state)
        assert int(state.updates) == i + 1
        assert td_abs.shape == (B,) and np.isfinite(metrics["loss"])
    p = [s.params for s in history]
    t = [s.target_params for s in history]
    assert not _same(p[0], first_target)  # the online network learns
    assert _same(t[0], first_target) and _same(t[1], first_target)  # not copied before the 3rd update
    assert _same(t[2], p[2])  # copied exactly at update 3
    assert _same(t[3], p[2]) and _same(t[4], p[2]) and not _same(t[4], p[4])
    assert _same(t[5], p[5])  # and again at update 6
    assert _same(t[6], p[5]) and not _same(t[6], p[6])


def test_act_epsilon_greedy():
    params = init(jax.random.key(4)).params
    obs = jnp.asarray(np.random.default_rng(5).normal(size=(3000, 3)).astype(np.float32))
    g = np.asarray(greedy(params, obs))
    assert g.dtype == np.int32
    np.testing.assert_array_equal(g, np.asarray(q_values(params, obs)).argmax(-1))
    assert len(np.unique(g)) > 1  # the check below would be weak on a constant policy
    for k in range(3):
        np.testing.assert_array_equal(act(params, obs, jax.random.key(k), 0.0), g)
    a = np.asarray(act(params, obs, jax.random.key(6), 1.0))
    np.testing.assert_allclose(np.bincount(a, minlength=A) / a.size, 1 / 3, atol=0.04)
    np.testing.assert_allclose(np.mean(a != g), 2 / 3, atol=0.04)
    half = np.asarray(act(params, obs, jax.random.key(7), 0.5))
    np.testing.assert_allclose(np.mean(half != g), 1 / 3, atol=0.04)


# ---------------------------------------------------------------------------- behaviour cloning


def test_pretraining_on_demos_clones_the_demonstrator(tmp_path):
    from rlhp_jax.demos import read_demos, record_policy
    from rlhp_jax.envs import make_env
    from rlhp_jax.replay import PrioritizedReplay, ReplayConfig

    t0 = time.perf_counter()
    env = make_env("Breakout-MinAtar", 1)
    rec = record_policy(env, tracker, jax.random.key(0), episodes=3, max_steps=1500, source="tracker")
    demos = read_demos(rec.save(tmp_path / "tracker.npz"))
    assert demos.num_steps == 1500 and demos.obs(np.arange(1)).shape == (1, 10, 10, 4)
    states = demos.obs(np.arange(demos.num_steps))
    np.testing.assert_array_equal(tracker(states), demos.actions)  # the demos are the tracker's
    assert np.bincount(demos.actions, minlength=3).min() > 50  # every action is demonstrated
    t_record = time.perf_counter() - t0

    cfg = DQfDConfig(td_weight=0.0, lr=5e-4, hidden_sizes=(64, 64), network="mlp")
    bc = DQfD(env.spec, cfg)
    bc_update = fast_jit(bc.update)
    bc_greedy = fast_jit(bc.greedy)
    replay = PrioritizedReplay(ReplayConfig(capacity=8, n_step=cfg.n_step), env.spec.obs_shape, 1, np.float32,
                               demos=demos)
    state = fast_jit(bc.init)(jax.random.key(0))
    before = np.mean(np.asarray(bc_greedy(state.params, states)) == demos.actions)
    rng = np.random.default_rng(0)
    zeros = jnp.zeros((cfg.batch_size, cfg.n_step), jnp.float32)
    for _ in range(1500):
        batch = replay.sample(rng, cfg.batch_size, demo_only=True)
        idx = batch.pop("index")
        batch.pop("true_reward")
        assert batch["is_demo"].all()
        state, metrics, td_abs = bc_update(state, batch, zeros)
        replay.update_priorities(idx, np.asarray(td_abs))
    after = np.mean(np.asarray(bc_greedy(state.params, states)) == demos.actions)
    elapsed = time.perf_counter() - t0
    print(f"behaviour cloning: accuracy {before:.3f} -> {after:.3f}; recording {t_record:.1f} s, total {elapsed:.1f} s")
    assert before < 0.7  # an untrained network does not already agree
    assert after >= 0.9
    assert float(metrics["demo_action_accuracy"]) >= 0.9
