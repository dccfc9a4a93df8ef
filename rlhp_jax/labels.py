"""The label set D of (σ¹, σ², μ) triples (layer 1: a data structure on the core types, under the
ensemble and the drivers that use it).

A fixed-capacity ring buffer held as arrays, so adding labels and sampling training batches
stay inside ``jit`` with static shapes however many labels have arrived.  With
``capacity`` equal to the whole label budget nothing is ever evicted; with a smaller capacity
it keeps only the most recent labels (Christiano A.2 keeps the last 3,000 on Atari).

Each slot also carries, for every ensemble member,

* ``heldout[m, i]`` — whether label i is in member m's validation set (probability 1/e,
  Christiano §2.2.3), drawn once when the label arrives;
* ``boot[m, i]`` — how many times label i appears in member m's bootstrap resample, a
  Poisson(1) count drawn once when the label arrives.  This is the online form of "|D|
  triples sampled from D with replacement" (Oza & Russell 2001): as D grows, each member's
  resample grows with it and the resample of the labels already there does not change.
"""

from __future__ import annotations

import math
from typing import Iterator

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

HELDOUT_FRACTION = 1.0 / math.e  # Christiano §2.2.3


class SegmentPairs(struct.PyTreeNode):
    """A batch of clip pairs, ``[pairs, 2, T, ...]``."""

    obs: jax.Array
    action: jax.Array
    true_reward: jax.Array  # [pairs, 2, T]; what the synthetic oracle judges, never trained on

    @property
    def num_pairs(self) -> int:
        return self.obs.shape[0]


class LabelBuffer(struct.PyTreeNode):
    obs: jax.Array  # [C, 2, T, *obs_shape]
    action: jax.Array  # [C, 2, T, *action_shape]
    true_reward: jax.Array  # [C, 2, T] kept for diagnostics only
    mu: jax.Array  # [C] float32 in {0, 0.5, 1}
    filled: jax.Array  # [C] bool: slot holds a label
    heldout: jax.Array  # [M, C] bool
    boot: jax.Array  # [M, C] float32 Poisson(1) bootstrap counts
    count: jax.Array  # int32, labels ever added
    ptr: jax.Array  # int32, next slot to write

    @property
    def capacity(self) -> int:
        return self.mu.shape[0]

    @property
    def num_members(self) -> int:
        return self.heldout.shape[0]


def bucket(n: int) -> int:
    """Round a count of pairs up to a power of two, so few batch shapes are ever compiled."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def padded_batches(pairs: dict, mu: np.ndarray, max_batch: int) -> Iterator[tuple[SegmentPairs, np.ndarray, np.ndarray]]:
    """Host arrays of labeled pairs (``pairs``: obs, action, true_reward ``[n, 2, T, ...]``; ``mu``
    [n], NaN for "can't tell") in batches of at most ``max_batch``, each padded with zeros to a
    power-of-two size (:func:`bucket`): yields ``(pairs, mu, mask)`` for :func:`add_labels`, with
    ``mask`` true on the real pairs that have a label to train on."""
    n = len(mu)
    for lo in range(0, n, max_batch):
        hi = min(n, lo + max_batch)
        q = bucket(hi - lo)
        pad = lambda x: np.concatenate([x[lo:hi], np.zeros((q - (hi - lo), *x.shape[1:]), x.dtype)])
        batch = SegmentPairs(obs=jnp.asarray(pad(pairs["obs"])), action=jnp.asarray(pad(pairs["action"])),
                             true_reward=jnp.asarray(pad(pairs["true_reward"]), jnp.float32))
        m = pad(np.asarray(mu))
        mask = (np.arange(q) < hi - lo) & np.isfinite(m)
        yield batch, np.nan_to_num(m), mask


def empty_label_buffer(capacity: int, num_members: int, segment_length: int, obs_shape, action_shape,
                       obs_dtype=jnp.float32, action_dtype=jnp.float32) -> LabelBuffer:
    if capacity < 1:
        raise ValueError(f"Label buffer capacity must be >= 1, got {capacity}")
    c, m, t = int(capacity), int(num_members), int(segment_length)
    return LabelBuffer(
        obs=jnp.zeros((c, 2, t, *obs_shape), obs_dtype),
        action=jnp.zeros((c, 2, t, *action_shape), action_dtype),
        true_reward=jnp.zeros((c, 2, t), jnp.float32),
        mu=jnp.zeros((c,), jnp.float32),
        filled=jnp.zeros((c,), bool),
        heldout=jnp.zeros((m, c), bool),
        boot=jnp.zeros((m, c), jnp.float32),
        count=jnp.zeros((), jnp.int32),
        ptr=jnp.zeros((), jnp.int32),
    )


def add_labels(buffer: LabelBuffer, key: jax.Array, pairs: SegmentPairs, mu: jax.Array,
               mask: jax.Array | None = None, heldout_fraction: float = HELDOUT_FRACTION) -> LabelBuffer:
    """Append the labeled pairs where ``mask`` is true (all when None); jittable.

    Oldest labels are overwritten once the buffer is full.  Each new label gets fresh
    held-out flags and bootstrap counts for every member.
    """
    q = pairs.num_pairs
    chex.assert_shape(mu, (q,))
    mask = jnp.ones((q,), bool) if mask is None else jnp.asarray(mask, bool)
    chex.assert_shape(mask, (q,))
    cap = buffer.capacity
    order = jnp.cumsum(mask.astype(jnp.int32)) - 1
    slots = jnp.where(mask, (buffer.ptr + order) % cap, cap)  # cap = out of range -> dropped
    # If more labels than capacity arrive at once, only the last `cap` of them are kept.
    n_new = jnp.sum(mask.astype(jnp.int32))
    keep = mask & (order >= n_new - cap)
    slots = jnp.where(keep, slots, cap)

    k_held, k_boot = jax.random.split(key)
    m = buffer.num_members
    held_new = jax.random.bernoulli(k_held, heldout_fraction, (m, q))
    boot_new = jax.random.poisson(k_boot, 1.0, (m, q)).astype(jnp.float32)

    def put(dst, src):
        return dst.at[slots].set(src.astype(dst.dtype), mode="drop")

    def put_members(dst, src):
        return dst.at[:, slots].set(src.astype(dst.dtype), mode="drop")

    return buffer.replace(
        obs=put(buffer.obs, pairs.obs),
        action=put(buffer.action, pairs.action),
        true_reward=put(buffer.true_reward, pairs.true_reward),
        mu=put(buffer.mu, jnp.asarray(mu, jnp.float32)),
        filled=put(buffer.filled, jnp.ones((q,), bool)),
        heldout=put_members(buffer.heldout, held_new),
        boot=put_members(buffer.boot, boot_new),
        count=buffer.count + n_new,
        ptr=(buffer.ptr + n_new) % cap,
    )


def num_labels(buffer: LabelBuffer) -> jax.Array:
    """Labels currently held (≤ capacity)."""
    return jnp.sum(buffer.filled.astype(jnp.int32))


def train_weights(buffer: LabelBuffer, bootstrap: bool = True) -> jax.Array:
    """[M, C] sampling weights of each member's training resample (0 for held-out/empty);
    ``bootstrap=False``: every training label weighs 1 (uniform sampling, Ibarz A.4)."""
    train = buffer.filled[None] & ~buffer.heldout
    return buffer.boot * train if bootstrap else train.astype(jnp.float32)


def heldout_weights(buffer: LabelBuffer) -> jax.Array:
    """[M, C] 0/1 weights of each member's validation set."""
    return (buffer.filled[None] & buffer.heldout).astype(jnp.float32)


def as_pairs(buffer: LabelBuffer) -> SegmentPairs:
    return SegmentPairs(obs=buffer.obs, action=buffer.action, true_reward=buffer.true_reward)
