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

A.2 holds the rate constant in blocks: it "is decreased every 5·10⁶ frames" to stay roughly
∝ c/(T + c).  With ``rate_step = S`` the rate within a block ``[kS, (k+1)S)`` is the curve's value
at the block's start, c/(kS + c), scaled so that the budget is still due at ``H``; ``due`` then
grows linearly within each block, through integer counts fixed at the block starts (the last
block ends at ``H``), so it stays integer and monotone in any precision.  ``rate_step=None`` is
the continuous curve above.

The untrained policy's first rollout is sized here too (:func:`initial_rollout_steps`): long
enough to hold every pair it offers as distinct clips.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np

# blocks of a rate held constant (``rate_step``) over the label horizon, at most: ``due`` looks the
# counts at their starts up in a table (a constant of the compiled program when traced)
MAX_RATE_BLOCKS = 100_000


@dataclasses.dataclass(frozen=True)
class LabelSchedule:
    total: int  # label budget
    initial: int  # labels asked about clips of the untrained policy, before RL starts
    total_steps: int  # environment steps of the run
    rate_constant: float  # c in c/(T + c)
    budget_steps: int | None = None  # H: the whole budget is due at this step (None: at total_steps)
    rate_step: int | None = None  # S: the rate is held for blocks of S steps (A.2); None: continuous

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
        if self.rate_step is not None:
            if self.rate_step < 1:
                raise ValueError(f"rate_step must be >= 1 step, got {self.rate_step}")
            if -(-self.horizon // self.rate_step) > MAX_RATE_BLOCKS:
                raise ValueError(f"rate_step {self.rate_step} cuts the label horizon ({self.horizon:,} steps) into more "
                                 f"than {MAX_RATE_BLOCKS:,} blocks; use a longer step, or the continuous rate (None)")

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
        if self.rate_step is not None:
            rate += f", held constant for blocks of {self.rate_step:,} steps"
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
        if self.rate_step is not None:
            return self._due_in_blocks(step, xp)
        frac = xp.log1p(xp.clip(xp.asarray(step, dtype=xp.float32), 0, self.total_steps) / self.rate_constant)
        frac = frac / math.log1p(self.horizon / self.rate_constant)
        # float32 rounding must not leave the final label undue at the last step
        n = xp.floor(self.initial + (self.total - self.initial) * frac + 1e-4)
        return xp.clip(n, self.initial, self.total).astype(xp.int32)

    def rate(self, step):
        """Instantaneous labels per environment step at ``step`` (∝ c / (T + c); with ``rate_step``,
        c / (T₀ + c) where T₀ is the start of the step's block)."""
        t = np.asarray(step, np.float64)
        if self.rate_step is None:
            scale = (self.total - self.initial) / math.log1p(self.horizon / self.rate_constant)
            return scale / (t + self.rate_constant)
        _, _, integral = self._blocks
        block_start = np.floor(t / self.rate_step) * self.rate_step
        return (self.total - self.initial) / integral / (block_start + self.rate_constant)

    # ------------------------------------------------------------------ the rate held in blocks (A.2)
    @functools.cached_property
    def _blocks(self):
        """Per block of the horizon: its start [K+1] (the last entry H), the labels due at each
        start [K+1] (``initial`` first, ``total`` last; monotone), and ∫₀ᴴ dT / (T₀(T) + c), the
        integral of the block-held rate before scaling (T₀: the start of T's block)."""
        h, s, c = self.horizon, self.rate_step, self.rate_constant
        starts = np.minimum(np.arange(-(-h // s) + 1, dtype=np.int64) * s, h)
        # each block at its start's rate, for its length (the last block ends at H)
        area = np.concatenate([[0.0], np.cumsum(np.diff(starts) / (starts[:-1] + c))])
        due = np.floor(self.initial + (self.total - self.initial) * area / area[-1] + 1e-9).astype(np.int64)
        due = np.clip(due, self.initial, self.total)
        due[-1] = self.total
        return starts, due.astype(np.int32), float(area[-1])

    def _due_in_blocks(self, step, xp):
        """``due`` with the rate held in blocks: the count at the block's start plus the block's
        share, linear in the steps taken into it (integer arithmetic for the step, so it is exact)."""
        starts, due_at, _ = self._blocks
        if xp is jnp:  # int32 steps (x64 off)
            if self.horizon >= 2**31:
                raise ValueError(f"on JAX arrays the step schedule needs a label horizon below 2**31 steps, "
                                 f"got {self.horizon:,}")
            itype, ftype = jnp.int32, jnp.float32
        else:
            itype, ftype = np.int64, np.float64
        t = xp.asarray(step)
        if not xp.issubdtype(t.dtype, xp.integer):
            t = xp.floor(t)
        # as the continuous curve: steps past the run's end count as its end; from H on, the whole budget
        t = xp.clip(t, 0, min(self.total_steps, self.horizon)).astype(itype)
        block = xp.minimum(t // min(self.rate_step, self.horizon), len(starts) - 2)
        start = xp.asarray(starts[:-1].astype(itype))[block]
        length = xp.asarray(np.diff(starts).astype(ftype))[block]
        gain = xp.asarray(np.diff(due_at).astype(ftype))[block]
        n = xp.asarray(due_at[:-1])[block] + xp.floor(gain * ((t - start).astype(ftype) / length)).astype(xp.int32)
        n = xp.where(t >= self.horizon, self.total, n)
        return xp.clip(n, self.initial, self.total).astype(xp.int32)


def label_schedule(total: int, total_steps: int, *, initial_fraction: float | None = None,
                   initial_count: int | None = None, rate_constant: float | None = None,
                   budget_steps: int | None = None, rate_step: int | None = None) -> LabelSchedule:
    """Build the appendix-A schedule.

    Give either ``initial_fraction`` (MuJoCo: 0.25 of the budget) or ``initial_count`` (Atari: 500;
    capped at the budget).  ``rate_constant`` defaults to a quarter of the horizon, which keeps the
    paper's shape (rate halves when T grows by c) on runs far shorter than the paper's; tasks
    from the papers pass the paper's constant.  ``budget_steps``: the step by which the whole
    budget is due (default: the run's last step).  ``rate_step``: the rate is held constant for
    blocks of this many steps (A.2); None: the continuous curve.
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
                         None if budget_steps is None else int(budget_steps),
                         None if rate_step is None else int(rate_step))


def initial_rollout_steps(pairs: int, segment_length: int) -> int:
    """Steps of the untrained policy's first rollout that hold ``pairs`` pairs of clips of
    ``segment_length`` steps without overlap: 2 · pairs · segment_length.  The length of Ibarz's
    initial trajectories (A.4 gives none; pairs: the initial labels, drawn uniformly) and of
    Christiano's first rollout with ``RunConfig.distinct_initial_clips`` (pairs: every candidate,
    ``candidate_factor`` per query)."""
    return 2 * int(pairs) * int(segment_length)
