"""Christiano et al. 2017 on Atari (appendix A.2): A2C on the learned reward, synthetic oracle or people (--teacher human).

    python -m experiments.atari                                    # Pong, 5,500 labels, 50M steps
    python -m experiments.atari --env Breakout --labels 3300 --steps 10000000
    python -m experiments.atari --baseline                         # A2C on the true reward
    python -m experiments.atari --ablation random_queries
    python -m experiments.atari --agent dqfd --demos demos/pong.npz --setup demos+prefs+autolabels   # Ibarz et al. 2018

Paper settings (A.2): A2C with 16 environments, 5-step updates, γ = 0.99, entropy 0.01,
learning rate 7e-4 decayed to 0 at 80M steps; the A.2 reward CNN (batch norm, dropout) in an
ensemble of 3, 10× candidates with disagreement selection, adaptive L2, r̂ normalized to std
0.05; 25-step clips; 500 labels from the untrained policy and 200 epochs of predictor training
on them before RL; then a label rate ∝ 5·10⁶/(T + 5·10⁶); only the last 3,000 labels kept; the
predictor processes about one label per 10 RL steps; score areas blanked; no life-loss or
game-over signal reaches the agent (the oracle's reward gets a −10 penalty at game over except
in Pong).  A GPU is needed for paper-scale runs: on a CPU the reward CNN trains at a few clip
pairs per second (BUILD_NOTES).
"""

from __future__ import annotations

import sys

from experiments.cli import Domain, main as cli_main

DEFAULT_LABELS = 5500  # Christiano Fig. 3 (human labels; synthetic runs 350 to 10,000)
DEFAULT_STEPS = 50_000_000  # A.2: "runs were actually trained for only 50 million timesteps"


def settings(args, env: str) -> dict:
    return dict(
        labels=DEFAULT_LABELS if args.labels is None else args.labels,
        steps=DEFAULT_STEPS if args.steps is None else args.steps,
        initial_label_count=500,  # A.2: 500 comparisons from the untrained policy
        rate_constant=5e6,  # A.2: label rate ∝ 5e6 / (T + 5e6)
        label_capacity=3000,  # A.2: a buffer of only the last 3,000 labels
        pretrain_epochs=200,  # A.2: predictor pretrained 200 epochs before RL
        fit_steps=None,
        labels_per_rl_step=0.1,  # A.2: "processes 1 label per 10 RL timesteps"
        iteration_steps=4000,  # 50 A2C updates (16 envs × 5 steps) between label rounds
        eval_every=10,
        checkpoint_every=25,
    )


def ibarz_settings(args, env: str) -> dict:
    """Ibarz et al. 2018 on Atari: ``IbarzConfig``'s defaults are the paper's (A.1, A.3, A.4)."""
    return {}


def _tasks():
    from rlhp_jax import tasks

    return tasks.names("atari")


DOMAIN = Domain(prog="python -m experiments.atari", doc=__doc__, tasks=_tasks, default_env="Pong",
                default_agent="a2c", settings=settings, out_root="runs/atari", segments_ablation=False,
                ibarz_settings=ibarz_settings)


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    sys.exit(main())
