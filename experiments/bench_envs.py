"""Benchmark: raw envpool steps/s versus steps/s through the project's environment wrapper.

    python -m experiments.bench_envs                          # Pong and HalfCheetah, 8 and 16 envs
    python -m experiments.bench_envs --tasks Pong --envs 8 --steps 2000

For each task and batch size it times, with uniformly random actions:
  raw-python   envpool's own ``step`` called from a Python loop (numpy actions)
  raw-xla      envpool's XLA step inside one jitted ``lax.scan``
  wrapper-*    ``EnvpoolVecEnv.step`` (masking, channel-last frames, oracle reward, validity
               flags) inside one jitted ``lax.scan``, per stepping backend
and prints env steps/s (steps × envs / s, best of 3, compile excluded) and the wrapper's cost relative to
the fastest raw path.  Record the figures in BUILD_NOTES.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax.envpool_envs import EnvpoolVecEnv


REPEATS = 3  # best of, by default: the two cores are shared with envpool's own threads


def best_time(fn, *args, repeats: int) -> float:
    """Seconds of ``fn(*args)`` (its outputs ready), best of ``repeats`` calls after a first call
    that compiles and warms up: every benchmark's timer."""
    jax.block_until_ready(fn(*args))  # compile + warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def raw_python(env: EnvpoolVecEnv, steps: int, repeats: int = REPEATS) -> float:
    raw = env.pool
    rng = np.random.default_rng(0)
    ids = np.arange(env.num_envs, dtype=np.int32)
    if env.spec.discrete:
        actions = rng.integers(0, env.spec.num_actions, (steps, env.num_envs), dtype=np.int32)
    else:
        actions = rng.uniform(-1, 1, (steps, env.num_envs, env.spec.num_actions))
    raw.step(actions[0], ids)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a in actions:
            raw.step(a, ids)
        best = min(best, time.perf_counter() - t0)
    return best


def raw_xla(env: EnvpoolVecEnv, steps: int, repeats: int = REPEATS) -> float:
    """envpool's XLA step alone (the env's own handle, built under x64; see EnvpoolVecEnv)."""
    handle, _, _, step = env.xla_ops
    ids = jnp.arange(env.num_envs, dtype=jnp.int32)

    @jax.jit
    def run(h, key):
        def body(h, k):
            if env.spec.discrete:
                a = jax.random.randint(k, (env.num_envs,), 0, env.spec.num_actions, jnp.int32)
            else:
                a = jax.random.uniform(k, (env.num_envs, env.spec.num_actions), jnp.float32, -1, 1)
            with jax.enable_x64(True):
                a = a if env.spec.discrete else a.astype(jnp.float64)
                h, (obs, rew, term, trunc, info) = step(h, a, ids)
                return h, (rew.sum() + obs.reshape(env.num_envs, -1)[:, 0].sum()).astype(jnp.float32)
        return jax.lax.scan(body, h, jax.random.split(key, steps))

    return best_time(run, handle, jax.random.key(0), repeats=repeats)


def wrapper(env: EnvpoolVecEnv, steps: int, repeats: int = REPEATS) -> float:
    state, _ = env.reset()

    @jax.jit
    def run(state, key):
        def body(s, k):
            if env.spec.discrete:
                a = jax.random.randint(k, (env.num_envs,), 0, env.spec.num_actions, jnp.int32)
            else:
                a = jax.random.uniform(k, (env.num_envs, env.spec.num_actions), jnp.float32, -1, 1)
            s, out = env.step(k, s, a)
            return s, out.true_reward.sum() + out.obs.reshape(env.num_envs, -1)[:, 0].sum() + out.valid.sum()
        return jax.lax.scan(body, state, jax.random.split(key, steps))

    return best_time(run, state, jax.random.key(0), repeats=repeats)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["Pong", "HalfCheetah"])
    p.add_argument("--envs", nargs="+", type=int, default=[8, 16])
    p.add_argument("--steps", type=int, default=1000, help="batched steps per timing")
    p.add_argument("--threads", type=int, default=0, help="envpool threads (0: one per env, capped by cores)")
    args = p.parse_args(argv)
    results = []
    for task in args.tasks:
        for n in args.envs:
            row = dict(task=task, num_envs=n, steps=args.steps, cpus=os.cpu_count())
            env = EnvpoolVecEnv(task, n, num_threads=args.threads, backend="callback")
            env.reset()
            row["raw-python"] = raw_python(env, args.steps)
            row["wrapper-callback"] = wrapper(env, args.steps)
            env_x = EnvpoolVecEnv(task, n, num_threads=args.threads, backend="xla")
            env_x.reset()
            row["raw-xla"] = raw_xla(env_x, args.steps)
            env_x.reset()
            row["wrapper-xla"] = wrapper(env_x, args.steps)
            rates = {k: args.steps * n / v for k, v in row.items() if k.startswith(("raw", "wrapper"))}
            best_raw = max(v for k, v in rates.items() if k.startswith("raw"))
            line = "  ".join(f"{k} {v:9,.0f}/s" for k, v in rates.items())
            costs = "  ".join(f"{k} cost {100 * (1 - v / best_raw):+.1f}%" for k, v in rates.items()
                              if k.startswith("wrapper"))
            print(f"{task:12s} envs={n:2d}  {line}  |  {costs}", flush=True)
            results.append(dict(row, steps_per_s=rates))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
