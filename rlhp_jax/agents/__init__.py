"""The agents, by name: PPO (any task), A2C (Christiano A.2, Atari) and TRPO (A.1, MuJoCo).

Every agent follows the protocol of :mod:`rlhp_jax.agents.common`; the driver asks this module
for one by name and never imports an algorithm directly.
"""

from __future__ import annotations

import importlib
from typing import Any

AGENTS = ("ppo", "a2c", "trpo")


def _module(name: str):
    if name not in AGENTS:
        raise ValueError(f"Unknown agent {name!r}. Available agents: {', '.join(AGENTS)}.")
    return importlib.import_module(f"rlhp_jax.agents.{name}")


def agent_class(name: str):
    return getattr(_module(name), name.upper())


def default_config(name: str, env_name: str):
    """The agent's preset for a task (the papers' settings where they give them)."""
    return _module(name).preset(env_name)


def check_compatible(name: str, spec) -> None:
    """Raise a ValueError a user can act on when the agent cannot run on the task."""
    from rlhp_jax.agents.common import is_image

    _module(name)
    if name == "trpo" and is_image(spec):
        raise ValueError(f"TRPO runs on vector-observation tasks (MuJoCo, classic control), not on "
                         f"{spec.name}'s frames: use --agent a2c (Christiano A.2) or --agent ppo.")


def make_agent(name: str, spec, config: Any = None, total_updates: int | None = None):
    check_compatible(name, spec)
    cls = agent_class(name)
    return cls(spec, config if config is not None else default_config(name, spec.name), total_updates)
