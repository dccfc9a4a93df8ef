"""The run grid behind the papers' figures (``python -m experiments.reproduce_mujoco``, and any
other figure of label budgets against RL on the true reward): one run of an entry point
(``experiments.mujoco``, ``experiments.atari``: ``Run.entry``) per task x arm x seed x step budget,
in ``ROOT/TASK-TAG-STEPS-seedS``; what state each is in (finished, to resume, to restart, to
start), refusing a directory that holds another run; and running them as subprocesses, ``--jobs``
at a time.  The plots and tables are ``experiments.figures.Figure``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from rlhp_jax.metrics import read_jsonl
from rlhp_jax.config_fields import config_object
from rlhp_jax.files import open_append
from rlhp_jax.runs import in_use, whole_run_problem

POLL_S = 1.0  # seconds between checks on running subprocesses
FINAL_ROWS = 5  # a run's final true return: the mean of its last 5 metrics rows


class GridError(ValueError):
    """The grid cannot run as asked (a run directory holds another configuration, bad flags)."""


# ------------------------------------------------------------------ the grid
def arm_tag(labels: int | None) -> str:
    """``700labels`` for a label budget, ``baseline`` for RL on the true reward (None)."""
    return "baseline" if labels is None else f"{labels}labels"


def run_dir(root: Path, task: str, labels: int | None, seed: int, steps: int, tag: str | None = None) -> Path:
    """``ROOT/TASK-TAG-STEPS-seedS`` (STEPS as ``1M``, ``200k``; TAG :func:`arm_tag` unless given):
    where one run of the grid lives.  The budget is in the name so that runs of another budget stay
    where they are."""
    return Path(root) / f"{task}-{arm_tag(labels) if tag is None else tag}-{steps_name(steps)}-seed{seed}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One cell of the grid: a task, an arm (a label budget, or None for RL on the true reward),
    a seed and a step budget."""

    task: str
    labels: int | None
    seed: int
    steps: int
    entry: str = "mujoco"  # the entry point that runs it: python -m experiments.<entry>
    extra: tuple[str, ...] = ()  # more flags of that entry point, the same for every run of the grid
    # a figure whose arms differ by more than the label budget (Ibarz's setups): the variant's name, put
    # before the budget in the tag, and its flags; a variant without labels learns no reward (no --baseline)
    variant: str = ""
    variant_argv: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        if not self.variant:
            return arm_tag(self.labels)
        return self.variant if self.labels is None else f"{self.variant}-{arm_tag(self.labels)}"

    def directory(self, root: Path) -> Path:
        return run_dir(root, self.task, self.labels, self.seed, self.steps, self.tag)

    def log_path(self, root: Path) -> Path:
        """Beside the run directory, so moving an incomplete directory aside keeps the log."""
        directory = self.directory(root)
        return directory.with_name(directory.name + ".log")

    def fresh_argv(self, root: Path) -> list[str]:
        """``experiments.<entry>`` flags that start this run in its directory."""
        argv = ["--env", self.task, "--seed", str(self.seed), "--steps", str(self.steps),
                "--out", str(self.directory(root))]
        if self.labels is not None:
            argv += ["--labels", str(self.labels)]
        elif not self.variant:
            argv += ["--baseline"]
        return argv + list(self.variant_argv) + list(self.extra)


def grid(tasks, label_budgets, seeds, steps_for: Callable[[str], int], entry: str = "mujoco",
         extra: tuple[str, ...] = ()) -> list[Run]:
    """Every run of the figure, seed by seed so that an interrupted grid covers every task."""
    arms = [*label_budgets, None]
    return [Run(task, labels, seed, steps_for(task), entry, tuple(extra))
            for seed in seeds for task in tasks for labels in arms]


def ordered(runs: list[Run], tasks, order: str) -> list[Run]:
    """``runs`` as made (``order`` "seeds": seed by seed) or task by task in the order of ``tasks``
    ("tasks": every seed of a task before the next task; within a task, the runs' own order)."""
    if order == "seeds":
        return list(runs)
    if order != "tasks":
        raise GridError(f"order must be 'seeds' or 'tasks', got {order!r}")
    rank = {task: i for i, task in enumerate(tasks)}
    return sorted(runs, key=lambda run: rank[run.task])  # stable: each task keeps its seed order


def expected_config(run: Run, root: Path) -> dict:
    """The ``config.json`` that ``experiments.<entry>`` would write for this run today — every
    setting, the code's defaults included — without its output path."""
    return config_of(run.entry, run.fresh_argv(root))


def config_of(entry: str, argv: list[str]) -> dict:
    """The ``config.json`` (without ``out``) that ``python -m experiments.<entry> ARGV`` would write."""
    from experiments.cli import build_parser, config_from_args, ibarz_config_from_args
    from rlhp_jax.config import config_to_json

    domain = importlib.import_module(f"experiments.{entry}").DOMAIN
    args = build_parser(domain).parse_args(argv)
    build = ibarz_config_from_args if args.agent == "dqfd" else config_from_args
    return {k: v for k, v in config_to_json(build(args, domain)).items() if k != "out"}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _effective(config: dict) -> dict:
    """``config`` with its ``env_options`` less those at the task's default value (a run that named
    the height reward on Hopper before it became the default is the run the default makes)."""
    from rlhp_jax.envpool_envs import option_defaults

    options = config.get("env_options")
    if not isinstance(options, list):
        return config
    defaults = option_defaults(str(config.get("env", "")))
    kept = [pair for pair in options
            if not (isinstance(pair, list) and len(pair) == 2 and pair[0] in defaults and defaults[pair[0]] == pair[1])]
    return {**config, "env_options": kept}


# settings of how often and how much a run saves, not of what it computes (a resumed run continues the
# same run): a finished or killed run made under other values is still the run asked for
SAVING_ONLY = ("checkpoint_every", "keep_checkpoints", "checkpoint_on_labels")


def config_mismatches(run: Run, config: dict, root: Path) -> list[str]:
    """How a run directory's ``config.json`` differs from the run asked for with today's settings:
    any field (a preset that changed since the run was made is a mismatch too), except the output
    path, for the true-reward arm the label budget it never uses, how often it saves
    (:data:`SAVING_ONLY`) and environment options named at the task's default value.  Other bytes
    at the same demo file path are a difference too (:func:`rlhp_jax.demos.demos_problem`)."""
    want, config = _effective(expected_config(run, root)), _effective(config)
    if run.labels is None:
        want.pop("labels", None)
    for key in SAVING_ONLY:
        want.pop(key, None)
    found = [line for key, value in want.items() for line in differences(key, config.get(key), value)]
    if not found and want.get("demos"):  # the same path, but is it the same file?
        from rlhp_jax.demos import demos_problem

        found += [f"demos: {why}"] if (why := demos_problem(run.directory(root), want["demos"])) else []
    return found


def differences(name: str, have, want) -> list[str]:
    """``NAME is HAVE, asked for WANT`` for each differing field, descending into nested settings
    (``agent_config``, ``ensemble``, ...) so the sub-key that differs is named rather than cut off."""
    if have == want:
        return []
    if isinstance(have, dict) and isinstance(want, dict):
        return [line for key in [*want, *(k for k in have if k not in want)]
                for line in differences(f"{name}.{key}", have.get(key), want.get(key))]
    return [f"{name} is {_short(have)}, asked for {_short(want)}"]


def run_state(run: Run, root: Path) -> str:
    """What to do with a run: ``finished`` (skip), ``resume``, ``restart`` (an incomplete
    directory to move aside first) or ``start``.  Raises :class:`GridError` when the directory
    holds a run of another configuration, naming the directory and each difference."""
    directory = run.directory(root)
    if in_use(directory):  # resumed or moved aside meanwhile, it would be two writers, or a run under a live one
        raise GridError(f"{directory} is in use by another process (a run of another grid, or one started by hand, "
                        "is writing there now): wait for it to end, or use another --root")
    if os.path.lexists(directory) and not directory.is_dir():  # a file, a link to one or to nothing: someone's
        raise GridError(f"{directory} is not a directory (a file, or a link to one or to nothing), so it holds no "
                        "run of this grid: move it away or use another --root")
    if not directory.exists() or not any(directory.iterdir()):
        return "start"
    config = config_object(directory)
    finished = (directory / "summary.json").exists()
    if config is None:
        if finished:
            raise GridError(f"{directory} has a summary.json but no readable config.json: it was not written by "
                            f"experiments.{run.entry}; move it away or use another --root")
        return "restart"
    problems = config_mismatches(run, config, root)
    if problems:
        raise GridError(f"{directory} holds another run than the one asked for: {'; '.join(problems)}. "
                        "Use another --root, or flags that match that run (e.g. its --steps).")
    if finished:
        check_whole_run(directory)
    return "finished" if finished else "resume"


def check_whole_run(directory: Path) -> None:
    """:class:`GridError` where a finished run's metrics do not cover the run it finished
    (:func:`rlhp_jax.runs.whole_run_problem`): never counted, skipped or drawn as a whole run."""
    if why := whole_run_problem(directory):
        raise GridError(f"{directory} says it finished, but {why}: its results would be read as a whole run's. "
                        "Restore the file, or move the directory aside so that the grid runs it again.")


def plan(runs: list[Run], root: Path) -> dict[Run, str]:
    """Each run's state (:func:`run_state`), checked for every run before any starts."""
    return {run: run_state(run, root) for run in runs}


def state_counts(states: dict[Run, str]) -> dict[str, int]:
    """How many runs of a plan are in each state (:func:`run_state`)."""
    return {s: sum(1 for v in states.values() if v == s) for s in ("finished", "resume", "restart", "start")}


def describe_plan(states: dict[Run, str], root: Path) -> str:
    """The plan as printed before the grid starts (and by --dry-run)."""
    counts = state_counts(states)
    lines = [f"{len(states)} runs: {counts['finished']} finished, {counts['resume']} to resume, "
             f"{counts['start'] + counts['restart']} to start"
             + (f" ({counts['restart']} of them after moving an incomplete directory aside)" if counts["restart"] else "")]
    lines += [f"  {state:<9} {run.directory(root)}" for run, state in states.items()]
    return "\n".join(lines)


def move_aside(directory: Path) -> Path:
    """Rename an incomplete run directory to ``DIR.incomplete-<timestamp>`` (never deletes); refused
    (GridError) where another process has begun writing there since the grid was planned."""
    if in_use(directory):
        raise GridError(f"{directory} is in use by another process since the grid was planned: not moved "
                        "aside, not started")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.incomplete-{stamp}")
    n = 1
    while os.path.lexists(target):
        n += 1
        target = directory.with_name(f"{directory.name}.incomplete-{stamp}-{n}")
    try:
        directory.rename(target)  # (a link is renamed, never what it points at)
    except OSError as e:  # removed or replaced by someone since the grid was planned
        raise GridError(f"{directory} could not be moved aside ({e.strerror or e}): not started") from None
    return target


# ------------------------------------------------------------------ running
# What a run's process does before it becomes ``python -m experiments.<entry>``: it asks Linux for a
# SIGTERM when the grid that started it dies (prctl's PR_SET_PDEATHSIG), so a SIGKILLed grid leaves
# no run training on unwatched, holding its directory, and the next grid resumes it.  A grid that
# died before the request was made is seen at once (the parent is no longer the grid): the run does
# not start.  (Not Linux: no request, and a SIGKILLed grid's runs go on as before.)  In the child,
# not in ``preexec_fn``: Python between fork and exec can deadlock on a lock another thread held.
_DIE_WITH_GRID = """\
import ctypes, os, runpy, signal, sys
grid, module = int(sys.argv[1]), sys.argv[2]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except (AttributeError, OSError):
    pass
if os.getppid() != grid:
    sys.exit(f"the grid that started this run (pid {grid}) is gone: not started")
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def launch(argv: list[str], log_path: Path, entry: str = "mujoco"):
    """Start ``python -m experiments.<entry> ARGV`` as a subprocess (its own memory, its own JAX)
    that ends with this process (:data:`_DIE_WITH_GRID`; Linux tells it when the *thread* that called
    this ends, so call it from the main thread, as every caller does), stdout and stderr appended to
    ``log_path``; returns the ``subprocess.Popen``.  The one seam through which this module runs
    anything (the tests replace it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open_append(log_path) as log:  # a link at its name is replaced, never appended through
        log.write(f"\n$ python -m experiments.{entry} {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen([sys.executable, "-c", _DIE_WITH_GRID, str(os.getpid()), f"experiments.{entry}",
                                 *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def argv_for(run: Run, state: str, root: Path) -> list[str]:
    """The ``experiments.<entry>`` command line for a run in ``state`` (resume or start)."""
    argv = ["--resume", str(run.directory(root))] if state == "resume" else run.fresh_argv(root)
    return argv + ["--no-progress"]


def final_return(rows: list[dict], metric: str = "true_return") -> float | None:
    """A run's final return: the mean ``metric`` of its last :data:`FINAL_ROWS` metrics rows that
    have one (one row is one iteration's training batch, noisy on its own; ``episode_return`` is
    None where no episode ended); None without any."""
    values = [r[metric] for r in rows if r.get(metric) is not None]
    return float(np.mean(values[-FINAL_ROWS:])) if values else None


def run_metrics(directory: Path) -> list[dict]:
    path = directory / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []


def return_digits(x: float) -> int:
    """Decimals a return of this size is shown with, in progress lines and tables alike: none from
    100 up, one below."""
    return 0 if abs(x) >= 100 else 1


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.{return_digits(x)}f}"


@contextlib.contextmanager
def stopped_as_by_ctrl_c(*signals: int) -> Iterator[None]:
    """Within the block, ``signals`` (SIGTERM from ``kill``, ``timeout`` or a scheduler; SIGHUP from
    a closed terminal) raise ``KeyboardInterrupt`` as Ctrl-C does, so :func:`execute` stops the runs it
    started instead of leaving them training on, unwatched.  (A SIGKILL cannot be caught: the runs
    then end by the SIGTERM :func:`launch` has Linux send them when the grid dies.)"""
    before = {sig: signal.getsignal(sig) for sig in signals}

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def execute(todo: list[tuple[Run, str]], root: Path, jobs: int, log: Callable[[str], None] = print,
            metric: str = "true_return") -> list[Run]:
    """Run each (run, state) with at most ``jobs`` subprocesses at once, printing a progress line
    as each one ends; returns the runs that failed.  Runs still going when this is interrupted
    are terminated."""
    pending, active, rates, failed = deque(todo), {}, {}, []
    total, done = len(todo), 0
    to_go = {run: run.steps - steps_done(run, state, root) for run, state in todo}  # read once, at the start
    try:
        while pending or active:
            while pending and len(active) < jobs:
                run, state = pending.popleft()
                try:
                    if state == "restart":
                        log(f"moved incomplete {run.directory(root)} aside to {move_aside(run.directory(root))}")
                    try:
                        proc = launch(argv_for(run, state, root), run.log_path(root), entry=run.entry)
                    except OSError as e:  # its log cannot be opened (a directory at its name, a full disk)
                        raise GridError(f"cannot start it: {run.log_path(root)}: {e.strerror or e}") from None
                except GridError as e:  # another process took it meanwhile, ...: this run fails, the rest go on
                    failed.append(run)
                    done += 1
                    log(f"[{done}/{total}] {run.task} {run.tag} seed {run.seed}: FAILED: {e}")
                    continue
                active[run] = (proc, time.monotonic())
                how = {"resume": "resuming it", "restart": "afresh, the old directory moved aside"}.get(state, "afresh")
                log(f"started {run.task} {run.tag} seed {run.seed} ({how}); log: {run.log_path(root)}")
            polled = [(run, proc.poll(), start) for run, (proc, start) in active.items()]
            ended = [(run, rc, start) for run, rc, start in polled if rc is not None]
            for run, rc, start in ended:
                del active[run]
                done += 1
                wall = time.monotonic() - start
                if rc == 0:  # (a run that failed in seconds says nothing of how long the others take)
                    rates[run] = wall / max(to_go[run], 1)
                now = time.monotonic()
                left = time_left(rates, [(r, to_go[r], 0.0) for r, _ in pending]
                                 + [(r, to_go[r], now - start) for r, (_, start) in active.items()], jobs) / 60
                head = f"[{done}/{total}] {run.task} {run.tag} seed {run.seed}"
                if rc != 0:
                    failed.append(run)
                    log(f"{head}: FAILED (exit {rc}); log: {run.log_path(root)}" + _minutes_left(left))
                else:
                    log(f"{head}: final {metric.replace('_', ' ')} (mean of the last {FINAL_ROWS} rows) "
                        f"{_fmt(final_return(run_metrics(run.directory(root)), metric))} "
                        f"(wall {wall:.0f} s)" + _minutes_left(left))
            if not ended:
                time.sleep(POLL_S)
    finally:
        for proc, _ in active.values():  # interrupted: stop the runs this call started
            proc.terminate()
            proc.wait()
    return failed


def steps_done(run: Run, state: str, root: Path) -> int:
    """Environment steps ``run`` has behind it when it starts in ``state``: a resumed run's last
    metrics row's, otherwise none."""
    rows = run_metrics(run.directory(root)) if state == "resume" else []
    return int(rows[-1].get("env_steps", 0)) if rows else 0


def time_left(rates: dict[Run, float], left: list[tuple[Run, int, float]], jobs: int) -> float:
    """Seconds until the runs ``left`` — (run, steps it has to go, seconds it has run) — are done,
    ``jobs`` at a time, from the seconds per step of the runs that finished (``rates``): each run
    at the rate of the finished runs of its task and arm, else of its arm, else of its task, else
    of all (a grid's tasks and arms differ several times over: Ant's learning run against
    Reacher's baseline); NaN before any run finished."""
    if not rates:
        return float("nan")

    def rate(run: Run) -> float:
        for same in (lambda r: (r.task, r.tag) == (run.task, run.tag), lambda r: r.tag == run.tag,
                     lambda r: r.task == run.task, lambda r: True):
            alike = [v for r, v in rates.items() if same(r)]
            if alike:
                return float(np.mean(alike))
        raise AssertionError("unreachable: rates is not empty")

    return sum(max(steps * rate(run) - ran, 0.0) for run, steps, ran in left) / jobs


def _minutes_left(minutes: float) -> str:
    return "" if np.isnan(minutes) else f"; about {minutes:.0f} min left"


def steps_name(steps: int) -> str:
    """A step budget in a run directory's name: :func:`steps_label`'s short form (``3M``, ``250k``)
    where it names exactly this budget, the number itself where it would round (``1000001``: its own
    directory, not 1M's)."""
    short = steps_label(steps)
    scale = {"M": 10**6, "k": 10**3}.get(short[-1], 1)
    return short if round(float(short.rstrip("Mk")) * scale) == steps else str(steps)


def steps_label(x, _pos=None) -> str:
    """Tick text for environment steps: 0, 250k, 1M, 1.5M."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:g}M"
    return f"{x / 1e3:g}k" if abs(x) >= 1e3 else f"{x:g}"
