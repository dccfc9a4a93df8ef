"""Christiano et al. 2017 on MuJoCo (appendix A.1): TRPO on the learned reward, synthetic oracle or people (--teacher human).

    python -m experiments.mujoco                                   # HalfCheetah, 700 labels
    python -m experiments.mujoco --env Hopper --labels 1400 --seed 1
    python -m experiments.mujoco --env Hopper --baseline           # TRPO on the true reward
    python -m experiments.mujoco --env Walker2d --ablation no_segments

Paper settings (A.1): TRPO with γ = 0.995, λ = 0.97 and an entropy bonus of 0.01 (0.001 on
Swimmer) when learning from the predictor; the A.1 reward MLP, an ensemble of 3 with 10×
candidates and disagreement selection, 1/e validation and adaptive L2, r̂ normalized to std 1;
clips of 1.5 s (30–188 steps by task; Reacher's and InvertedPendulum's whole 50- and 25-step
episode); 25 % of the labels from the untrained policy, then a label rate ∝ 2·10⁶/(T + 2·10⁶);
control costs removed; leaving the healthy range ends no episode: it costs a penalty per step, or
on Hopper and Walker2d the run-on reward of the paper's public code pays the torso's height
instead (``--env-options '(("penalty_shape","range"),)'`` for the penalty); the pendulums' episodes
last that code's 25 and 50 steps (``episode_steps``).  The predictor processes about one
label per 10 RL steps.  The paper trains it asynchronously, so by the time the first batch is
scored it has fitted the initial labels for one batch's worth of steps; here it does that much
before the first update, and no more (appendix A's 200 pretraining epochs are Atari's;
--pretrain-steps / --pretrain-epochs change it).  The baseline (--baseline) trains on the true
reward of this modified task as it is.  These settings are ``rlhp_jax.presets.MUJOCO`` (from
Python: ``RunConfig.paper("HalfCheetah")``); every flag below the first group sets the config field
it is named after.
"""

from __future__ import annotations

from experiments import cli
from experiments.cli import DOMAIN_PROGS, Domain, main as cli_main

DOMAIN = Domain(prog=DOMAIN_PROGS["mujoco"], doc=__doc__, backend="mujoco", default_env="HalfCheetah")


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    cli.exit_script(main())
