"""The papers' figures of label budgets against RL on the true reward, from one command each:
what a figure is (:class:`Figure`: its entry point, tasks, budgets, metric, where its table goes
and what still differs from the paper), its table of final returns in ``docs/results.md``, its
plots, and the command line that runs its grid (:mod:`experiments.grid`) and draws it.

``experiments.reproduce_mujoco`` (Christiano Fig. 2) and ``experiments.reproduce_atari``
(Christiano Fig. 3) are each one :class:`Figure` and its ``main``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import json
import math
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from experiments import grid as grid_lib
from experiments.grid import (FINAL_ROWS, GridError, Run, describe_plan, execute, final_return, grid,
                              ordered, plan, return_digits, run_dir, run_metrics, state_counts, steps_label,
                              stopped_as_by_ctrl_c)
from rlhp_jax.files import write_atomic
from rlhp_jax.metrics import save_png
from rlhp_jax.refusal import check_new_file, check_out_directory, refuse
from rlhp_jax.runs import claimed

TARGET_FRACTION = 0.9  # the target budget passes when it reaches 90 % of RL's final return
WARMUP_ITERATIONS = 3  # iterations the wall-time estimate's warm-up runs (the first is start-up)


def account(states: dict, failed: list) -> str:
    """What a grid did, once its runs have ended: how many it skipped, resumed and started, and failed."""
    n = state_counts(states)
    aside = f" ({n['restart']} after moving an incomplete directory aside)" if n["restart"] else ""
    return (f"done: {n['finished']} skipped (finished before), {n['resume']} resumed, {n['start'] + n['restart']} "
            f"started{aside}; {len(failed)} of them failed")


def meets_target(learned_mean: float, rl_mean: float) -> bool:
    """Christiano's claim that labels "nearly match" RL, as a check: at least 90 % of RL's final
    return when that is positive; when it is not (a ratio would flip), at most 10 % of |RL| below it."""
    if rl_mean > 0:
        return learned_mean >= TARGET_FRACTION * rl_mean
    return learned_mean >= rl_mean - (1 - TARGET_FRACTION) * abs(rl_mean)


def seeds_at_target(learned: list[float], rl: list[float]) -> str:
    """``k of n (RL m of n')``: how many of the learned arm's seeds reach the target
    (:func:`meets_target`) on their own against RL's mean over its seeds, and how many of RL's own
    seeds do (its spread alone leaves some below 90 % of its mean).  A mean can pass on one seed
    far above RL while most seeds fall short (Swimmer's fast gait); this count shows which it is;
    – without both arms."""
    if not learned or not rl:
        return "–"
    rl_mean = float(np.mean(rl))

    def count(arm):
        return f"{sum(meets_target(x, rl_mean) for x in arm)} of {len(arm)}"

    return f"{count(learned)} (RL {count(rl)})"


def cell(finals: list[float]) -> str:
    """``mean ± std (n seeds)``, both to the precision the mean's size calls for; – without seeds."""
    if not finals:
        return "–"
    mean, std, n = float(np.mean(finals)), float(np.std(finals)), len(finals)
    digits = return_digits(mean)
    return f"{mean:.{digits}f} ± {std:.{digits}f} ({n} seed{'s' if n != 1 else ''})"


def difference(larger: list[float], target: list[float]) -> str:
    """``mean(larger) − mean(target)`` signed, with its standard error √(s₁²/n₁ + s₂²/n₂) (each
    arm's sample std) when both arms have two seeds or more; to :func:`cell`'s precision, or finer
    (up to 3 decimals) where that would print a difference or an error that is not zero as 0: at a
    task's ceiling the two budgets differ by hundredths, and "-0.0 ± 0.0" hides which way."""
    d = float(np.mean(larger)) - float(np.mean(target))
    se = (float(np.sqrt(np.var(larger, ddof=1) / len(larger) + np.var(target, ddof=1) / len(target)))
          if min(len(larger), len(target)) >= 2 else None)
    digits = return_digits(float(np.mean(target)))
    smallest = min((abs(x) for x in (d, se or 0.0) if x != 0.0), default=None)
    if smallest is not None and round(smallest, digits) == 0:
        digits = min(3, max(digits, -math.floor(math.log10(smallest))))
    return f"{d:+.{digits}f}" if se is None else f"{d:+.{digits}f} ± {se:.{digits}f}"


def _seeds_note(counts: list[int]) -> str:
    low, high = min(counts), max(counts)
    return f"({low} seed{'s' if high != 1 else ''})" if low == high else f"({low}–{high} seeds)"


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.4 h``, ``2.1 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172_800 else f"{seconds / 86_400:.1f} days"


def arm_styles(label_budgets) -> list[tuple[int | None, str, tuple]]:
    """(arm, legend stem, colour) for each arm: label budgets in blues, lighter for fewer labels;
    RL on the true reward in orange (the papers' colours)."""
    from matplotlib import colormaps

    budgets = sorted(label_budgets)
    shades = np.linspace(0.4, 0.9, len(budgets)) if len(budgets) > 1 else [0.7]
    blues = colormaps["Blues"]
    styles = [(n, f"{n} synthetic labels", blues(float(s))) for n, s in zip(budgets, shades)]
    return styles + [(None, "RL on the true reward", (1.0, 0.5, 0.05, 1.0))]


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure of a paper: a grid of ``python -m experiments.<entry>`` runs, task × seed ×
    {each label budget, RL on the true reward}, and how its results are shown."""

    name: str  # the command: python -m experiments.<name>
    entry: str  # the entry point of each run: python -m experiments.<entry>
    title: str  # the results.md section's heading
    tasks: tuple[str, ...]  # the figure's tasks, in the order they run and are drawn
    default_steps: dict  # task -> environment steps per run
    default_labels: tuple[int, ...]  # the label budgets run by default
    target_labels: int  # the budget the pass/fail check compares with RL
    more_labels: int | None  # a larger budget that should at least match the target one
    differences: tuple[str, ...]  # what still differs from the paper, written under the table
    differences_from: str  # "appendix A.1"
    file_prefix: str  # DOCS/<prefix>_<task>.png, DOCS/<prefix>_<combined>.png
    combined: str  # the combined figure's file stem, e.g. "fig2"
    metric: str = "true_return"  # the metrics column drawn and tabled
    metric_text: str = "true return"  # ... in words
    y_label: str = "true return per episode\n(mean of 5 consecutive iterations)"
    default_seeds: int = 5
    smooth: int = 5  # points averaged per seed: "the average reward over five consecutive batches"
    # the warm-up that estimates the grid's wall time (describe_estimate): WARMUP_ITERATIONS of the run's
    # iterations (its iteration_steps; these steps where that is 0, one agent batch) and the flags that
    # leave out the run's start-up phase
    warmup_steps: int = WARMUP_ITERATIONS * 8192
    warmup_flags: tuple[str, ...] = ()
    startup_note: str = ""  # what of a run's start-up the estimate leaves out

    # ------------------------------------------------------------------ results
    @property
    def table_begin(self) -> str:
        return f"<!-- {self.name}:table:begin -->"

    @property
    def table_end(self) -> str:
        return f"<!-- {self.name}:table:end -->"

    @property
    def section_title(self) -> str:
        return f"## {self.title} (python -m experiments.{self.name})"

    def finished_final(self, directory: Path) -> float | None:
        """The final return (:func:`experiments.grid.final_return`) of the run in ``directory``;
        None until it has finished (written its ``summary.json``) or where it has none.  (The plan
        that comes before every drawing has refused a finished run whose metrics do not cover it:
        :func:`experiments.grid.check_whole_run`.)"""
        if not (directory / "summary.json").exists():
            return None
        return final_return(run_metrics(directory), self.metric)

    def finished_finals(self, root: Path, task: str, labels: int | None, seeds, steps: int) -> list[float]:
        """The final return (:meth:`finished_final`) of each finished seed of one arm."""
        finals = (self.finished_final(run_dir(root, task, labels, seed, steps)) for seed in seeds)
        return [value for value in finals if value is not None]

    @property
    def seeds_heading(self) -> str:
        """The table's column counting the target budget's seeds that reach the target on their own."""
        return f"{self.target_labels}-label seeds at target"

    @property
    def more_heading(self) -> str:
        """The table's column (and its legend's name) for the larger budget against the target one."""
        return f"{self.more_labels} ≥ {self.target_labels}"

    def results_table(self, root: Path, tasks, label_budgets, seeds, steps_for: Callable[[str], int]) -> str:
        """The Markdown table: per task, each arm's final return over finished seeds, the target
        check and, when both were run, whether the larger budget at least matches the target one."""
        target, more = self.target_labels, self.more_labels
        compare_more = target in label_budgets and more in label_budgets
        head = [f"{n} labels" for n in label_budgets] + ["RL on the true reward", f"{target} labels vs RL",
                                                          self.seeds_heading]
        head += [self.more_heading] if compare_more else []
        lines = ["| task | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
        for task in tasks:
            finals = {n: self.finished_finals(root, task, n, seeds, steps_for(task)) for n in [*label_budgets, None]}
            cells = [cell(finals[n]) for n in [*label_budgets, None]]
            aim, rl = finals.get(target, []), finals[None]
            cells.append("PASS" if aim and rl and meets_target(np.mean(aim), np.mean(rl))
                         else "FAIL" if aim and rl else "–")
            cells.append(seeds_at_target(aim, rl))
            if compare_more:
                larger = finals[more]
                cells.append(f"{'yes' if np.mean(larger) >= np.mean(aim) else 'no'} ({difference(larger, aim)})"
                             if larger and aim else "–")
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def reproduce_command(self, tasks, label_budgets, seeds, steps_override: int | None, run_args=()) -> str:
        """The command line that reruns (or, finished, redraws) exactly this grid, ``--run-args``
        included: a table of runs made with other flags must not name the figure's default command."""
        parts = [f"python -m experiments.{self.name}", "--tasks", *tasks]
        parts += ["--seeds", str(len(seeds))] if list(seeds) == list(range(len(seeds))) else ["--seed-list", *map(str, seeds)]
        parts += ["--labels", *map(str, label_budgets)]
        budgets = {self.default_steps[t] for t in tasks if t in self.default_steps}
        if steps_override is not None or len(budgets) == 1:
            parts += ["--steps", str(steps_override if steps_override is not None else budgets.pop())]
        if run_args:
            parts.append("--run-args=" + shlex.quote(shlex.join(run_args)))
        return " ".join(parts)

    def section_markdown(self, table: str, command: str, steps_for: Callable[[str], int], tasks, figure: str) -> str:
        """What goes between the markers in results.md: table, how to read it, the command, the
        date, the per-task step budgets, the remaining differences from the paper and the figure."""
        budgets = {steps_for(t) for t in tasks}
        steps = "" if len(budgets) == 1 else "; environment steps per run: " + ", ".join(f"{t} {steps_for(t):,}" for t in tasks)
        lines = [
            table, "",
            f"Final {self.metric_text}: the mean of the last {FINAL_ROWS} metrics rows (training iterations) "
            "that have one, of each finished seed; then mean ± std over those seeds. "
            f"\"{self.target_labels} labels vs RL\" passes when {self.target_labels} labels reach "
            f"{TARGET_FRACTION:.0%} of RL's mean (when RL's mean is ≤ 0: at most {1 - TARGET_FRACTION:.0%} of |RL| "
            f"below it); \"{self.seeds_heading}\" counts the seeds whose own final return meets that target "
            "against RL's mean, and in brackets RL's own seeds that do: a mean carried by one seed far above RL "
            "shows there as few seeds of many; "
            "– where an arm has no finished seed. "
            + (f"\"{self.more_heading}\" compares the two budgets' means; in brackets their "
               "difference ± its standard error (√(s₁²/n₁ + s₂²/n₂), each arm's sample std): a difference within "
               "about twice its standard error is what the seeds' spread alone gives. "
               if f"| {self.more_heading} |" in table else "")
            + "The curves smooth each seed over "
            f"{self.smooth} consecutive iterations.", "",
            f"Reproduce: `{command}` ({datetime.date.today().isoformat()}{steps}).", "",
            f"Remaining differences from {self.differences_from}:", "",
            *[f"- {item}" for item in self.differences], "",
            f"![{self.title} on this machine]({figure})",
        ]
        return "\n".join(lines)

    def read_results(self, results_md_path) -> tuple[str, int, int]:
        """``results_md_path``'s text (empty where there is no file yet) and where its table's
        markers begin and end (-1 and -1 where it has none).  GridError where the section cannot be
        written there: a directory, a path below a file, a file that is not UTF-8 text, markers
        not each once and in order.  ``main`` asks before any run of the grid starts."""
        begin_mark, end_mark = self.table_begin, self.table_end
        try:  # (a table is derived: an existing file is rewritten, outside its markers as it was)
            path = check_new_file(results_md_path, overwrite=True, flag="--results-md")
            text = path.read_text(encoding="utf-8") if path.exists() else ""
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            raise GridError(f"--results-md {results_md_path}: {' '.join(str(e).split())[:120]}") from None
        begin, end = text.find(begin_mark), text.find(end_mark)
        if (begin == -1) != (end == -1) or end < begin or text.count(begin_mark) > 1 or text.count(end_mark) > 1:
            raise GridError(f"{path}: the markers {begin_mark} and {end_mark} must each appear once, in that order")
        return text, begin, end

    def write_results_section(self, results_md_path, markdown: str) -> None:
        """Put ``markdown`` between the table markers of ``results_md_path``, leaving everything
        outside them as it was; without markers, append a new section holding them.  Written
        atomically (``files.write_atomic``) so a crash never leaves it half written."""
        begin_mark, end_mark = self.table_begin, self.table_end
        path = Path(results_md_path)
        text, begin, end = self.read_results(path)
        block = f"{begin_mark}\n{markdown.strip()}\n{end_mark}"
        if begin == -1:
            while text and not text.endswith("\n\n"):  # one blank line before the new section
                text += "\n"
            new = f"{text}{self.section_title}\n\n{block}\n"
        else:
            new = text[:begin] + block + text[end + len(end_mark):]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, new)

    # ------------------------------------------------------------------ figures
    def seed_curves(self, root: Path, task: str, labels: int | None, seeds,
                    steps: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(environment steps, return [seed, point]) of one arm, each seed smoothed over
        ``smooth`` consecutive rows and cut to the rows every seed has (runs may still be going);
        None when no seed has a row."""
        runs = []
        for seed in seeds:
            rows = [r for r in run_metrics(run_dir(root, task, labels, seed, steps)) if r.get(self.metric) is not None]
            if rows:
                runs.append((np.array([r["env_steps"] for r in rows], float),
                             np.array([r[self.metric] for r in rows], float)))
        if not runs:
            return None
        n = min(len(y) for _, y in runs)
        k = min(self.smooth, n)
        window = np.ones(k) / k
        ys = np.stack([np.convolve(y[:n], window, mode="valid") for _, y in runs])
        return runs[0][0][k - 1:n], ys

    def draw_task(self, ax, root: Path, task: str, label_budgets, seeds, steps: int) -> dict:
        """One panel: each arm's mean over seeds as a line, ± std shaded, and each seed as a thin
        faint line of the arm's colour (a band hides outcomes that split: Swimmer's learned seeds end
        on a slow, an RL-like or a fast gait, and its band spans all three).  Returns {legend stem:
        (line, seeds drawn)} for the arms that have any rows."""
        from matplotlib.ticker import MaxNLocator

        drawn = {}
        for labels, stem, colour in arm_styles(label_budgets):
            curves = self.seed_curves(root, task, labels, seeds, steps)
            if curves is None:
                continue
            x, ys = curves
            mean, std = ys.mean(0), ys.std(0)
            for y in ys:
                ax.plot(x, y, color=colour, alpha=0.35, linewidth=0.6)
            (line,) = ax.plot(x, mean, color=colour)
            ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
            drawn[stem] = (line, len(ys))
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(steps_label)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        return drawn

    def plot(self, root: Path, docs: Path, tasks, label_budgets, seeds, steps_for: Callable[[str], int]) -> list[Path]:
        """One PNG per task and the combined ``<prefix>_<combined>.png``; returns their paths."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        docs.mkdir(parents=True, exist_ok=True)
        written = []
        for task in tasks:
            fig, ax = plt.subplots(figsize=(6, 4))
            drawn = self.draw_task(ax, root, task, label_budgets, seeds, steps_for(task))
            ax.set_xlabel("environment steps")
            ax.set_ylabel(self.y_label)
            if drawn:
                ax.legend([line for line, _ in drawn.values()],
                          [f"{stem} {_seeds_note([k])}" for stem, (_, k) in drawn.items()], fontsize=8)
            fig.tight_layout()
            written.append(docs / f"{self.file_prefix}_{task}.png")
            save_png(fig, written[-1])
            plt.close(fig)

        cols = min(4, len(tasks))
        rows = math.ceil(len(tasks) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows + 0.8), squeeze=False)
        legend: dict[str, tuple] = {}  # stem -> (a line to show, seeds drawn on each task)
        for ax, task in zip(axes.flat, tasks):
            for stem, (line, k) in self.draw_task(ax, root, task, label_budgets, seeds, steps_for(task)).items():
                legend.setdefault(stem, (line, []))[1].append(k)
        for ax in axes.flat[len(tasks):]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel("environment steps")
        for ax in axes[:, 0]:
            ax.set_ylabel(self.y_label)
        if legend:  # once for the figure; a seed count that differs between tasks shows as a range
            fig.legend([line for line, _ in legend.values()],
                       [f"{stem} {_seeds_note(counts)}" for stem, (_, counts) in legend.items()],
                       loc="lower center", ncol=len(legend), fontsize=9, frameon=False)
        fig.tight_layout(rect=(0, 0.06 if legend else 0, 1, 1))
        written.append(docs / f"{self.file_prefix}_{self.combined}.png")
        save_png(fig, written[-1])
        plt.close(fig)
        return written

    # ------------------------------------------------------------------ how long it will take
    def warmup_argv(self, run: Run, out: Path) -> list[str]:
        """The command line (after ``python -m experiments.<entry>``) of ``run``'s warm-up, writing to
        ``out``: :data:`WARMUP_ITERATIONS` iterations of its arm, its label schedule as over its whole
        budget (``--label-horizon``), with ``warmup_flags``."""
        iteration = int(grid_lib.expected_config(run, out.parent).get("iteration_steps") or 0)
        steps = min(run.steps, WARMUP_ITERATIONS * iteration if iteration else self.warmup_steps)
        return ["--env", run.task, "--seed", str(run.seed), "--steps", str(steps), "--out", str(out),
                "--no-progress", *(["--baseline"] if run.labels is None else
                                   ["--labels", str(run.labels), "--label-horizon", str(run.steps)]),
                *run.extra, *self.warmup_flags]

    def warmup(self, run: Run, workdir: Path) -> tuple[float, float]:
        """Run ``run``'s warm-up (:meth:`warmup_argv`) in ``workdir``; returns (seconds before the
        first iteration's row, seconds per environment step after it), from the rows' ``wall_s``."""
        out = workdir / "run"
        proc = grid_lib.launch(self.warmup_argv(run, out), workdir / "warmup.log", entry=self.entry)
        while proc.poll() is None:
            time.sleep(grid_lib.POLL_S)
        rows = [r for r in run_metrics(out) if r.get("wall_s") is not None]
        if proc.poll() != 0 or len(rows) < 2:
            tail = (workdir / "warmup.log").read_text(errors="replace")[-1500:]
            raise GridError(f"the warm-up run did not give two iterations (exit {proc.poll()}):\n{tail}")
        per_step = (rows[-1]["wall_s"] - rows[0]["wall_s"]) / max(rows[-1]["env_steps"] - rows[0]["env_steps"], 1)
        return rows[0]["wall_s"] - per_step * rows[0]["env_steps"], per_step

    def describe_estimate(self, todo: list[tuple[Run, str]], jobs: int, root: Path) -> str:
        """The lines printed before the grid starts: a warm-up of the grid's first learning run,
        measured, and what it says of the whole grid on this device (every run costed as a learning
        run: the true-reward arm is cheaper, so this errs long)."""
        import jax

        device = jax.devices()[0].device_kind if jax.devices() else "?"
        first = next((run for run, _ in todo if run.labels is not None), todo[0][0])
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="rlhp_warmup_") as d:
            try:
                startup, per_step = self.warmup(first, Path(d))
            except GridError as e:
                return f"no estimate: {e}"
        steps = sum(run.steps - grid_lib.steps_done(run, state, root) for run, state in todo)
        total = (len(todo) * startup + steps * per_step) / jobs
        return (f"estimate on this device ({device}), from a {time.perf_counter() - t0:.0f} s warm-up of "
                f"{first.task} {first.tag}: {1e6 * per_step:.0f} s per million environment steps, {startup:.0f} s "
                f"start-up per run; {len(todo)} runs, {steps:,} steps to go, {jobs} at a time: about "
                f"{_duration(total)}" + (f" ({self.startup_note})" if self.startup_note else ""))

    # ------------------------------------------------------------------ command line
    def known_tasks(self) -> list[str]:
        return importlib.import_module(f"experiments.{self.entry}").DOMAIN.tasks()

    def parse_args(self, argv=None, doc: str | None = None) -> argparse.Namespace:
        p = argparse.ArgumentParser(allow_abbrev=False, prog=f"python -m experiments.{self.name}", description=doc,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--tasks", "--games", nargs="+", default=list(self.tasks), help=f"default: {' '.join(self.tasks)}")
        seeds = p.add_mutually_exclusive_group()
        seeds.add_argument("--seeds", type=int, default=self.default_seeds, metavar="N",
                           help=f"run seeds 0..N-1 (default {self.default_seeds})")
        seeds.add_argument("--seed-list", type=int, nargs="+", default=None, metavar="S",
                           help="run exactly these seeds instead")
        p.add_argument("--labels", type=int, nargs="+", default=list(self.default_labels),
                       help=f"synthetic-label budgets (default {' '.join(map(str, self.default_labels))})")
        p.add_argument("--steps", type=int, default=None,
                       help="environment steps per run on every task (default: the figure's own per task)")
        p.add_argument("--root", default=f"runs/{self.name}", help="where the runs go (default %(default)s)")
        p.add_argument("--docs", default="docs/results", help="where the PNGs go (default %(default)s)")
        p.add_argument("--results-md", default="docs/results.md",
                       help="Markdown file whose marked section receives the table (default %(default)s)")
        p.add_argument("--jobs", type=int, default=1, help="runs at the same time (default 1)")
        p.add_argument("--order", choices=("seeds", "tasks"), default="seeds",
                       help="seeds (default): every task of seed 0, then seed 1, ..., so an interrupted grid "
                            "covers every task; tasks: every seed of the first task, then the next task, so "
                            "a sitting finishes whole tasks")
        p.add_argument("--run-args", default="", metavar="FLAGS",
                       help=f"more flags for every run's python -m experiments.{self.entry}, e.g. a smoke budget: "
                            "--run-args='--iteration-steps 160 --pretrain-epochs 2' (part of each run's config: "
                            "a finished run made with other flags is refused, not mixed in)")
        p.add_argument("--no-estimate", action="store_true",
                       help="start at once, without the short warm-up that estimates the grid's wall time")
        p.add_argument("--plot-only", action="store_true", help="run nothing; redraw and rewrite the table")
        p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
        self.add_arguments(p)
        args = p.parse_args(argv)
        args.seed_list = list(range(args.seeds)) if args.seed_list is None else args.seed_list
        args.labels = sorted(set(args.labels))
        try:
            args.run_args = tuple(shlex.split(args.run_args))
        except ValueError as e:
            p.error(f"--run-args: {e}")
        return args

    def check_args(self, args: argparse.Namespace) -> None:
        """Raise :class:`GridError` for flags that cannot make a grid."""
        from rlhp_jax.tasks import find

        known = self.known_tasks()
        args.tasks = [t if t in known or find(t) is None or find(t).name not in known else find(t).name
                      for t in args.tasks]  # any spelling the task registry reads: hopper, Hopper-v4
        bad = [t for t in args.tasks if t not in known]
        if bad:
            raise GridError(f"unknown task(s) {', '.join(bad)}; supported: {', '.join(known)}")
        if len(set(args.tasks)) != len(args.tasks):
            raise GridError("--tasks names a task twice")
        missing = [t for t in args.tasks if args.steps is None and t not in self.default_steps]
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

    # the hooks a figure of another shape (experiments.reproduce_ibarz) overrides
    def runs(self, args: argparse.Namespace, steps_for: Callable[[str], int]) -> list[Run]:
        """Every run of the grid the command line asks for."""
        return grid(args.tasks, args.labels, args.seed_list, steps_for, entry=self.entry, extra=args.run_args)

    def draw(self, args: argparse.Namespace, root: Path, docs: Path,
             steps_for: Callable[[str], int]) -> tuple[str, list[Path]]:
        """(the results table, the PNGs written: the combined figure last)."""
        table = self.results_table(root, args.tasks, args.labels, args.seed_list, steps_for)
        return table, self.plot(root, docs, args.tasks, args.labels, args.seed_list, steps_for)

    def command_line(self, args: argparse.Namespace) -> str:
        """The command that reruns (or redraws) the grid asked for."""
        return self.reproduce_command(args.tasks, args.labels, args.seed_list, args.steps, args.run_args)

    def check_run_args(self, run: Run, root: Path) -> None:
        """Raise :class:`GridError` when ``--run-args`` are not flags the runs' entry point takes:
        found here, before any run starts, not once per run as each of them fails; or when they name
        a flag the grid sets itself for each run (the last of two wins: ``--seed 3`` made every
        ``…-seedN`` directory a copy of seed 3, averaged as if they were N seeds), or ``--pause-at``."""
        flags = {a.split("=", 1)[0] for a in run.extra}
        if "--pause-at" in flags:  # a paused run exits 0 with no summary: the grid would log a "final" return
            raise GridError("--run-args: --pause-at stops a run part-way, and the grid would report the paused runs "
                            "as ended and, run again, resume them to their end; pause one of its runs with python "
                            f"-m experiments.{run.entry} --resume DIR --pause-at N")
        owned = ("--env", "--seed", "--steps", "--out", "--labels", "--baseline", "--resume")
        taken = sorted(flags & set(owned))
        if taken:
            raise GridError(f"--run-args: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} the grid's own "
                            "(--tasks, --seeds/--seed-list, --steps, --root, --labels name them); drop "
                            f"{'it' if len(taken) == 1 else 'them'} from --run-args")
        try:
            grid_lib.expected_config(run, root)
        except SystemExit:  # argparse has printed the entry point's usage and the bad flag
            raise GridError(f"--run-args: not flags of python -m experiments.{run.entry} (above)") from None
        except ValueError as e:
            raise GridError(f"--run-args: {e}") from None

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Flags of this figure only (none here)."""

    def main(self, argv=None, doc: str | None = None) -> int:
        args = self.parse_args(argv, doc)
        root, docs = Path(args.root), Path(args.docs)
        steps_for = (lambda task: args.steps) if args.steps is not None else self.default_steps.__getitem__
        with contextlib.ExitStack() as held:
            try:
                self.check_args(args)
                check_out_directory(root, "--root")
                check_out_directory(docs, "--docs")  # where the figures and the table go: known before hours of runs
                self.read_results(args.results_md)
                runs = ordered(self.runs(args, steps_for), args.tasks, args.order)
                if args.run_args:
                    self.check_run_args(runs[0], root)
                if not (args.dry_run or args.plot_only):  # one grid at a time runs in a root (the others only read)
                    held.enter_context(claimed(root, "--root", holder="another grid of it"))
                states = plan(runs, root)
            except (GridError, ValueError) as e:
                return refuse(e)
            return self._carry_out(args, states, root, docs, steps_for)

    def _carry_out(self, args: argparse.Namespace, states: dict, root: Path, docs: Path, steps_for) -> int:
        """:meth:`main` once the plan is made: run what is left (unless ``--dry-run`` or
        ``--plot-only``), then draw the figures and write the table."""
        if args.dry_run:
            print(describe_plan(states, root), flush=True)
            return 0
        if args.plot_only and all(state == "start" for state in states.values()):
            # a mistyped --root or --steps would otherwise overwrite results.md's table with dashes
            return refuse(f"no run of this grid under {root} (check --root, --steps and the seeds): nothing to "
                          "draw, and results.md is left as it is")
        failed = []
        if not args.plot_only:
            print(describe_plan(states, root), flush=True)
            todo = [(run, state) for run, state in states.items() if state != "finished"]
            if todo and not args.no_estimate:
                print(self.describe_estimate(todo, args.jobs, root), flush=True)
            try:
                with stopped_as_by_ctrl_c(signal.SIGTERM, signal.SIGHUP):
                    failed = execute(todo, root, args.jobs, log=lambda line: print(line, flush=True),
                                     metric=self.metric)
            except KeyboardInterrupt:
                print("interrupted: the runs it started were stopped; the same command resumes the grid",
                      file=sys.stderr)
                return 130
            print(account(states, failed), flush=True)
        table, figures = self.draw(args, root, docs, steps_for)
        results_md = Path(args.results_md)
        figure = os.path.relpath(figures[-1], results_md.parent)
        command = self.command_line(args)
        try:
            self.write_results_section(results_md, self.section_markdown(table, command, steps_for, args.tasks, figure))
        except GridError as e:
            return refuse(e)
        print(table)
        print(json.dumps({"plots": [str(f) for f in figures], "results": str(results_md)}))
        if failed:
            print(f"{len(failed)} run(s) failed; logs: " + ", ".join(str(r.log_path(root)) for r in failed),
                  file=sys.stderr)
            return 1
        return 0
