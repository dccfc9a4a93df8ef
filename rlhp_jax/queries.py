"""Segments, candidate pairs and query selection (layer 4: data).

Christiano §2.2.4: sample many pairs of trajectory segments, have every ensemble member predict
which one will be preferred, and ask about the pairs on which the members disagree most (the
highest variance of the predicted preference probability).  Appendix A draws 10× more
candidates than queries.  Random selection is the ablation.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhp_jax.core import sample_indices
from rlhp_jax.labels import SegmentPairs

CANDIDATE_FACTOR = 10  # Christiano A: "a factor 10 more clip pair candidates"


def valid_segment_starts(boundary: jax.Array, length: int, excluded: jax.Array | None = None) -> jax.Array:
    """[T, N] step flags -> [T - length + 1, N] bool: may a segment of ``length`` start here?

    A segment must not run across an episode boundary (``boundary[t]`` = the environment reset
    after step t, so a boundary on the segment's last step is fine) and must not contain any
    step flagged in ``excluded`` (e.g. a deferred-reset step that is not a real transition).
    """
    t_len = boundary.shape[0]
    if length > t_len:
        raise ValueError(f"Segment length {length} is longer than the rollout ({t_len} steps)")
    b = jnp.concatenate([jnp.zeros_like(boundary[:1], jnp.int32), jnp.cumsum(boundary.astype(jnp.int32), 0)])
    n_starts = t_len - length + 1
    # boundaries on steps start .. start+length-2
    crossings = b[length - 1: length - 1 + n_starts] - b[:n_starts]
    ok = crossings == 0
    if excluded is not None:
        e = jnp.concatenate([jnp.zeros_like(excluded[:1], jnp.int32), jnp.cumsum(excluded.astype(jnp.int32), 0)])
        ok &= (e[length: length + n_starts] - e[:n_starts]) == 0
    return ok


def sample_segment_starts(key: jax.Array, boundary: jax.Array, num_segments: int, length: int,
                          excluded: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Draw ``num_segments`` clip starts uniformly among the valid ones of a ``[T, N]`` rollout.

    Returns ``(t0, env)``, each ``[num_segments]`` int32: clip ``i`` covers steps
    ``t0[i] .. t0[i] + length - 1`` of environment ``env[i]``.
    """
    valid = valid_segment_starts(boundary, length, excluded)
    n_envs = valid.shape[1]
    flat = sample_indices(key, valid.reshape(-1), num_segments)  # no valid start: any start
    return (flat // n_envs).astype(jnp.int32), (flat % n_envs).astype(jnp.int32)


def gather_segments(x: jax.Array, t0: jax.Array, env: jax.Array, length: int) -> jax.Array:
    """``[T, N, ...]`` time-major array -> ``[S, length, ...]`` the clips starting at (t0, env)."""
    steps = t0[:, None] + jnp.arange(length)[None, :]
    return x[steps, env[:, None]]


def segment_sums(values: jax.Array, t0: jax.Array, env: jax.Array, length: int) -> jax.Array:
    """Sums of ``[..., T, N]`` per-step values over the clips (t0, env) -> ``[..., S]``, through a
    cumulative sum, so scoring many candidate clips never gathers their frames."""
    c = jnp.cumsum(values, axis=-2)
    c = jnp.concatenate([jnp.zeros_like(c[..., :1, :]), c], axis=-2)
    return c[..., t0 + length, env] - c[..., t0, env]


def sample_segments(key: jax.Array, obs: jax.Array, action: jax.Array, true_reward: jax.Array,
                    boundary: jax.Array, num_segments: int, length: int,
                    excluded: jax.Array | None = None):
    """Draw ``num_segments`` clips of ``length`` steps uniformly among the valid starts.

    Inputs are time-major rollout arrays ``[T, N, ...]``; returns ``(obs, action, true_reward)``
    each ``[num_segments, length, ...]``.
    """
    t0, env = sample_segment_starts(key, boundary, num_segments, length, excluded)
    take = lambda x: gather_segments(x, t0, env, length)
    return take(obs), take(action), take(true_reward)


def sample_candidate_pairs(key: jax.Array, obs, action, true_reward, boundary, num_pairs: int,
                           length: int, excluded=None) -> SegmentPairs:
    """``num_pairs`` pairs of independently drawn segments from one rollout, ``[P, 2, L, ...]``."""
    o, a, r = sample_segments(key, obs, action, true_reward, boundary, 2 * num_pairs, length, excluded)
    pair = lambda x: x.reshape(num_pairs, 2, *x.shape[1:])
    return SegmentPairs(obs=pair(o), action=pair(a), true_reward=pair(r))


def select_by_disagreement(probs: jax.Array, k: int, valid: jax.Array | None = None) -> jax.Array:
    """Indices of the ``k`` candidates whose predicted P[σ¹ ≻ σ²] varies most across members.

    Args:
      probs: ``[members, candidates]`` predicted preference probabilities.
      k: number of queries to keep (static).
      valid: optional ``[candidates]`` bool; only these compete (the rest rank last). Lets a
        caller keep one compiled shape while the number of live candidates varies.
    Returns: ``[k]`` int32 indices, highest variance first.
    """
    chex.assert_rank(probs, 2)
    if not 1 <= k <= probs.shape[1]:
        raise ValueError(f"Cannot select {k} queries from {probs.shape[1]} candidates")
    variance = jnp.var(probs, axis=0)
    if valid is not None:
        variance = jnp.where(valid, variance, -jnp.inf)
    return jax.lax.top_k(variance, k)[1]


def select_random(key: jax.Array, num_candidates: int, k: int, valid: jax.Array | None = None) -> jax.Array:
    """``k`` distinct candidate indices uniformly at random (the "random queries" ablation).

    With ``valid``, the valid candidates come first in random order, then the others.
    """
    if not 1 <= k <= num_candidates:
        raise ValueError(f"Cannot select {k} queries from {num_candidates} candidates")
    priority = jax.random.uniform(key, (num_candidates,))
    if valid is not None:
        priority = jnp.where(valid, priority, -1.0)
    return jax.lax.top_k(priority, k)[1]


def take_pairs(pairs: SegmentPairs, idx: jax.Array) -> SegmentPairs:
    return jax.tree.map(lambda x: x[idx], pairs)
