"""Christiano et al. 2017, Fig. 2, from one command: synthetic labels versus RL on the true reward
on the eight MuJoCo tasks, over seeds.

    python -m experiments.reproduce_mujoco                          # 8 tasks x 5 seeds x {700 labels, true reward}
    python -m experiments.reproduce_mujoco --labels 350 700 1400    # Fig. 2's three label budgets
    python -m experiments.reproduce_mujoco --tasks Hopper Swimmer --seeds 3 --steps 200000 --jobs 2
    python -m experiments.reproduce_mujoco --seed-list 3 4          # seeds 3 and 4 only
    python -m experiments.reproduce_mujoco --dry-run                # the plan; nothing runs
    python -m experiments.reproduce_mujoco --plot-only              # redraw and rewrite the table

The grid is every task x seed x {each --labels budget, the true-reward baseline}; each cell is one
``python -m experiments.mujoco`` run (A.1 settings) in ``ROOT/TASK-TAG-STEPS-seedS`` (TAG:
``700labels`` or ``baseline``; STEPS: the budget, ``1M``, ``3M``), started as its own subprocess
with ``--no-progress``, its output in ``ROOT/TASK-TAG-STEPS-seedS.log``.  Runs of another budget
keep their own directories, so changing a budget never collides with finished runs.  ``--jobs N`` runs N of them at once.  Runs go seed by seed (every
task and arm of seed 0, then seed 1, ...), so an interrupted grid already covers every task.

Seeds: ``--seeds N`` (default 5, as in the paper) means seeds 0..N-1; ``--seed-list S [S ...]``
names them instead.  The two flags exclude each other.

Step budget: ``DEFAULT_STEPS``: 1M environment steps on Reacher and InvertedPendulum, whose
true-reward runs level off well before that, and 3M on the others (HalfCheetah, Hopper, Walker2d,
Swimmer, Ant, InvertedDoublePendulum), whose true-reward runs are still climbing at 1M (Hopper
seed 0: 630 at 1M, 3,162 at 2.76M).  On this project's 2-core CPU a 1M-step run takes 1-10 min (the 700-label
arm 2-4x the true-reward one), so the whole default grid (8 tasks x 5 seeds x 2 arms) takes
several sittings: it resumes where it stopped.  ``--steps`` sets one budget for every task.

Re-running is safe and cheap:

* a run directory with ``summary.json`` is finished and skipped;
* one with a ``config.json`` but no summary was interrupted: it continues with
  ``experiments.mujoco --resume DIR`` (from its newest checkpoint, or from the start with the
  same config and seed when it was stopped before its first one);
* a directory with neither a readable ``config.json`` nor a summary (killed while being created)
  is moved aside to ``DIR.incomplete-<timestamp>`` (nothing is deleted) and started afresh;
* a run whose ``config.json`` names another task, seed, step budget, label count or arm than
  the one asked for stops everything before any run starts (``--plot-only`` and ``--dry-run``
  too, so the command written under the table is the one that made it), with the directory and
  the difference named: use another ``--root``, or ask for what that directory holds.

A run that fails (non-zero exit) is reported with its log; the other runs go on, and the command
exits with status 1 at the end.  After each run: ``[k/N] TASK TAG seed S: final true return X
(wall Y s); about Z min left`` (X: the mean of its last 5 metrics rows, as in the table; Z: the
mean wall time of the runs finished so far in this invocation x the runs left / --jobs).

Outputs: ``DOCS/mujoco_TASK.png`` per task and ``DOCS/mujoco_fig2.png`` with every task, in the
layout of Fig. 2 (true return per episode against environment steps; each seed smoothed over 5
consecutive iterations, as the paper averages "five consecutive batches"; mean over seeds with a
± std band; label budgets in blues, darker for more labels; RL on the true reward in orange), and
a table of final returns written into ``--results-md`` between the lines
``<!-- reproduce_mujoco:table:begin -->`` and ``<!-- reproduce_mujoco:table:end -->``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from experiments import mujoco
from experiments.grid import (FINAL_ROWS, GridError, describe_plan, execute, final_return, grid, plan, run_dir,
                                     run_metrics, steps_label)

TASKS = ("Reacher", "HalfCheetah", "Hopper", "Walker2d", "Swimmer", "Ant", "InvertedPendulum",
         "InvertedDoublePendulum")  # Fig. 2's eight tasks, in the order this module runs and draws them

# Environment steps per run (--steps overrides it for all tasks): 1M where TRPO on the true reward
# has levelled off by then (Reacher by ~400k, InvertedPendulum by ~700k, seed 0), 3M where it is
# still climbing at 1M (Hopper seed 0: 630 at 1M, 3,162 at 2.76M; InvertedDoublePendulum seed 0:
# -15,800 at the start, -11,000 at 1M).
DEFAULT_STEPS = {
    "Reacher": 1_000_000,
    "HalfCheetah": 3_000_000,
    "Hopper": 3_000_000,
    "Walker2d": 3_000_000,
    "Swimmer": 3_000_000,
    "Ant": 3_000_000,
    "InvertedPendulum": 1_000_000,
    "InvertedDoublePendulum": 3_000_000,
}
DEFAULT_SEEDS = 5  # "All curves are the average of 5 runs" (Fig. 2 caption)
DEFAULT_LABELS = (700,)  # "With 700 labels we are able to nearly match reinforcement learning"
TARGET_LABELS = 700  # the budget the pass/fail check compares with RL
MORE_LABELS = 1400  # "by 1400 labels our algorithm performs slightly better" than RL
SMOOTH = 5  # Fig. 2: "each point is the average reward over five consecutive batches"
TARGET_FRACTION = 0.9  # 700 labels pass when they reach 90 % of RL's final return

# What still differs from Christiano et al.'s appendix A.1 in these runs (written under the table).
A1_DIFFERENCES: list[str] = [
    "1M environment steps on Reacher and InvertedPendulum, 3M on the other six (a 2-core CPU budget; "
    "A.1 does not give its run length)",
    "the label budget is spent by the run's end: the rate keeps A.1's shape ∝ 2e6/(T + 2e6), "
    "scaled so the last label is due at the last step",
    "Reacher's clips are its whole 50-step episode (1 s), shorter than A.1's 1.5 s",
    "the penalty for a step outside the healthy range (Hopper, Walker2d, Ant, both pendulums) is ours: "
    "such a step scores minus the task's alive bonus (A.1 replaces termination by a penalty of unstated size)",
    "the reward MLP sees each observation feature standardized over the labeled clips (A.1 feeds raw features)",
    "the predictor is fitted between RL iterations (one label per 10 RL steps), not asynchronously; it fits "
    "one iteration's share before the first update, so every batch is scored as an asynchronous predictor "
    "would score it at the batch's end",
    "TRPO's batch (8 envs x 1024 steps), trust region (KL 0.01) and value function are ours: A.1 gives only "
    "gamma, lambda and the entropy bonus",
]

TABLE_BEGIN = "<!-- reproduce_mujoco:table:begin -->"
TABLE_END = "<!-- reproduce_mujoco:table:end -->"
SECTION_TITLE = "## Christiano Fig. 2, all eight tasks (python -m experiments.reproduce_mujoco)"


# ------------------------------------------------------------------ results
def meets_target(learned_mean: float, rl_mean: float) -> bool:
    """Christiano's claim for 700 labels, "nearly match" RL, as a check: at least 90 % of RL's
    final return when that is positive; when it is not (a ratio would flip), at most 10 % of
    |RL| below it."""
    if rl_mean > 0:
        return learned_mean >= TARGET_FRACTION * rl_mean
    return learned_mean >= rl_mean - (1 - TARGET_FRACTION) * abs(rl_mean)


def finished_finals(root: Path, task: str, labels: int | None, seeds, steps: int) -> list[float]:
    """The final true return (:func:`final_return`) of each finished seed of one arm."""
    finals = []
    for seed in seeds:
        directory = run_dir(root, task, labels, seed, steps)
        if (directory / "summary.json").exists():
            value = final_return(run_metrics(directory))
            if value is not None:
                finals.append(value)
    return finals


def _cell(finals: list[float]) -> str:
    """``mean ± std (n seeds)``, both to the precision the mean's size calls for; – without seeds."""
    if not finals:
        return "–"
    mean, std, n = float(np.mean(finals)), float(np.std(finals)), len(finals)
    digits = 0 if abs(mean) >= 100 else 1
    return f"{mean:.{digits}f} ± {std:.{digits}f} ({n} seed{'s' if n != 1 else ''})"


def results_table(root: Path, tasks, label_budgets, seeds, steps_for: Callable[[str], int]) -> str:
    """The Markdown table: per task, each arm's final true return over finished seeds, the 700-label
    target check and, when both were run, whether 1400 labels beat 700."""
    compare_more = TARGET_LABELS in label_budgets and MORE_LABELS in label_budgets
    head = [f"{n} labels" for n in label_budgets] + ["RL on the true reward", f"{TARGET_LABELS} labels vs RL"]
    head += [f"{MORE_LABELS} ≥ {TARGET_LABELS}"] if compare_more else []
    lines = ["| task | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
    for task in tasks:
        finals = {n: finished_finals(root, task, n, seeds, steps_for(task)) for n in [*label_budgets, None]}
        cells = [_cell(finals[n]) for n in [*label_budgets, None]]
        target, rl = finals.get(TARGET_LABELS, []), finals[None]
        cells.append("PASS" if target and rl and meets_target(np.mean(target), np.mean(rl))
                     else "FAIL" if target and rl else "–")
        if compare_more:
            more = finals[MORE_LABELS]
            cells.append(("yes" if np.mean(more) >= np.mean(target) else "no") if more and target else "–")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reproduce_command(tasks, label_budgets, seeds, steps_override: int | None) -> str:
    """The command line that reruns (or, finished, redraws) exactly this grid."""
    parts = ["python -m experiments.reproduce_mujoco", "--tasks", *tasks]
    parts += ["--seeds", str(len(seeds))] if list(seeds) == list(range(len(seeds))) else ["--seed-list", *map(str, seeds)]
    parts += ["--labels", *map(str, label_budgets)]
    budgets = {DEFAULT_STEPS[t] for t in tasks}
    if steps_override is not None or len(budgets) == 1:
        parts += ["--steps", str(steps_override if steps_override is not None else budgets.pop())]
    return " ".join(parts)


def section_markdown(table: str, command: str, steps_for: Callable[[str], int], tasks, figure: str) -> str:
    """What goes between the markers in results.md: table, how to read it, the command, the date,
    the per-task step budgets, the remaining differences from A.1 and the combined figure."""
    budgets = {steps_for(t) for t in tasks}
    steps = "" if len(budgets) == 1 else "; environment steps per run: " + ", ".join(f"{t} {steps_for(t):,}" for t in tasks)
    lines = [
        table, "",
        f"Final true return: the mean of the last {FINAL_ROWS} metrics rows (training iterations) of each "
        "finished seed; then mean ± std over those seeds. "
        f"\"{TARGET_LABELS} labels vs RL\" passes when {TARGET_LABELS} labels reach {TARGET_FRACTION:.0%} of RL's mean "
        f"(when RL's mean is ≤ 0: at most {1 - TARGET_FRACTION:.0%} of |RL| below it); – where an arm has no "
        "finished seed. The curves smooth each seed over 5 consecutive iterations (Fig. 2: \"five consecutive "
        "batches\").", "",
        f"Reproduce: `{command}` ({datetime.date.today().isoformat()}{steps}).", "",
        "Remaining differences from appendix A.1:", "",
        *[f"- {item}" for item in A1_DIFFERENCES], "",
        f"![Christiano Fig. 2 on this machine]({figure})",
    ]
    return "\n".join(lines)


def write_results_section(results_md_path, markdown: str) -> None:
    """Put ``markdown`` between the table markers of ``results_md_path``, leaving everything outside
    them as it was; without markers, append a new section holding them.  Written atomically (a
    temporary file in the same directory, then ``os.replace``) so a crash never leaves it half written."""
    path = Path(results_md_path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    block = f"{TABLE_BEGIN}\n{markdown.strip()}\n{TABLE_END}"
    if begin == -1 and end == -1:
        while text and not text.endswith("\n\n"):  # one blank line before the new section
            text += "\n"
        new = f"{text}{SECTION_TITLE}\n\n{block}\n"
    elif begin == -1 or end == -1 or end < begin or text.count(TABLE_BEGIN) > 1 or text.count(TABLE_END) > 1:
        raise GridError(f"{path}: the markers {TABLE_BEGIN} and {TABLE_END} must each appear once, in that order")
    else:
        new = text[:begin] + block + text[end + len(TABLE_END):]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ figures
def seed_curves(root: Path, task: str, labels: int | None, seeds, steps: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(environment steps, true return [seed, point]) of one arm, each seed smoothed over
    :data:`SMOOTH` consecutive rows and cut to the rows every seed has (runs may still be going);
    None when no seed has a row."""
    runs = []
    for seed in seeds:
        rows = [r for r in run_metrics(run_dir(root, task, labels, seed, steps)) if r.get("true_return") is not None]
        if rows:
            runs.append((np.array([r["env_steps"] for r in rows], float), np.array([r["true_return"] for r in rows], float)))
    if not runs:
        return None
    n = min(len(y) for _, y in runs)
    k = min(SMOOTH, n)
    window = np.ones(k) / k
    ys = np.stack([np.convolve(y[:n], window, mode="valid") for _, y in runs])
    return runs[0][0][k - 1:n], ys


def arm_styles(label_budgets) -> list[tuple[int | None, str, tuple]]:
    """(arm, legend stem, colour) for each arm: label budgets in blues, lighter for fewer labels;
    RL on the true reward in orange (Fig. 2's colours)."""
    from matplotlib import colormaps

    budgets = sorted(label_budgets)
    shades = np.linspace(0.4, 0.9, len(budgets)) if len(budgets) > 1 else [0.7]
    blues = colormaps["Blues"]
    styles = [(n, f"{n} synthetic labels", blues(float(s))) for n, s in zip(budgets, shades)]
    return styles + [(None, "RL on the true reward", (1.0, 0.5, 0.05, 1.0))]


def _seeds_note(counts: list[int]) -> str:
    low, high = min(counts), max(counts)
    return f"({low} seed{'s' if high != 1 else ''})" if low == high else f"({low}–{high} seeds)"


def draw_task(ax, root: Path, task: str, label_budgets, seeds, steps: int) -> dict:
    """One panel of Fig. 2: each arm's mean over seeds as a line, ± std shaded.  Returns
    {legend stem: (line, seeds drawn)} for the arms that have any rows."""
    from matplotlib.ticker import MaxNLocator

    drawn = {}
    for labels, stem, colour in arm_styles(label_budgets):
        curves = seed_curves(root, task, labels, seeds, steps)
        if curves is None:
            continue
        x, ys = curves
        mean, std = ys.mean(0), ys.std(0)
        (line,) = ax.plot(x, mean, color=colour)
        ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
        drawn[stem] = (line, len(ys))
    ax.set_title(task)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(steps_label)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    return drawn


Y_LABEL = "true return per episode\n(mean of 5 consecutive iterations)"


def plot(root: Path, docs: Path, tasks, label_budgets, seeds, steps_for: Callable[[str], int]) -> list[Path]:
    """One PNG per task and the combined ``mujoco_fig2.png``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs.mkdir(parents=True, exist_ok=True)
    written = []
    for task in tasks:
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = draw_task(ax, root, task, label_budgets, seeds, steps_for(task))
        ax.set_xlabel("environment steps")
        ax.set_ylabel(Y_LABEL)
        if drawn:
            ax.legend([line for line, _ in drawn.values()],
                      [f"{stem} {_seeds_note([k])}" for stem, (_, k) in drawn.items()], fontsize=8)
        fig.tight_layout()
        written.append(docs / f"mujoco_{task}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    cols = min(4, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows + 0.8), squeeze=False)
    legend: dict[str, tuple] = {}  # stem -> (a line to show, seeds drawn on each task)
    for ax, task in zip(axes.flat, tasks):
        for stem, (line, k) in draw_task(ax, root, task, label_budgets, seeds, steps_for(task)).items():
            legend.setdefault(stem, (line, []))[1].append(k)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("environment steps")
    for ax in axes[:, 0]:
        ax.set_ylabel(Y_LABEL)
    if legend:  # once for the figure; a seed count that differs between tasks shows as a range
        fig.legend([line for line, _ in legend.values()],
                   [f"{stem} {_seeds_note(counts)}" for stem, (_, counts) in legend.items()],
                   loc="lower center", ncol=len(legend), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if legend else 0, 1, 1))
    written.append(docs / "mujoco_fig2.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# ------------------------------------------------------------------ command line
def _known_tasks() -> list[str]:
    return mujoco.DOMAIN.tasks()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.reproduce_mujoco", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"default: {' '.join(TASKS)}")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                       help=f"run seeds 0..N-1 (default {DEFAULT_SEEDS})")
    seeds.add_argument("--seed-list", type=int, nargs="+", default=None, metavar="S",
                       help="run exactly these seeds instead")
    p.add_argument("--labels", type=int, nargs="+", default=list(DEFAULT_LABELS),
                   help="synthetic-label budgets, e.g. 350 700 1400 (default 700)")
    p.add_argument("--steps", type=int, default=None,
                   help="environment steps per run on every task (default: DEFAULT_STEPS, 1M each)")
    p.add_argument("--root", default="runs/reproduce_mujoco", help="where the runs go (default %(default)s)")
    p.add_argument("--docs", default="docs/results", help="where the PNGs go (default %(default)s)")
    p.add_argument("--results-md", default="docs/results.md",
                   help="Markdown file whose marked section receives the table (default %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (default 1)")
    p.add_argument("--plot-only", action="store_true", help="run nothing; redraw and rewrite the table")
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    args = p.parse_args(argv)
    args.seed_list = list(range(args.seeds)) if args.seed_list is None else args.seed_list
    args.labels = sorted(set(args.labels))
    return args


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`GridError` for flags that cannot make a grid."""
    known = _known_tasks()
    bad = [t for t in args.tasks if t not in known]
    if bad:
        raise GridError(f"unknown task(s) {', '.join(bad)}; supported: {', '.join(known)}")
    if len(set(args.tasks)) != len(args.tasks):
        raise GridError("--tasks names a task twice")
    missing = [t for t in args.tasks if args.steps is None and t not in DEFAULT_STEPS]
    if missing:
        raise GridError(f"no default step budget for {', '.join(missing)}: give --steps")
    if not args.seed_list or min(args.seed_list) < 0 or len(set(args.seed_list)) != len(args.seed_list):
        raise GridError("seeds must be at least one, non-negative and distinct (--seeds N with N >= 1, or --seed-list)")
    if min(args.labels) < 1:
        raise GridError("--labels must be positive (the true-reward baseline is always run)")
    if args.steps is not None and args.steps < 1:
        raise GridError("--steps must be positive")
    if args.jobs < 1:
        raise GridError("--jobs must be at least 1")


def main(argv=None) -> int:
    args = parse_args(argv)
    root, docs, seeds = Path(args.root), Path(args.docs), args.seed_list
    steps_for = (lambda task: args.steps) if args.steps is not None else DEFAULT_STEPS.__getitem__
    try:
        check_args(args)
        states = plan(grid(args.tasks, args.labels, seeds, steps_for), root)
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe_plan(states, root), flush=True)
        return 0
    failed = []
    if not args.plot_only:
        print(describe_plan(states, root), flush=True)
        todo = [(run, state) for run, state in states.items() if state != "finished"]
        try:
            failed = execute(todo, root, args.jobs, log=lambda line: print(line, flush=True))
        except KeyboardInterrupt:
            print("interrupted: the same command resumes the grid", file=sys.stderr)
            return 130
    table = results_table(root, args.tasks, args.labels, seeds, steps_for)
    figures = plot(root, docs, args.tasks, args.labels, seeds, steps_for)
    results_md = Path(args.results_md)
    figure = os.path.relpath(figures[-1], results_md.parent)
    command = reproduce_command(args.tasks, args.labels, seeds, args.steps)
    try:
        write_results_section(results_md, section_markdown(table, command, steps_for, args.tasks, figure))
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    print(json.dumps({"plots": [str(f) for f in figures], "results": str(results_md)}))
    if failed:
        print(f"{len(failed)} run(s) failed; logs: " + ", ".join(str(r.log_path(root)) for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
