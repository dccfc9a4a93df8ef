"""The paper's environment modifications (Christiano appendix A) on the gymnax backend."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax.envs import make_env
from rlhp_jax.tasks import names as supported_envs

STEPS = 600
NUM_ENVS = 4


def _run(env, seed=0, steps=STEPS):
    """Random actions for ``steps`` steps; returns the stacked StepOuts as numpy arrays."""

    def body(carry, key):
        state = carry
        k_act, k_env = jax.random.split(key)
        if env.spec.discrete:
            action = jax.random.randint(k_act, (env.num_envs,), 0, env.spec.num_actions)
        else:
            action = jax.random.uniform(k_act, (env.num_envs, env.spec.num_actions), minval=-2.0, maxval=2.0)
        state, out = env.step(k_env, state, action)
        return state, out

    k_reset, k_run = jax.random.split(jax.random.PRNGKey(seed))
    state, _ = env.reset(k_reset)
    _, outs = jax.jit(lambda s, k: jax.lax.scan(body, s, jax.random.split(k, steps)))(state, k_run)
    return jax.tree.map(np.asarray, outs)


@pytest.fixture(scope="module")
def cartpole_reset():
    return _run(make_env("CartPole-v1", NUM_ENVS))


@pytest.fixture(scope="module")
def cartpole_continue():
    return _run(make_env("CartPole-v1", NUM_ENVS, on_terminate="continue", terminal_penalty=-1.0))


def test_boundary_only_at_the_fixed_horizon(cartpole_reset):
    horizon = make_env("CartPole-v1", 1).spec.horizon
    steps_with_boundary = np.nonzero(cartpole_reset.boundary.any(axis=1))[0]
    np.testing.assert_array_equal(steps_with_boundary, [horizon - 1])
    assert cartpole_reset.boundary[horizon - 1].all()


def test_reset_mode_penalty_exactly_when_the_task_terminates(cartpole_reset):
    out = cartpole_reset
    assert out.terminated.sum() > 20  # a random policy drops the pole every ~20 steps
    np.testing.assert_allclose(out.true_reward - out.raw_reward, np.where(out.terminated, -10.0, 0.0))
    # after a silent reset the pole is upright again: the raw reward stays 1 throughout
    np.testing.assert_array_equal(out.raw_reward, 1.0)


def test_continue_mode_penalises_every_step_out_of_range(cartpole_continue):
    out = cartpole_continue
    assert out.terminated.sum() >= 1
    # once out of range the task pays 0 and the penalty -1 applies on every such step
    out_of_range = out.true_reward < 0
    assert out_of_range.sum() > 5 * out.terminated.sum()
    np.testing.assert_allclose(out.true_reward[out_of_range], -1.0)
    # 'terminated' marks the step of leaving the range: that step still pays the task's 1, minus 1
    np.testing.assert_allclose(out.true_reward[out.terminated], 0.0)
    # and the physics was not reset: the next step is out of range too (unless the episode ended)
    t, e = np.nonzero(out.terminated[:-1])
    assert (out.true_reward[t + 1, e] < 0).all()


def test_reset_state_has_no_weakly_typed_leaves():
    """gymnax starts CartPole's ``time`` from a Python 0 (weakly typed); a checkpoint gives it back
    strongly typed, and every program taking the state would compile again on resume."""
    state, _ = make_env("CartPole-v1", 2).reset(jax.random.PRNGKey(0))
    weak = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(state) if x.weak_type]
    assert weak == []


def test_no_termination_signal_in_the_agent_view():
    env = make_env("Pendulum-v1", 2)
    out = _run(env, steps=250)
    assert not out.terminated.any()
    assert out.boundary[199].all() and out.boundary.sum() == 2
    assert np.isfinite(out.obs).all() and out.obs.shape == (250, 2, 3)


def test_unknown_env_and_bad_settings_raise():
    with pytest.raises(ValueError, match="Unknown environment 'Hoper'.*Supported environments.*CartPole-v1.*Pong.*Hopper"):
        make_env("Hoper", 2)
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        make_env("CartPole-v1", 0)
    with pytest.raises(ValueError, match="on_terminate must be 'reset' or 'continue'"):
        make_env("CartPole-v1", 1, on_terminate="explode")
    assert {"CartPole-v1", "Pendulum-v1", "Pong", "Hopper", "InvertedDoublePendulum"} <= set(supported_envs())


def test_obs_dtype_and_action_space_of_spec():
    spec = make_env("Pendulum-v1", 1).spec
    assert not spec.discrete and spec.action_shape == (1,)
    assert spec.action_low == (-2.0,) and spec.action_high == (2.0,)
    spec = make_env("CartPole-v1", 1).spec
    assert spec.discrete and spec.action_shape == () and spec.action_dtype == jnp.int32


def test_minatar_game_over_is_a_silent_reset_with_a_penalty():
    env = make_env("Breakout-MinAtar", 2)
    assert env.spec.obs_shape == (10, 10, 4) and env.spec.discrete and env.spec.on_terminate == "reset"
    out = _run(env, steps=300)
    t, n = np.nonzero(out.terminated)
    assert len(t) >= 2  # random paddles lose the ball quickly
    np.testing.assert_allclose(out.true_reward[t, n] - out.raw_reward[t, n], -10.0)
    assert not out.boundary[t, n].any() and not out.boundary.any()  # horizon 1000 not reached
    assert out.valid.all() and out.render.shape == (300, 2, 0)


def test_reward_model_kind_follows_the_observation():
    from rlhp_jax.core import EnvSpec
    from rlhp_jax.reward_models import reward_model_spec_for

    spec = lambda shape: EnvSpec("x", shape, True, 4, None, None, 100, 0.0, 25, 1.0)
    assert reward_model_spec_for(spec((84, 84, 4))).kind == "cnn"  # Atari: the A.2 CNN
    assert reward_model_spec_for(spec((10, 10, 4))).kind == "mlp"  # MinAtar: too small for its convs
    assert reward_model_spec_for(spec((11,))).kind == "mlp"


DEFERRED_CHECK = r"""
import sys
from rlhp_jax.envs import make_env

make_env("CartPole-v1", 2)
# gymnax's plotting libraries were not run (seaborn brings scipy.stats and pandas) ...
print(sorted(m for m in ("scipy.stats", "pandas", "seaborn.palettes", "matplotlib.figure") if m in sys.modules))
# ... yet each works when used, through gymnax's own names and through a later import
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import gymnax.environments.misc.pong as pong
print(type(plt.figure()).__name__, len(pong.sns.color_palette("cubehelix", 3)), callable(pong.plt.subplots))
import seaborn
print(seaborn is sys.modules["seaborn"], "scipy.stats" in sys.modules)
"""


def test_gymnax_import_defers_its_plotting_libraries_until_used():
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", DEFERRED_CHECK], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).parents[1]))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["[]", "Figure 3 True", "True True"], out.stdout


@pytest.mark.parametrize("options, says", [(dict(bogus_option=1), "unknown env option 'bogus_option'"),
                                           (dict(horizon=0), "horizon must be a whole number"),
                                           (dict(segment_length=2.5), "segment_length must be a whole number"),
                                           (dict(reward_std=float("nan")), "reward_std must be a finite number > 0")])
def test_a_classic_task_refuses_options_it_does_not_take(options, says):
    """Atari and MuJoCo refused an unknown option; a gymnax task ran as it is (``--env-options
    '(("horizn",100),)'`` trained at the default horizon without a word) or with a horizon of 0."""
    from rlhp_jax.envs import make_env

    with pytest.raises(ValueError, match=re.escape(says)):
        make_env("CartPole-v1", 2, **options)
