"""Plot the fall diagnostics of preference runs on tasks that penalize leaving a healthy range.

    python -m experiments.fall_diagnostics runs/mujoco/Hopper-trpo-700labels-seed0 --out docs/results/falls_Hopper.png

Every iteration of a learning run on a task that penalizes each step out of its range (Ant, the
pendulums, CartPole; Hopper and Walker2d with ``--env-options '(("penalty_shape","range"),)'``, their
default being the height reward, which has no penalty to find falls by) writes ``fall_*`` columns
to ``metrics.jsonl`` (``RunParts.fall_diagnostics``).  This draws four panels
against environment steps, one line per run: how often the agent is out of the healthy range;
how many candidate clips and how many of the clips selection picks show a fall; mean r̂ on
fallen and on healthy steps; and corr(r̂, true return) on clips with and without a fall.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlhp_jax.metrics import read_jsonl, save_png
from rlhp_jax.refusal import refuse

PANELS = (
    ("agent out of the healthy range (fraction of steps)", (("fall_out_of_range", "-"),)),
    ("clips holding a fall (fraction)", (("fall_candidate_falls", "-"), ("fall_chosen_falls", "--"))),
    ("mean r̂ (as the agent gets it)", (("fall_rhat_healthy", "-"), ("fall_rhat_fallen", "--"))),
    ("mean true reward", (("fall_true_healthy", "-"), ("fall_true_fallen", "--"))),
    ("corr(r̂, true return) over clips", (("fall_corr_healthy_clips", "-"), ("fall_corr_fall_clips", "--"))),
)
LEGEND = {"fall_candidate_falls": "candidates", "fall_chosen_falls": "chosen by selection",
          "fall_rhat_healthy": "healthy steps", "fall_rhat_fallen": "fallen steps",
          "fall_true_healthy": "healthy steps", "fall_true_fallen": "fallen steps",
          "fall_corr_healthy_clips": "clips without a fall", "fall_corr_fall_clips": "clips with a fall"}


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(env_steps, values) of the rows that have a finite ``key``."""
    pts = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(run_dirs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(run_dirs):
        rows = read_jsonl(run / "metrics.jsonl")
        if not any("fall_out_of_range" in r for r in rows):
            raise ValueError(f"{run} has no fall diagnostics: they come from a learning run on a task with a "
                             "penalty out of range (Hopper and Walker2d default to the height reward: run them "
                             "with --env-options '((\"penalty_shape\",\"range\"),)')")
        for ax, (title, keys) in zip(axes.flat, PANELS + (("", ()),)):
            if not keys:
                ax.axis("off")
                continue
            for key, style in keys:
                x, y = series(rows, key)
                label = run.name + (f": {LEGEND[key]}" if key in LEGEND else "")
                ax.plot(x, y, style, color=colors[i % len(colors)], label=label, lw=1.2)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            if "fraction" in title:
                ax.set_ylim(-0.02, 1.02)
    for ax in axes[1]:
        ax.set_xlabel("environment steps")
    for ax in list(axes.flat)[:len(PANELS)]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, out)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", type=Path, default=Path("falls.png"))
    args = p.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        return refuse(f"no metrics.jsonl in {', '.join(missing)}")
    try:
        plot(args.runs, args.out)
    except (ValueError, OSError) as e:
        return refuse(e)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
