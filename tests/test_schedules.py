"""Label schedules (schedules.py): Christiano appendix A, rate ∝ c / (T + c), continuous or held in
blocks (A.2: "decreased every 5·10⁶ frames")."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_jit
from hypothesis import given

from rlhp_jax.schedules import MAX_RATE_BLOCKS, LabelSchedule, label_schedule

budgets = st.integers(1, 100_000)
run_lengths = st.integers(1, 10**9)
fractions = st.floats(0.0, 1.0)
rate_constants = st.one_of(st.none(), st.floats(1.0, 1e9))


@given(budgets, run_lengths, fractions, rate_constants)
def test_monotone_and_exact_endpoints(total, total_steps, frac, c):
    s = label_schedule(total, total_steps, initial_fraction=frac, rate_constant=c)
    assert s.initial == round(frac * total)
    # numpy grid over the whole run, both ends included
    steps = np.unique(np.concatenate([np.linspace(0, total_steps, 257).astype(np.int64), [1, total_steps - 1]]))
    steps = steps[steps >= 0]
    due = s.due(steps)
    assert due.dtype == np.int32
    assert np.all(np.diff(due) >= 0), "schedule must never take labels back"
    assert due[0] == s.initial
    assert due[-1] == total
    assert np.all((due >= s.initial) & (due <= total))
    # Python ints and NumPy scalars give the same endpoints
    assert int(s.due(0)) == s.initial
    assert int(s.due(total_steps)) == total
    assert int(s.due(np.int64(total_steps))) == total
    # past the end and before the start: clipped, never beyond the budget
    assert int(s.due(total_steps * 3)) == total
    assert int(s.due(-5)) == s.initial


@given(budgets, st.integers(1, 2**31 - 1), fractions)
def test_jax_inputs(total, total_steps, frac):
    s = label_schedule(total, total_steps, initial_fraction=frac)
    steps = jnp.array([0, total_steps // 3, total_steps // 2, total_steps], jnp.int32)
    d = s.due(steps)
    assert isinstance(d, jax.Array) and d.dtype == jnp.int32
    d = np.asarray(d)
    assert d[0] == s.initial and d[-1] == total
    assert np.all(np.diff(d) >= 0)
    # NumPy and JAX agree (up to one label where float32 log1p implementations round apart)
    assert np.all(np.abs(d - s.due(np.asarray(steps))) <= 1)


def test_due_under_jit():
    s = label_schedule(700, 10_000, initial_fraction=0.25)
    f = fast_jit(s.due)
    assert int(f(jnp.int32(0))) == 175
    assert int(f(jnp.int32(10_000))) == 700
    np.testing.assert_array_equal(f(jnp.arange(0, 10_001, 500)), s.due(np.arange(0, 10_001, 500)))


def test_paper_settings():
    mujoco = label_schedule(700, 10**7, initial_fraction=0.25, rate_constant=2e6)
    assert mujoco.due(0) == 175 and mujoco.due(10**7) == 700
    atari = label_schedule(5500, 5 * 10**7, initial_count=500, rate_constant=5e6)
    assert atari.due(0) == 500 and atari.due(5 * 10**7) == 5500
    # the "no online queries" ablation: everything up front
    offline = label_schedule(1000, 10**6, initial_fraction=1.0)
    np.testing.assert_array_equal(offline.due(np.array([0, 1, 10**6])), 1000)
    # an initial count above the budget is capped (documented)
    assert label_schedule(100, 1000, initial_count=500).initial == 100


@given(budgets, run_lengths, fractions, rate_constants)
def test_initial_labels_due_at_step_zero(total, total_steps, frac, c):
    s = label_schedule(total, total_steps, initial_fraction=frac, rate_constant=c)
    assert int(s.due(0)) == s.initial
    # nothing extra is due until the rate has produced a whole label
    if s.initial == total:
        assert s.rate(0) == 0.0
        return
    first = 1.0 / s.rate(0)  # steps per label at the start
    if first > 4:
        assert int(s.due(int(first / 4))) == s.initial


@given(st.integers(10, 100_000), st.integers(100, 10**9), st.floats(0.0, 0.9), st.floats(0.0, 1e9))
def test_rate_halves_when_t_plus_c_doubles(total, total_steps, frac, t):
    s = label_schedule(total, total_steps, initial_fraction=frac)
    c = s.rate_constant
    r = s.rate(t)
    np.testing.assert_allclose(s.rate(2 * t + c), r / 2, rtol=1e-9)  # T + c doubled
    np.testing.assert_allclose(r * (t + c), s.rate(0) * c, rtol=1e-9)  # ∝ c / (T + c)
    assert s.rate(t + 1) < r


def test_rate_is_derivative_of_due():
    # a big budget so the floor in due() is negligible
    s = LabelSchedule(total=10**6, initial=0, total_steps=10**6, rate_constant=2.5e5)
    for t in (0, 10**5, 5 * 10**5, 9 * 10**5):
        h = 10**4
        slope = (int(s.due(t + h)) - int(s.due(t))) / h
        exact = s.rate(t + h / 2)  # midpoint rule
        np.testing.assert_allclose(slope, exact, rtol=0.01)
    # the paper's statement: after twice as many steps (T ≫ c), about half the rate
    s = LabelSchedule(total=1000, initial=250, total_steps=10**9, rate_constant=1e3)
    np.testing.assert_allclose(s.rate(2 * 10**8) / s.rate(10**8), 0.5, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(total=0, initial=0, total_steps=10, rate_constant=1.0), "budget must be at least 1"),
        (dict(total=-3, initial=0, total_steps=10, rate_constant=1.0), "budget must be at least 1"),
        (dict(total=10, initial=11, total_steps=10, rate_constant=1.0), "initial labels"),
        (dict(total=10, initial=-1, total_steps=10, rate_constant=1.0), "initial labels"),
        (dict(total=10, initial=2, total_steps=0, rate_constant=1.0), "total_steps"),
        (dict(total=10, initial=2, total_steps=-100, rate_constant=1.0), "total_steps"),
        (dict(total=10, initial=2, total_steps=10, rate_constant=0.0), "rate_constant"),
        (dict(total=10, initial=2, total_steps=10, rate_constant=-1.0), "rate_constant"),
    ],
)
def test_bad_schedule_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabelSchedule(**kwargs)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((0, 1000), {}, "budget must be at least 1"),
        ((100, 0), {}, "total_steps"),
        ((100, -1000), {}, "total_steps"),
        ((100, 1000), dict(initial_fraction=1.5), "initial_fraction"),
        ((100, 1000), dict(initial_fraction=-0.1), "initial_fraction"),
        ((100, 1000), dict(initial_count=-1), "initial labels"),
        ((100, 1000), dict(initial_fraction=0.1, initial_count=5), "not both"),
        ((100, 1000), dict(rate_constant=0.0), "rate_constant"),
    ],
)
def test_bad_label_schedule_raises(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        label_schedule(*args, **kwargs)


def test_default_rate_constant():
    s = label_schedule(100, 4000)
    assert s.rate_constant == 1000.0 and s.initial == 25
    assert math.isclose(s.rate(s.rate_constant), s.rate(0) / 2)


@given(st.integers(1_000, 10**9), st.integers(0, 10**8))
def test_rate_follows_a1_formula_whatever_the_run_length(total_steps, t):
    """A.1: the rate after T steps ∝ 2·10⁶/(T + 2·10⁶) — the shape is the paper's, not stretched
    over the run (a 1M-step run's rate ends at 2/3 of where it started, as the paper's does)."""
    s = label_schedule(700, total_steps, initial_fraction=0.25, rate_constant=2e6)
    assert s.rate(t) / s.rate(0) == pytest.approx(2e6 / (t + 2e6), rel=1e-9)


def test_a_run_that_ends_before_the_horizon_asks_what_is_due_then_and_says_so():
    c, horizon, run = 2e6, 10_000_000, 1_000_000
    s = label_schedule(700, run, initial_fraction=0.25, rate_constant=c, budget_steps=horizon)
    want = 175 + 525 * math.log1p(run / c) / math.log1p(horizon / c)
    assert s.labels_in_run == int(s.due(run)) == math.floor(want) < 700
    assert int(s.due(horizon)) == s.labels_in_run  # nothing is asked after the run's end
    assert f"it will ask {s.labels_in_run} of the 700 labels" in s.describe()
    assert "1,000,000" in s.describe() and "10,000,000" in s.describe()
    # the same constant with no horizon spends the budget by the run's end, and says so
    whole = label_schedule(700, run, initial_fraction=0.25, rate_constant=c)
    assert whole.labels_in_run == 700 and "all due by step 1,000,000" in whole.describe()
    # the rate's shape is the same either way; only the budget spent differs
    assert s.rate(run) / s.rate(0) == pytest.approx(whole.rate(run) / whole.rate(0))
    with pytest.raises(ValueError, match="horizon"):
        label_schedule(700, run, rate_constant=c, budget_steps=0)


def test_default_rate_constant_follows_the_horizon():
    """Without a paper constant, c is a quarter of the steps over which the budget is spread."""
    assert label_schedule(20, 4096).rate_constant == 1024
    assert label_schedule(20, 4096, budget_steps=40_000).rate_constant == 10_000


# ------------------------------------------------------------------ A.2: the rate held in blocks
def held(total, total_steps, frac, c, step, horizon=None):
    """A schedule whose rate is held for blocks of ``step`` steps, the blocks capped at MAX_RATE_BLOCKS."""
    h = total_steps if horizon is None else horizon
    step = max(step, -(-h // MAX_RATE_BLOCKS))
    return label_schedule(total, total_steps, initial_fraction=frac, rate_constant=c, budget_steps=horizon,
                          rate_step=step)


def grid(s):
    """Steps over the run: both ends, and both sides of every block start (up to 64 blocks)."""
    starts = np.arange(0, s.horizon + 1, s.rate_step, dtype=np.int64)[:64]
    steps = np.concatenate([np.linspace(0, s.total_steps, 129).astype(np.int64), starts, starts - 1, starts + 1,
                            [1, s.total_steps - 1, s.total_steps, s.horizon - 1, s.horizon]])
    return np.unique(np.clip(steps, 0, s.total_steps))


GRID_MAX = 129 + 3 * 64 + 5  # the most steps grid() returns


@given(budgets, run_lengths, fractions, rate_constants, st.integers(1, 10**9))
def test_held_rate_is_monotone_integer_and_spends_the_budget_at_the_horizon(total, total_steps, frac, c, step):
    s = held(total, total_steps, frac, c, step)
    steps = grid(s)
    due = s.due(steps)
    assert due.dtype == np.int32
    assert np.all(np.diff(due) >= 0), "schedule must never take labels back"
    assert due[0] == s.initial and due[-1] == total
    assert np.all((due >= s.initial) & (due <= total))
    # Python ints, NumPy scalars and floats give what the array gives
    assert int(s.due(0)) == s.initial and int(s.due(total_steps)) == total
    assert int(s.due(np.int64(total_steps))) == total and int(s.due(float(total_steps))) == total
    for t in steps[:: max(1, len(steps) // 8)]:
        assert int(s.due(int(t))) == int(due[np.searchsorted(steps, t)])
    assert int(s.due(total_steps * 3)) == total and int(s.due(-5)) == s.initial


@given(budgets, st.integers(1, 2**31 - 1), fractions, st.integers(1, 2**31 - 1))
def test_held_rate_on_jax_arrays(total, total_steps, frac, step):
    s = held(total, total_steps, frac, None, step)
    # one length for every example (the grid's last step repeated), so the eager JAX ops compile once
    steps = np.pad(grid(s), (0, GRID_MAX - len(grid(s))), mode="edge")
    d = s.due(jnp.asarray(steps, jnp.int32))
    assert isinstance(d, jax.Array) and d.dtype == jnp.int32
    d = np.asarray(d)
    assert d[0] == s.initial and d[-1] == total
    assert np.all(np.diff(d) >= 0)
    # NumPy (float64 within a block) and JAX (float32) agree up to one label
    assert np.all(np.abs(d - s.due(steps)) <= 1)


def test_held_rate_under_jit():
    s = label_schedule(700, 10_000, initial_fraction=0.25, rate_constant=2_500, rate_step=1_000)
    f = fast_jit(s.due)
    assert int(f(jnp.int32(0))) == 175 and int(f(jnp.int32(10_000))) == 700
    steps = np.arange(0, 10_001, 50)
    np.testing.assert_array_equal(f(jnp.asarray(steps, jnp.int32)), s.due(steps))


@given(st.integers(100, 100_000), st.integers(10**4, 10**9), st.floats(0.0, 0.9), rate_constants,
       st.integers(1, 10**9))
def test_held_rate_is_the_curve_at_each_blocks_start(total, total_steps, frac, c, step):
    """Within a block the rate is constant at c/(T₀ + c) (T₀: the block's start), scaled like the
    continuous curve's; due() grows by that rate over the block, to the label."""
    s = held(total, total_steps, frac, c, step)
    c, step = s.rate_constant, s.rate_step
    for k in (0, 1, 2, (s.horizon - 1) // step):
        t0 = k * step
        if t0 >= s.total_steps:
            continue
        end = min(t0 + step, s.total_steps, s.horizon)
        assert s.rate(t0) == s.rate(end - 1) == pytest.approx(s.rate(0) * c / (t0 + c), rel=1e-12)
        gained = int(s.due(end)) - int(s.due(t0))
        assert abs(gained - s.rate(t0) * (end - t0)) <= 1 + 1e-9
        assert s.rate(end) < s.rate(t0) or end >= s.horizon


def test_a2_rate_is_decreased_every_five_million_steps():
    """A.2: 500 labels up front, then a rate ∝ 5·10⁶/(T + 5·10⁶) "decreased every 5·10⁶ frames"."""
    s = label_schedule(5500, 50_000_000, initial_count=500, rate_constant=5e6, rate_step=5_000_000)
    assert int(s.due(0)) == 500 and int(s.due(50_000_000)) == 5500
    blocks = np.arange(0, 50_000_000, 5_000_000)
    per_block = np.diff(s.due(np.append(blocks, 50_000_000)))
    # the labels of each block: ∝ 1/(k + 1), to the label
    expected = 5000 * (1 / (np.arange(10) + 1)) / np.sum(1 / (np.arange(10) + 1))
    assert np.all(np.abs(per_block - expected) <= 1)
    # constant within the first block: the same labels in its first and its last million steps
    first = np.diff(s.due(np.array([0, 1_000_000, 4_000_000, 5_000_000])))
    assert abs(first[0] - first[2]) <= 1
    assert s.rate(5_000_000) == pytest.approx(s.rate(4_999_999) / 2)
    assert "held constant for blocks of 5,000,000 steps" in s.describe()
    # None: the continuous curve, exactly as before
    continuous = label_schedule(5500, 50_000_000, initial_count=500, rate_constant=5e6)
    assert continuous.rate_step is None and "held" not in continuous.describe()
    steps = np.arange(0, 50_000_001, 1_000_000)
    frac = np.log1p(np.clip(steps.astype(np.float32), 0, 5e7) / 5e6) / math.log1p(10)
    np.testing.assert_array_equal(continuous.due(steps), np.clip(np.floor(500 + 5000 * frac + 1e-4), 500, 5500))


def test_bad_rate_step_raises():
    with pytest.raises(ValueError, match="rate_step must be >= 1"):
        label_schedule(100, 1000, rate_step=0)
    with pytest.raises(ValueError, match="more than 100,000 blocks"):
        label_schedule(100, 10**9, rate_step=1000)
    s = label_schedule(100, 2**31, rate_step=2**30)  # NumPy counts any step; JAX's int32 steps cannot
    assert int(s.due(2**31)) == 100
    with pytest.raises(ValueError, match="below 2\\*\\*31"):
        s.due(jnp.int32(5))


@given(budgets, st.integers(1, 10**8), st.integers(1, 10**9), fractions, st.integers(1, 10**9))
def test_held_rate_with_a_horizon_past_the_run(total, run, horizon, frac, step):
    """A run that ends before the label horizon asks what is due at its end, and nothing after."""
    s = held(total, run, frac, 2e6, step, horizon=max(horizon, run))
    due = s.due(grid(s))
    assert np.all(np.diff(due) >= 0) and due[0] == s.initial
    assert int(s.due(run)) == s.labels_in_run == int(s.due(10 * s.horizon)) <= total
    if s.horizon == run:
        assert s.labels_in_run == total
