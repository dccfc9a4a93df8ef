"""Label schedules (layer 4).

Christiano appendix A: a first batch of comparisons from the untrained policy (25 % of the
budget on MuJoCo, 500 on Atari), then labels at a rate ∝ c / (T + c) after T environment steps
(c = 2·10⁶ on MuJoCo, 5·10⁶ on Atari): "after twice as many timesteps have elapsed, we answer
about half as many queries per unit time".  Integrating the rate, the number of labels due by
step T is

    due(T) = initial + (total − initial) · ln(1 + T/c) / ln(1 + H/c)

which is monotone and reaches ``total`` exactly at the horizon ``H``.  ``c`` is the paper's
constant where the task has one (the presets pass it), so the *shape* of the rate never depends
on how long a run is: over a 1M-step MuJoCo run the rate falls only to c/(1M + c) = 2/3 of its
start, as it does over the first 1M steps of the paper's runs.  ``H`` is the run's length unless
a horizon is given (``budget_steps``): a run that ends before it asks only ``due(T_end)``
labels, and ``describe()`` says so before the run starts.  The "no online queries" ablation is
``initial = total``.
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
    budget_steps: int | None = None  # H: the whole budget is due at this step (None: at total_steps)

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
        if self.budget_steps is not None and self.budget_steps < 1:
            raise ValueError(f"the label horizon must be >= 1 step, got {self.budget_steps}")

    @property
    def horizon(self) -> int:
        """The step at which the whole budget is due."""
        return self.total_steps if self.budget_steps is None else self.budget_steps

    @property
    def labels_in_run(self) -> int:
        """Labels the run asks for by its last step (the budget, unless it ends before the horizon)."""
        return int(self.due(self.total_steps))

    def describe(self) -> str:
        """One line for the run's log: the schedule, and what happens to the budget."""
        rate = f"rate ∝ {self.rate_constant:.3g}/(T + {self.rate_constant:.3g})"
        text = f"label schedule: {self.initial} of {self.total} labels before RL, then {rate}"
        if self.labels_in_run < self.total:
            return (f"{text}; the budget is due by step {self.horizon:,} but the run ends at step "
                    f"{self.total_steps:,}: it will ask {self.labels_in_run} of the {self.total} labels")
        return f"{text}; all due by step {min(self.horizon, self.total_steps):,}"

    def due(self, step):
        """Cumulative labels that should have been collected by environment step ``step``.

        Works on Python ints, NumPy and JAX arrays; integer-valued (floor), clipped to [initial, total].
        """
        xp = jnp if not isinstance(step, (int, float, np.ndarray, np.generic)) else np
        frac = xp.log1p(xp.clip(xp.asarray(step, dtype=xp.float32), 0, self.total_steps) / self.rate_constant)
        frac = frac / math.log1p(self.horizon / self.rate_constant)
        # float32 rounding must not leave the final label undue at the last step
        n = xp.floor(self.initial + (self.total - self.initial) * frac + 1e-4)
        return xp.clip(n, self.initial, self.total).astype(xp.int32)

    def rate(self, step):
        """Instantaneous labels per environment step at ``step`` (∝ c / (T + c))."""
        scale = (self.total - self.initial) / math.log1p(self.horizon / self.rate_constant)
        return scale / (np.asarray(step, np.float64) + self.rate_constant)


def label_schedule(total: int, total_steps: int, *, initial_fraction: float | None = None,
                   initial_count: int | None = None, rate_constant: float | None = None,
                   budget_steps: int | None = None) -> LabelSchedule:
    """Build the appendix-A schedule.

    Give either ``initial_fraction`` (MuJoCo: 0.25 of the budget) or ``initial_count`` (Atari: 500;
    capped at the budget).  ``rate_constant`` defaults to a quarter of the horizon, which keeps the
    paper's shape (rate halves when T grows by c) on runs far shorter than the paper's; tasks
    from the papers pass the paper's constant.  ``budget_steps``: the step by which the whole
    budget is due (default: the run's last step).
    """
    if initial_fraction is not None and initial_count is not None:
        raise ValueError("Give initial_fraction or initial_count, not both")
    if initial_count is None:
        frac = 0.25 if initial_fraction is None else float(initial_fraction)
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"initial_fraction must be in [0, 1], got {frac}")
        initial_count = int(round(frac * total))
    initial_count = min(int(initial_count), int(total))
    horizon = total_steps if budget_steps is None else budget_steps
    c = float(rate_constant) if rate_constant is not None else max(horizon / 4.0, 1.0)
    return LabelSchedule(int(total), initial_count, int(total_steps), c,
                         None if budget_steps is None else int(budget_steps))
