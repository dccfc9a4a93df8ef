"""Ibarz et al. 2018, Fig. 1, from one command: the final game score of each training setup and
label schedule on the paper's nine Atari games, over seeds.

    python -m experiments.reproduce_ibarz --demos demos/       # 9 games x 3 seeds x 5 setups x 4 schedules
    python -m experiments.reproduce_ibarz --games Pong --seeds 1 --setups no_demos demos+prefs --labels 6800
    python -m experiments.reproduce_ibarz --dry-run            # the plan; nothing runs
    python -m experiments.reproduce_ibarz --plot-only          # redraw and rewrite the table
    python -m experiments.reproduce_ibarz --games Pong --seeds 1 --labels 4 --steps 200 --demos DIR \\
        --run-args='--iteration-steps 100 --bc-batches 3 ...'  # a CPU smoke budget: the command end to end

Each cell is one ``python -m experiments.atari --agent dqfd`` run with Ibarz's settings (the
Ibarz preset: DQfD with prioritized replay, all 18 actions and 0-90 no-ops, the A.3 reward CNN
without an ensemble, A.4's pretraining stages, 100,000 actor steps per iteration, 50M steps),
in ``ROOT/GAME-SETUP-Nlabels-STEPS-seedS``.  The setups are Fig. 1's synthetic ones:

* ``imitation``: DQfD's supervised losses on the demonstrations only (no labels, one bar);
* ``no_demos``: preferences only (Christiano et al.'s setup with DQN);
* ``demos+prefs``: demonstrations and preferences;
* ``demos+prefs+autolabels``: the same, plus every initial clip compared against a demo clip;
* ``20%demos+prefs``: ``demos+prefs`` with a fifth of the demonstrations (``--demo-fraction 0.2``).

Fig. 1's ``demos + human preferences`` bar needs people: ``python -m experiments.atari --agent
dqfd --teacher human --demos ...`` runs it, one person at a time.  The schedules are A.3's full
6,800 labels and its reductions by 2, 4 and 6 (3,400, 1,700, 1,133); ``--labels`` picks them.

Demonstrations: the setups that use them read ``DEMOS/GAME.npz`` (``--demos``, default
``demos``).  The paper's were expert human play, which no registry carries; record your own by
playing (``python -m rlhp_jax.human play --env GAME --out DEMOS/GAME.npz``) or from a trained
policy (``python -m rlhp_jax.demos_cli record --run RUN --out DEMOS/GAME.npz``).  A missing file
stops the command before anything runs, naming the file and these two ways.

Grid, resume, refusing directories of another configuration, ``--jobs`` and the results markers
work as in :mod:`experiments.reproduce_mujoco` (:mod:`experiments.grid`, :mod:`experiments.figures`).
The score of a run is ``episode_return`` (the game's unclipped score of the episodes that ended in
an iteration), the mean of its last 5 iterations; bars are the mean over seeds with ± std, as
Fig. 1 draws them.  Before starting, a short warm-up of the grid's first learning run (each
pretraining stage for a few batches and three short iterations) is timed on this device and the
whole grid's wall time printed (``--no-estimate`` skips it).  Outputs: ``DOCS/ibarz_GAME.png`` per
game, ``DOCS/ibarz_fig1.png`` with all, and a table in ``--results-md`` between
``<!-- reproduce_ibarz:table:begin -->`` and ``<!-- reproduce_ibarz:table:end -->``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from experiments import grid as grid_lib
from experiments.figures import Figure, cell
from experiments.grid import GridError, Run, run_metrics
from rlhp_jax.config import FULL_SCHEDULE, IbarzConfig
from rlhp_jax.metrics import save_png

# Fig. 1's nine games, in its order
TASKS = ("BeamRider", "Breakout", "Enduro", "Hero", "MontezumaRevenge", "Pong", "PrivateEye", "Qbert", "Seaquest")
STEPS = IbarzConfig.total_steps  # Fig. 1: "after 50 million agent steps"
DEFAULT_STEPS = {task: STEPS for task in TASKS}
DEFAULT_SEEDS = 3  # Fig. 1: "the standard deviation across three runs of each experiment"
SCHEDULES = (FULL_SCHEDULE, FULL_SCHEDULE // 2, FULL_SCHEDULE // 4, round(FULL_SCHEDULE / 6))  # 6800 3400 1700 1133


@dataclasses.dataclass(frozen=True)
class Setup:
    """One of Fig. 1's training setups: its name in directories and flags, its words in the
    legend, the protocol's ``--setup`` and any more flags."""

    name: str
    legend: str
    setup: str
    argv: tuple[str, ...] = ()

    @property
    def uses_demos(self) -> bool:
        return self.setup != "no_demos"

    @property
    def uses_labels(self) -> bool:
        return self.setup != "imitation"


SETUPS = (
    Setup("imitation", "imitation", "imitation"),
    Setup("no_demos", "no demos", "no_demos"),
    Setup("demos+prefs", "demos + preferences", "demos+prefs"),
    Setup("demos+prefs+autolabels", "demos + pr. + autolabels", "demos+prefs+autolabels"),
    Setup("20%demos+prefs", "20% demos + preferences", "demos+prefs", ("--demo-fraction", "0.2")),
)
BY_NAME = {s.name: s for s in SETUPS}

# What still differs from Ibarz et al.'s appendix A in these runs (written under the table).
IBARZ_DIFFERENCES = (
    "the demonstrations are whatever DEMOS/GAME.npz holds (the paper's were expert human play from Hester et "
    "al. 2018, which no package registry carries): scores that depend on demonstrations compare only to runs "
    "with demonstrations of the same quality",
    "no demos + human preferences bars: Fig. 1's human arm needs people (python -m experiments.atari --agent "
    "dqfd --teacher human)",
    "the reward model is fitted between iterations of 100,000 actor steps (A.4's protocol), with the weight of "
    "the squared-reward loss (A.3 gives none) ours",
    "the size of the oracle's game-over penalty and the score masks' rectangles are ours (the task registry, "
    "rlhp_jax/atari_masks.py)",
    "each bar is the mean over seeds of each run's score in its last 5 iterations (500,000 actor steps); Fig. 1 "
    "does not say how long it averages",
)


class IbarzFigure(Figure):
    """Fig. 1: final scores per game x setup x schedule (bars), not curves against RL."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--setups", nargs="+", default=[s.name for s in SETUPS], choices=[s.name for s in SETUPS],
                       metavar="SETUP", help="Fig. 1's setups to run (default: all: "
                                             + " ".join(s.name for s in SETUPS).replace("%", "%%") + ")")
        p.add_argument("--demos", default="demos", metavar="DIR",
                       help="directory of demonstration files, one DIR/GAME.npz per game (default %(default)s)")

    def check_args(self, args: argparse.Namespace) -> None:
        super().check_args(args)
        if len(set(args.setups)) != len(args.setups):
            raise GridError("--setups names a setup twice")
        if args.plot_only:
            return
        missing = [str(self.demo_file(args, task)) for task in args.tasks
                   if any(BY_NAME[s].uses_demos for s in args.setups) and not self.demo_file(args, task).is_file()]
        if missing:
            raise GridError(
                f"no demonstrations at {', '.join(missing)}. The setups {', '.join(s for s in args.setups if BY_NAME[s].uses_demos)} "
                "learn from them: record a file per game by playing (python -m rlhp_jax.human play --env GAME --out "
                "DIR/GAME.npz) or from a trained policy (python -m rlhp_jax.demos_cli record --run RUN --out "
                "DIR/GAME.npz), or run only --setups no_demos")

    @staticmethod
    def demo_file(args: argparse.Namespace, task: str) -> Path:
        return Path(args.demos) / f"{task}.npz"

    def runs(self, args: argparse.Namespace, steps_for: Callable[[str], int]) -> list[Run]:
        """Seed by seed, then game, setup and schedule (the schedules of a setup side by side)."""
        runs = []
        for seed in args.seed_list:
            for task in args.tasks:
                for name in args.setups:
                    setup = BY_NAME[name]
                    argv = ("--agent", "dqfd", "--setup", setup.setup, *setup.argv)
                    if setup.uses_demos:
                        argv += ("--demos", str(self.demo_file(args, task)))
                    for labels in (args.labels if setup.uses_labels else [None]):
                        runs.append(Run(task, labels, seed, steps_for(task), self.entry, args.run_args,
                                        variant=name, variant_argv=argv))
        return runs

    # ------------------------------------------------------------------ results
    def finals(self, root: Path, runs: list[Run]) -> dict[tuple, list[float]]:
        """{(task, setup, labels): the final score of each finished seed}."""
        out: dict[tuple, list[float]] = {}
        for run in runs:
            values = out.setdefault((run.task, run.variant, run.labels), [])
            value = self.finished_final(run.directory(root))
            if value is not None:
                values.append(value)
        return out

    def ibarz_table(self, finals: dict, tasks, setups, schedules) -> str:
        """Rows game x setup, one column per schedule (imitation: the no-labels column)."""
        with_labels = any(BY_NAME[s].uses_labels for s in setups)
        head = ["game", "setup"] + ([f"{n} labels" for n in schedules] if with_labels else [])
        head += ["no labels"] if "imitation" in setups else []
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for task in tasks:
            for name in setups:
                setup = BY_NAME[name]
                cells = [cell(finals.get((task, name, n), [])) if setup.uses_labels else ""
                         for n in (schedules if with_labels else [])]
                if "imitation" in setups:
                    cells.append("" if setup.uses_labels else cell(finals.get((task, name, None), [])))
                lines.append(f"| {task} | {setup.legend} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def draw_game(self, ax, finals: dict, task: str, setups, schedules) -> list[tuple]:
        """One panel like Fig. 1's: a group of bars per setup, one bar per schedule (blues, darker for
        more labels; imitation grey), mean over seeds with ± std as a vertical line.  Returns the
        (bar, legend text) pairs drawn."""
        from matplotlib import colormaps

        order = sorted(schedules, reverse=True)
        shades = dict(zip(order, np.linspace(0.9, 0.4, len(order)) if len(order) > 1 else [0.7]))
        width = 0.8 / max(len(order), 1)
        handles = {}
        for i, name in enumerate(setups):
            arms = order if BY_NAME[name].uses_labels else [None]
            for j, labels in enumerate(arms):
                values = finals.get((task, name, labels), [])
                if not values:
                    continue
                x = i + (j - (len(arms) - 1) / 2) * width
                colour = "0.55" if labels is None else colormaps["Blues"](float(shades[labels]))
                bar = ax.bar(x, np.mean(values), width * 0.95, color=colour,
                             yerr=np.std(values) if len(values) > 1 else None, ecolor="black", capsize=0)
                handles.setdefault("no labels (imitation)" if labels is None else f"{labels} labels", bar)
        ax.set_xticks(range(len(setups)), [BY_NAME[s].legend.replace(" + ", "\n+ ") for s in setups], fontsize=7)
        ax.set_title(task)
        ax.grid(axis="y", alpha=0.3)
        return list(handles.items())

    def draw(self, args, root: Path, docs: Path, steps_for) -> tuple[str, list[Path]]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        finals = self.finals(root, self.runs(args, steps_for))
        schedules = args.labels
        table = self.ibarz_table(finals, args.tasks, args.setups, sorted(schedules, reverse=True))
        docs.mkdir(parents=True, exist_ok=True)
        written = []
        for task in args.tasks:
            fig, ax = plt.subplots(figsize=(1.3 * len(args.setups) + 2, 3.6))
            handles = self.draw_game(ax, finals, task, args.setups, schedules)
            ax.set_ylabel(self.y_label)
            if handles:
                ax.legend([h for _, h in handles], [t for t, _ in handles], fontsize=7)
            fig.tight_layout()
            written.append(docs / f"{self.file_prefix}_{task}.png")
            save_png(fig, written[-1])
            plt.close(fig)
        cols = min(3, len(args.tasks))
        rows = math.ceil(len(args.tasks) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=((1.3 * len(args.setups) + 1.5) * cols, 3.2 * rows + 0.8),
                                 squeeze=False)
        legend: dict = {}
        for ax, task in zip(axes.flat, args.tasks):
            for text, handle in self.draw_game(ax, finals, task, args.setups, schedules):
                legend.setdefault(text, handle)
        for ax in axes.flat[len(args.tasks):]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel(self.y_label)
        if legend:
            fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend), fontsize=9,
                       frameon=False)
        fig.tight_layout(rect=(0, 0.05 if legend else 0, 1, 1))
        written.append(docs / f"{self.file_prefix}_{self.combined}.png")
        save_png(fig, written[-1])
        plt.close(fig)
        return table, written

    def command_line(self, args: argparse.Namespace) -> str:
        command = self.reproduce_command(args.tasks, args.labels, args.seed_list, args.steps, args.run_args)
        if list(args.setups) != [s.name for s in SETUPS]:
            command += " --setups " + " ".join(args.setups)
        return command + f" --demos {args.demos}"

    def section_markdown(self, table, command, steps_for, tasks, figure) -> str:
        text = super().section_markdown(table, command, steps_for, tasks, figure)
        head, _, rest = text.partition("\n\nFinal ")
        _, _, rest = rest.partition("\n\n")
        note = (f"Final {self.metric_text}: the mean of the last {grid_lib.FINAL_ROWS} iterations' {self.metric} "
                "(the game's score of the episodes that ended in each) of each finished seed; then mean ± std over "
                "those seeds, as Fig. 1's bars and lines; – where a cell has no finished seed.")
        return f"{head}\n\n{note}\n\n{rest}"

    # ------------------------------------------------------------------ how long it will take
    def warmup(self, run: Run, workdir: Path) -> tuple[float, float]:
        """Run ``run`` for :data:`WARMUP_BATCHES` batches of each pretraining stage and three short
        iterations (the reward model's batches per iteration scaled with the iteration); returns
        (seconds of start-up, seconds per actor step), the start-up being the measured stages scaled
        to the run's own batch counts (each stage's compilation included: it errs long).  Flags in
        ``--run-args`` apply to the warm-up too (a smoke budget's shorter iterations)."""
        cfg = grid_lib.expected_config(run, workdir)
        rm_per_it = max(1, round(cfg["rm_batches_per_iteration"] * WARMUP_ITERATION_STEPS / cfg["iteration_steps"]))
        # the run's initial labels (so its initial rollout), then a few labels in each short iteration
        initial = IbarzConfig(setup="no_demos", labels=cfg["labels"], initial_labels=cfg["initial_labels"]).initial_count()
        labels = ["--initial-label-count", str(initial), "--labels", str(min(run.labels, initial + 30))] \
            if run.labels is not None else []
        out = workdir / "run"
        argv = [*run.fresh_argv(workdir), *labels, "--out", str(out), "--no-progress",
                "--iteration-steps", str(WARMUP_ITERATION_STEPS), "--rm-batches-per-iteration", str(rm_per_it),
                "--bc-batches", str(WARMUP_BATCHES), "--rm-pretrain-batches", str(WARMUP_BATCHES),
                "--second-pretrain-batches", str(WARMUP_BATCHES), *run.extra]  # --run-args win here too
        warm = grid_lib.config_of(self.entry, argv)
        argv += ["--steps", str(3 * warm["iteration_steps"])]
        proc = grid_lib.launch(argv, workdir / "warmup.log", entry=self.entry)
        while proc.poll() is None:
            time.sleep(grid_lib.POLL_S)
        rows = run_metrics(out)
        its = [r for r in rows if r.get("phase") == "iteration"]
        if proc.poll() != 0 or len(its) < 2:
            tail = (workdir / "warmup.log").read_text(errors="replace")[-1500:]
            raise GridError(f"the warm-up run did not give two iterations (exit {proc.poll()}):\n{tail}")
        per_step = (its[-1]["wall_s"] - its[0]["wall_s"]) / max(its[-1]["env_steps"] - its[0]["env_steps"], 1)
        before = [r for r in rows if r.get("phase") != "iteration"]
        startup, last = 0.0, 0.0
        stages = dict(bc="bc_batches", reward_model="rm_pretrain_batches", second_pretraining="second_pretrain_batches")
        for r in before:  # each stage's time, scaled from the warm-up's batch count to the run's
            took = r["wall_s"] - last
            last = r["wall_s"]
            key = stages.get(r["phase"])
            startup += took if key is None else took * max(cfg[key], 1) / max(warm[key], 1)
        return startup, per_step


WARMUP_BATCHES = 100  # batches of each pretraining stage in the warm-up
WARMUP_ITERATION_STEPS = 2000  # actor steps of each warm-up iteration

FIG1 = IbarzFigure(
    name="reproduce_ibarz", entry="atari", title="Ibarz Fig. 1, nine Atari games", tasks=TASKS,
    default_steps=DEFAULT_STEPS, default_labels=SCHEDULES, target_labels=FULL_SCHEDULE, more_labels=None,
    differences=IBARZ_DIFFERENCES, differences_from="Ibarz et al.'s appendix A", file_prefix="ibarz",
    combined="fig1", metric="episode_return", metric_text="game score",
    y_label="game score per episode\n(last 5 iterations)", default_seeds=DEFAULT_SEEDS,
    startup_note="the start-up includes the initial rollout and A.4's pretraining stages, scaled from the warm-up")


def main(argv=None) -> int:
    return FIG1.main(argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
