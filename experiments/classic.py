"""Preference-based RL on classic-control and MinAtar tasks (gymnax), with a synthetic oracle or people.

    python -m experiments.classic --env CartPole-v1
    python -m experiments.classic --env Pendulum-v1 --labels 1000 --steps 150000
    python -m experiments.classic --env CartPole-v1 --baseline      # the same agent on the true reward
    python -m experiments.classic --env CartPole-v1 --ablation random_queries
    python -m experiments.classic --env CartPole-v1 --teacher human --labels 100   # you label, in a browser
    python -m experiments.classic --env Breakout-MinAtar --agent dqfd --demos demos/breakout_minatar.npz

Writes ``metrics.jsonl``/``metrics.csv`` (one row per iteration), TensorBoard events,
``learning_curve.png``, checkpoints, ``config.json`` and ``summary.json`` to ``--out``.
"""

from __future__ import annotations

import sys

from experiments.cli import Domain, main as cli_main

# Per-task budgets of this entry point: the ones the BUILD_NOTES targets are measured at.
# CartPole from preferences is seed-sensitive (BUILD_NOTES, "the README's CartPole job"): at 60k
# steps seeds 0, 1 and 4 end at 500, seeds 2 and 3 reach 500 / 471 and fall back to 328 / 365;
# longer runs (100k), longer clips, γ = 0.995 and random queries did not fix it.
DEFAULTS = {
    "CartPole-v1": dict(labels=200, steps=60_000),
    "Pendulum-v1": dict(labels=1000, steps=150_000),
}


def settings(args, env: str) -> dict:
    d = DEFAULTS.get(env, dict(labels=500, steps=100_000))
    return dict(labels=d["labels"] if args.labels is None else args.labels,
                steps=d["steps"] if args.steps is None else args.steps)


def ibarz_settings(args, env: str) -> dict:
    """Ibarz et al.'s protocol at a tenth of the paper's scale for the MinAtar games (CPU-sized):
    iterations of 10,000 steps, 680 labels (50 initial), a tenth of each pretraining phase."""
    return dict(total_steps=1_000_000, iteration_steps=10_000, labels=680, rate_constant=5e5, bc_batches=2_000,
                rm_pretrain_batches=5_000, second_pretrain_batches=6_000, rm_batches_per_iteration=625)


def _tasks():
    from rlhp_jax import tasks

    return tasks.names("gymnax")


DOMAIN = Domain(prog="python -m experiments.classic", doc=__doc__, tasks=_tasks, default_env="CartPole-v1",
                default_agent="ppo", settings=settings, out_root="runs/classic",
                ibarz_settings=ibarz_settings)


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    sys.exit(main())
