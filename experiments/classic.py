"""Preference-based RL on classic-control tasks (gymnax), with a synthetic oracle.

    python -m experiments.classic --env CartPole-v1
    python -m experiments.classic --env Pendulum-v1 --labels 1000 --steps 150000
    python -m experiments.classic --env CartPole-v1 --baseline      # PPO on the true reward

Writes ``metrics.jsonl``/``metrics.csv`` (one row per iteration), ``learning_curve.png``,
``config.json`` and ``summary.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

# Per-task defaults of this entry point: the budgets the BUILD_NOTES targets are measured at.
# CartPole from preferences is seed-sensitive (BUILD_NOTES): at 60k steps seed 0 reaches 500,
# seeds 1 and 2 peak at ~380 and ~300; longer runs and other label rates did not fix it.
DEFAULTS = {
    "CartPole-v1": dict(labels=200, steps=60_000, rate_constant=None),
    "Pendulum-v1": dict(labels=1000, steps=150_000, rate_constant=None),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.classic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1", help="gymnax task (CartPole-v1, Pendulum-v1, ...)")
    p.add_argument("--labels", type=int, default=None, help="synthetic-label budget (default per task)")
    p.add_argument("--steps", type=int, default=None, help="environment steps of RL (default per task)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/classic/ENV-seedN)")
    p.add_argument("--baseline", action="store_true", help="train the same agent on the true reward instead")
    p.add_argument("--selection", choices=["disagreement", "random"], default="disagreement",
                   help="query selection: ensemble disagreement (paper) or random (ablation)")
    p.add_argument("--rate-constant", type=float, default=None,
                   help="c of the label rate c/(T+c) (default per task; steps/4 when the task has none)")
    p.add_argument("--initial-labels", type=float, default=0.25,
                   help="fraction of the budget asked about clips of the untrained policy (A.1: 0.25)")
    p.add_argument("--members", type=int, default=3, help="reward-model ensemble size")
    p.add_argument("--segment-length", type=int, default=None, help="clip length in steps (default per task)")
    p.add_argument("--mistake-rate", type=float, default=0.0, help="oracle flips a label with this probability")
    p.add_argument("--beta", type=float, default=math.inf, help="Boltzmann-rational oracle temperature (inf: perfect)")
    p.add_argument("--myopic-gamma", type=float, default=1.0, help="oracle discount over a clip (1: none)")
    p.add_argument("--skip-below", type=float, default=-math.inf, help="oracle skips when both clip returns are below")
    p.add_argument("--tie-within", type=float, default=0.0, help="oracle ties when clip returns differ by at most this")
    p.add_argument("--ppo", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override fields of the task's PPO preset, e.g. --ppo lr=3e-4 ent_coef=0.01")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def ppo_config(env: str, overrides: list[str]):
    """The task's PPO preset with FIELD=VALUE overrides applied (values parsed as Python literals)."""
    import ast

    from rlhp_jax.agents.ppo import preset

    cfg = preset(env)
    changes = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or not hasattr(cfg, name):
            fields = ", ".join(f.name for f in dataclasses.fields(cfg))
            raise ValueError(f"--ppo expects FIELD=VALUE with FIELD one of: {fields}; got {item!r}")
        current = getattr(cfg, name)
        try:
            parsed = value if isinstance(current, str) else ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"--ppo {name}: cannot parse {value!r}") from None
        changes[name] = tuple(parsed) if isinstance(current, tuple) else type(current)(parsed)
    return dataclasses.replace(cfg, **changes)


def config_from_args(args):
    from rlhp_jax.driver import RunConfig
    from rlhp_jax.ensemble import EnsembleConfig
    from rlhp_jax.envs import gymnax_envs
    from rlhp_jax.teachers import SyntheticTeacher

    if args.env not in gymnax_envs():
        raise ValueError(f"Unknown environment {args.env!r}. Supported: {', '.join(gymnax_envs())} (this entry point runs the gymnax classic-control tasks).")
    d = DEFAULTS.get(args.env, dict(labels=500, steps=100_000, rate_constant=None))
    labels = d["labels"] if args.labels is None else args.labels
    steps = d["steps"] if args.steps is None else args.steps
    if not args.baseline and labels < 1:
        raise ValueError(f"--labels must be at least 1 (got {labels}); use --baseline to train on the true reward.")
    if steps < 1:
        raise ValueError(f"--steps must be positive, got {steps}")
    tag = "baseline" if args.baseline else f"{labels}labels"
    out = args.out or f"runs/classic/{args.env}-{tag}-seed{args.seed}"
    return RunConfig(
        env=args.env, total_steps=steps, labels=max(labels, 1), seed=args.seed,
        reward_source="true" if args.baseline else "model",
        selection=args.selection, segment_length=args.segment_length, out=out,
        ppo=ppo_config(args.env, args.ppo),
        rate_constant=args.rate_constant if args.rate_constant is not None else d["rate_constant"],
        initial_label_fraction=args.initial_labels,
        ensemble=EnsembleConfig(num_members=args.members),
        teacher=SyntheticTeacher(mistake_rate=args.mistake_rate, beta=args.beta, gamma=args.myopic_gamma,
                                 skip_below=args.skip_below, tie_within=args.tie_within),
    )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        from rlhp_jax.driver import PreferenceRun

        run = PreferenceRun(cfg, progress=not args.no_progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = run.run()
    print(json.dumps(summary, indent=2))
    print(f"metrics, plot and summary in {cfg.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
