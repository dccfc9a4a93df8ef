"""Reward-model diagnostics of Ibarz et al. 2018 (§3.2, appendices C–E), as plots.

    python -m experiments.ibarz_diagnostics alignment --run RUN_DIR [--steps 20000]
        true vs learned reward summed over windows of 25 and 1,000 actor steps (Fig. 3 / 8):
        the run's final policy and reward model, fixed, on fresh experience
    python -m experiments.ibarz_diagnostics loss --run RUN_DIR
        reward-model loss against the label-entropy lower bound over training (Fig. 7)
    python -m experiments.ibarz_diagnostics label-noise --rates 0 0.05 0.1 0.2 --out DIR -- TRAINING FLAGS
        one run per mistake rate of the synthetic oracle (Fig. 9); TRAINING FLAGS are those of
        experiments.atari / experiments.classic with --agent dqfd (--env decides which)
    python -m experiments.ibarz_diagnostics frozen --run RUN_DIR [--out DIR] [--steps N]
        a fresh agent trained on RUN_DIR's final reward model, held fixed: true and model return over
        training (reward hacking, Fig. 4)

    python -m experiments.ibarz_diagnostics compare --runs RUN_DIR... --out setups.png
        score per episode of several runs (e.g. the four setups, Fig. 1) on one plot

Each writes a PNG and a JSON of the numbers it plots next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from experiments.cli import add_compile_cache_flag, start_compile_cache
from rlhp_jax.files import write_atomic
from rlhp_jax.refusal import refuse


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load_run(run_dir: str):
    """(the run's directory, its ``IbarzConfig``), read and checked by ``runs.read_run_config``;
    a run of another protocol is a one-line ``ValueError``."""
    from rlhp_jax.config import IbarzConfig
    from rlhp_jax.runs import read_run_config

    cfg = read_run_config(run_dir)
    if not isinstance(cfg, IbarzConfig):
        raise ValueError(f"{run_dir} is not a run of Ibarz et al.'s protocol (--agent dqfd): these diagnostics "
                         "read only such runs")
    return Path(run_dir), cfg


# ---------------------------------------------------------------------------- alignment
def window_sums(x: np.ndarray, window: int) -> np.ndarray:
    """Sums over consecutive, non-overlapping windows (a trailing partial window is dropped)."""
    n = (len(x) // window) * window
    return np.asarray(x[:n], np.float64).reshape(-1, window).sum(1)


def alignment(run_dir: str, steps: int, epsilon: float, seed: int = 1) -> dict:
    import jax
    import jax.numpy as jnp

    from rlhp_jax.ibarz import IbarzRun, load_models
    from rlhp_jax.metrics import save_png

    run, cfg = _load_run(run_dir)
    if not cfg.uses_reward_model:
        raise ValueError(f"{run} used no reward model ({cfg.setup} setup): nothing to align")
    r = IbarzRun(dataclasses.replace(cfg, num_envs=1), progress=False, log=lambda *_: None)
    key = jax.random.PRNGKey(seed)
    params, rm_state, meta = load_models(run, r.agent, r.rm, r.agent.init(key).params, r.rm.init(key))
    env_state, obs = r.env.reset(key)
    true, model = [], []
    for _ in range(steps):
        key, k = jax.random.split(key)
        o = obs
        env_state, action, out = r.act_step(params, env_state, obs, k, jnp.float32(epsilon))
        if bool(out.valid[0]):
            true.append(float(out.true_reward[0]))
            model.append(float(r.rewards(rm_state, o, action)[0]))
        obs = out.obs
    true, model = np.asarray(true), np.asarray(model)
    result = dict(run=str(run), env=cfg.env, steps=len(true), epsilon=epsilon, stage=meta["stage"],
                  labels=meta["labels"])
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
    for ax, w in zip(axes, (25, 1000)):
        t, m = window_sums(true, w), window_sums(model, w)
        corr = float(np.corrcoef(t, m)[0, 1]) if len(t) > 2 and t.std() > 0 and m.std() > 0 else None
        result[f"windows_{w}"] = dict(count=len(t), correlation=corr, true=t.tolist(), model=m.tolist())
        ax.scatter(t, m, s=8, alpha=0.5, color="tab:purple")
        ax.set_xlabel(f"true reward over {w} steps (oracle's)")
        ax.set_ylabel(f"r̂ over {w} steps")
        ax.set_title(f"{w}-step windows ({len(t)}), corr = {corr:.2f}" if corr is not None
                     else f"{w}-step windows ({len(t)}): too few / constant")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{cfg.env}: true vs learned reward, final policy and reward model of {run.name}")
    fig.tight_layout()
    save_png(fig, run / "alignment.png")
    plt.close(fig)
    write_atomic(run / "alignment.json", json.dumps(result))
    return {k: v for k, v in result.items() if not k.startswith("windows")} | {
        f"correlation_{w}": result[f"windows_{w}"]["correlation"] for w in (25, 1000)}


# ---------------------------------------------------------------------------- loss vs bound
def loss_plot(run_dir: str) -> dict:
    from rlhp_jax.metrics import read_jsonl, save_png

    run, cfg = _load_run(run_dir)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("rm_loss") is not None]
    if not rows:
        raise ValueError(f"{run}: no reward-model training recorded yet")
    x = [r["env_steps"] for r in rows]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.3))
    ax.plot(x, [r["rm_loss"] for r in rows], "-o", markersize=3, label="cross-entropy loss (every label)")
    ax.plot(x, [r.get("rm_val_loss") for r in rows], "-o", markersize=3, label="cross-entropy loss (held-out labels)")
    ax.plot(x, [r["label_entropy_bound"] for r in rows], "k:", label="label-entropy lower bound")
    ax.set_xlabel("actor steps")
    ax.set_ylabel("loss (nats per label)")
    ax.set_title(f"{cfg.env}: reward-model loss vs its lower bound")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, run / "reward_model_loss.png")
    plt.close(fig)
    last = rows[-1]
    result = dict(run=str(run), final_loss=last["rm_loss"], final_val_loss=last.get("rm_val_loss"),
                  final_bound=last["label_entropy_bound"],
                  final_ratio=last["rm_loss"] / max(last["label_entropy_bound"], 1e-9))
    write_atomic(run / "reward_model_loss.json", json.dumps(result))
    return result


# ---------------------------------------------------------------------------- label noise
def _domain_for(env: str):
    from rlhp_jax import tasks

    if env in tasks.names("gymnax"):
        from experiments.classic import DOMAIN
    else:
        from experiments.atari import DOMAIN
    return DOMAIN


def label_noise(rates: list[float], out: str, training: list[str], progress: bool) -> dict:
    from experiments.cli import build_parser, ibarz_config_from_args
    from rlhp_jax.ibarz import IbarzRun
    from rlhp_jax.metrics import read_jsonl, save_png

    if not rates or any(not 0.0 <= r <= 0.5 for r in rates):
        raise ValueError(f"--rates must be mistake probabilities in [0, 0.5], got {rates}")
    env = "Pong"
    if "--env" in training:
        env = training[training.index("--env") + 1]
    domain = _domain_for(env)
    parser = build_parser(domain)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    results = {}
    for rate in rates:
        args = parser.parse_args(list(training) + ["--agent", "dqfd", "--teacher.mistake-rate", str(rate),
                                                   "--out", str(root / f"mistakes-{rate:g}")])
        if getattr(args, "setup", None) == "demos+prefs+autolabels":
            raise ValueError("Ibarz's label-noise runs do not use autolabels (Fig. 9): choose another --setup")
        cfg = ibarz_config_from_args(args, domain)
        summary = IbarzRun(cfg, progress=progress).run()
        rows = [r for r in read_jsonl(Path(cfg.out) / "metrics.jsonl") if r.get("phase") == "iteration"]
        results[rate] = dict(summary=summary, curve=[(r["env_steps"], r.get("episode_return")) for r in rows])
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for rate, res in results.items():
        pts = [(x, y) for x, y in res["curve"] if y is not None]
        if pts:
            axes[0].plot(*zip(*pts), "-o", markersize=3, label=f"{rate:.0%} mistakes")
    axes[0].set_xlabel("actor steps")
    axes[0].set_ylabel("score per episode")
    axes[0].set_title("learning curves")
    axes[0].legend(fontsize=8)
    finals = [(rate, res["summary"]["final_episode_return"]) for rate, res in results.items()
              if res["summary"]["final_episode_return"] is not None]
    if finals:
        axes[1].plot([100 * r for r, _ in finals], [s for _, s in finals], "-o")
    axes[1].set_xlabel("oracle mistake rate (%)")
    axes[1].set_ylabel("final score per episode")
    axes[1].set_title("final score vs label noise")
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle(f"{env}: effect of label noise (synthetic oracle)")
    fig.tight_layout()
    save_png(fig, root / "label_noise.png")
    plt.close(fig)
    out_json = {str(k): dict(final_episode_return=v["summary"]["final_episode_return"], run=v["summary"].get("env"),
                             curve=v["curve"]) for k, v in results.items()}
    write_atomic(root / "label_noise.json", json.dumps(out_json))
    return {str(k): v["final_episode_return"] for k, v in out_json.items()}


# ---------------------------------------------------------------------------- frozen reward model
def frozen(run_dir: str, out: str | None, steps: int | None, progress: bool) -> dict:
    from rlhp_jax.ibarz import IbarzRun
    from rlhp_jax.metrics import read_jsonl, save_png

    run, cfg = _load_run(run_dir)
    if not cfg.learns_rewards:
        raise ValueError(f"{run} learned no reward model ({cfg.setup} setup{', frozen' if cfg.frozen_reward else ''})")
    target = Path(out) if out else run.with_name(run.name + "-frozen")
    changes = dict(frozen_reward=str(run), out=str(target))
    if steps is not None:
        changes["total_steps"] = steps
    summary = IbarzRun(dataclasses.replace(cfg, **changes), progress=progress).run()
    rows = [r for r in read_jsonl(target / "metrics.jsonl") if r.get("phase") == "iteration"]
    x = [r["env_steps"] for r in rows]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.3))
    ax.plot(x, [r.get("true_reward_per_1000") for r in rows], color="tab:blue", label="true (oracle's) reward")
    ax.set_ylabel("true reward per 1,000 steps", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(x, [r.get("model_reward_per_1000") for r in rows], color="tab:red", label="reward model")
    ax2.set_ylabel("r̂ per 1,000 steps", color="tab:red")
    ax.set_xlabel("actor steps")
    ax.grid(alpha=0.3)
    ax.set_title(f"{cfg.env}: training on a frozen reward model (from {run.name})")
    fig.tight_layout()
    save_png(fig, target / "reward_hacking.png")
    plt.close(fig)
    result = dict(summary=summary, true_reward_per_1000=[r.get("true_reward_per_1000") for r in rows],
                  model_reward_per_1000=[r.get("model_reward_per_1000") for r in rows], env_steps=x)
    write_atomic(target / "reward_hacking.json", json.dumps(result))
    return dict(out=str(target), final_episode_return=summary["final_episode_return"])


# ---------------------------------------------------------------------------- several runs
def compare(runs: list[str], out: str) -> dict:
    from rlhp_jax.metrics import read_jsonl, save_png

    result = {}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for i, run_dir in enumerate(runs):
        run, cfg = _load_run(run_dir)
        rows = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("phase") == "iteration"]
        label = cfg.setup + (" (frozen r̂)" if cfg.frozen_reward else "") + f", seed {cfg.seed}"
        pts = [(r["env_steps"], r["episode_return"]) for r in rows if r.get("episode_return") is not None]
        if pts:
            axes[0].plot(*zip(*pts), "-o", markersize=3, label=label, color=f"C{i}")
        tr = [(r["env_steps"], r["true_reward_per_1000"]) for r in rows if r.get("true_reward_per_1000") is not None]
        if tr:
            axes[1].plot(*zip(*tr), "-o", markersize=3, label=label, color=f"C{i}")
        result[str(run)] = dict(setup=cfg.setup, seed=cfg.seed, labels=rows[-1]["labels"] if rows else None,
                                final_episode_return=pts[-1][1] if pts else None, curve=pts)
    axes[0].set_ylabel("score per episode (game reward)")
    axes[1].set_ylabel("oracle's reward per 1,000 steps")
    for a in axes:
        a.set_xlabel("actor steps")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, out)
    plt.close(fig)
    write_atomic(out.with_suffix(".json"), json.dumps(result))
    return {k: v["final_episode_return"] for k, v in result.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.ibarz_diagnostics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("alignment", allow_abbrev=False, help="true vs learned reward over 25- and 1000-step windows")
    a.add_argument("--run", required=True)
    a.add_argument("--steps", type=int, default=20_000, help="actor steps to collect (default 20,000)")
    a.add_argument("--epsilon", type=float, default=0.01, help="exploration of the fixed policy")
    a.add_argument("--seed", type=int, default=1)
    lo = sub.add_parser("loss", allow_abbrev=False, help="reward-model loss vs the label-entropy bound")
    lo.add_argument("--run", required=True)
    n = sub.add_parser("label-noise", allow_abbrev=False, help="one run per oracle mistake rate")
    n.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2])
    n.add_argument("--out", required=True)
    n.add_argument("--no-progress", action="store_true")
    n.add_argument("training", nargs=argparse.REMAINDER, help="-- then the training flags")
    f = sub.add_parser("frozen", allow_abbrev=False, help="train a fresh agent on a finished run's reward model, held fixed")
    f.add_argument("--run", required=True)
    f.add_argument("--out", default=None)
    f.add_argument("--steps", type=int, default=None)
    f.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("compare", allow_abbrev=False, help="score curves of several runs on one plot")
    c.add_argument("--runs", nargs="+", required=True)
    c.add_argument("--out", required=True, help="PNG to write (a JSON beside it)")
    for training in (a, n, f):  # the commands that compile: a second call loads the programs
        add_compile_cache_flag(training)
    args = p.parse_args(argv)
    if hasattr(args, "no_compile_cache"):
        start_compile_cache(args)
    try:
        if args.cmd == "alignment":
            res = alignment(args.run, args.steps, args.epsilon, args.seed)
            print(f"wrote {Path(args.run) / 'alignment.png'}")
        elif args.cmd == "loss":
            res = loss_plot(args.run)
            print(f"wrote {Path(args.run) / 'reward_model_loss.png'}")
        elif args.cmd == "label-noise":
            training = [x for x in args.training if x != "--"]
            res = label_noise(args.rates, args.out, training, not args.no_progress)
            print(f"wrote {Path(args.out) / 'label_noise.png'}")
        elif args.cmd == "compare":
            res = compare(args.runs, args.out)
            print(f"wrote {args.out}")
        else:
            res = frozen(args.run, args.out, args.steps, not args.no_progress)
            print(f"wrote {Path(res['out']) / 'reward_hacking.png'}")
    except (ValueError, OSError) as e:  # a CheckpointError and a DemoError are ValueErrors
        return refuse(e)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
