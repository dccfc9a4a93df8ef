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

    python -m experiments.reward_inputs --policy runs/mujoco/Swimmer-trpo-baseline-seed0

``--policy RUN`` asks what matters to the agent: the fits are made on random actions' transitions
of RUN's task, as above, then scored on the transitions of RUN's newest policy (its sampled
actions), states the random steps may never visit.  A fit that follows the policy's rewards step
by step (R² there) can still get their *mean* wrong, and the mean per step is what the agent
maximizes: where the prediction's mean is far from the true one, an r̂ of those inputs fitted to
the first labels pays the policy's gait for something other than its speed.  ``--mlp SEEDS`` fits
A.1's reward MLP itself (by squared error to the step rewards, not by preferences) beside the
least squares, SEEDS times per input set.

Steps whose next observation is not their own (an episode boundary, envpool's deferred reset, a
termination that resets the task) are left out.  Vector observations only.
"""

from __future__ import annotations

import argparse

import numpy as np

from rlhp_jax.refusal import refuse

INPUT_SETS = ("o_t", "o_t,a_t", "o_t+1", "o_t,a_t,o_t+1")


def transitions(task: str, steps: int, num_envs: int, seed: int, policy=None, params=None) -> dict[str, np.ndarray]:
    """``steps`` batched steps of ``task`` (one compiled rollout), acting by ``policy(params, obs,
    key)`` (a ``policy_fn``; default: uniformly random actions): the observation before each kept
    step (``obs``), its action (``action``, as the task receives it: clipped to the bounds,
    one-hot where discrete), the observation after it (``next_obs``) and its true reward
    (``reward``), flattened over environments."""
    import jax
    import jax.numpy as jnp

    from rlhp_jax.rollout import uniform_random_policy
    from rlhp_jax.core import clip_action
    from rlhp_jax.envs import make_env
    from rlhp_jax.rollout import collect_rollout

    env = make_env(task, num_envs)
    spec = env.spec
    if len(spec.obs_shape) != 1:
        raise ValueError(f"{task} has observations of shape {spec.obs_shape}: this probe fits vector observations only")
    k_reset, k_roll = jax.random.split(jax.random.PRNGKey(seed))
    state, obs = env.reset(k_reset)
    _, _, ro = collect_rollout(env, policy or uniform_random_policy(spec), params, state, obs, k_roll, steps)
    kept = np.asarray(ro.valid) & ~np.asarray(ro.boundary)
    if spec.on_terminate == "reset":  # a termination that resets: the next observation is the reset's
        kept &= ~np.asarray(ro.terminated)
    action = np.asarray(clip_action(spec, ro.action))
    if spec.discrete:
        action = np.eye(spec.num_actions)[action]
    next_obs = np.asarray(jnp.concatenate([ro.obs[1:], ro.last_obs[None]], axis=0))
    return dict(obs=np.asarray(ro.obs)[kept], action=action[kept], next_obs=next_obs[kept],
                reward=np.asarray(ro.true_reward)[kept])


FIELDS = {"o_t": "obs", "a_t": "action", "o_t+1": "next_obs"}  # an input set's parts: transitions' fields


def _features(xs, stats=None, quadratic: bool = False):
    """The design matrix of a fit on the inputs ``xs`` (columns side by side), standardized by
    ``stats`` (a fitted set's mean and std; its own where None), with every pairwise product of
    the standardized inputs where ``quadratic`` (squares included), and a constant; and the stats."""
    x = np.concatenate([np.asarray(i, np.float64).reshape(len(xs[0]), -1) for i in xs], axis=1)
    if stats is None:
        stats = (x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0))
    z = (x - stats[0]) / stats[1]
    if quadratic:
        i, j = np.triu_indices(z.shape[1])
        z = np.concatenate([z, z[:, i] * z[:, j]], axis=1)
    return np.concatenate([z, np.ones((len(z), 1))], axis=1), stats


def _r2(pred, target) -> float:
    """R² of ``pred`` against ``target`` (negative where worse than ``target``'s mean; NaN where
    ``target`` does not vary)."""
    pred, target = np.asarray(pred, np.float64), np.asarray(target, np.float64)
    return float(1.0 - np.mean((pred - target) ** 2) / target.var()) if target.var() > 0 else float("nan")


def r_squared(reward: np.ndarray, *inputs: np.ndarray, quadratic: bool = False) -> float:
    """R² of the least-squares fit of ``reward`` on ``inputs`` and a constant (``quadratic``: see
    :func:`_features`); NaN where the reward does not vary."""
    y = np.asarray(reward, np.float64)
    if y.var() == 0:
        return float("nan")
    x, _ = _features(inputs, quadratic=quadratic)
    w, *_ = np.linalg.lstsq(x, y, rcond=None)
    return _r2(x @ w, y)


def _inputs(t: dict, name: str) -> tuple[np.ndarray, ...]:
    return tuple(t[FIELDS[part]] for part in name.split(","))


def probe(task: str, steps: int = 2000, num_envs: int = 8, seed: int = 0) -> dict[str, dict[str, float]]:
    """{"linear" | "quadratic": {input set (:data:`INPUT_SETS`): R²}} for ``task``, and ``steps``:
    the number of transitions fitted."""
    t = transitions(task, steps, num_envs, seed)
    return dict(steps=len(t["reward"]), **{kind: {name: r_squared(t["reward"], *_inputs(t, name),
                                                                  quadratic=kind == "quadratic")
                                                  for name in INPUT_SETS} for kind in ("linear", "quadratic")})


def transfer(fitted: dict, scored: dict) -> dict:
    """Fits on ``fitted``'s transitions (:func:`transitions`), scored on ``scored``'s: the true mean
    reward per step there (``true_mean``) and, per kind and input set, the fit's mean prediction
    there (``mean``) and its R² there (``r2``: negative where it does worse than the true mean)."""
    y, target = np.asarray(fitted["reward"], np.float64), np.asarray(scored["reward"], np.float64)
    out = dict(true_mean=float(target.mean()), steps=len(target))
    for kind in ("linear", "quadratic"):
        out[kind] = {}
        for name in INPUT_SETS:
            x, stats = _features(_inputs(fitted, name), quadratic=kind == "quadratic")
            w, *_ = np.linalg.lstsq(x, y, rcond=None)
            pred = _features(_inputs(scored, name), stats, quadratic=kind == "quadratic")[0] @ w
            out[kind][name] = dict(mean=float(pred.mean()), r2=_r2(pred, target))
    return out


def mlp_transfer(fitted: dict, scored: dict, *, discrete: bool, num_actions: int, seeds: int = 3,
                 steps: int = 6000, batch: int = 256, lr: float = 1e-3) -> dict:
    """As :func:`transfer`, with A.1's reward MLP (``RewardMLP``: 2 × 64, leaky ReLU) in place of the
    least squares, fitted by squared error to the step rewards (Adam, ``steps`` batches of
    ``batch``) on the standardized inputs, once per seed: {input set: {"mean": [per seed], "r2":
    [per seed], "fit_r2": [per seed, on the fitted steps]}}."""
    import jax
    import jax.numpy as jnp
    import optax

    from rlhp_jax.reward_models import RewardMLP

    y, target = jnp.asarray(fitted["reward"], jnp.float32), scored["reward"]
    out = {}
    for name in INPUT_SETS:
        parts = name.split(",")
        states = [p for p in parts if p != "a_t"]
        x = np.concatenate([fitted[FIELDS[p]] for p in states], axis=1)
        mu, sd = x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0)
        xs = jnp.asarray((x - mu) / sd, jnp.float32)
        xp = jnp.asarray((np.concatenate([scored[FIELDS[p]] for p in states], axis=1) - mu) / sd, jnp.float32)
        # the action as the reward model takes it: an index where discrete (transitions one-hot them)
        to_action = (lambda a: jnp.asarray(np.argmax(a, axis=1), jnp.int32)) if discrete else \
            (lambda a: jnp.asarray(a, jnp.float32))
        a_fit, a_score = to_action(fitted["action"]), to_action(scored["action"])
        model = RewardMLP(num_actions=num_actions, discrete=discrete, use_action="a_t" in parts)
        opt = optax.adam(lr)

        @jax.jit
        def train(key):
            params = model.init(key, xs[:1], a_fit[:1])

            def step(carry, k):
                params, opt_state = carry
                idx = jax.random.randint(k, (batch,), 0, len(y))
                g = jax.grad(lambda p: jnp.mean((model.apply(p, xs[idx], a_fit[idx]) - y[idx]) ** 2))(params)
                updates, opt_state = opt.update(g, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), None

            (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), jax.random.split(key, steps))
            return model.apply(params, xs, a_fit), model.apply(params, xp, a_score)

        rows = dict(mean=[], r2=[], fit_r2=[])
        for seed in range(seeds):
            on_fit, pred = (np.asarray(v, np.float64) for v in train(jax.random.PRNGKey(seed)))
            rows["mean"].append(float(pred.mean()))
            rows["r2"].append(_r2(pred, target))
            rows["fit_r2"].append(_r2(on_fit, y))
        out[name] = rows
    return out


def run_policy(run: str):
    """(the run's task spec, its agent's ``policy_fn``, its params): the newest policy of the
    Christiano run ``run``, sampling."""
    from experiments.reward_diagnostics import load

    pr, state = load(run)
    return pr.spec, pr.agent.policy, state["agent"].params


def _cells(values) -> str:
    """Per-seed values as ``a, b, c``."""
    return ", ".join("–" if np.isnan(v) else f"{v:.3g}" for v in values)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.reward_inputs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=[], help="tasks to probe (any vector-observation task)")
    p.add_argument("--policy", default=None, metavar="RUN",
                   help="also score the random-action fits on RUN's newest policy's transitions (RUN's task)")
    p.add_argument("--mlp", type=int, default=0, metavar="SEEDS",
                   help="with --policy: also fit A.1's reward MLP by squared error, SEEDS times per input set")
    p.add_argument("--steps", type=int, default=2000, help="batched steps per task (default 2000)")
    p.add_argument("--envs", type=int, default=8, help="environments stepped at once (default 8)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 2 or args.envs < 1:
        p.error("--steps must be at least 2 and --envs positive")
    if not args.tasks and args.policy is None:
        p.error("give --tasks, --policy RUN, or both")
    if args.mlp and args.policy is None or args.mlp < 0:
        p.error("--mlp SEEDS (a positive count) fits the MLP for --policy RUN: give both")
    from rlhp_jax.tasks import resolve

    results, moved = {}, None
    try:
        for task in args.tasks:
            resolve(task)  # every name checked before any task is stepped
        if args.policy is not None:
            spec, policy, params = run_policy(args.policy)
            print(f"stepping {spec.name} ({args.steps} steps × {args.envs} environments) with random actions and with "
                  f"{args.policy}'s policy", flush=True)
            fitted = transitions(spec.name, args.steps, args.envs, args.seed)
            scored = transitions(spec.name, args.steps, args.envs, args.seed + 1, policy=policy, params=params)
            moved = transfer(fitted, scored)
            if args.mlp:
                print(f"fitting A.1's reward MLP on each input set, {args.mlp} seed(s)", flush=True)
                mlp = mlp_transfer(fitted, scored, discrete=spec.discrete, num_actions=spec.num_actions, seeds=args.mlp)
        for task in args.tasks:
            print(f"stepping {task} ({args.steps} steps × {args.envs} environments, random actions)", flush=True)
            results[task] = probe(task, args.steps, args.envs, args.seed)
    except (ValueError, OSError) as e:
        return refuse(e)
    if moved is not None:
        print(f"\nfitted on random actions, scored on {args.policy}'s policy ({moved['steps']:,} transitions; "
              f"true reward per step there {moved['true_mean']:.4g}): the fit's mean per step there, and its R² there\n")
        print("| inputs | linear: mean | linear: R² | quadratic: mean | quadratic: R² |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name in INPUT_SETS:
            lin, quad = moved["linear"][name], moved["quadratic"][name]
            r2 = ["–" if np.isnan(x["r2"]) else f"{x['r2']:.3f}" for x in (lin, quad)]
            print(f"| {name} | {lin['mean']:.4g} | {r2[0]} | {quad['mean']:.4g} | {r2[1]} |")
        if args.mlp:
            print("\nA.1's reward MLP, fitted by squared error on the random actions' steps (one value per seed)\n")
            print("| inputs | R² on the fitted steps | mean per step on the policy | R² on the policy |")
            print("| --- | ---: | ---: | ---: |")
            for name, rows in mlp.items():
                print(f"| {name} | {_cells(rows['fit_r2'])} | {_cells(rows['mean'])} | {_cells(rows['r2'])} |")
        if not results:
            return 0
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
