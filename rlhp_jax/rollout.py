"""Collecting fixed-length rollouts from a batched environment with ``jax.lax.scan`` (layer 1: pure
functions against the ``core.VecEnv`` protocol, whichever environment implements it).

The rollout keeps everything the environment reports (``true_reward``, ``terminated``,
``raw_reward``, ``render``) so that the oracle, the metrics and the clips can use it, but agents
must learn only from ``obs``, ``action``, ``boundary``, ``valid`` and a reward array passed in
separately (Christiano et al. 2017, appendix A).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlhp_jax.core import EnvSpec, PolicyFn, Rollout, VecEnv, clip_action, episode_ends

def uniform_random_policy(spec: EnvSpec) -> PolicyFn:
    """A policy that ignores its parameters: uniformly random actions over the task's action space
    (discrete, or uniform within the continuous bounds): the untrained-agent clips and queues, the
    baseline's random-policy reward statistics, the probes of ``experiments.reward_inputs``."""

    def policy(params, obs, key):
        n = obs.shape[0]
        if spec.discrete:
            a = jax.random.randint(key, (n,), 0, spec.num_actions, jnp.int32)
        else:
            low, high = jnp.asarray(spec.action_low, jnp.float32), jnp.asarray(spec.action_high, jnp.float32)
            a = jax.random.uniform(key, (n, spec.num_actions), minval=low, maxval=high)
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


def transition_obs(spec: EnvSpec, rollout: Rollout) -> jax.Array:
    """[T, N, 2·D] each step's observation and the next side by side, ``[o_t, o_{t+1}]``: the input
    of an r̂ of the transition (``EnsembleConfig.next_obs``, ours; the papers' r̂ sees (o_t, a_t)).
    ``o_{t+1}`` is the next step's observation, ``last_obs`` after the rollout's last step.  Where
    an episode ends (``core.episode_ends``) the next observation may already be the fresh
    episode's (a gymnax task resets within the step), so those steps get ``o_t`` again: one step
    of MuJoCo's 1000 sees no motion rather than a jump to the start."""
    obs = rollout.obs
    nxt = jnp.concatenate([obs[1:], rollout.last_obs[None]], axis=0)
    ends = episode_ends(spec, rollout.boundary, rollout.terminated)
    nxt = jnp.where(ends.reshape(ends.shape + (1,) * (obs.ndim - 2)), obs, nxt)
    return jnp.concatenate([obs, nxt], axis=-1)
