"""Christiano et al. 2017 on Atari (appendix A.2): A2C on the learned reward, synthetic oracle or people (--teacher human).

    python -m experiments.atari                                    # Pong, 5,500 labels, 50M steps
    python -m experiments.atari --env Breakout --labels 3300 --steps 10000000
    python -m experiments.atari --baseline                         # A2C on the true reward
    python -m experiments.atari --ablation random_queries
    python -m experiments.atari --agent dqfd --demos demos/pong.npz --setup demos+prefs+autolabels   # Ibarz et al. 2018
    python -m experiments.atari --agent dqfd --demos demos/pong.npz --teacher human   # Ibarz, people label

Paper settings (A.2): A2C with 16 environments, 5-step updates, γ = 0.99, entropy 0.01,
learning rate 7e-4 decayed to 0 at 80M steps; the A.2 reward CNN (batch norm, dropout) in an
ensemble of 3, 10× candidates with disagreement selection, adaptive L2, r̂ normalized to std
0.05; 25-step clips; 500 labels from the untrained policy and 200 epochs of predictor training
on them before RL; then a label rate ∝ 5·10⁶/(T + 5·10⁶); only the last 3,000 labels kept; the
predictor processes about one label per 10 RL steps; score areas blanked; no life-loss or
game-over signal reaches the agent (the oracle's reward gets a −10 penalty at game over except
in Pong).  A GPU is needed for paper-scale runs: on a CPU the reward CNN trains at a few clip
pairs per second (BUILD_NOTES).  These settings are ``rlhp_jax.presets.ATARI`` (from Python:
``RunConfig.paper("Pong")``); every flag below the first group sets the config field it is named after.
"""

from __future__ import annotations

from experiments import cli
from experiments.cli import DOMAIN_PROGS, Domain, main as cli_main

DOMAIN = Domain(prog=DOMAIN_PROGS["atari"], doc=__doc__, backend="atari", default_env="Pong")


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    cli.exit_script(main())
