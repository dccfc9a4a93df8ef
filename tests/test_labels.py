"""The label ring buffer (labels.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax import labels as labels_lib

# Every small test adds Q pairs per call (a mask picks which) into a buffer of CAP slots, with
# a mask always given: one compiled add_labels serves them all.
Q = 12
CAP = 8


def small_buffer(capacity=CAP, members=2):
    return labels_lib.empty_label_buffer(capacity, members, 2, (1,), (), jnp.float32, np.int32)


def tagged_pairs(tags):
    """Pairs whose every entry carries a tag, so each slot says which pair it holds."""
    tags = np.asarray(tags, np.float32)
    q = tags.shape[0]
    obs = np.broadcast_to(tags[:, None, None, None], (q, 2, 2, 1))
    act = np.broadcast_to(tags[:, None, None].astype(np.int32), (q, 2, 2))
    rew = np.broadcast_to(tags[:, None, None], (q, 2, 2))
    return labels_lib.SegmentPairs(obs=obs, action=act, true_reward=rew)


def held_tags(buf):
    """Which tag each filled slot holds (−1 for empty slots)."""
    tags = np.asarray(buf.obs[:, 0, 0, 0])
    return np.where(np.asarray(buf.filled), tags, -1)


def test_empty_buffer():
    buf = small_buffer()
    assert buf.capacity == CAP and buf.num_members == 2
    assert int(labels_lib.num_labels(buf)) == 0 and int(buf.count) == 0
    assert buf.obs.shape == (CAP, 2, 2, 1) and buf.action.dtype == jnp.int32
    np.testing.assert_array_equal(labels_lib.train_weights(buf), 0.0)
    np.testing.assert_array_equal(labels_lib.heldout_weights(buf), 0.0)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        labels_lib.empty_label_buffer(0, 2, 2, (1,), ())


def test_add_with_mask_adds_only_masked_pairs_in_order(add_labels):
    buf = small_buffer()
    mu = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.5] * 2)
    mask = np.array([True, False, True, False, True, True] + [False] * 6)
    buf = add_labels(buf, jax.random.key(0), tagged_pairs(np.arange(Q) + 10), mu, mask)
    np.testing.assert_array_equal(held_tags(buf), [10, 12, 14, 15, -1, -1, -1, -1])
    np.testing.assert_array_equal(buf.mu[:4], [1.0, 0.5, 0.0, 0.5])
    np.testing.assert_array_equal(buf.action[:4, 1, 1], [10, 12, 14, 15])
    np.testing.assert_array_equal(buf.true_reward[:4, 0, 0], [10, 12, 14, 15])
    assert int(buf.count) == 4 and int(buf.ptr) == 4
    assert int(labels_lib.num_labels(buf)) == 4
    # a second batch continues where the first stopped
    buf = add_labels(buf, jax.random.key(1), tagged_pairs(np.arange(Q) + 20), mu,
                     np.array([False, True, False, False, False, True] + [False] * 6))
    np.testing.assert_array_equal(held_tags(buf), [10, 12, 14, 15, 21, 25, -1, -1])
    np.testing.assert_array_equal(buf.mu[4:6], [0.0, 0.5])
    assert int(buf.count) == 6 and int(labels_lib.num_labels(buf)) == 6
    # an all-false mask changes nothing
    before = buf
    buf = add_labels(buf, jax.random.key(2), tagged_pairs(np.arange(Q) + 30), mu, np.zeros(Q, bool))
    jax.tree.map(np.testing.assert_array_equal, buf, before)


def test_ring_buffer_keeps_the_most_recent_labels(add_labels):
    buf = small_buffer()
    # label i has tag i and μ = i mod 3 / 2, so survivors can be identified by either
    added = []
    n = 5
    for call in range(5):  # 5 × 5 = 25 labels into 8 slots
        tags = np.arange(Q) + n * call
        mu = (tags % 3) / 2.0
        buf = add_labels(buf, jax.random.key(call), tagged_pairs(tags), np.asarray(mu, np.float32),
                         np.arange(Q) < n)
        added += tags[:n].tolist()
        recent = added[-CAP:]
        assert sorted(held_tags(buf)[held_tags(buf) >= 0].tolist()) == sorted(recent)
        # μ stays with its pair
        np.testing.assert_array_equal(np.asarray(buf.mu)[np.asarray(buf.filled)],
                                      (held_tags(buf)[np.asarray(buf.filled)] % 3) / 2.0)
        assert int(buf.count) == len(added)
        assert int(labels_lib.num_labels(buf)) == min(len(added), CAP)
    # slot = label index mod capacity: the ring overwrites the oldest slot first
    np.testing.assert_array_equal(held_tags(buf), [24, 17, 18, 19, 20, 21, 22, 23])
    assert int(buf.ptr) == 25 % CAP


def test_more_labels_than_capacity_at_once(add_labels):
    buf = small_buffer()
    mu = np.asarray((np.arange(Q) % 3) / 2.0, np.float32)
    # 11 of the 12 pairs are labeled (tag 1 is not): more than the 8 slots
    buf = add_labels(buf, jax.random.key(0), tagged_pairs(np.arange(Q)), mu, np.arange(Q) != 1)
    # only the last 8 survive (tags 4..11), each in the slot it would have reached one at a
    # time: label number i (0-based among the 11) goes to slot i mod 8
    np.testing.assert_array_equal(held_tags(buf), [9, 10, 11, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(buf.mu, (np.array([9, 10, 11, 4, 5, 6, 7, 8]) % 3) / 2.0)
    assert int(buf.count) == 11 and int(buf.ptr) == 3
    assert int(labels_lib.num_labels(buf)) == CAP
    # the next label evicts the oldest survivor (tag 4)
    buf = add_labels(buf, jax.random.key(1), tagged_pairs([99] * Q), mu, np.arange(Q) == 0)
    np.testing.assert_array_equal(held_tags(buf), [9, 10, 11, 99, 5, 6, 7, 8])


def test_heldout_and_boot_redrawn_for_overwritten_slots(add_labels):
    cap, members = 1000, 3
    buf = labels_lib.empty_label_buffer(cap, members, 1, (1,), (), jnp.float32, np.int32)

    def pairs(n, tag):
        return labels_lib.SegmentPairs(obs=np.full((n, 2, 1, 1), tag), action=np.zeros((n, 2, 1), np.int32),
                                       true_reward=np.zeros((n, 2, 1)))

    buf = add_labels(buf, jax.random.key(0), pairs(cap, 1.0), np.ones(cap), np.ones(cap, bool))
    old_held, old_boot = np.asarray(buf.heldout), np.asarray(buf.boot)
    # overwrite the first 400 slots
    mask = np.arange(cap) < 400
    buf = add_labels(buf, jax.random.key(1), pairs(cap, 2.0), np.zeros(cap), mask)
    new_held, new_boot = np.asarray(buf.heldout), np.asarray(buf.boot)
    # untouched slots keep their draws exactly
    np.testing.assert_array_equal(new_held[:, 400:], old_held[:, 400:])
    np.testing.assert_array_equal(new_boot[:, 400:], old_boot[:, 400:])
    # overwritten slots get fresh, independent draws: they differ from the old ones about as
    # often as two independent Bernoulli(1/e) draws do (2p(1−p) ≈ 0.465), and are 1/e held out
    p = labels_lib.HELDOUT_FRACTION
    changed = (new_held[:, :400] != old_held[:, :400]).mean()
    assert abs(changed - 2 * p * (1 - p)) < 0.07
    assert abs(new_held[:, :400].mean() - p) < 0.06
    assert (new_boot[:, :400] != old_boot[:, :400]).mean() > 0.4
    np.testing.assert_array_equal(np.asarray(buf.obs[:400, 0, 0, 0]), 2.0)
    np.testing.assert_array_equal(np.asarray(buf.obs[400:, 0, 0, 0]), 1.0)


def test_train_and_heldout_weights():
    buf = small_buffer(capacity=4, members=2).replace(
        filled=np.array([True, True, True, False]),
        heldout=np.array([[True, False, False, False], [False, False, True, True]]),
        boot=np.array([[2.0, 0.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0]]))
    np.testing.assert_array_equal(labels_lib.train_weights(buf), [[0, 0, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(labels_lib.heldout_weights(buf), [[1, 0, 0, 0], [0, 0, 1, 0]])
    pairs = labels_lib.as_pairs(buf)
    assert pairs.obs is buf.obs and pairs.num_pairs == 4


def test_bad_shapes_raise():
    buf = small_buffer()
    with pytest.raises(AssertionError):
        labels_lib.add_labels(buf, jax.random.key(0), tagged_pairs(np.arange(Q)), np.ones(Q - 1))
    with pytest.raises(AssertionError):
        labels_lib.add_labels(buf, jax.random.key(0), tagged_pairs(np.arange(Q)), np.ones(Q), np.ones(Q + 1, bool))


def test_heldout_fraction_constant():
    assert math.isclose(labels_lib.HELDOUT_FRACTION, math.exp(-1))
