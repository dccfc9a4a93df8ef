"""A trained run's policy, read back from its run directory (layer 6: driver): what demo recording
(``python -m rlhp_jax.demos_cli record --run DIR``) plays.

Both protocols: the newest models of an Ibarz run (DQfD, ε-greedy) or the newest checkpoint of a
Christiano run (the agent's greedy action, ε-greedy), restored through the drivers' own templates
(``ibarz.load_models``, ``PreferenceRun.restore_latest``).  Its own module, not :mod:`rlhp_jax.runs`:
it needs both drivers, and both drivers import ``runs``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from rlhp_jax import tasks
from rlhp_jax.agents.dqfd import DQfD
from rlhp_jax.config import IbarzConfig, RunConfig
from rlhp_jax.demos import DemoError
from rlhp_jax.driver import PreferenceRun
from rlhp_jax.ensemble import RewardEnsemble
from rlhp_jax.envs import make_env
from rlhp_jax.ibarz import load_models
from rlhp_jax.reward_models import reward_model_spec_for
from rlhp_jax.runs import read_run_config

__all__ = ["load_policy", "run_env"]


def run_env(cfg: RunConfig | IbarzConfig, env: str | None = None, num_envs: int = 1):
    """The environment a run's policy acts in: ``env`` (default: the run's task) with the run's
    wrapper options (for an Ibarz run that set none on Atari, Ibarz A.1's)."""
    options = cfg.env_kwargs() if isinstance(cfg, IbarzConfig) else dict(cfg.env_options)
    return make_env(env or cfg.env, num_envs, **options)


def load_policy(run_dir: str | os.PathLike, env, epsilon: float):
    """``act(obs, key)`` of a trained policy: the newest models of an Ibarz run (DQfD, ε-greedy)
    or the newest checkpoint of a Christiano run (the agent's greedy action, ε-greedy).  Raises
    ``DemoError`` when the run trained on another task than ``env``'s or has no checkpoint, and
    ``ValueError`` when ``run_dir`` is no run directory."""
    run = Path(run_dir)
    cfg = read_run_config(run)
    trained_on = tasks.find(cfg.env)
    if (trained_on.name if trained_on else cfg.env) != env.spec.name:
        raise DemoError(f"{run} trained on {cfg.env}, not {env.spec.name}")
    if not isinstance(cfg, RunConfig):  # Ibarz et al.'s protocol
        agent = DQfD(env.spec, cfg.agent_config)
        rm = RewardEnsemble(dataclasses.replace(reward_model_spec_for(env.spec), dropout_rate=cfg.reward_dropout),
                            cfg.reward_model)
        params, _, _ = load_models(run, agent, rm, agent.init(jax.random.PRNGKey(0)).params,
                                   rm.init(jax.random.PRNGKey(0)))
        act_jit = jax.jit(lambda o, k: agent.act(params, o, k, epsilon))
        return lambda obs, key: act_jit(jnp.asarray(obs), key)
    pr = PreferenceRun(cfg, progress=False, resume=True)
    restored = pr.restore_latest()
    if restored is None:
        raise DemoError(f"{run}: no checkpoint to record a policy from")
    state, _ = restored
    params = state["agent"].params
    greedy = jax.jit(pr.agent.act_deterministic)

    def act(obs, key):
        k1, k2 = jax.random.split(key)
        a = greedy(params, jnp.asarray(obs))
        rand = jax.random.randint(k1, a.shape, 0, env.spec.num_actions)
        return jnp.where(jax.random.uniform(k2, a.shape) < epsilon, rand, a)

    return act
