"""Christiano Fig. 2 on this machine: synthetic labels versus RL on the true reward, over seeds.

    python -m experiments.reproduce_mujoco                         # HalfCheetah, Hopper, Swimmer; 3 seeds
    python -m experiments.reproduce_mujoco --tasks Hopper --seeds 0 1 --steps 500000 --labels 700 1400
    python -m experiments.reproduce_mujoco --plot-only             # redraw from finished runs

Runs ``experiments.mujoco`` for every task × seed × {each label budget, the true-reward
baseline} at the same step budget (a finished run is skipped, an interrupted one resumed), then
draws one PNG per task — the oracle's true return per 1000-step episode against environment
steps, mean ± std over seeds — and a Markdown table of the final returns.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from experiments import mujoco
from rlhp_jax.metrics import read_jsonl


def _run_dir(root: Path, task: str, tag: str, seed: int) -> Path:
    return root / f"{task}-{tag}-seed{seed}"


def run_grid(args) -> None:
    for task in args.tasks:
        for seed in args.seeds:
            for labels in [*args.labels, None]:
                tag = "baseline" if labels is None else f"{labels}labels"
                out = _run_dir(Path(args.root), task, tag, seed)
                if (out / "summary.json").exists():
                    continue
                if (out / "checkpoints").exists():
                    argv = ["--resume", str(out)]
                else:
                    argv = ["--env", task, "--seed", str(seed), "--steps", str(args.steps), "--out", str(out)]
                    argv += ["--baseline"] if labels is None else ["--labels", str(labels)]
                print(f"== {task} {tag} seed {seed}", flush=True)
                if mujoco.main(argv + ["--no-progress"]) != 0:
                    raise SystemExit(f"run failed: {out}")


def curves(root: Path, task: str, tag: str, seeds) -> tuple[np.ndarray, np.ndarray] | None:
    runs = []
    for seed in seeds:
        path = _run_dir(root, task, tag, seed) / "metrics.jsonl"
        if path.exists():
            rows = read_jsonl(path)
            runs.append(([r["env_steps"] for r in rows], [r["true_return"] for r in rows]))
    if not runs:
        return None
    n = min(len(x) for x, _ in runs)
    return np.asarray(runs[0][0][:n]), np.asarray([y[:n] for _, y in runs])


def plot(args) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root, docs = Path(args.root), Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    table = ["| task | " + " | ".join([f"{n} labels" for n in args.labels] + ["RL, true reward"]) + " |",
             "| --- |" + " --- |" * (len(args.labels) + 1)]
    for task in args.tasks:
        fig, ax = plt.subplots(figsize=(6, 4))
        cells = []
        for tag, label in [(f"{n}labels", f"{n} synthetic labels") for n in args.labels] + [("baseline", "RL on true reward")]:
            c = curves(root, task, tag, args.seeds)
            if c is None:
                cells.append("–")
                continue
            x, ys = c
            # smooth each seed over 5 iterations (the per-iteration return is noisy)
            k = min(5, ys.shape[1])
            ys = np.stack([np.convolve(y, np.ones(k) / k, mode="valid") for y in ys])
            x = x[k - 1:]
            m, s = ys.mean(0), ys.std(0)
            ax.plot(x, m, label=f"{label} ({len(ys)} seeds)")
            ax.fill_between(x, m - s, m + s, alpha=0.2)
            cells.append(f"{m[-1]:.0f} ± {s[-1]:.0f}")
        ax.set_title(f"{task}: true return (mean ± std over seeds)")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("true return per 1000-step episode")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(docs / f"mujoco_{task}.png", dpi=110)
        plt.close(fig)
        table.append(f"| {task} | " + " | ".join(cells) + " |")
    md = "\n".join(table)
    (docs / "mujoco_table.md").write_text(md + "\n")
    return md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["HalfCheetah", "Hopper", "Swimmer"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--labels", nargs="+", type=int, default=[700])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--root", default="runs/reproduce_mujoco")
    p.add_argument("--docs", default="docs/results")
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    tasks = mujoco.DOMAIN.tasks()
    bad = [t for t in args.tasks if t not in tasks]
    if bad:
        print(f"error: unknown task(s) {', '.join(bad)}; supported: {', '.join(tasks)}", file=sys.stderr)
        return 2
    if not args.plot_only:
        run_grid(args)
    print(plot(args))
    print(json.dumps({"plots": [str(Path(args.docs) / f"mujoco_{t}.png") for t in args.tasks]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
