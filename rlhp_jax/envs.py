"""Environment protocol (layer 3) and its pure-JAX gymnax backend.

Every driver and agent talks to a batch of environments through the same small protocol::

    env = make_env("CartPole-v1", num_envs=8)
    state, obs = env.reset(key)                      # obs: [num_envs, *obs_shape]
    state, out = env.step(key, state, action)        # out: StepOut, every field [num_envs, ...]

The modifications of Christiano et al. 2017, appendix A, live here and only here:

* The agent never sees termination; every episode has the same length, ``horizon``.  What
  happens instead depends on the task's ``on_terminate``:

  - ``"continue"`` (Christiano A.1, robotics): the simulation runs on outside the healthy
    range and ``terminal_penalty`` is added to the *true* reward on every step spent there
    (the agent must learn to stay in range);
  - ``"reset"`` (A.2, Atari-style): the emulator resets silently, the clock keeps running,
    and ``terminal_penalty`` is added once, on the step that terminated.

  The true reward is read only by the synthetic oracle and the metrics.
* The only boundary the agent sees is ``StepOut.boundary``, the fixed-horizon reset, which
  carries no information about the task.
* ``StepOut.true_reward`` and ``StepOut.terminated`` sit beside, never inside, what the agent
  learns from; agents read ``obs``, ``action`` and ``boundary`` only.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rlhp_jax import deferred, tasks
from rlhp_jax.core import EnvSpec, StepOut, VecEnv


# gymnax's package imports seaborn and matplotlib.pyplot for its own rendering, which this
# project never calls: they stand deferred while gymnax is imported (``deferred``).
GYMNAX_PLOTTING_IMPORTS = ("seaborn", "matplotlib.pyplot")


def import_gymnax():
    """``gymnax``, imported with its plotting libraries deferred (``GYMNAX_PLOTTING_IMPORTS``)."""
    return deferred.import_module("gymnax", deferring=GYMNAX_PLOTTING_IMPORTS)


@struct.dataclass
class GymnaxState:
    inner: Any  # batched gymnax env state
    t: jax.Array  # [num_envs] int32 step within the fixed-length episode


class GymnaxVecEnv:
    """A batch of gymnax environments with the paper's fixed-horizon, penalty-not-termination rule."""

    def __init__(self, name: str, num_envs: int, **overrides: Any):
        gymnax = import_gymnax()  # here: keep its import cost off modules that do not step envs

        task = tasks.resolve(name)
        if task.backend != "gymnax":
            raise ValueError(f"{name!r} is not a gymnax task; gymnax tasks: {', '.join(tasks.names('gymnax'))}.")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        name = task.name
        settings = dict(horizon=task.horizon, terminal_penalty=task.terminal_penalty,
                        segment_length=task.segment_length, reward_std=task.reward_std,
                        on_terminate=task.on_terminate)
        unknown = sorted(set(overrides) - set(settings))
        if unknown:  # (a misspelt option ran the task as it is, without a word)
            raise ValueError(f"unknown env option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                             f"for {name}; its options: {', '.join(settings)}")
        settings.update(overrides)
        for key in ("horizon", "segment_length"):
            if not (isinstance(settings[key], int) and not isinstance(settings[key], bool) and settings[key] >= 1):
                raise ValueError(f"env option {key} must be a whole number of steps >= 1, got {settings[key]!r}")
        for key in ("terminal_penalty", "reward_std"):
            if isinstance(settings[key], bool) or not isinstance(settings[key], (int, float)) \
                    or not math.isfinite(settings[key]) or (key == "reward_std" and settings[key] <= 0):
                raise ValueError(f"env option {key} must be a finite number{' > 0' if key == 'reward_std' else ''}, "
                                 f"got {settings[key]!r}")
        self._env, params = gymnax.make(name)
        # The wrapper owns the clock: the inner task must never time out by itself.
        if hasattr(params, "max_steps_in_episode"):
            params = params.replace(max_steps_in_episode=10**9)
        self._params = params
        self.num_envs = int(num_envs)
        obs_space = self._env.observation_space(params)
        act_space = self._env.action_space(params)
        discrete = hasattr(act_space, "n")
        if discrete:
            num_actions, low, high = int(act_space.n), None, None
        else:
            shape = tuple(act_space.shape) or (1,)
            num_actions = int(shape[0])
            low = tuple(float(x) for x in jnp.broadcast_to(act_space.low, shape))
            high = tuple(float(x) for x in jnp.broadcast_to(act_space.high, shape))
        self._scalar_action = not discrete and tuple(act_space.shape) == ()
        self.spec = EnvSpec(
            name=name,
            obs_shape=tuple(obs_space.shape),
            discrete=discrete,
            num_actions=num_actions,
            action_low=low,
            action_high=high,
            horizon=int(settings["horizon"]),
            terminal_penalty=float(settings["terminal_penalty"]),
            segment_length=int(settings["segment_length"]),
            reward_std=float(settings["reward_std"]),
            on_terminate=str(settings["on_terminate"]),
        )
        if self.spec.on_terminate not in ("reset", "continue"):
            raise ValueError(f"on_terminate must be 'reset' or 'continue', got {self.spec.on_terminate!r}")

    # -- single-environment pieces (vmapped below) --------------------------------------
    def _reset_one(self, key):
        obs, inner = self._env.reset_env(key, self._params)
        return obs.astype(jnp.float32), inner

    def _step_one(self, key, inner, t, action):
        k_step, k_reset = jax.random.split(key)
        act = action
        if self._scalar_action:
            act = action[..., 0]
        elif not self.spec.discrete:
            act = action
        was_out = jnp.asarray(self._env.is_terminal(inner, self._params), bool)
        obs, inner_next, reward, done, _ = self._env.step_env(k_step, inner, act, self._params)
        out_of_range = jnp.asarray(done, bool)
        t_next = t + 1
        boundary = t_next >= self.spec.horizon
        raw = jnp.asarray(reward, jnp.float32)
        if self.spec.on_terminate == "continue":
            terminated = out_of_range & ~was_out  # the step on which the task would have ended
            true_reward = raw + jnp.where(out_of_range, self.spec.terminal_penalty, 0.0)
            do_reset = boundary
        else:
            terminated = out_of_range
            true_reward = raw + jnp.where(terminated, self.spec.terminal_penalty, 0.0)
            do_reset = terminated | boundary
        reset_obs, reset_inner = self._reset_one(k_reset)
        inner_next = jax.tree.map(lambda a, b: jnp.where(do_reset, a, b), reset_inner, inner_next)
        obs = jnp.where(do_reset, reset_obs, obs.astype(jnp.float32))
        t_next = jnp.where(boundary, 0, t_next)
        return inner_next, t_next, StepOut(obs, true_reward, terminated, boundary, raw,
                                           valid=jnp.ones((), bool), render=jnp.zeros((0,), jnp.float32))

    # -- the protocol -------------------------------------------------------------------
    def reset(self, key: jax.Array) -> tuple[GymnaxState, jax.Array]:
        keys = jax.random.split(key, self.num_envs)
        obs, inner = jax.vmap(self._reset_one)(keys)
        # gymnax starts some fields from Python scalars (CartPole's ``time = 0``), so they come out
        # weakly typed; a checkpoint restores them strongly typed, and the programs that take the
        # state would compile again on resume.  Strong types from the start: the same programs.
        inner = jax.tree.map(lambda x: jnp.asarray(x, x.dtype), inner)
        return GymnaxState(inner=inner, t=jnp.zeros(self.num_envs, jnp.int32)), obs

    def step(self, key: jax.Array, state: GymnaxState, action: jax.Array) -> tuple[GymnaxState, StepOut]:
        keys = jax.random.split(key, self.num_envs)
        inner, t, out = jax.vmap(self._step_one)(keys, state.inner, state.t, action)
        return GymnaxState(inner=inner, t=t), out

    # -- evaluation on the unmodified task ----------------------------------------------
    def episodic_eval_step(self, key, inner, action):
        """One step of the *unmodified* task (for evaluation): returns (inner, obs, reward, done)."""
        act = action[..., 0] if self._scalar_action else action
        obs, inner_next, reward, done, _ = self._env.step_env(key, inner, act, self._params)
        return inner_next, obs.astype(jnp.float32), jnp.asarray(reward, jnp.float32), jnp.asarray(done, bool)

    def episodic_reset(self, key):
        return self._reset_one(key)


def make_env(name: str, num_envs: int, **overrides: Any) -> VecEnv:
    """Build a batched environment by name (any spelling ``tasks.resolve`` accepts: gymnax, Atari or
    MuJoCo). Raises ValueError listing the supported names."""
    if tasks.resolve(name).backend == "gymnax":
        return GymnaxVecEnv(name, num_envs, **overrides)
    from rlhp_jax import envpool_envs

    return envpool_envs.EnvpoolVecEnv(name, num_envs, **overrides)
