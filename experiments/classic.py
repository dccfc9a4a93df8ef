"""Preference-based RL on classic-control and MinAtar tasks (gymnax), with a synthetic oracle or people.

    python -m experiments.classic --env CartPole-v1
    python -m experiments.classic --env Pendulum-v1 --labels 1000 --steps 150000
    python -m experiments.classic --env CartPole-v1 --baseline      # the same agent on the true reward
    python -m experiments.classic --env CartPole-v1 --ablation random_queries
    python -m experiments.classic --env CartPole-v1 --teacher human --labels 100   # you label, in a browser
    python -m experiments.classic --env Breakout-MinAtar --agent dqfd --demos demos/breakout_minatar.npz

Writes ``metrics.jsonl``/``metrics.csv`` (one row per iteration), TensorBoard events,
``learning_curve.png``, checkpoints, ``config.json`` and ``summary.json`` to ``--out``.

Budgets per task (CartPole-v1 200 labels / 60k steps, Pendulum-v1 1,000 / 150k, others 500 / 100k)
and ``--agent dqfd``'s tenth-scale Ibarz protocol for MinAtar are ``rlhp_jax.presets``' (from
Python: ``RunConfig.paper("CartPole-v1")``); every flag below the first group sets the config
field it is named after.
"""

from __future__ import annotations

from experiments import cli
from experiments.cli import DOMAIN_PROGS, Domain, main as cli_main

DOMAIN = Domain(prog=DOMAIN_PROGS["gymnax"], doc=__doc__, backend="gymnax", default_env="CartPole-v1")


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    cli.exit_script(main())
