"""Bradley-Terry preference model (layer 1: pure math).

Christiano et al. 2017, §2.2.3, eq. (1): the probability that a person prefers segment 1 is a
softmax over the two segments' summed (undiscounted) predicted rewards.  Both papers assume
the person answers uniformly at random a fraction ``error_rate`` of the time (10 %), giving

    P_e[σ¹ ≻ σ²] = (1 − ε) · softmax(R¹, R²)₁ + ε / 2        (Ibarz et al. 2018, A.3)

Labels ``mu`` are the probability mass the person put on segment 1: 1 (prefers σ¹), 0
(prefers σ²) or 0.5 (equally good).  "Can't tell" answers are not labels and never reach
these functions.

Everything here is pure, jit- and vmap-safe, and works on any batch shape.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

VALID_LABELS = (0.0, 0.5, 1.0)


def is_concrete(x) -> bool:
    """True for a value known now (a number or array), False for a JAX tracer: config checks
    skip traced settings, such as an error rate the compiled loop is vmapped over."""
    return not isinstance(x, jax.core.Tracer)


def preference_logit(returns_1: jax.Array, returns_2: jax.Array) -> jax.Array:
    """log-odds of σ¹ ≻ σ² under the plain Bradley-Terry model: R¹ − R²."""
    return jnp.asarray(returns_1) - jnp.asarray(returns_2)


def _log_probs(returns_1, returns_2, error_rate):
    """(log P[σ¹ ≻ σ²], log P[σ² ≻ σ¹]) with the random-response error model, computed stably.

    log((1-ε)·σ(d) + ε/2) = logaddexp(log(1-ε) + log σ(d), log(ε/2)); log σ(d) = -softplus(-d)
    never overflows, so returns of ±1e4 (or more) are fine.
    """
    d = preference_logit(returns_1, returns_2)
    eps = jnp.asarray(error_rate, d.dtype)
    log_sig_1 = -jax.nn.softplus(-d)
    log_sig_2 = -jax.nn.softplus(d)
    log_keep = jnp.log1p(-eps)
    log_rand = jnp.log(eps / 2.0)
    lp1 = jnp.logaddexp(log_keep + log_sig_1, log_rand)
    lp2 = jnp.logaddexp(log_keep + log_sig_2, log_rand)
    return lp1, lp2


def preference_probability(returns_1, returns_2, error_rate=0.1) -> jax.Array:
    """P[σ¹ ≻ σ²] = (1 − ε)·softmax + ε/2, elementwise over any (broadcastable) batch shape.

    Args:
      returns_1, returns_2: summed predicted rewards of the two segments.
      error_rate: ε, the probability that the person answers uniformly at random (0 ≤ ε ≤ 1).
    """
    d = preference_logit(returns_1, returns_2)
    eps = jnp.asarray(error_rate, d.dtype)
    return (1.0 - eps) * jax.nn.sigmoid(d) + eps / 2.0


def segment_returns(rewards: jax.Array) -> jax.Array:
    """Undiscounted sum of per-step rewards over the last (time) axis: [..., T] -> [...]."""
    return jnp.sum(rewards, axis=-1)


def preference_log_likelihoods(rewards_1, rewards_2, mu, error_rate=0.1) -> jax.Array:
    """Per-pair cross-entropy −[μ log P(σ¹≻σ²) + (1−μ) log P(σ²≻σ¹)], shape [batch]."""
    lp1, lp2 = _log_probs(segment_returns(rewards_1), segment_returns(rewards_2), error_rate)
    mu = jnp.asarray(mu, lp1.dtype)
    return -(mu * lp1 + (1.0 - mu) * lp2)


def bradley_terry_loss(rewards_1, rewards_2, mu, error_rate=0.1, weights=None) -> jax.Array:
    """Mean cross-entropy between the labels and the Bradley-Terry prediction (Christiano §2.2.3).

    Args:
      rewards_1, rewards_2: per-step predicted rewards, ``[batch, T]``; summed over T, no discount.
      mu: ``[batch]`` probability that σ¹ is preferred: 1, 0, or 0.5 for a tie.
      error_rate: ε of the random-response error model (10 % in both papers).
      weights: optional ``[batch]`` non-negative weights (bootstrap counts, masks); the loss is
        the weighted mean, and 0 when all weights are 0.
    """
    chex.assert_rank([rewards_1, rewards_2], 2)
    chex.assert_equal_shape([rewards_1, rewards_2])
    chex.assert_rank(mu, 1)
    chex.assert_equal(mu.shape[0], rewards_1.shape[0])
    per_pair = preference_log_likelihoods(rewards_1, rewards_2, mu, error_rate)
    if weights is None:
        return jnp.mean(per_pair)
    chex.assert_equal_shape([weights, mu])
    w = jnp.asarray(weights, per_pair.dtype)
    return jnp.sum(w * per_pair) / jnp.maximum(jnp.sum(w), 1e-8)


def target_return_loss(rewards, true_rewards) -> jax.Array:
    """The "target" ablation of Christiano §3.3: squared error between predicted and true clip
    returns (an oracle that reports each clip's total reward instead of a preference).

    ``rewards`` and ``true_rewards`` are per-step ``[batch, 2, T]``; returns the mean over clips.
    """
    chex.assert_rank(rewards, 3)
    chex.assert_equal_shape([rewards, true_rewards])
    return jnp.mean(jnp.square(jnp.sum(rewards, -1) - jnp.sum(true_rewards, -1)))


def label_entropy_bound(mu, error_rate=0.1, weights=None) -> jax.Array:
    """The smallest Bradley-Terry loss any reward model can reach on labels ``mu`` (Ibarz C, Fig. 7).

    With the error model the predicted probability lies in [ε/2, 1 − ε/2], so the per-label minimum
    is the cross-entropy of μ against μ clipped to that range: log 2 for a tie ("indifferent"
    label, Ibarz's label entropy) and −log(1 − ε/2) for a strict label (0 without the error model).
    Weighted mean over labels (``weights``: e.g. which buffer slots are filled).
    """
    mu = jnp.asarray(mu, jnp.float32)
    p = jnp.clip(mu, error_rate / 2, 1.0 - error_rate / 2)
    xlogy = lambda a, b: jnp.where(a > 0, a * jnp.log(jnp.maximum(b, 1e-30)), 0.0)
    per = -(xlogy(mu, p) + xlogy(1.0 - mu, 1.0 - p))
    w = jnp.ones_like(per) if weights is None else jnp.asarray(weights, jnp.float32)
    return jnp.sum(w * per) / jnp.maximum(jnp.sum(w), 1e-8)


def preference_accuracy(returns_1, returns_2, mu, weights=None) -> jax.Array:
    """Fraction of strict labels (μ ≠ 0.5) whose preferred side has the larger predicted return.

    Ties carry no ranking to get right and are left out; returns NaN when no strict label is
    present (and weighted by ``weights`` if given).
    """
    mu = jnp.asarray(mu)
    strict = (mu != 0.5).astype(jnp.float32)
    w = strict if weights is None else strict * jnp.asarray(weights, jnp.float32)
    r1, r2 = jnp.asarray(returns_1), jnp.asarray(returns_2)
    # equal predicted returns rank nothing: wrong for either label (not "right" for μ = 0)
    correct = jnp.where(mu > 0.5, r1 > r2, r2 > r1).astype(jnp.float32)
    total = jnp.sum(w)
    return jnp.where(total > 0, jnp.sum(w * correct) / jnp.maximum(total, 1e-8), jnp.nan)


def check_labels(mu) -> None:
    """Raise ValueError unless every label is one of 0, 0.5, 1 (host-side validation)."""
    import numpy as np

    arr = np.asarray(mu, dtype=np.float64)
    bad = ~np.isin(arr, VALID_LABELS)
    if bad.any():
        examples = ", ".join(repr(float(x)) for x in arr[bad][:5])
        raise ValueError(
            f"Preference labels must be 0 (second segment preferred), 0.5 (tie) or 1 (first "
            f"preferred); got {int(bad.sum())} invalid value(s), e.g. {examples}. "
            "'Can't tell' answers are dropped, not encoded as labels."
        )
