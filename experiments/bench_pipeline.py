"""Benchmark: the whole training system per component, against raw envpool.

    python -m experiments.bench_pipeline                       # Pong (A2C) and HalfCheetah (TRPO)
    python -m experiments.bench_pipeline --tasks HalfCheetah --iterations 4

For each task it builds the entry point's paper configuration (``experiments.atari`` /
``experiments.mujoco``) and times, compile excluded (best of ``--repeats``):

  raw envpool   envpool's XLA step alone inside one jitted scan, random actions
  acting        the agent's policy + the wrapped environment for one iteration's env steps
  reward        r̂ of every ensemble member on those steps (inference)
  update        the agent's updates for those steps (A2C: one per 80 steps; TRPO: one per batch)
  predictor     the reward-model steps due per iteration (≈ 1 label processed per 10 RL steps),
                on a full label buffer
  end to end    a real ``PreferenceRun`` for ``--iterations`` iterations (synthetic oracle,
                labels, fits, metrics, checkpoints): the median time between iterations
                (iterations that compile a new query-batch shape are outliers)

and prints env steps/s for each and the end-to-end rate as a fraction of raw envpool.  Record
the figures in BUILD_NOTES.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import atari, mujoco
from experiments.bench_envs import best_time, raw_xla
from experiments.cli import build_parser, config_from_args
from rlhp_jax import labels as labels_lib
from rlhp_jax.driver import PreferenceRun
from rlhp_jax.metrics import read_jsonl
from rlhp_jax.rollout import collect_rollout
from rlhp_jax.core import clip_action


def _config(task: str, extra: list[str], out: str):
    domain = atari.DOMAIN if task in atari.DOMAIN.tasks() else mujoco.DOMAIN
    args = build_parser(domain).parse_args(["--env", task, "--out", out, "--no-progress", *extra])
    return config_from_args(args, domain)


def bench_task(task: str, iterations: int, repeats: int, extra: list[str]) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"bench-{task}-")
    cfg = _config(task, extra, tmp)
    run = PreferenceRun(cfg, progress=False)
    env, agent, ens, spec = run.env, run.agent, run.ensemble, run.spec
    steps = run.steps_per_iter
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    agent_state = agent.init(k1)
    ens_state = jax.jit(ens.init)(k2)
    env_state, obs = env.reset(k3)
    T = agent.config.num_steps

    @jax.jit
    def acting(params, env_state, obs, key):
        def one(carry, k):
            s, o = carry
            s, o, ro = collect_rollout(env, agent.policy, params, s, o, k, T)
            return (s, o), ro
        _, ro = jax.lax.scan(one, (env_state, obs), jax.random.split(key, run.updates_per_iter))
        return ro

    t_act = best_time(acting, agent_state.params, env_state, obs, key, repeats=repeats)
    rollouts = acting(agent_state.params, env_state, obs, key)

    @jax.jit
    def reward(ens_state, ro):
        o = ro.obs.reshape(-1, *ro.obs.shape[3:])
        a = clip_action(spec, ro.action).reshape(-1, *ro.action.shape[3:])
        return ens.predict_reward(ens_state, o, a)

    t_reward = best_time(reward, ens_state, rollouts, repeats=repeats)
    rewards = reward(ens_state, rollouts).reshape(rollouts.true_reward.shape)

    @jax.jit
    def updates(agent_state, ro, rewards, key):
        def one(s, x):
            r, rw, k = x
            return agent.update(s, r, rw, k)[0], None
        return jax.lax.scan(one, agent_state, (ro, rewards, jax.random.split(key, run.updates_per_iter)))[0]

    if run.iteration_loop == "host":  # as the driver does it: CNN gradients outside loop bodies on CPU
        one_update = jax.jit(agent.update)
        updates_scan = updates

        def updates(agent_state, ro, rewards, key):  # noqa: F811
            for i, k in enumerate(jax.random.split(key, run.updates_per_iter)):
                pick = lambda x: x[i]
                agent_state = one_update(agent_state, jax.tree.map(pick, ro), rewards[i], k)[0]
            return agent_state

        t_update_scan = best_time(updates_scan, agent_state, rollouts, rewards, key, repeats=repeats)
    t_update = best_time(updates, agent_state, rollouts, rewards, key, repeats=repeats)

    # a label buffer full of clips from this rollout, labeled at random
    cap = min(cfg.label_capacity or cfg.labels, cfg.labels)
    buffer = ens.empty_buffer(cap, run.seg_len)
    flat = jax.tree.map(lambda x: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), rollouts)
    n_pairs = min(cap, 256)
    starts = jax.random.randint(key, (n_pairs, 2), 0, flat.obs.shape[0] - run.seg_len)
    env_i = jax.random.randint(k1, (n_pairs, 2), 0, env.num_envs)
    idx = starts[..., None] + jnp.arange(run.seg_len)
    take = lambda x: x[idx, env_i[..., None]]
    pairs = labels_lib.SegmentPairs(obs=take(flat.obs), action=take(clip_action(spec, flat.action)),
                                    true_reward=take(flat.true_reward))
    mu = jax.random.bernoulli(k2, 0.5, (n_pairs,)).astype(jnp.float32)
    for _ in range(max(1, cap // n_pairs)):
        buffer = labels_lib.add_labels(buffer, k3, pairs, mu)
    fit = ens.fitter()
    t0 = time.perf_counter()
    jax.block_until_ready(fit(ens_state, buffer, key, 1)[0].params)
    t_fit_compile = time.perf_counter() - t0
    t_fit = best_time(lambda s, b, k: fit(s, b, k, run.fit_steps)[0].params, ens_state, buffer, key, repeats=1)
    del buffer, pairs

    raw_seconds = raw_xla(env, steps // env.num_envs, repeats=repeats) if env.xla_ops is not None else None

    # end to end: a short real run (its own directory), iterations 2.. timed from the metrics
    e2e_cfg = dataclasses.replace(cfg, total_steps=steps * iterations, out=os.path.join(tmp, "run"))
    PreferenceRun(e2e_cfg, progress=False).run()
    rows = read_jsonl(os.path.join(tmp, "run", "metrics.jsonl"))
    # median iteration time: robust to the few iterations that compile a new query-batch shape
    walls = np.diff([r["wall_s"] for r in rows])
    e2e = steps / float(np.median(walls)) if len(walls) else float("nan")

    rate = lambda s: steps / s if s else None
    result = dict(
        task=task, agent=cfg.agent, num_envs=env.num_envs, steps_per_iteration=steps,
        updates_per_iteration=run.updates_per_iter, fit_steps_per_iteration=run.fit_steps,
        members=ens.config.num_members, iteration_loop=run.iteration_loop, seconds=dict(acting=t_act, reward=t_reward, update=t_update,
                                                     predictor=t_fit, predictor_compile=t_fit_compile),
        steps_per_s=dict(raw_envpool=rate(raw_seconds), acting=rate(t_act), reward=rate(t_reward),
                         update=rate(t_update), predictor=rate(t_fit), end_to_end=e2e),
        cpus=os.cpu_count(), backend=jax.default_backend(), device=str(jax.devices()[0]),
        jax=jax.__version__,
    )
    if run.iteration_loop == "host":
        result["update_steps_per_s_inside_scan"] = steps / t_update_scan
    if raw_seconds:
        result["end_to_end_fraction_of_raw"] = e2e / rate(raw_seconds)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["Pong", "HalfCheetah"])
    p.add_argument("--iterations", type=int, default=8, help="iterations of the end-to-end run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="further entry-point flags, e.g. --extra --ensemble.num-members 1 --iteration-steps 800")
    args = p.parse_args(argv)
    results = []
    for task in args.tasks:
        r = bench_task(task, args.iterations, args.repeats, args.extra)
        s = r["seconds"]
        total = s["acting"] + s["reward"] + s["update"] + s["predictor"]
        parts = "  ".join(f"{k} {v:7.2f}s ({100 * v / total:4.1f}%)" for k, v in s.items() if k != "predictor_compile")
        print(f"{task:12s} {r['agent']} {r['steps_per_iteration']} steps/iteration: {parts}", flush=True)
        print(f"{'':12s} env steps/s: " + "  ".join(f"{k} {v:,.0f}" for k, v in r["steps_per_s"].items()
                                                     if v is not None), flush=True)
        results.append(r)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
