"""Christiano et al. 2017 on MuJoCo (appendix A.1): TRPO on the learned reward, synthetic oracle or people (--teacher human).

    python -m experiments.mujoco                                   # HalfCheetah, 700 labels
    python -m experiments.mujoco --env Hopper --labels 1400 --seed 1
    python -m experiments.mujoco --env Hopper --baseline           # TRPO on the true reward
    python -m experiments.mujoco --env Walker2d --ablation no_segments

Paper settings (A.1): TRPO with γ = 0.995, λ = 0.97 and an entropy bonus of 0.01 (0.001 on
Swimmer) when learning from the predictor; the A.1 reward MLP, an ensemble of 3 with 10×
candidates and disagreement selection, 1/e validation and adaptive L2, r̂ normalized to std 1;
clips of 1.5 s (30–188 steps by task; Reacher's whole 50-step episode); 25 % of the labels from
the untrained policy, then a label rate ∝ 2·10⁶/(T + 2·10⁶); control costs removed; leaving the
healthy range costs a penalty instead of ending the episode.  The predictor processes about one
label per 10 RL steps.  The paper trains it asynchronously, so by the time the first batch is
scored it has fitted the initial labels for one batch's worth of steps; here it does that much
before the first update, and no more (appendix A's 200 pretraining epochs are Atari's;
--pretrain-steps / --pretrain-epochs change it).  The baseline (--baseline) trains on the true
reward of this modified task as it is.
"""

from __future__ import annotations

import dataclasses
import sys

from experiments.cli import Domain, main as cli_main

DEFAULT_LABELS = 700  # Christiano Fig. 2: 700 labels "nearly match" RL on the true reward
DEFAULT_STEPS = 1_000_000  # our budget on a CPU; pass --steps for longer runs


def settings(args, env: str) -> dict:
    from rlhp_jax.agents import default_config

    agent_cfg = None
    if args.baseline and args.agent == "trpo":
        # A.1 adds the entropy bonus "when learning from the reward predictor" only
        agent_cfg = dataclasses.replace(default_config("trpo", env), ent_coef=0.0)
    return dict(
        labels=DEFAULT_LABELS if args.labels is None else args.labels,
        steps=DEFAULT_STEPS if args.steps is None else args.steps,
        agent_config=agent_cfg,
        initial_label_fraction=0.25,  # A.1: 25 % of comparisons from the untrained policy
        rate_constant=2e6,  # A.1: label rate ∝ 2e6 / (T + 2e6)
        fit_steps=None,  # from labels_per_rl_step
        labels_per_rl_step=0.1,  # A.2's "1 label per 10 RL timesteps", used for both domains
        # A pretrains (200 epochs) "in the Atari domain" only; on MuJoCo the asynchronous predictor has
        # fitted one iteration's share of labels by the time the first batch is scored: do that much
        pretrain_steps=None,
        baseline_reward="raw",  # the true reward of the modified task, unscaled
        eval_every=5,
    )


def _tasks():
    from rlhp_jax import tasks

    return tasks.names("mujoco")


DOMAIN = Domain(prog="python -m experiments.mujoco", doc=__doc__, tasks=_tasks, default_env="HalfCheetah",
                default_agent="trpo", settings=settings, out_root="runs/mujoco")


def main(argv=None) -> int:
    return cli_main(DOMAIN, argv)


if __name__ == "__main__":
    sys.exit(main())
