"""The reward-predictor ensemble (ensemble.py) trained on preferences.

All MLP tests share the shapes and the compiled functions of ``conftest.py``; ``N_FIT`` is the
one scan length used with ``ens3.fit``, so that scan compiles once.
"""

from __future__ import annotations

import dataclasses
import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MLP_SPEC, OBS_DIM, SEGMENT_LENGTH, Compiled, fast_jit, random_pairs
from hypothesis import assume, given

from rlhp_jax import labels as labels_lib
from rlhp_jax.ensemble import (INPUT_CLIP, INPUT_STD_FLOOR, NOISE_LEVELS, EnsembleConfig, RewardEnsemble, adaptive_l2,
                               gaussian_noise, resolve_member_axis, standardize)
from rlhp_jax.reward_models import RewardModelSpec, mirror_step
from rlhp_jax.tasks import Mirror

N_FIT = 500  # steps of every ens3.fit call
N_FIT_1 = 60  # steps of every ens1_noreg.fit call
L2_INIT = EnsembleConfig().l2_init
L2_RATE = EnsembleConfig().l2_rate
TOL = dict(rtol=1e-5, atol=1e-6)
# vmap and lax.map reduce in different orders; Adam's first steps are ≈ lr·sign(g), so a
# parameter whose gradient is ≈ 0 can move by a fraction of lr = 3e-4 either way.  Adam's
# moments (the gradients themselves) are compared tightly.
PARAM_TOL = dict(rtol=1e-4, atol=1.5e-4)
# A host loop over the compiled step and one scan are different programs, rounded differently at
# each of their steps, and the ±lr walk of near-zero gradients adds up over the steps: one weight
# of 64 was 2.3·lr apart after 60 steps with XLA:CPU's older emitters (conftest.FAST_COMPILE).  Ten
# steps' worth, as between batched and sharded programs (tests/test_compiled.py); the fit's metrics
# (losses and accuracies over its steps), which any change of keys, batches or steps would move,
# are compared tightly.
LOOP_PARAM_TOL = dict(rtol=1e-4, atol=10 * EnsembleConfig().learning_rate)


def tree_allclose(a, b, **kw):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **kw), a, b)


def without_output_bias(params):
    """The output layer's bias adds the same constant to every reward, which Bradley-Terry cannot
    see: its gradient is exactly 0, so Adam (≈ lr·sign(g) early on) moves it by ±lr on float
    rounding noise alone.  It is left out of comparisons between differently-ordered programs."""
    return {k: ({kk: vv for kk, vv in v.items() if not (k == "Dense_2" and kk == "bias")}
                if isinstance(v, dict) else v) for k, v in params.items()}


def member(tree, m):
    """Member m of a [M, ...] pytree, kept as a 1-member [1, ...] pytree."""
    return jax.tree.map(lambda x: np.asarray(x)[m:m + 1], tree)  # NumPy: no eager XLA ops


def member_state(state, m):
    """Member m of an ensemble state, as the state of a 1-member ensemble."""
    return state.replace(
        params=member(state.params, m), batch_stats=member(state.batch_stats, m),
        opt_state=member(state.opt_state, m), l2=member(state.l2, m),
        train_loss_avg=member(state.train_loss_avg, m), val_loss_avg=member(state.val_loss_avg, m),
        norm_mean=member(state.norm_mean, m), norm_std=member(state.norm_std, m))


def member_buffer(buffer, m):
    """The label buffer as member m alone sees it (its held-out flags and bootstrap counts)."""
    return buffer.replace(heldout=member(buffer.heldout, m), boot=member(buffer.boot, m))


def flat_rows(pairs):
    p, _, t = pairs.obs.shape[:3]
    return pairs.obs.reshape(p * 2 * t, OBS_DIM), pairs.action.reshape(p * 2 * t)


def max_abs_change(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def state3(ens3):
    return ens3.init(jax.random.key(0))


@pytest.fixture(scope="module")
def fitted3(ens3, state3, learning_buffer):
    return ens3.fit(state3, learning_buffer, jax.random.key(1), N_FIT)


# ------------------------------------------------------------------ (1) one step, three ways
@pytest.mark.parametrize("other", ["vmap", "unroll"])
def test_vmap_and_unroll_equal_sequential(request, other, ens3, state3, learning_buffer):
    ens_other = request.getfixturevalue(f"ens3_{other}")
    assert ens3.ens.mode == "map" and ens_other.ens.mode == other
    s_map, s_vmap = state3, state3
    for i in range(3):
        key = jax.random.key(10 + i)
        s_map, m_map = ens3.train_step(s_map, learning_buffer, key)
        s_vmap, m_vmap = ens_other.train_step(s_vmap, learning_buffer, key)
        tree_allclose(m_map, m_vmap, **TOL)
    tree_allclose(without_output_bias(s_map.params), without_output_bias(s_vmap.params), **PARAM_TOL)
    tree_allclose(s_map.opt_state, s_vmap.opt_state, **TOL)  # moments: the gradients themselves
    for f in ("l2", "train_loss_avg", "val_loss_avg"):
        np.testing.assert_allclose(getattr(s_map, f), getattr(s_vmap, f), rtol=1e-5)
    assert int(s_map.steps) == int(s_vmap.steps) == 3
    # the steps did something, and the members are different networks
    assert max_abs_change(s_map.params, state3.params) > 1e-4
    k = np.asarray(s_map.params["Dense_0"]["kernel"])
    assert not np.allclose(k[0], k[1])


def test_reused_training_forward_equals_a_separate_forward(ens3, state3, learning_buffer):
    """An MLP with no input noise reuses the gradient's forward pass for the training loss; the
    step must equal the one that measures it with its own inference-mode forward pass."""
    assert ens3.ens.train_mode_is_inference
    separate = RewardEnsemble(MLP_SPEC, ens3.ens.config)
    separate.train_mode_is_inference = False
    step = fast_jit(separate.train_step)
    s_a, s_b = state3, state3
    for i in range(2):
        key = jax.random.key(30 + i)
        s_a, m_a = ens3.train_step(s_a, learning_buffer, key)
        s_b, m_b = step(s_b, learning_buffer, key)
        tree_allclose(m_a, m_b, **TOL)
    for f in ("l2", "train_loss_avg", "val_loss_avg"):
        np.testing.assert_allclose(getattr(s_a, f), getattr(s_b, f), rtol=1e-6)
    tree_allclose(s_a.params, s_b.params, rtol=0, atol=1e-7)
    noisy = RewardEnsemble(MLP_SPEC, dataclasses.replace(ens3.ens.config, input_noise=0.1))
    assert not noisy.train_mode_is_inference  # noise: training mode is not inference mode


def one_label_per_member(buffer, members):
    """Member m trains on label m only and validates on label 10 + m only, so its minibatches are
    the same whatever the key: the ensemble and the member trained alone see the same data."""
    boot = np.zeros((members, buffer.capacity), np.float32)
    held = np.zeros((members, buffer.capacity), bool)
    for m in range(members):
        boot[m, m] = 1.0 + m  # any positive count
        held[m, 10 + m] = True
    return buffer.replace(boot=boot, heldout=held)


def test_each_member_trains_as_if_alone(ens3, ens1, state3, learning_buffer):
    buf3 = one_label_per_member(learning_buffer, 3)
    s3 = state3
    for i in range(4):
        s3, _ = ens3.train_step(s3, buf3, jax.random.key(20 + i))
    for m in range(3):
        alone = member_state(state3, m)
        for i in range(4):  # different keys from the ensemble's: the data does not depend on them
            alone, _ = ens1.train_step(alone, member_buffer(buf3, m), jax.random.key(100 * m + i))
        tree_allclose(without_output_bias(member(s3.params, m)), without_output_bias(alone.params), **PARAM_TOL)
        tree_allclose(member(s3.opt_state, m), alone.opt_state, **TOL)
        np.testing.assert_allclose(s3.l2[m:m + 1], alone.l2, rtol=1e-6)
        np.testing.assert_allclose(s3.train_loss_avg[m:m + 1], alone.train_loss_avg, rtol=1e-5)
        np.testing.assert_allclose(s3.val_loss_avg[m:m + 1], alone.val_loss_avg, rtol=1e-5)
    # the comparison has teeth: member 0 trained on member 1's labels ends up elsewhere
    wrong = member_state(state3, 0)
    for i in range(4):
        wrong, _ = ens1.train_step(wrong, member_buffer(buf3, 1), jax.random.key(i))
    assert max_abs_change(wrong.params, member(s3.params, 0)) > 1e-4


def test_member_without_training_labels_does_not_move(ens3, state3, learning_buffer):
    buf = one_label_per_member(learning_buffer, 3)
    boot = np.array(buf.boot)
    boot[1] = 0.0
    buf = buf.replace(boot=boot)
    s, metrics = ens3.train_step(state3, buf, jax.random.key(5))
    tree_allclose(member(s.params, 1), member(state3.params, 1), rtol=0, atol=0)
    np.testing.assert_array_equal(s.l2[1], state3.l2[1])
    assert max_abs_change(member(s.params, 0), member(state3.params, 0)) > 0


# ------------------------------------------------------------------ (2) it learns
def test_learns_to_rank_heldout_pairs(ens3, fitted3, learning_buffer):
    state, metrics = fitted3
    test = random_pairs(999, 200)  # pairs no member has seen
    obs, act = flat_rows(test)
    r = ens3.predict_reward(state, obs, act).reshape(200, 2, SEGMENT_LENGTH)
    pred_ret = np.asarray(r.sum(-1))
    true_ret = np.asarray(test.true_reward.sum(-1))
    acc = np.mean((pred_ret[:, 0] > pred_ret[:, 1]) == (true_ret[:, 0] > true_ret[:, 1]))
    assert acc > 0.9, acc
    # the per-step rewards match the truth up to scale and offset
    corr = np.corrcoef(np.asarray(r).ravel(), np.asarray(test.true_reward).ravel())[0, 1]
    assert corr > 0.9, corr
    # training loss fell well below log 2 ≈ 0.69 (an untrained, indifferent model)
    assert np.all(np.asarray(metrics["train_loss"]) < 0.5), metrics
    # each member also ranks its own held-out labels
    ev = ens3.evaluate(state, learning_buffer)
    assert np.all(np.asarray(ev["val_accuracy"]) > 0.85), ev
    assert np.all(np.asarray(ev["train_accuracy"]) > 0.9), ev


def test_target_loss_regresses_clip_returns(learning_buffer):
    """The "target" ablation (Christiano §3.3) fits summed predictions to the true clip returns."""
    target = Compiled(MLP_SPEC, EnsembleConfig(num_members=3, loss="target", adaptive_l2=False, member_axis="map"))
    state = target.init(jax.random.key(0))
    test = random_pairs(999, 200)
    obs, act = flat_rows(test)
    mse = lambda st: float(np.mean((np.asarray(target.member_rewards(st, obs, act)[0]).reshape(200, 2, -1).sum(-1)
                                    - np.asarray(test.true_reward).sum(-1)) ** 2))
    before = mse(state)
    state, metrics = target.fit(state, learning_buffer, jax.random.key(1), 300)
    assert mse(state) < 0.1 * before, (before, mse(state))
    with pytest.raises(ValueError, match="loss must be"):
        EnsembleConfig(loss="squared")


# ------------------------------------------------------------------ (3) adaptive L2
@given(st.floats(1e-6, 1.0), st.floats(0.05, 5.0), st.floats(0.2, 3.0))
def test_adaptive_l2_rule(l2, train, ratio):
    assume(abs(ratio - 1.5) > 1e-3 and abs(ratio - 1.1) > 1e-3)
    new = float(adaptive_l2(jnp.float32(l2), jnp.float32(train), jnp.float32(ratio * train)))
    if ratio > 1.5:
        expected = l2 * (1 + L2_RATE)  # validation much worse than training: regularize more
    elif ratio < 1.1:
        expected = l2 / (1 + L2_RATE)  # no sign of overfitting: regularize less
    else:
        expected = l2
    np.testing.assert_allclose(new, expected, rtol=1e-6)


def test_adaptive_l2_rule_custom_bounds_elementwise():
    l2 = jnp.array([1.0, 1.0, 1.0])
    out = adaptive_l2(l2, jnp.array([1.0, 1.0, 1.0]), jnp.array([2.5, 1.5, 0.5]), rate=0.5, low=1.0, high=2.0)
    np.testing.assert_allclose(out, [1.5, 1.0, 1 / 1.5], rtol=1e-6)


def conflicting_buffer(buffer, *, overfit):
    """A buffer whose validation set the training set cannot help with, from the learning pairs.

    overfit=True: validation = the training pairs with the opposite labels, so fitting the
    training labels makes the validation loss grow (val ≫ 1.5 × train → L2 must go up).
    overfit=False: training labels contradict each other (each pair labeled both ways, loss
    stays ≈ log 2), validation pairs are a clip against itself labeled a tie (loss exactly
    log 2 whatever the model): val ≈ train < 1.1 × train → L2 must go down every step.
    """
    c, half = buffer.capacity, buffer.capacity // 2
    obs, act, mu = np.array(buffer.obs), np.array(buffer.action), np.array(buffer.mu)
    if overfit:
        obs[half:], act[half:] = obs[:half], act[:half]
        mu[half:] = 1.0 - mu[:half]
    else:
        q = half // 2
        obs[q:half], act[q:half] = obs[:q], act[:q]
        mu[:q], mu[q:half] = 1.0, 0.0
        obs[half:, 1], act[half:, 1] = obs[half:, 0], act[half:, 0]
        mu[half:] = 0.5
    m = buffer.num_members
    held = np.zeros((m, c), bool)
    held[:, half:] = True
    return buffer.replace(obs=obs, action=act, mu=mu, heldout=held, boot=np.ones((m, c), np.float32))


def test_adaptive_l2_grows_when_overfitting(ens3, state3, learning_buffer):
    state, metrics = ens3.fit(state3, conflicting_buffer(learning_buffer, overfit=True), jax.random.key(2), N_FIT)
    val, train = np.asarray(state.val_loss_avg), np.asarray(state.train_loss_avg)
    assert np.all(val > 1.5 * train), (val, train)  # the setup does overfit
    l2 = np.asarray(state.l2)
    assert np.all(l2 > L2_INIT * 1.1), l2
    assert np.all(l2 <= L2_INIT * (1 + L2_RATE) ** N_FIT * (1 + 1e-4))


def test_adaptive_l2_shrinks_without_overfitting(ens3, state3, learning_buffer):
    state, _ = ens3.fit(state3, conflicting_buffer(learning_buffer, overfit=False), jax.random.key(3), N_FIT)
    np.testing.assert_allclose(state.val_loss_avg, math.log(2), rtol=1e-4)
    # (nearly) every step went down: never below N_FIT steps down, at most 2 % of steps not
    l2 = np.asarray(state.l2)
    assert np.all(l2 >= L2_INIT / (1 + L2_RATE) ** N_FIT * (1 - 1e-4)), l2
    assert np.all(l2 <= L2_INIT / (1 + L2_RATE) ** (0.96 * N_FIT)), l2


def test_l2_coefficient_shrinks_the_weights(ens3, state3, learning_buffer):
    """The coefficient in the state is what the loss uses: a large one shrinks every kernel."""
    def kernel_norm(params, m):
        return sum(float(np.sum(np.square(np.asarray(p)[m]))) for p in jax.tree.leaves(params) if p.ndim > 2)

    strong = state3.replace(l2=np.array([0.0, 10.0, 0.0], np.float32))
    s, _ = ens3.train_step(strong, learning_buffer, jax.random.key(8))
    plain, _ = ens3.train_step(state3.replace(l2=np.zeros(3, np.float32)), learning_buffer, jax.random.key(8))
    assert kernel_norm(s.params, 1) < kernel_norm(state3.params, 1) - 1e-3
    assert kernel_norm(s.params, 1) < kernel_norm(plain.params, 1) - 1e-3
    # members with the same (zero) coefficient are unaffected by member 1's
    tree_allclose(member(s.params, 0), member(plain.params, 0), rtol=1e-6, atol=1e-7)


def test_no_adaptive_l2_stays_zero(ens1_noreg, fitted1_noreg, state3, learning_buffer):
    assert float(ens1_noreg.init(jax.random.key(0)).l2[0]) == 0.0
    state, _ = fitted1_noreg
    np.testing.assert_array_equal(state.l2, 0.0)
    # the rule is really off (0 · factor would hide it): a nonzero coefficient is left alone,
    # on the overfitting set-up where the adaptive ensemble raises it
    start = member_state(state3, 0)
    assert start.l2[0] == np.float32(L2_INIT)
    buf = member_buffer(conflicting_buffer(learning_buffer, overfit=True), 0)
    state, _ = ens1_noreg.fit(start, buf, jax.random.key(6), N_FIT_1)
    np.testing.assert_array_equal(state.l2, np.float32(L2_INIT))


# ------------------------------------------------------------------ (4) normalization
@pytest.fixture(scope="module")
def buffer1(learning_buffer):
    return member_buffer(learning_buffer, 0)


@pytest.fixture(scope="module")
def fitted1_noreg(ens1_noreg, buffer1):
    state = ens1_noreg.init(jax.random.key(4))
    return ens1_noreg.fit(state, buffer1, jax.random.key(5), N_FIT_1)


def test_host_fit_loop_equals_scan(ens1_noreg, fitted1_noreg, buffer1):
    """The host loop over the compiled step (the CNN's CPU default) gives the scan's results."""
    host = RewardEnsemble(MLP_SPEC, dataclasses.replace(ens1_noreg.ens.config, fit_loop="host"))
    state = ens1_noreg.init(jax.random.key(4))
    s_host, m_host = host.fitter(jit=fast_jit)(state, buffer1, jax.random.key(5), N_FIT_1)
    s_scan, m_scan = fitted1_noreg
    tree_allclose(m_host, m_scan, rtol=1e-4, atol=1e-5)
    tree_allclose(without_output_bias(s_host.params), without_output_bias(s_scan.params), **LOOP_PARAM_TOL)
    # the mean of r̂ carries the output bias, the walk of a gradient that is float noise alone
    np.testing.assert_allclose(s_host.norm_mean, s_scan.norm_mean, **LOOP_PARAM_TOL)
    np.testing.assert_allclose(s_host.norm_std, s_scan.norm_std, rtol=1e-4)
    assert int(s_host.steps) == N_FIT_1



def test_a_fit_in_blocks_equals_one_scan(ens1_noreg, fitted1_noreg, buffer1):
    """The driver's pretraining runs as blocks of an iteration's fit (one compiled program for both
    counts): the same keys in blocks give the scan's steps."""
    block = N_FIT_1 // 4
    assert N_FIT_1 % block == 0 and N_FIT_1 > block  # the blocked path, not the fallback
    state = ens1_noreg.init(jax.random.key(4))
    s_blk, m_blk = ens1_noreg.ens.fitter(jit=fast_jit, block=block)(state, buffer1, jax.random.key(5), N_FIT_1)
    s_scan, m_scan = fitted1_noreg
    tree_allclose(without_output_bias(s_blk.params), without_output_bias(s_scan.params), **PARAM_TOL)
    np.testing.assert_allclose(s_blk.l2, s_scan.l2, rtol=1e-5)
    np.testing.assert_allclose(s_blk.norm_std, s_scan.norm_std, rtol=1e-4)
    np.testing.assert_allclose(m_blk["train_loss"], m_scan["train_loss"], rtol=1e-4)
    tree_allclose(m_blk["evaluation"], m_scan["evaluation"], rtol=1e-4, atol=1e-5)  # the last block's
    assert int(s_blk.steps) == N_FIT_1


def test_a_fit_of_no_steps_only_normalizes(ens1_noreg, buffer1):
    """No pretraining (A.1) still standardizes the inputs and normalizes r̂ over the initial labels:
    a 0-step fit, scan or host loop."""
    host = RewardEnsemble(MLP_SPEC, dataclasses.replace(ens1_noreg.ens.config, fit_loop="host"))
    state = ens1_noreg.init(jax.random.key(4))
    want = ens1_noreg.update_normalization(ens1_noreg.update_input_statistics(state, buffer1), buffer1)
    assert float(want.norm_std[0]) != 1.0 and not np.allclose(want.input_std, 1.0)
    for fit in (ens1_noreg.fit, host.fitter(jit=fast_jit)):
        got, metrics = fit(state, buffer1, jax.random.key(5), 0)
        tree_allclose(got.params, state.params, rtol=0, atol=0)
        np.testing.assert_allclose(got.input_mean, want.input_mean, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got.input_std, want.input_std, rtol=1e-6)
        np.testing.assert_allclose(got.norm_mean, want.norm_mean, rtol=1e-6)
        np.testing.assert_allclose(got.norm_std, want.norm_std, rtol=1e-6)
        assert int(got.steps) == 0 and np.isnan(np.asarray(metrics["train_loss"])).all()

def test_a_fit_validates_from_the_scores_it_normalizes_with(ens1_noreg, fitted1_noreg, buffer1):
    """A fit ends by scoring the label set for r̂'s normalization; its metrics carry the fitted
    model's ``evaluate`` from those scores, so the driver and Ibarz's protocol validate without a
    second pass over the set.  ``label_loss`` is the BT loss over every filled label."""
    state, metrics = fitted1_noreg
    want = ens1_noreg.evaluate(state, buffer1)
    assert set(metrics["evaluation"]) == set(want) >= {"val_accuracy", "val_loss", "label_loss"}
    tree_allclose(metrics["evaluation"], want, rtol=1e-6, atol=1e-7)
    n = buffer1.capacity * 2 * SEGMENT_LENGTH
    raw = np.asarray(ens1_noreg.member_rewards(state, buffer1.obs.reshape(n, OBS_DIM), buffer1.action.reshape(n)))
    ret = raw[0].reshape(buffer1.capacity, 2, SEGMENT_LENGTH).sum(-1)
    p1 = 0.9 / (1 + np.exp(ret[:, 1] - ret[:, 0])) + 0.05  # the 10 % random-response model
    mu = np.asarray(buffer1.mu)
    loss = -np.mean(mu * np.log(p1) + (1 - mu) * np.log(1 - p1))
    np.testing.assert_allclose(metrics["evaluation"]["label_loss"][0], loss, rtol=1e-4)


def test_normalized_reward_has_zero_mean_and_configured_std(ens1_noreg, fitted1_noreg, buffer1):
    state, _ = fitted1_noreg
    n = buffer1.capacity * 2 * SEGMENT_LENGTH
    r = np.asarray(ens1_noreg.predict_reward(state, buffer1.obs.reshape(n, OBS_DIM), buffer1.action.reshape(n)))
    assert abs(r.mean()) < 1e-3
    np.testing.assert_allclose(r.std(), 2.0, rtol=1e-3)  # reward_std = 2 in this config
    # the normalization is an affine map of the raw member output
    raw = np.asarray(ens1_noreg.member_rewards(
        state, buffer1.obs.reshape(n, OBS_DIM), buffer1.action.reshape(n)))[0]
    np.testing.assert_allclose(float(state.norm_mean[0]), raw.mean(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(float(state.norm_std[0]), raw.std(), rtol=1e-3)


def test_normalization_ignores_empty_slots(ens1_noreg, fitted1_noreg, buffer1):
    state, _ = fitted1_noreg
    # half the slots empty, filled with garbage that must not count
    obs, act = np.array(buffer1.obs), np.asarray(buffer1.action)
    half = np.arange(buffer1.capacity) < 128
    junk_obs = obs.copy()
    junk_obs[128:] = 1e3
    update = ens1_noreg.update_normalization
    s = update(state, buffer1.replace(filled=half, obs=junk_obs))
    clean = update(state, buffer1.replace(filled=np.ones_like(half), obs=obs[:128].repeat(2, 0),
                                          action=act[:128].repeat(2, 0)))
    np.testing.assert_allclose(s.norm_mean, clean.norm_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s.norm_std, clean.norm_std, rtol=1e-4)


def test_the_label_set_is_scored_up_to_its_last_filled_slot(ens1_noreg, fitted1_noreg, buffer1):
    """The whole-buffer pass (normalization, validation) scores each member in chunks, up to the
    chunk that holds the last filled slot, and leaves the rows after it 0; when every chunk is
    needed, the last one ends at the buffer's end (overlapping the one before)."""
    state, _ = fitted1_noreg
    chunked = RewardEnsemble(MLP_SPEC, dataclasses.replace(ens1_noreg.ens.config, chunk_size=96))
    score = fast_jit(chunked.buffer_member_rewards)
    n = buffer1.capacity * 2 * SEGMENT_LENGTH  # 2,560 rows: 26 chunks of 96 and an overlapping 27th
    want = np.asarray(ens1_noreg.member_rewards(state, buffer1.obs.reshape(n, OBS_DIM), buffer1.action.reshape(n)))[0]
    assert np.all(want != 0.0)
    full = np.asarray(score(state, buffer1)).reshape(n)
    np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-6)
    filled = np.zeros(buffer1.capacity, bool)
    filled[:37] = filled[50] = True  # slots 0-50 are rows 0-509: the first six chunks (576 rows)
    got = np.asarray(score(state, buffer1.replace(filled=filled))).reshape(n)
    np.testing.assert_allclose(got[:576], want[:576], rtol=1e-5, atol=1e-6)
    assert np.all(got[576:] == 0.0)
    assert np.all(np.asarray(score(state, buffer1.replace(filled=np.zeros_like(filled)))) == 0.0)


def test_input_statistics_are_the_labeled_clips_feature_moments(ens1_noreg, buffer1):
    """Each feature's mean and std over every step of every filled clip; empty slots do not count;
    a feature constant over the clips gets the floor, not a zero std."""
    obs = np.array(buffer1.obs)
    obs[..., 1] = 3.0  # constant feature
    half = np.arange(buffer1.capacity) < 128
    junk = obs.copy()
    junk[128:] = 1e3
    state = ens1_noreg.init(jax.random.key(0))
    got = ens1_noreg.update_input_statistics(state, buffer1.replace(filled=half, obs=junk))
    rows = obs[:128].reshape(-1, OBS_DIM)
    np.testing.assert_allclose(got.input_mean, rows.mean(0), rtol=1e-5, atol=1e-6)
    want_std = np.maximum(rows.std(0), INPUT_STD_FLOOR)
    np.testing.assert_allclose(got.input_std, want_std, rtol=1e-4)
    assert float(got.input_std[1]) == pytest.approx(INPUT_STD_FLOOR)
    # no labels yet: the identity stays
    empty = ens1_noreg.update_input_statistics(state, buffer1.replace(filled=np.zeros_like(half)))
    np.testing.assert_array_equal(empty.input_mean, 0.0)
    np.testing.assert_array_equal(empty.input_std, 1.0)


@given(st.floats(-50, 50), st.floats(0.02, 40))
def test_standardize_centres_and_scales_each_feature(shift, scale):
    x = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32) * np.float32([scale, 1, 0.05]) + shift
    mean, std = x.mean(0), x.std(0)
    z = np.asarray(standardize(jnp.asarray(x), jnp.asarray(mean), jnp.asarray(std)))
    assert np.abs(z).max() <= INPUT_CLIP
    np.testing.assert_allclose(np.clip(z, -INPUT_CLIP, INPUT_CLIP), z)
    unclipped = np.abs((x - mean) / std).max(0) < INPUT_CLIP
    np.testing.assert_allclose(z.mean(0)[unclipped], 0.0, atol=1e-3)
    np.testing.assert_allclose(z.std(0)[unclipped], 1.0, rtol=1e-3)
    # off (scalar statistics): the observations pass through unchanged
    np.testing.assert_array_equal(standardize(x, jnp.zeros(()), jnp.ones(())), x)


def test_standardized_reward_ignores_the_units_of_a_feature(ens1_noreg, fitted1_noreg, buffer1):
    """r̂ after a fit is a function of the standardized observation: multiplying one feature by
    1000 (and its statistics with it) leaves every prediction as it was."""
    state, _ = fitted1_noreg
    n = buffer1.capacity * 2 * SEGMENT_LENGTH
    obs, act = np.asarray(buffer1.obs).reshape(n, OBS_DIM), np.asarray(buffer1.action).reshape(n)
    assert not np.allclose(state.input_std, 1.0)
    unit = np.ones(OBS_DIM, np.float32)
    unit[0] = 1000.0
    rescaled = state.replace(input_mean=state.input_mean * unit, input_std=state.input_std * unit)
    np.testing.assert_allclose(ens1_noreg.predict_reward(rescaled, obs * unit, act),
                               ens1_noreg.predict_reward(state, obs, act), rtol=1e-4, atol=1e-4)


MIRROR = Mirror(obs_sign=(-1.0, 1.0, -1.0), obs_index=(2, 1, 0), action_index=(1, 0))  # a swap and a sign


@pytest.mark.parametrize("mirrored", [True, False])
def test_a_mirrored_reward_pays_a_step_and_its_mirror_image_alike(mirrored, buffer1):
    """``EnsembleConfig.mirror``: after a fit, r̂ of any step (inside the labeled clips' range or
    far outside it) equals r̂ of its mirror image, and the input statistics are those of the clips
    and their images.  Without it the same fit is not symmetric (the test can fail)."""
    ens = RewardEnsemble(dataclasses.replace(MLP_SPEC, mirror=MIRROR), EnsembleConfig(num_members=1, mirror=mirrored))
    state, _ = fast_jit(ens.fit, static_argnums=3)(ens.init(jax.random.key(8)), buffer1, jax.random.key(9), 30)
    rng = np.random.default_rng(3)
    obs = (rng.normal(size=(64, OBS_DIM)) * np.float32([1, 1, 30])).astype(np.float32)
    act = rng.integers(0, 2, 64).astype(np.int32)
    reward = np.asarray(ens.predict_reward(state, obs, act))
    image = np.asarray(ens.predict_reward(state, *mirror_step(MIRROR, jnp.asarray(obs), jnp.asarray(act))))
    rows = np.asarray(buffer1.obs)[np.asarray(buffer1.filled)].reshape(-1, OBS_DIM)
    if not mirrored:
        assert np.abs(reward - image).max() > 0.05
        np.testing.assert_allclose(state.input_mean, rows.mean(0), rtol=1e-4, atol=1e-5)
        return
    np.testing.assert_allclose(reward, image, rtol=1e-5, atol=1e-5)
    both = np.concatenate([rows, rows[:, [2, 1, 0]] * np.float32([-1, 1, -1])])
    np.testing.assert_allclose(state.input_mean, both.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.input_std, both.std(0), rtol=1e-4)


def test_a_mirror_needs_a_task_that_declares_one():
    with pytest.raises(ValueError, match="declared reflection"):
        RewardEnsemble(MLP_SPEC, EnsembleConfig(mirror=True))


def test_images_and_grids_are_not_standardized():
    """The CNN's frames are scaled to [0, 1] (and batch-normed); MinAtar's 0/1 grids go to the MLP as they are."""
    for kind, shape in (("cnn", (84, 84, 4)), ("mlp", (10, 10, 4))):
        spec = RewardModelSpec(kind, shape, (), "int32", 3, True)
        assert not RewardEnsemble(spec).standardizes
    assert RewardEnsemble(MLP_SPEC).standardizes
    assert not RewardEnsemble(MLP_SPEC, EnsembleConfig(standardize_inputs=False)).standardizes


# ------------------------------------------------------------------ (5) the CNN shares the code
def test_cnn_train_step_shapes():
    spec = RewardModelSpec("cnn", (84, 84, 4), (), "int32", 6, True)
    cnn = Compiled(spec, EnsembleConfig(num_members=2, batch_size=2, input_noise=0.1, member_axis="unroll"))
    state = cnn.init(jax.random.key(0))
    cap, t = 4, 2
    rng = np.random.default_rng(1)
    buf = cnn.empty_buffer(cap, t).replace(
        obs=rng.integers(0, 256, (cap, 2, t, 84, 84, 4), np.uint8),
        action=rng.integers(0, 6, (cap, 2, t), np.int32),
        mu=np.array([1.0, 0.0, 0.5, 1.0], np.float32),
        filled=np.ones(cap, bool),
        heldout=np.array([[False, False, False, True], [True, False, False, False]]),
        boot=np.ones((2, cap), np.float32))
    assert cnn.empty_buffer(cap, t).obs.dtype == jnp.uint8
    new, metrics = cnn.train_step(state, buf, jax.random.key(2))
    # same structure and shapes, new values
    assert jax.tree.structure(new.params) == jax.tree.structure(state.params)
    jax.tree.map(lambda a, b: (a.shape == b.shape) or pytest.fail(f"{a.shape} != {b.shape}"), new.params, state.params)
    assert state.params["Conv_0"]["kernel"].shape == (2, 7, 7, 4, 16)
    assert max_abs_change(new.params, state.params) > 0
    # batch-norm statistics live in their own collection and were updated in train mode
    assert set(state.batch_stats) == {f"BatchNorm_{i}" for i in range(4)}
    assert state.batch_stats["BatchNorm_0"]["mean"].shape == (2, 16)
    assert max_abs_change(new.batch_stats, state.batch_stats) > 0
    for k in ("train_loss", "val_loss", "train_loss_train_mode"):
        assert metrics[k].shape == (2,) and np.all(np.isfinite(metrics[k]))
    assert int(new.steps) == 1


def test_resolve_member_axis():
    assert resolve_member_axis("auto", "cpu") == "map"
    assert resolve_member_axis("auto", "cpu", model_kind="cnn") == "unroll"
    assert resolve_member_axis("auto", "gpu") == "vmap"
    assert resolve_member_axis("auto", "gpu", model_kind="cnn") == "unroll"
    assert resolve_member_axis("vmap", "cpu") == "vmap"
    with pytest.raises(ValueError, match="member_axis"):
        EnsembleConfig(member_axis="pmap")
    with pytest.raises(ValueError, match="fit_loop"):
        EnsembleConfig(fit_loop="while")
    cnn_spec = RewardModelSpec("cnn", (84, 84, 4), (), "int32", 6, True)
    assert RewardEnsemble(cnn_spec).fit_loop("cpu") == "host"
    assert RewardEnsemble(cnn_spec).fit_loop("gpu") == "scan"
    assert RewardEnsemble(MLP_SPEC).fit_loop("cpu") == "scan"
    with pytest.raises(ValueError, match="num_members"):
        EnsembleConfig(num_members=0)
    with pytest.raises(ValueError, match="error_rate"):
        EnsembleConfig(error_rate=1.0)


# ------------------------------------------------------------------ (6) bootstrap and held-out
@pytest.fixture(scope="module")
def big_buffer(add_labels):
    n, members = 20_000, 3
    buf = labels_lib.empty_label_buffer(n, members, 1, (1,), (), jnp.float32, jnp.int32)
    pairs = labels_lib.SegmentPairs(obs=np.zeros((n, 2, 1, 1), np.float32), action=np.zeros((n, 2, 1), np.int32),
                                    true_reward=np.zeros((n, 2, 1), np.float32))
    return add_labels(buf, jax.random.key(7), pairs, np.ones(n, np.float32), np.ones(n, bool))


def test_heldout_fraction_is_one_over_e(big_buffer):
    held = np.asarray(big_buffer.heldout)
    n = held.shape[1]
    p = 1 / math.e
    tol = 5 * math.sqrt(p * (1 - p) / n)  # ≈ 0.017
    for m in range(held.shape[0]):
        assert abs(held[m].mean() - p) < tol, held[m].mean()
    # members draw independently: they agree on about p² + (1 − p)² of the labels, not all
    agree = (held[0] == held[1]).mean()
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.03


def test_heldout_labels_never_in_training_weights(big_buffer):
    w = np.asarray(labels_lib.train_weights(big_buffer))
    held = np.asarray(big_buffer.heldout)
    assert np.all(w[held] == 0)
    np.testing.assert_array_equal(w[~held], np.asarray(big_buffer.boot)[~held])
    np.testing.assert_array_equal(np.asarray(labels_lib.heldout_weights(big_buffer)), held.astype(np.float32))


def test_no_ensemble_ablation_fits_its_one_predictor_on_every_training_label(buffer1):
    """§3.3 "no ensemble": a single predictor, so no bootstrap resample — each training label weighs 1."""
    from rlhp_jax.config import RunConfig, with_ablation

    cfg = with_ablation(RunConfig(), "no_ensemble").ensemble
    assert cfg.num_members == 1 and cfg.bootstrap is False
    train = np.asarray(buffer1.filled[None] & ~buffer1.heldout, np.float32)
    assert (np.asarray(buffer1.boot)[train > 0] != 1).any()  # a Poisson resample would weigh them otherwise
    np.testing.assert_array_equal(np.asarray(labels_lib.train_weights(buffer1, cfg.bootstrap)), train)
    # a fit trains even where every bootstrap count is 0 (a resampling member would not move)
    single = RewardEnsemble(MLP_SPEC, dataclasses.replace(cfg, member_axis="map"))
    state = single.init(jax.random.key(0))
    unsampled = buffer1.replace(boot=jnp.zeros_like(buffer1.boot))
    moved, _ = fast_jit(single.train_step)(state, unsampled, jax.random.key(1))
    assert not np.allclose(np.asarray(moved.params["Dense_0"]["kernel"]), np.asarray(state.params["Dense_0"]["kernel"]))


def test_bootstrap_counts_are_poisson_one(big_buffer):
    boot = np.asarray(big_buffer.boot)
    n = boot.shape[1]
    assert np.all(boot == np.round(boot)) and boot.min() >= 0
    for m in range(boot.shape[0]):
        assert abs(boot[m].mean() - 1.0) < 5 / math.sqrt(n)  # mean 1, variance 1
        assert abs(boot[m].var() - 1.0) < 0.06
        assert abs((boot[m] == 0).mean() - 1 / math.e) < 0.02  # Poisson(1): P(0) = 1/e


# ------------------------------------------------------------------ input noise (Ibarz A.3)
NOISE_TAIL = 4.3250  # √2 · erfinv(1 − 2^-16): the outermost level's magnitude


@given(st.lists(st.integers(1, 7), min_size=1, max_size=3), st.integers(0, 2 ** 31 - 1))
def test_gaussian_noise_shape_bounds_and_key(shape, seed):
    """Any shape (odd sizes use half of the last 32-bit word); finite, within the outermost
    quantile levels; the same key gives the same noise, another key other noise."""
    key = jax.random.PRNGKey(seed)
    a = np.asarray(gaussian_noise(key, tuple(shape)))
    assert a.shape == tuple(shape) and a.dtype == np.float32
    assert np.all(np.isfinite(a)) and np.all(np.abs(a) <= NOISE_TAIL)
    np.testing.assert_array_equal(a, gaussian_noise(key, tuple(shape)))
    if a.size >= 8:
        assert not np.array_equal(a, gaussian_noise(jax.random.PRNGKey(seed + 1), tuple(shape)))


def test_gaussian_noise_is_standard_normal():
    """200,000 draws: mean 0 and std 1 to sampling error, the empirical CDF within 0.005 of
    Φ everywhere it is checked (Kolmogorov–Smirnov's 1 % critical value at this size is 0.0036),
    the values on the 2^16 levels Φ⁻¹((k + ½) / 2^16), and the two halves of one random word
    independent (no correlation between neighbours)."""
    x = np.asarray(gaussian_noise(jax.random.PRNGKey(7), (200_000,)), np.float64)
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01
    grid = np.linspace(-3, 3, 61)
    phi = 0.5 * (1 + np.vectorize(math.erf)(grid / math.sqrt(2)))
    ecdf = np.searchsorted(np.sort(x), grid, side="right") / x.size
    assert np.max(np.abs(ecdf - phi)) < 0.005
    # on the level grid: Φ(x)·2^16 - ½ is an integer
    k = 0.5 * (1 + np.vectorize(math.erf)(x[:2000] / math.sqrt(2))) * NOISE_LEVELS - 0.5
    np.testing.assert_allclose(k, np.round(k), atol=0.02)
    assert abs(np.corrcoef(x[0::2], x[1::2])[0, 1]) < 0.01


@pytest.mark.parametrize("n, size, cin, kernel, stride, cout", [(3, 26, 16, 5, 2, 16), (2, 20, 4, 7, 3, 5), (2, 9, 1, 5, 4, 2)])
def test_strided_convolution_has_lax_values_and_gradients(n, size, cin, kernel, stride, cout):
    """core.conv_general_dilated (the reward CNN's convolution): lax's values, and the same gradients through
    its phase-by-phase input gradient, which it takes (a custom VJP) for strided VALID NHWC layers on CPU."""
    from rlhp_jax.core import conv_general_dilated

    k1, k2 = jax.random.split(jax.random.PRNGKey(n + size))
    x, w = jax.random.normal(k1, (n, size, size, cin)), jax.random.normal(k2, (kernel, kernel, cin, cout))
    dims = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
    loss = lambda conv: lambda x, w: jnp.sum(jnp.sin(conv(x, w, (stride, stride), "VALID", dimension_numbers=dims)))
    ours, theirs = loss(conv_general_dilated), loss(jax.lax.conv_general_dilated)
    assert "custom_vjp_call" in str(jax.make_jaxpr(ours)(x, w))  # the phase gradient is the one taken
    np.testing.assert_allclose(ours(x, w), theirs(x, w), rtol=1e-6)
    for a, b in zip(jax.grad(ours, (0, 1))(x, w), jax.grad(theirs, (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # padded or stride-1 layers are lax's own
    assert "custom_vjp_call" not in str(jax.make_jaxpr(lambda x, w: conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=dims))(x, w))
