"""Label schedules (layer 4).

Christiano appendix A: a first batch of comparisons from the untrained policy (25 % of the
budget on MuJoCo, 500 on Atari), then labels at a rate ∝ c / (T + c) after T environment steps
(c = 2·10⁶ on MuJoCo, 5·10⁶ on Atari): "after twice as many timesteps have elapsed, we answer
about half as many queries per unit time".  Integrating the rate, the number of labels due by
step T is

    due(T) = initial + (total − initial) · ln(1 + T/c) / ln(1 + T_total/c)

which is monotone and reaches ``total`` exactly at ``T_total``.  The "no online queries"
ablation is ``initial = total``.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class LabelSchedule:
    total: int  # label budget
    initial: int  # labels asked about clips of the untrained policy, before RL starts
    total_steps: int  # environment steps of the run
    rate_constant: float  # c in c/(T + c)

    def __post_init__(self):
        if self.total < 1:
            raise ValueError(f"The label budget must be at least 1, got {self.total}. "
                             "Use the true-reward baseline to train without labels.")
        if not 0 <= self.initial <= self.total:
            raise ValueError(f"initial labels ({self.initial}) must be between 0 and the budget ({self.total})")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.rate_constant <= 0:
            raise ValueError(f"rate_constant must be > 0, got {self.rate_constant}")

    def due(self, step):
        """Cumulative labels that should have been collected by environment step ``step``.

        Works on Python ints, NumPy and JAX arrays; integer-valued (floor), clipped to [initial, total].
        """
        xp = jnp if not isinstance(step, (int, float, np.ndarray, np.generic)) else np
        frac = xp.log1p(xp.clip(xp.asarray(step, dtype=xp.float32), 0, self.total_steps) / self.rate_constant)
        frac = frac / math.log1p(self.total_steps / self.rate_constant)
        # float32 rounding must not leave the final label undue at the last step
        n = xp.floor(self.initial + (self.total - self.initial) * frac + 1e-4)
        return xp.clip(n, self.initial, self.total).astype(xp.int32)

    def rate(self, step):
        """Instantaneous labels per environment step at ``step`` (∝ c / (T + c))."""
        scale = (self.total - self.initial) / math.log1p(self.total_steps / self.rate_constant)
        return scale / (np.asarray(step, np.float64) + self.rate_constant)


def label_schedule(total: int, total_steps: int, *, initial_fraction: float | None = None,
                   initial_count: int | None = None, rate_constant: float | None = None) -> LabelSchedule:
    """Build the appendix-A schedule.

    Give either ``initial_fraction`` (MuJoCo: 0.25 of the budget) or ``initial_count`` (Atari: 500;
    capped at the budget).  ``rate_constant`` defaults to ``total_steps / 4``, which keeps the
    paper's shape (rate halves when T grows by c) on runs far shorter than the paper's.
    """
    if initial_fraction is not None and initial_count is not None:
        raise ValueError("Give initial_fraction or initial_count, not both")
    if initial_count is None:
        frac = 0.25 if initial_fraction is None else float(initial_fraction)
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"initial_fraction must be in [0, 1], got {frac}")
        initial_count = int(round(frac * total))
    initial_count = min(int(initial_count), int(total))
    c = float(rate_constant) if rate_constant is not None else max(total_steps / 4.0, 1.0)
    return LabelSchedule(int(total), initial_count, int(total_steps), c)
