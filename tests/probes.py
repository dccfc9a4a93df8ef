"""Probe environments for agent tests: tiny, pure-JAX tasks with a known best action."""

from __future__ import annotations

import jax.numpy as jnp

from rlhp_jax.core import EnvSpec, StepOut


class ProbeEnv:
    """Constant observation; reward depends on the action only.

    Discrete: reward 1 for action 1, else 0.  Continuous (bounds [-1, 1]): reward -(a - 0.5)^2.
    ``raw_reward`` reports the action the environment received (to check clipping).
    """

    def __init__(self, num_envs: int, continuous: bool, horizon: int = 4):
        self.num_envs = num_envs
        self.continuous = continuous
        self.spec = EnvSpec(
            name="probe", obs_shape=(1,), discrete=not continuous, num_actions=1 if continuous else 2,
            action_low=(-1.0,) if continuous else None, action_high=(1.0,) if continuous else None,
            horizon=horizon, terminal_penalty=0.0, segment_length=2, reward_std=1.0,
        )

    def _obs(self):
        return jnp.ones((self.num_envs, 1), jnp.float32)

    def reset(self, key):
        return jnp.zeros(self.num_envs, jnp.int32), self._obs()

    def step(self, key, t, action):
        if self.continuous:
            received = action[:, 0]
            reward = -((received - 0.5) ** 2)
        else:
            received = action.astype(jnp.float32)
            reward = (action == 1).astype(jnp.float32)
        t = t + 1
        boundary = t >= self.spec.horizon
        out = StepOut(self._obs(), reward, jnp.zeros_like(boundary), boundary, received,
                      valid=jnp.ones_like(boundary), render=jnp.zeros((self.num_envs, 0)))
        return jnp.where(boundary, 0, t), out


def probe_training(agent, env, num_updates: int, reset_key):
    """A pure ``train(state, key) -> (state, params_after_each_update, rollouts, metrics)``:
    ``num_updates`` rollouts of ``agent.config.num_steps`` steps on ``env``, each followed by an
    update on the true reward (jit it; the agent tests share it)."""
    import jax

    from rlhp_jax.rollout import collect_rollout

    def train(state, key):
        env_state, obs = env.reset(reset_key)

        def body(carry, k):
            state, env_state, obs = carry
            k_roll, k_upd = jax.random.split(k)
            env_state, obs, ro = collect_rollout(env, agent.policy, state.params, env_state, obs, k_roll,
                                                 agent.config.num_steps)
            state, metrics = agent.update(state, ro, ro.true_reward, k_upd)
            return (state, env_state, obs), (state.params, ro, metrics)

        (state, _, _), (params, rollouts, metrics) = jax.lax.scan(
            body, (state, env_state, obs), jax.random.split(key, num_updates))
        return state, params, rollouts, metrics

    return train

