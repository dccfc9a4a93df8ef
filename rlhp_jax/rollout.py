"""Collecting fixed-length rollouts from a batched environment with ``jax.lax.scan``.

The rollout keeps everything the environment reports (``true_reward``, ``terminated``,
``raw_reward``, ``render``) so that the oracle, the metrics and the clips can use it, but agents
must learn only from ``obs``, ``action``, ``boundary``, ``valid`` and a reward array passed in
separately (Christiano et al. 2017, appendix A).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlhp_jax.envs import EnvSpec, VecEnv

# policy_fn(params, obs [N, *obs_shape], key) -> (action, log_prob [N], value [N])
PolicyFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class Rollout(NamedTuple):
    """``num_steps`` steps of ``num_envs`` environments. Leading axes: [T, N].

    ``action`` is the policy's sample as drawn (for continuous tasks *before* clipping, so that
    ``log_prob`` refers to it); the environment received ``clip_action(spec, action)``.
    ``obs[t]`` is the observation the action was taken in; after a step with ``boundary`` (or a
    silent task reset) the next observation is already the fresh episode's first one.
    """

    obs: jax.Array  # [T, N, *obs_shape] float32
    action: jax.Array  # [T, N] int32 (discrete) or [T, N, act_dim] float32 (continuous)
    log_prob: jax.Array  # [T, N] log-prob of ``action`` under the behaviour policy
    value: jax.Array  # [T, N] value estimate of ``obs``
    boundary: jax.Array  # [T, N] bool, fixed-horizon episode ended with this step
    true_reward: jax.Array  # [T, N] task reward incl. terminal penalty (oracle / metrics only)
    terminated: jax.Array  # [T, N] bool, underlying task terminated (oracle / metrics only)
    raw_reward: jax.Array  # [T, N] unmodified task reward (metrics only)
    valid: jax.Array  # [T, N] bool, False on envpool's deferred-reset steps (action ignored)
    render: jax.Array  # [T, N, R] extra per-step data for rendering clips (R may be 0)
    last_obs: jax.Array  # [N, *obs_shape] observation after the last step
    last_value: jax.Array  # [N] value estimate of ``last_obs`` (for bootstrapping)


def clip_action(spec: EnvSpec, action: jax.Array) -> jax.Array:
    """The action the environment receives: continuous actions clipped to the bounds."""
    if spec.discrete:
        return action
    low = jnp.asarray(spec.action_low, jnp.float32)
    high = jnp.asarray(spec.action_high, jnp.float32)
    return jnp.clip(action, low, high)


def uniform_random_policy(spec: EnvSpec) -> PolicyFn:
    """A policy that ignores its parameters: uniform discrete actions, or uniform in [-1, 1] per
    action dimension (clips and saved queues of an untrained agent's kind of behaviour)."""

    def policy(params, obs, key):
        n = obs.shape[0]
        if spec.discrete:
            a = jax.random.randint(key, (n,), 0, spec.num_actions)
        else:
            a = jax.random.uniform(key, (n, spec.num_actions), minval=-1.0, maxval=1.0)
        return a, jnp.zeros(n), jnp.zeros(n)

    return policy


@functools.partial(jax.jit, static_argnames=("env", "policy_fn", "num_steps"))
def collect_rollout(
    env: VecEnv,
    policy_fn: PolicyFn,
    params: Any,
    env_state: Any,
    obs: jax.Array,
    key: jax.Array,
    num_steps: int,
) -> tuple[Any, jax.Array, Rollout]:
    """Run ``policy_fn`` for ``num_steps`` steps in every environment.

    Returns ``(env_state, next_obs, rollout)``; pass the first two back in to continue.
    ``env``, ``policy_fn`` and ``num_steps`` are static (hashable) arguments.
    """

    def step(carry, step_key):
        env_state, obs = carry
        k_act, k_env = jax.random.split(step_key)
        action, log_prob, value = policy_fn(params, obs, k_act)
        env_state, out = env.step(k_env, env_state, clip_action(env.spec, action))
        transition = (obs, action, log_prob, value, out.boundary, out.true_reward, out.terminated, out.raw_reward,
                      out.valid, out.render)
        return (env_state, out.obs), transition

    k_steps, k_last = jax.random.split(key)
    (env_state, last_obs), traj = jax.lax.scan(step, (env_state, obs), jax.random.split(k_steps, num_steps))
    _, _, last_value = policy_fn(params, last_obs, k_last)
    return env_state, last_obs, Rollout(*traj, last_obs=last_obs, last_value=last_value)
