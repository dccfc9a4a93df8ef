"""Synthetic teachers (layer 5): turn a batch of clip pairs into labels.

The oracle of Christiano §3 prefers the clip with the larger true return and calls it a tie when
the returns are equal.  The variants below are the "irrational" teachers researchers compare
against (in the style of B-Pref, Lee et al. 2021).  Every threshold is in the units of the
teacher's *perceived return* R — the (optionally discounted) sum of the true per-step rewards
of a clip, including any termination penalty — and is compared with R directly at every call,
so it means the same thing at the first iteration and the last one (nothing is rescaled by the
returns seen so far).

Order of decisions for one pair, with R¹, R² the perceived returns:

1. skip:  if max(R¹, R²) < ``skip_below`` the teacher does not answer (no label);
2. tie:   if |R¹ − R²| ≤ ``tie_within`` the label is 0.5 (equal returns always tie);
3. choice: σ¹ with probability sigmoid(β·(R¹ − R²)) when ``beta`` is finite (Boltzmann-rational),
          otherwise σ¹ exactly when R¹ > R²;
4. mistake: a strict label is flipped with probability ``mistake_rate``.

Perceived return: R = Σₜ γ^(L−1−t) rₜ with ``gamma`` the myopic discount (1 = no discount; the
myopic teacher weighs the end of a clip most, as a person remembers it best).

**One interface for every teacher** (:class:`Teacher`), as a host loop sees it: ``ask`` poses
selected pairs, ``collect`` hands back the answers that have arrived, as batches ready for
``labels.add_labels``.  :class:`OracleTeacher` is the oracle behind it (answers at once);
``rlhp_jax.human.teacher.HumanTeacher`` is people, through the label store (answers minutes
later).  The compiled loop calls ``SyntheticTeacher.label_pairs`` inside its program: the same
function the oracle's ``ask`` runs.  :func:`await_answers` is the one way a host loop waits for
people's answers (the driver's first labels, each of Ibarz's labeling points).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, NamedTuple, Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax.labels import SegmentPairs
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.preferences import check_labels, is_concrete


@dataclasses.dataclass(frozen=True)
class SyntheticTeacher:
    mistake_rate: float = 0.0  # probability a strict label is flipped
    beta: float = math.inf  # Boltzmann rationality; inf = always picks the larger return
    gamma: float = 1.0  # myopic discount over the clip; 1 = plain sum
    skip_below: float = -math.inf  # no answer when both perceived returns are below this
    tie_within: float = 0.0  # tie when perceived returns differ by at most this

    def __post_init__(self):
        if is_concrete(self.mistake_rate) and not 0.0 <= self.mistake_rate <= 1.0:
            raise ValueError(f"mistake_rate must be in [0, 1], got {self.mistake_rate}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0 (inf for a perfectly rational teacher), got {self.beta}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not self.tie_within >= 0:  # also rejects NaN, which would never tie, not even equal returns
            raise ValueError(f"tie_within must be >= 0, got {self.tie_within}")
        if math.isnan(self.skip_below):  # NaN would silently skip every pair
            raise ValueError(f"skip_below must be a number or -inf, got {self.skip_below}")

    def perceived_returns(self, rewards: jax.Array) -> jax.Array:
        """[..., L] true per-step rewards -> [...] the teacher's (discounted) clip return."""
        length = rewards.shape[-1]
        weights = self.gamma ** jnp.arange(length - 1, -1, -1, dtype=jnp.float32)
        return jnp.sum(rewards * weights, axis=-1)

    def label(self, key: jax.Array, rewards_1: jax.Array, rewards_2: jax.Array):
        """Label P pairs from their true per-step rewards ``[P, L]``.

        Returns ``(mu, answered)``: ``mu`` [P] in {0, 0.5, 1}; ``answered`` [P] bool, False where
        the teacher skipped (those must not be trained on).
        """
        chex.assert_rank([rewards_1, rewards_2], 2)
        chex.assert_equal_shape([rewards_1, rewards_2])
        k_choice, k_mistake = jax.random.split(key)
        r1, r2 = self.perceived_returns(rewards_1), self.perceived_returns(rewards_2)
        diff = r1 - r2
        if math.isinf(self.beta):
            first = diff > 0
        else:
            first = jax.random.uniform(k_choice, diff.shape) < jax.nn.sigmoid(self.beta * diff)
        flip = jax.random.uniform(k_mistake, diff.shape) < self.mistake_rate
        first = jnp.where(flip, ~first, first)
        tie = jnp.abs(diff) <= self.tie_within
        mu = jnp.where(tie, 0.5, first.astype(jnp.float32))
        answered = jnp.maximum(r1, r2) >= self.skip_below
        return mu, answered

    def label_pairs(self, key, pairs):
        """Convenience: label a ``SegmentPairs`` batch."""
        return self.label(key, pairs.true_reward[:, 0], pairs.true_reward[:, 1])


class Answers(NamedTuple):
    """A batch of answered pairs for ``labels.add_labels``."""

    pairs: SegmentPairs  # [q, 2, T, ...], padded to a compiled size
    mu: Any  # [q] labels in {0, 0.5, 1}
    mask: Any  # [q] bool: a label to train on (not padding, not skipped, not "can't tell")
    key: jax.Array  # the key the label set draws this batch's held-out flags and bootstrap counts with


class Teacher(Protocol):
    """Who answers a run's queries, as the host loop sees it.

    ``responses`` counts answers read so far, "can't tell" and skipped pairs included (the label
    schedule is met when responses and pending pairs reach the labels due); ``max_pending``
    caps the pairs waiting for an answer (None: no cap)."""

    asynchronous: bool  # answers arrive later (people), not at once
    responses: int
    max_pending: int | None

    def ask(self, pairs: SegmentPairs, render, take: int, keys, env_steps: int) -> None:
        """Pose the first ``take`` of ``pairs`` (``render``: what drawing their clips needs; ``keys``:
        (label, add) keys for a teacher that answers at once)."""

    def collect(self, key) -> list[Answers]:
        """The answers that arrived since the last call (``key``: for batches the teacher forms itself)."""

    def pending(self) -> int:
        """Pairs asked and not answered yet."""

    def withdraw_older_than(self, env_steps: int) -> int:
        """Stop offering pairs made before ``env_steps``; returns how many."""

    def publish(self, **facts) -> None:
        """Tell whoever answers how the run is doing (labels due, progress)."""

    def meta(self) -> dict:
        """What a checkpoint keeps of the teacher."""

    def restore(self, meta: dict) -> None:
        """Continue from a checkpoint's metadata."""

    def close(self) -> None:
        ...


WAIT_LOG_S = 15.0  # while waiting for people: seconds between progress lines
WAIT_POLL_S = 0.5  # ... and between looks at the answers


def await_answers(look: Callable[[int], int], report: Callable[[int, float], None],
                  log_s: float = WAIT_LOG_S, poll_s: float = WAIT_POLL_S) -> float:
    """Wait for people's answers; returns the seconds waited.

    ``look(i)``, for i = 1, 2, …, adds the answers that have arrived (the caller derives the i-th
    look's key from ``i``) and returns how many are still awaited; the wait ends at the first look
    that returns 0 or less (a teacher that answers at once: the first, with no pause).  Between
    looks it sleeps ``poll_s`` seconds, and calls ``report(awaited, seconds waited)`` at once and
    then every ``log_s`` seconds."""
    t0, last_log, looks = time.perf_counter(), -math.inf, 0
    while True:
        looks += 1
        awaited = look(looks)
        if awaited <= 0:
            return time.perf_counter() - t0
        if time.monotonic() - last_log >= log_s:
            report(awaited, time.perf_counter() - t0)
            last_log = time.monotonic()
        time.sleep(poll_s)


class OracleTeacher:
    """The synthetic oracle behind the :class:`Teacher` interface: labels pairs as they are asked."""

    asynchronous = False
    max_pending = None

    def __init__(self, teacher: SyntheticTeacher):
        self.teacher = teacher
        self.responses = 0
        self._label = program(self._label_first, quick=True)
        self._answers: list[Answers] = []

    def _label_first(self, key, pairs: SegmentPairs, take):
        """Labels of every pair and the mask of those to train on: the first ``take``, answered."""
        mu, ok = self.teacher.label_pairs(key, pairs)
        return mu, (jnp.arange(pairs.num_pairs) < take) & ok

    def ask(self, pairs: SegmentPairs, render, take: int, keys, env_steps: int) -> None:
        k_label, k_add = keys
        mu, mask = self._label(k_label, pairs, take)
        check_labels(np.asarray(mu)[np.asarray(mask)])
        self._answers.append(Answers(pairs, mu, mask, k_add))
        self.responses += take

    def collect(self, key) -> list[Answers]:
        answers, self._answers = self._answers, []
        return answers

    def pending(self) -> int:
        return 0

    def withdraw_older_than(self, env_steps: int) -> int:
        return 0

    def publish(self, **facts) -> None:
        pass

    def meta(self) -> dict:
        return dict(responses=self.responses)

    def restore(self, meta: dict) -> None:
        self.responses = int(meta["queries"])  # every pair asked was answered (or skipped) at once

    def close(self) -> None:
        pass
