"""Bradley-Terry preference model with the random-response error model (preferences.py)."""

from __future__ import annotations

import math

import chex
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_jit
from hypothesis import given

from rlhp_jax.preferences import (
    bradley_terry_loss,
    check_labels,
    preference_accuracy,
    preference_log_likelihoods,
    preference_probability,
    segment_returns,
)

B, T = 6, 3  # fixed batch shape: every jitted function below compiles once

prob = fast_jit(preference_probability)
per_pair = fast_jit(preference_log_likelihoods)
loss = fast_jit(bradley_terry_loss)
loss_grad = fast_jit(jax.grad(bradley_terry_loss, argnums=(0, 1)))
accuracy = fast_jit(preference_accuracy)

error_rates = st.floats(1e-3, 0.5)
labels = hnp.arrays(np.float32, (B,), elements=st.sampled_from([0.0, 0.5, 1.0]))


def rewards(lo=-100.0, hi=100.0, shape=(B, T)):
    return hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32))


def grid_rewards(bound=100, shape=(B, T)):
    """Multiples of 1/8 in [-bound, bound]: sums and shifts of these are exact in float32."""
    return hnp.arrays(np.float32, shape, elements=st.integers(-8 * bound, 8 * bound).map(lambda i: i / 8.0))


def reference_probability(r1, r2, eps):
    d = np.asarray(r1, np.float64).sum(-1) - np.asarray(r2, np.float64).sum(-1)
    return (1 - eps) / (1 + np.exp(-d)) + eps / 2


# ------------------------------------------------------------------ the formula itself
@given(rewards(-5, 5), rewards(-5, 5), labels, error_rates)
def test_matches_float64_reference(r1, r2, mu, eps):
    p_ref = reference_probability(r1, r2, eps)
    p = prob(segment_returns(r1), segment_returns(r2), eps)
    np.testing.assert_allclose(p, p_ref, rtol=1e-5, atol=1e-6)
    ce_ref = -(mu * np.log(p_ref) + (1 - mu) * np.log(1 - p_ref))
    np.testing.assert_allclose(per_pair(r1, r2, mu, eps), ce_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss(r1, r2, mu, eps), ce_ref.mean(), rtol=1e-4, atol=1e-5)


def test_known_values():
    # no error model: plain logistic of the return difference
    np.testing.assert_allclose(prob(1.0, 0.0, 0.0), 1 / (1 + math.exp(-1)), rtol=1e-6)
    # 10 % random answers: 0.9 * sigmoid + 0.05
    np.testing.assert_allclose(prob(2.0, 0.0, 0.1), 0.9 / (1 + math.exp(-2)) + 0.05, rtol=1e-6)
    r1 = jnp.array([[1.0, 1.0]])
    r2 = jnp.array([[0.0, 0.0]])
    np.testing.assert_allclose(bradley_terry_loss(r1, r2, jnp.array([1.0]), 0.1),
                               -math.log(0.9 / (1 + math.exp(-2)) + 0.05), rtol=1e-6)


# ------------------------------------------------------------------ symmetries
@given(rewards(), rewards(), labels, error_rates)
def test_swapping_segments_maps_p_to_one_minus_p(r1, r2, mu, eps):
    R1, R2 = segment_returns(r1), segment_returns(r2)
    np.testing.assert_allclose(prob(R1, R2, eps) + prob(R2, R1, eps), 1.0, atol=2e-6)
    # the loss of (σ¹, σ², μ) is the loss of (σ², σ¹, 1 − μ)
    np.testing.assert_allclose(per_pair(r1, r2, mu, eps), per_pair(r2, r1, 1 - mu, eps), rtol=1e-6, atol=1e-6)


@given(grid_rewards(), grid_rewards(), labels, error_rates, st.integers(-1000, 1000))
def test_constant_reward_shift_changes_nothing_exactly(r1, r2, mu, eps, c):
    # on a grid where float32 sums are exact, the shift must leave everything bit-identical
    R1, R2 = segment_returns(r1), segment_returns(r2)
    R1c, R2c = segment_returns(r1 + c), segment_returns(r2 + c)
    np.testing.assert_array_equal(prob(R1c, R2c, eps), prob(R1, R2, eps))
    np.testing.assert_array_equal(loss(r1 + c, r2 + c, mu, eps), loss(r1, r2, mu, eps))


@given(rewards(), rewards(), labels, error_rates, st.floats(-1000, 1000))
def test_constant_reward_shift_changes_nothing(r1, r2, mu, eps, c):
    c = np.float32(c)
    np.testing.assert_allclose(per_pair(r1 + c, r2 + c, mu, eps), per_pair(r1, r2, mu, eps), atol=2e-3)
    g = loss_grad(r1, r2, mu, eps)
    gc = loss_grad(r1 + c, r2 + c, mu, eps)
    np.testing.assert_allclose(gc[0], g[0], atol=2e-3)
    np.testing.assert_allclose(gc[1], g[1], atol=2e-3)


@given(grid_rewards(), st.randoms(use_true_random=False), labels, error_rates)
def test_equal_returns_give_exactly_one_half(r1, rnd, mu, eps):
    # a different clip with the same (exact) return: permute each row's steps
    r2 = np.stack([rnd.sample(list(row), len(row)) for row in r1]).astype(np.float32)
    np.testing.assert_array_equal(segment_returns(r1), segment_returns(r2))
    np.testing.assert_array_equal(prob(segment_returns(r1), segment_returns(r2), eps), 0.5)
    # whatever the label, the cross-entropy of a 50/50 prediction is log 2
    np.testing.assert_allclose(per_pair(r1, r2, mu, eps), math.log(2), rtol=1e-6)


# ------------------------------------------------------------------ numerical stability
@given(rewards(-3333.0, 3333.0), rewards(-3333.0, 3333.0), labels, error_rates)
def test_probability_bounded_and_finite_for_large_returns(r1, r2, mu, eps):
    p = np.asarray(prob(segment_returns(r1), segment_returns(r2), eps))
    l = np.asarray(per_pair(r1, r2, mu, eps))
    g1, g2 = loss_grad(r1, r2, mu, eps)
    chex.assert_tree_all_finite((p, l, g1, g2))
    ulp = 1e-6  # float32 rounding of (1 − ε)·1 + ε/2
    assert np.all(p >= eps / 2 - ulp) and np.all(p <= 1 - eps / 2 + ulp)


@pytest.mark.parametrize("eps", [0.1, 0.01])
def test_extreme_returns(eps):
    big = np.zeros((B, T), np.float32)
    big[:, 0] = [1e4, -1e4, 1e6, -1e6, 3e38, -3e38]  # up to float32's largest finite values
    small = np.zeros((B, T), np.float32)
    mu = np.tile(np.array([0.0, 1.0], np.float32), B // 2)  # every label contradicts a huge margin
    p = prob(segment_returns(big), segment_returns(small), eps)
    np.testing.assert_allclose(p, np.tile([1 - eps / 2, eps / 2], B // 2), rtol=1e-6)
    # the error model caps a confidently wrong prediction's loss at −log(ε/2)
    np.testing.assert_allclose(per_pair(big, small, mu, eps), -math.log(eps / 2), rtol=1e-5)
    chex.assert_tree_all_finite(loss_grad(big, small, mu, eps))


@given(rewards(-3333.0, 3333.0), rewards(-3333.0, 3333.0), labels, error_rates)
def test_loss_bounded_by_error_model(r1, r2, mu, eps):
    l = np.asarray(per_pair(r1, r2, mu, eps))
    assert np.all(l <= -math.log(eps / 2) + 1e-5)
    # ... and never below the loss of a perfect, maximally confident prediction
    floor = np.where(mu == 0.5, math.log(2), -math.log(1 - eps / 2))
    assert np.all(l >= floor - 1e-5)


# ------------------------------------------------------------------ gradients
@given(rewards(-10, 10), rewards(-10, 10), error_rates)
def test_gradient_points_toward_preferred_segment(r1, r2, eps):
    for label, sign in ((1.0, -1.0), (0.0, 1.0)):
        mu = np.full((B,), label, np.float32)
        g1, g2 = (np.asarray(g) for g in loss_grad(r1, r2, mu, eps))
        # descending the loss raises every step of the preferred clip, lowers the other's
        assert np.all(np.sign(g1) == sign), (label, g1)
        assert np.all(np.sign(g2) == -sign), (label, g2)
        # the loss only sees the returns: every step of a clip gets the same gradient, and
        # the two clips' gradients cancel (zero-sum)
        np.testing.assert_allclose(g1, g1[:, :1].repeat(T, 1), rtol=1e-6)
        np.testing.assert_allclose(g1 + g2, 0.0, atol=1e-7)


@given(grid_rewards(10), rewards(-10, 10), error_rates)
def test_tie_gradient(r1, r2, eps):
    mu = np.full((B,), 0.5, np.float32)
    # equal returns: a tie is already predicted perfectly, nothing to move
    g1, g2 = loss_grad(r1, r1[:, ::-1].copy(), mu, eps)
    np.testing.assert_allclose(g1, 0.0, atol=1e-7)
    np.testing.assert_allclose(g2, 0.0, atol=1e-7)
    # unequal returns: a tie pulls the returns together, symmetrically
    g1, g2 = (np.asarray(g) for g in loss_grad(r1, r2, mu, eps))
    np.testing.assert_allclose(g1 + g2, 0.0, atol=1e-7)
    d = r1.astype(np.float64).sum(1) - r2.astype(np.float64).sum(1)
    # (beyond |d| ≈ 80 the error model saturates and the float32 gradient underflows to 0)
    strict = (np.abs(d) > 1e-3) & (np.abs(d) < 40)
    assert np.all(np.sign(g1[strict, 0]) == np.sign(d[strict]))


# ------------------------------------------------------------------ accuracy
def test_accuracy_basic_cases():
    r1 = jnp.array([2.0, 0.0, 1.0, 5.0])
    r2 = jnp.array([1.0, 3.0, 4.0, 5.0])
    np.testing.assert_allclose(accuracy(r1, r2, jnp.array([1.0, 0.0, 0.0, 0.5])), 1.0)
    np.testing.assert_allclose(accuracy(r1, r2, jnp.array([0.0, 1.0, 1.0, 0.5])), 0.0)
    np.testing.assert_allclose(accuracy(r1, r2, jnp.array([1.0, 1.0, 0.0, 0.5])), 2 / 3)
    # ties in the labels are left out, whatever the predictions
    np.testing.assert_allclose(accuracy(r1, r2, jnp.array([1.0, 0.5, 0.5, 0.5])), 1.0)
    # weights
    w = jnp.array([3.0, 1.0, 0.0, 1.0])
    # pair 0 right (weight 3), pair 1 wrong (1), pair 2 ignored (0), pair 3 predicts no order (1)
    np.testing.assert_allclose(accuracy(r1, r2, jnp.array([1.0, 1.0, 1.0, 1.0]), w), 3 / 5)


def test_accuracy_equal_predictions_are_not_correct():
    """A model predicting equal returns has not ranked anything, for μ = 1 or μ = 0 alike."""
    r = np.zeros(4)
    np.testing.assert_allclose(accuracy(r, r, jnp.array([1.0, 1.0, 0.0, 0.0])), 0.0)
    np.testing.assert_allclose(accuracy(r, r, jnp.array([0.0, 0.0, 0.0, 0.0])), 0.0)


def test_accuracy_nan_with_only_ties():
    r1, r2 = jnp.array([1.0, 2.0]), jnp.array([0.0, 3.0])
    assert np.isnan(accuracy(r1, r2, jnp.array([0.5, 0.5])))
    # also when the strict labels all have zero weight
    assert np.isnan(accuracy(r1, r2, jnp.array([1.0, 0.5]), jnp.array([0.0, 1.0])))


# ------------------------------------------------------------------ weights and bad input
def test_weighted_loss():
    r1 = jnp.array([[1.0], [0.0], [2.0]])
    r2 = jnp.array([[0.0], [1.0], [0.0]])
    mu = jnp.array([1.0, 1.0, 0.0])
    pp = preference_log_likelihoods(r1, r2, mu)
    w = jnp.array([2.0, 0.0, 1.0])
    np.testing.assert_allclose(bradley_terry_loss(r1, r2, mu, weights=w), (2 * pp[0] + pp[2]) / 3, rtol=1e-6)
    np.testing.assert_allclose(bradley_terry_loss(r1, r2, mu, weights=np.zeros(3)), 0.0)


@pytest.mark.parametrize(
    "r1_shape, r2_shape, mu_len, match",
    [
        ((4,), (4,), 4, "rank"),  # rank-1 rewards (returns passed where rewards are expected)
        ((4, 3, 1), (4, 3, 1), 4, "rank"),
        ((4, 3), (4, 2), 4, "shape"),  # segments of different lengths
        ((4, 3), (4, 3), 3, "equal"),  # one label too few
    ],
)
def test_bad_shapes_raise(r1_shape, r2_shape, mu_len, match):
    with pytest.raises(AssertionError, match=match):
        bradley_terry_loss(np.zeros(r1_shape), np.zeros(r2_shape), np.zeros(mu_len))


def test_bad_mu_rank_and_weights_raise():
    r = np.zeros((4, 3))
    with pytest.raises(AssertionError, match="rank"):
        bradley_terry_loss(r, r, np.zeros((4, 1)))
    with pytest.raises(AssertionError, match="shape"):
        bradley_terry_loss(r, r, np.zeros(4), weights=np.ones(3))


# ------------------------------------------------------------------ check_labels
def test_check_labels_accepts_valid():
    check_labels([0, 0.5, 1, 1, 0])
    check_labels(np.array([0.5], np.float32))
    check_labels(jnp.array([[1.0, 0.0], [0.5, 0.5]]))
    check_labels([])


@given(hnp.arrays(np.float64, st.integers(1, 8), elements=st.sampled_from([0.0, 0.5, 1.0])),
       st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: x not in (0.0, 0.5, 1.0)),
       st.integers(0, 8))
def test_check_labels_rejects_and_names_bad_values(valid, bad, pos):
    mu = np.insert(valid, min(pos, len(valid)), bad)
    with pytest.raises(ValueError, match="1 invalid value") as info:
        check_labels(mu)
    assert repr(float(bad)) in str(info.value)


def test_check_labels_counts_several_bad_values():
    with pytest.raises(ValueError, match=r"3 invalid value\(s\), e\.g\. 2\.0, -1\.0, 0\.25"):
        check_labels([1.0, 2.0, -1.0, 0.5, 0.25])
