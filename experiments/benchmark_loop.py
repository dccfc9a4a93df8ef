"""The ``loop`` section of ``python -m experiments.benchmark``: the compiled loop as seeds grow.

    python -m experiments.benchmark --sections loop
    python -m experiments.benchmark_loop --seeds 1 8 32          # the section alone

For each seed count it builds the README's CartPole-v1 run (``python -m experiments.classic``'s
settings: 200 labels, PPO, 60k steps; ``--quick``: 4k steps) as one program over all seeds
(``rlhp_jax.compiled``), compiles it, runs it once, and reports

* seed·env steps/s of the run (compile excluded): seeds × steps / run time;
* the compile time and the run time;
* the wall time (compile + run) relative to one seed's, compile excluded and included — the
  issue's target is 32 seeds in at most 4× one seed's wall time on the 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

ENV = "CartPole-v1"


def default_seeds(quick: bool) -> list[int]:
    if quick:
        return [1, 2]
    return [1, 8, 32] if jax.default_backend() == "cpu" else [1, 8, 64, 256]


def measure(num_seeds: int, steps: int) -> dict:
    from experiments.sweep import base_config
    from rlhp_jax.compiled import CompiledRun

    program = CompiledRun(base_config(["--env", ENV, "--steps", str(steps)], None))
    keys, hypers, _ = program.lanes(range(num_seeds))
    t0 = time.perf_counter()
    compiled, keys, hypers = program.compile_lanes(keys, hypers)
    t1 = time.perf_counter()
    jax.block_until_ready(compiled(keys, hypers))
    t2 = time.perf_counter()
    total = program.num_iters * program.steps_per_iter
    return dict(seeds=num_seeds, env_steps=total, compile_s=t1 - t0, run_s=t2 - t1, wall_s=t2 - t0,
                seed_steps_per_s=num_seeds * total / (t2 - t1))


def rows(args: argparse.Namespace) -> list[dict]:
    quick = bool(getattr(args, "quick", False))
    seeds = getattr(args, "seeds", None) or default_seeds(quick)
    steps = 4096 if quick else 61_440
    results, out = [], []
    for n in seeds:
        r = measure(n, steps)
        results.append(r)
        print(f"  loop: {n} seeds, {r['seed_steps_per_s']:,.0f} seed·steps/s (compile {r['compile_s']:.1f} s, "
              f"run {r['run_s']:.1f} s)", file=sys.stderr)
        out.append(dict(name=f"compiled loop, {ENV}, {n} seed{'s' if n > 1 else ''}", value=r["seed_steps_per_s"],
                        unit="seed·env steps/s", seeds=n, env_steps=r["env_steps"], compile_s=round(r["compile_s"], 2),
                        run_s=round(r["run_s"], 2)))
    one = next((r for r in results if r["seeds"] == 1), None)
    for r in results:
        if one is None or r["seeds"] == 1:
            continue
        target = "≤ 4 (32 seeds, CPU)" if r["seeds"] == 32 else ""
        out.append(dict(name=f"{r['seeds']} seeds / 1 seed, run time", value=r["run_s"] / one["run_s"],
                        unit="× one seed", target=target))
        out.append(dict(name=f"{r['seeds']} seeds / 1 seed, wall time incl. compile", value=r["wall_s"] / one["wall_s"],
                        unit="× one seed", target=target))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", help="seed counts (default 1 8 32 on CPU, 1 8 64 256 elsewhere)")
    p.add_argument("--quick", action="store_true")
    for row in rows(p.parse_args(argv)):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
