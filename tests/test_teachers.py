"""Synthetic teachers (teachers.py): the oracle and its irrational variants."""

from __future__ import annotations

import functools
import math

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_jit
from hypothesis import given

from rlhp_jax.labels import SegmentPairs
from rlhp_jax.teachers import SyntheticTeacher, await_answers

P, L = 16, 4  # shape of the property-test batches


@functools.lru_cache(maxsize=None)
def _jitted(teacher):
    return fast_jit(teacher.label)


def label(teacher, key, r1, r2, jit=True):
    """Label with a teacher: jitted once per distinct teacher, or eagerly (for teachers that
    change every hypothesis example, where compiling each one would cost more)."""
    fn = _jitted(teacher) if jit else teacher.label
    mu, answered = fn(key, jnp.asarray(r1, jnp.float32), jnp.asarray(r2, jnp.float32))
    return np.asarray(mu), np.asarray(answered)


def z_tolerance(p, n, z=5.0):
    return z * math.sqrt(max(p * (1 - p), 1e-12) / n)


# ------------------------------------------------------------------ oracle
@given(hnp.arrays(np.int32, (P, L), elements=st.integers(-3, 3)),
       hnp.arrays(np.int32, (P, L), elements=st.integers(-3, 3)))
def test_oracle_prefers_larger_true_return(r1, r2):
    mu, answered = label(SyntheticTeacher(), jax.random.key(0), r1, r2)
    R1, R2 = r1.sum(1), r2.sum(1)
    expected = np.where(R1 > R2, 1.0, np.where(R1 < R2, 0.0, 0.5))
    np.testing.assert_array_equal(mu, expected)
    assert answered.all()


def test_oracle_examples_and_label_pairs():
    r = jnp.array([[[1.0, 2.0], [0.0, 0.0]],  # σ¹ better
                   [[0.0, 0.0], [1.0, 2.0]],  # σ² better
                   [[3.0, 0.0], [1.0, 2.0]]])  # equal returns: tie
    pairs = SegmentPairs(obs=np.zeros((3, 2, 2, 1)), action=np.zeros((3, 2, 2)), true_reward=r)
    mu, answered = fast_jit(SyntheticTeacher().label_pairs)(jax.random.key(0), pairs)
    np.testing.assert_array_equal(mu, [1.0, 0.0, 0.5])
    np.testing.assert_array_equal(answered, True)


def test_oracle_does_not_depend_on_the_key():
    rng = np.random.default_rng(1)
    r1, r2 = rng.normal(size=(64, L)), rng.normal(size=(64, L))
    a = label(SyntheticTeacher(), jax.random.key(3), r1, r2)
    b = label(SyntheticTeacher(), jax.random.key(4), r1, r2)
    np.testing.assert_array_equal(a[0], b[0])


# ------------------------------------------------------------------ mistakes
@pytest.mark.parametrize("p", [0.1, 0.3])
def test_mistake_rate_flips_about_p_of_strict_labels_never_ties(p):
    n = 20_000
    rng = np.random.default_rng(5)
    r1, r2 = rng.integers(0, 5, (n, 1)), rng.integers(0, 5, (n, 1))
    truth, _ = label(SyntheticTeacher(), jax.random.key(0), r1, r2)
    noisy, answered = label(SyntheticTeacher(mistake_rate=p), jax.random.key(6), r1, r2)
    assert answered.all()
    ties = truth == 0.5
    assert 0.1 < ties.mean() < 0.3  # plenty of ties to check
    np.testing.assert_array_equal(noisy[ties], 0.5)
    strict = ~ties
    assert set(np.unique(noisy[strict])) <= {0.0, 1.0}
    flipped = (noisy[strict] != truth[strict]).mean()
    assert abs(flipped - p) < z_tolerance(p, strict.sum())


def test_mistake_rate_one_flips_every_strict_label():
    r1 = jnp.array([[1.0], [0.0], [2.0]])
    r2 = jnp.array([[0.0], [1.0], [2.0]])
    mu, _ = label(SyntheticTeacher(mistake_rate=1.0), jax.random.key(0), r1, r2)
    np.testing.assert_array_equal(mu, [0.0, 1.0, 0.5])


# ------------------------------------------------------------------ Boltzmann
def test_boltzmann_large_beta_is_deterministic():
    n = 2000
    r1 = np.random.default_rng(1).normal(size=(n, L)).astype(np.float32)
    r2 = r1 + np.where(np.arange(n) % 2 == 0, 0.05, -0.05).astype(np.float32)[:, None]  # |ΔR| ≈ 0.2
    truth, _ = label(SyntheticTeacher(), jax.random.key(0), r1, r2)
    for seed in range(3):
        mu, _ = label(SyntheticTeacher(beta=1e4), jax.random.key(seed), r1, r2)
        np.testing.assert_array_equal(mu, truth)


def test_boltzmann_small_beta_is_a_coin_flip():
    n = 20_000
    rng = np.random.default_rng(2)
    r1 = 10.0 + rng.uniform(size=(n, 1))  # σ¹ always better by ≥ 9
    r2 = rng.uniform(size=(n, 1))
    mu, _ = label(SyntheticTeacher(beta=1e-4), jax.random.key(3), r1, r2)
    assert abs(mu.mean() - 0.5) < z_tolerance(0.5, n)


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_boltzmann_frequency_matches_sigmoid(beta):
    n_per = 8000
    diffs = np.array([-2.0, -0.5, 0.25, 1.0, 3.0], np.float32)
    r1 = np.repeat(diffs, n_per)[:, None] + np.float32(7.0)  # the shift must not matter
    r2 = np.full_like(r1, 7.0)
    mu, _ = label(SyntheticTeacher(beta=beta), jax.random.key(11), r1, r2)
    freq = mu.reshape(len(diffs), n_per).mean(1)
    expected = 1.0 / (1.0 + np.exp(-beta * diffs))
    for f, e in zip(freq, expected):
        assert abs(f - e) < z_tolerance(e, n_per), (freq, expected)


# ------------------------------------------------------------------ myopia
def test_myopic_teacher_weights_later_steps_more():
    early = jnp.array([[3.0, 0.0, 0.0, 0.0]])  # larger plain sum, reward early
    late = jnp.array([[0.0, 0.0, 0.0, 2.0]])  # smaller plain sum, reward at the end
    mu, _ = label(SyntheticTeacher(gamma=1.0), jax.random.key(0), early, late)
    assert mu[0] == 1.0
    mu, _ = label(SyntheticTeacher(gamma=0.5), jax.random.key(0), early, late)
    assert mu[0] == 0.0  # 3·0.5³ = 0.375 < 2
    t = SyntheticTeacher(gamma=0.9)
    r = jnp.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(t.perceived_returns(r), 0.9**3 * 1 + 0.9**2 * 2 + 0.9 * 3 + 4, rtol=1e-6)


# ------------------------------------------------------------------ thresholds, at every stage
# Single-step clips: the perceived return is the reward itself, so the expected decisions can be
# computed exactly in float32.  "Early" returns are small; "late" ones are shifted and scaled by
# large amounts, with the threshold moved the same way.  The decision rule must be the
# docstring's, R compared with the threshold directly, at both stages.
returns = hnp.arrays(np.float32, (P,), elements=st.integers(-40, 40).map(lambda i: i / 8.0))
stage = st.sampled_from([(1.0, 0.0), (1.0, 1e4), (1000.0, 0.0), (64.0, -5e4)])


@given(returns, returns, st.integers(-40, 40).map(lambda i: i / 8.0), stage)
def test_skip_below_iff_both_below_threshold(r1, r2, threshold, scale_shift):
    a, b = scale_shift
    r1, r2 = np.float32(a) * r1 + np.float32(b), np.float32(a) * r2 + np.float32(b)
    s = float(np.float32(a) * np.float32(threshold) + np.float32(b))
    teacher = SyntheticTeacher(skip_below=s)
    mu, answered = label(teacher, jax.random.key(0), r1[:, None], r2[:, None], jit=False)
    np.testing.assert_array_equal(answered, ~((r1 < s) & (r2 < s)))
    # skipping only removes pairs: the answered labels are the oracle's
    oracle, _ = label(SyntheticTeacher(), jax.random.key(0), r1[:, None], r2[:, None])
    np.testing.assert_array_equal(mu[answered], oracle[answered])


@given(returns, returns, st.integers(0, 24).map(lambda i: i / 8.0), stage)
def test_tie_within_iff_difference_at_most_threshold(r1, r2, threshold, scale_shift):
    a, b = scale_shift
    r1, r2 = np.float32(a) * r1 + np.float32(b), np.float32(a) * r2 + np.float32(b)
    tol = float(a * threshold)
    mu, answered = label(SyntheticTeacher(tie_within=tol), jax.random.key(0), r1[:, None], r2[:, None], jit=False)
    tie = np.abs(r1 - r2) <= tol
    np.testing.assert_array_equal(mu == 0.5, tie)
    np.testing.assert_array_equal(mu[~tie], (r1 > r2)[~tie].astype(np.float32))
    assert answered.all()


def test_thresholds_do_not_depend_on_the_rest_of_the_batch():
    """Nothing is rescaled by the returns seen so far: a pair gets the same answer alone or
    beside pairs with huge returns."""
    teacher = SyntheticTeacher(skip_below=0.0, tie_within=0.5)
    pair_1 = np.array([[0.3], [-1.0], [2.0], [-0.5]], np.float32)
    pair_2 = np.array([[0.0], [-2.0], [1.0], [-0.2]], np.float32)
    alone = label(teacher, jax.random.key(0), pair_1, pair_2)
    big = np.array([[1e5], [-1e5], [3e4], [0.0]], np.float32)
    mixed = label(teacher, jax.random.key(0), np.concatenate([pair_1, big]), np.concatenate([pair_2, -big]))
    np.testing.assert_array_equal(mixed[0][:4], alone[0])
    np.testing.assert_array_equal(mixed[1][:4], alone[1])
    np.testing.assert_array_equal(alone[0], [0.5, 1.0, 1.0, 0.5])
    np.testing.assert_array_equal(alone[1], [True, False, True, False])


def test_decision_order_skip_then_tie_then_mistake():
    teacher = SyntheticTeacher(mistake_rate=1.0, skip_below=1.0, tie_within=0.5)
    r1 = np.array([[0.0], [3.0], [3.0]], np.float32)
    r2 = np.array([[0.2], [3.4], [0.0]], np.float32)
    mu, answered = label(teacher, jax.random.key(0), r1, r2)
    np.testing.assert_array_equal(answered, [False, True, True])
    np.testing.assert_array_equal(mu[1:], [0.5, 0.0])  # the tie is not flipped; the strict one is


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mistake_rate=-0.1), "mistake_rate"),
        (dict(mistake_rate=1.5), "mistake_rate"),
        (dict(mistake_rate=math.nan), "mistake_rate"),
        (dict(beta=0.0), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(beta=math.nan), "beta"),
        (dict(gamma=0.0), "gamma"),
        (dict(gamma=1.01), "gamma"),
        (dict(tie_within=-0.1), "tie_within"),
        (dict(tie_within=math.nan), "tie_within"),
        (dict(skip_below=math.nan), "skip_below"),
    ],
)
def test_invalid_parameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticTeacher(**kwargs)


def test_bad_shapes_raise():
    with pytest.raises(AssertionError):
        SyntheticTeacher().label(jax.random.key(0), np.zeros((4,)), np.zeros((4,)))
    with pytest.raises(AssertionError):
        SyntheticTeacher().label(jax.random.key(0), np.zeros((4, 3)), np.zeros((4, 2)))


def test_await_answers_looks_until_none_is_awaited_and_reports_while_it_waits():
    """The one wait for people: looks 1, 2, … until one finds nothing awaited, a report at the
    first look that finds answers awaited (then every ``log_s``), none after the last look."""
    awaited, looks, reports = iter([3, 1, 0, 5]), [], []
    waited = await_answers(lambda i: looks.append(i) or next(awaited), lambda n, s: reports.append(n),
                           log_s=3600, poll_s=0)
    assert looks == [1, 2, 3] and reports == [3] and waited >= 0
    looks.clear()  # a teacher that answers at once: one look, no report, no pause
    assert await_answers(lambda i: looks.append(i) or 0, lambda n, s: reports.append(n), poll_s=3600) < 60
    assert looks == [1] and reports == [3]
