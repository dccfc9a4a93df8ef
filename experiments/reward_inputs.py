"""Can a reward model of one step's observation and action express a task's reward?

    python -m experiments.reward_inputs --tasks Swimmer HalfCheetah Hopper

Christiano et al.'s r̂ (and this project's ``RewardMLP``) sees a step's observation o_t and action
a_t.  The oracle's reward of that step is often a function of the *transition*: MuJoCo
locomotion pays the mean forward velocity over the step, (x_{t+1} − x_t) / dt, which o_t and a_t
determine only through the task's dynamics.  For each task this rolls uniformly random actions
(the untrained policy's states, where the first labels come from) and prints how much of the
per-step true reward a least-squares fit explains (R²) from o_t; o_t and a_t; o_{t+1}; and o_t, a_t
and o_{t+1}: linear in them, and quadratic (the standardized inputs and their pairwise products,
a crude stand-in for a small MLP).  Where (o_t, o_{t+1}) explain nearly all of it and (o_t, a_t)
much less, an r̂ of (o_t, a_t) must learn that part of the dynamics from the labeled clips, and
what it learns from random flailing need not hold on a gait (Swimmer: BUILD_NOTES, "Swimmer's
step reward is a function of the transition").

Steps whose next observation is not their own (an episode boundary, envpool's deferred reset, a
termination that resets the task) are left out.  Vector observations only.
"""

from __future__ import annotations

import argparse

import numpy as np

from rlhp_jax.refusal import refuse

INPUT_SETS = ("o_t", "o_t,a_t", "o_t+1", "o_t,a_t,o_t+1")


def transitions(task: str, steps: int, num_envs: int, seed: int) -> dict[str, np.ndarray]:
    """``steps`` batched steps of ``task`` under uniformly random actions: the observation before
    each kept step (``obs``), its action (``action``, one-hot where discrete), the observation
    after it (``next_obs``) and its true reward (``reward``), flattened over environments."""
    import jax

    from rlhp_jax.envs import make_env

    env = make_env(task, num_envs)
    spec = env.spec
    if len(spec.obs_shape) != 1:
        raise ValueError(f"{task} has observations of shape {spec.obs_shape}: this probe fits vector observations only")
    key = jax.random.PRNGKey(seed)
    key, k = jax.random.split(key)
    state, obs = env.reset(k)
    keep_resets = spec.on_terminate != "reset"  # a termination that resets: the next observation is the reset's
    o, a, o1, r = [], [], [], []
    for _ in range(steps):
        key, k_a, k_s = jax.random.split(key, 3)
        if spec.discrete:
            action = jax.random.randint(k_a, (num_envs,), 0, spec.num_actions)
        else:
            low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
            action = low + (high - low) * jax.random.uniform(k_a, (num_envs, spec.num_actions))
        state, out = env.step(k_s, state, action)
        kept = np.asarray(out.valid) & ~np.asarray(out.boundary)
        if not keep_resets:
            kept &= ~np.asarray(out.terminated)
        act = np.eye(spec.num_actions)[np.asarray(action)] if spec.discrete else np.asarray(action)
        o.append(np.asarray(obs)[kept]), a.append(act[kept]), o1.append(np.asarray(out.obs)[kept])
        r.append(np.asarray(out.true_reward)[kept])
        obs = out.obs
    return dict(obs=np.concatenate(o), action=np.concatenate(a), next_obs=np.concatenate(o1), reward=np.concatenate(r))


def r_squared(reward: np.ndarray, *inputs: np.ndarray, quadratic: bool = False) -> float:
    """R² of the least-squares fit of ``reward`` on ``inputs`` (columns side by side) and a constant;
    ``quadratic``: on the standardized inputs and every pairwise product of them (squares included).
    NaN where the reward does not vary."""
    x = np.concatenate([np.asarray(i, np.float64).reshape(len(reward), -1) for i in inputs], axis=1)
    if quadratic:
        x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)
        i, j = np.triu_indices(x.shape[1])
        x = np.concatenate([x, x[:, i] * x[:, j]], axis=1)
    y = np.asarray(reward, np.float64)
    if y.var() == 0:
        return float("nan")
    x = np.concatenate([x, np.ones((len(y), 1))], axis=1)
    w, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(1.0 - np.mean((x @ w - y) ** 2) / y.var())


def probe(task: str, steps: int = 2000, num_envs: int = 8, seed: int = 0) -> dict[str, dict[str, float]]:
    """{"linear" | "quadratic": {input set (:data:`INPUT_SETS`): R²}} for ``task``, and ``steps``:
    the number of transitions fitted."""
    t = transitions(task, steps, num_envs, seed)
    sets = {"o_t": (t["obs"],), "o_t,a_t": (t["obs"], t["action"]), "o_t+1": (t["next_obs"],),
            "o_t,a_t,o_t+1": (t["obs"], t["action"], t["next_obs"])}
    return dict(steps=len(t["reward"]), **{kind: {name: r_squared(t["reward"], *xs, quadratic=kind == "quadratic")
                                                  for name, xs in sets.items()} for kind in ("linear", "quadratic")})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.reward_inputs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", required=True, help="tasks to probe (any vector-observation task)")
    p.add_argument("--steps", type=int, default=2000, help="batched steps per task (default 2000)")
    p.add_argument("--envs", type=int, default=8, help="environments stepped at once (default 8)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 2 or args.envs < 1:
        p.error("--steps must be at least 2 and --envs positive")
    from rlhp_jax.tasks import resolve

    results = {}
    try:
        for task in args.tasks:
            resolve(task)  # every name checked before any task is stepped
        for task in args.tasks:
            print(f"stepping {task} ({args.steps} steps × {args.envs} environments, random actions)", flush=True)
            results[task] = probe(task, args.steps, args.envs, args.seed)
    except ValueError as e:
        return refuse(e)
    print("\nR² of the per-step true reward fitted on each input set (– where the kept steps' reward is constant)\n")
    print("| task | transitions | " + " | ".join(f"linear {s}" for s in INPUT_SETS) + " | "
          + " | ".join(f"quadratic {s}" for s in INPUT_SETS) + " |")
    print("| --- | ---: |" + " ---: |" * (2 * len(INPUT_SETS)))
    for task, got in results.items():
        cells = ["–" if np.isnan(v) else f"{v:.3f}" for v in (got[k][s] for k in ("linear", "quadratic") for s in INPUT_SETS)]
        print(f"| {task} | {got['steps']:,} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
