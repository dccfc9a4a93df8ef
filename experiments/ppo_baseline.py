"""PPO on the true reward ("RL on the true reward" baseline).

    python -m experiments.ppo_baseline --env CartPole-v1 --steps 50000 --seed 0

Prints the greedy evaluation return on the unmodified task against env steps, the wall time
and the env steps per second (training incl. compilation and evaluation).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import time

from rlhp_jax.agents.ppo import PPOConfig, preset, train_on_rewards


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=50_000, help="env-step budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=5_000, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override PPOConfig fields, e.g. lr=3e-4"
    )
    args = parser.parse_args(argv)

    config = preset(args.env)
    fields = {f.name: f.type for f in dataclasses.fields(PPOConfig)}
    overrides = {}
    for item in args.set:
        name, value = item.split("=", 1)
        if name not in fields:
            parser.error(f"unknown PPOConfig field {name!r}")
        default = getattr(config, name)
        overrides[name] = type(default)(ast.literal_eval(value)) if not isinstance(default, str) else value
    config = dataclasses.replace(config, **overrides)
    print(f"{args.env} seed={args.seed} steps={args.steps} {config}")

    def log(row: dict) -> None:
        if "eval_return" in row:
            print(
                f"steps {row['env_steps']:>8d}  eval_return {row['eval_return']:9.2f}  "
                f"wall {row['wall_s']:6.1f}s  kl {row['approx_kl']:.4f}  ent {row['entropy']:.3f}  "
                f"ev {row['explained_var']:.2f}",
                flush=True,
            )

    start = time.perf_counter()
    _, history = train_on_rewards(
        args.env, args.steps, args.seed, config, args.eval_every, args.eval_episodes, log=log
    )
    wall = time.perf_counter() - start
    steps = history[-1]["env_steps"]
    first_max = next((r["env_steps"] for r in history if r.get("eval_return", -1e9) >= _target(args.env)), None)
    first, last = history[0], history[-1]
    steady = (last["env_steps"] - first["env_steps"]) / max(last["wall_s"] - first["wall_s"], 1e-9)
    print(
        f"done: final eval_return {last['eval_return']:.2f}  target reached at {first_max} steps  "
        f"wall {wall:.1f}s (train loop {last['wall_s']:.1f}s)  {steps / wall:.0f} env steps/s overall, "
        f"{steady:.0f} env steps/s after the first update (compiled, incl. evaluation)"
    )
    return history


def _target(env_name: str) -> float:
    return {"CartPole-v1": 500.0, "Pendulum-v1": -250.0}.get(env_name, float("inf"))


if __name__ == "__main__":
    main()
