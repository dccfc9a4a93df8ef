"""experiments.reproduce_mujoco: the Fig. 2 grid's plan (skip, resume, restart, mismatch), its
runner (failures, progress, --jobs), the target check, the results.md section and the figures.

No MuJoCo and no JAX here: ``reproduce_mujoco.launch`` — the one place the module starts a run —
is replaced by a fake that writes what ``experiments.mujoco`` would (config.json, metrics.jsonl,
summary.json) and finishes at once.  Only the tests of that seam itself start real entry points
(refused at once, or a CartPole run killed with its grid seconds after it starts)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import figures
from experiments import grid as mg
from experiments import reproduce_mujoco as rm

STEPS = 1000


def write_run(root: Path, task: str, labels: int | None, seed: int, *, steps: int = STEPS, returns=(1.0,),
              finished: bool = True, config_changes: dict | None = None) -> Path:
    """A run directory as experiments.mujoco leaves it (finished, or stopped before its summary)."""
    out = mg.run_dir(root, task, labels, seed, steps)
    out.mkdir(parents=True)
    config = dict(expected(task, labels, seed, steps, root), out=str(out))
    config.update(config_changes or {})
    (out / "config.json").write_text(json.dumps(config))
    with open(out / "metrics.jsonl", "w") as f:
        for i, value in enumerate(returns):
            f.write(json.dumps({"iteration": i + 1, "env_steps": 100 * (i + 1), "true_return": value}) + "\n")
    if finished:
        (out / "summary.json").write_text(json.dumps({"final_true_return": returns[-1], "env_steps": 100 * len(returns)}))
    return out


def expected(task, labels, seed, steps, root) -> dict:
    """The whole config experiments.mujoco writes for that run (what the grid compares against)."""
    return mg.expected_config(mg.Run(task, labels, seed, steps), root)


class FakeProc:
    """What ``launch`` returns: ``poll()`` is None for ``delay`` calls, then the exit status."""

    def __init__(self, rc: int, delay: int = 0):
        self.rc, self.delay = rc, delay

    def poll(self):
        if self.delay:
            self.delay -= 1
            return None
        return self.rc

    def terminate(self):
        self.rc = -15

    def wait(self):
        return self.rc


class FakeLauncher:
    """Stands in for ``mg.launch``: records each argv and writes the run it asks for.  A run whose
    directory name is in ``fail`` exits 1 after writing only its config; returns per arm follow
    ``returns`` (labels -> list of true returns)."""

    def __init__(self, fail=(), returns=None, delay=0):
        self.calls, self.fail, self.delay = [], set(fail), delay
        self.returns = returns or {}

    def __call__(self, argv, log_path, entry="mujoco"):
        assert entry == "mujoco"
        self.calls.append(list(argv))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("fake run\n")
        if argv[0] == "--resume":
            out = Path(argv[1])
            config = json.loads((out / "config.json").read_text())
            labels = None if config["reward_source"] == "true" else config["labels"]
            task, seed, steps = config["env"], config["seed"], config["total_steps"]
        else:
            flag = dict(zip(argv, argv[1:]))
            out, task, seed, steps = Path(flag["--out"]), flag["--env"], int(flag["--seed"]), int(flag["--steps"])
            labels = None if "--baseline" in argv else int(flag["--labels"])
            assert not out.exists(), "a fresh start must get a directory that is not there"
        values = self.returns.get(labels, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
        if out.name in self.fail:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(expected(task, labels, seed, steps, out.parent)))
            return FakeProc(1, self.delay)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        write_run(out.parent, task, labels, seed, steps=steps, returns=values)
        return FakeProc(0, self.delay)


@pytest.fixture
def grid(tmp_path, monkeypatch):
    """(root, argv for main with everything under tmp_path, the fake launcher)."""
    fake = FakeLauncher()
    monkeypatch.setattr(mg, "launch", fake)
    monkeypatch.setattr(mg, "POLL_S", 0.0)
    root = tmp_path / "runs"
    argv = ["--root", str(root), "--docs", str(tmp_path / "docs" / "results"),
            "--results-md", str(tmp_path / "docs" / "results.md"), "--steps", str(STEPS), "--no-estimate"]
    return root, argv, fake


def test_default_tasks_are_the_eight_of_fig2_and_each_has_a_budget():
    assert rm.TASKS == ("Reacher", "HalfCheetah", "Hopper", "Walker2d", "Swimmer", "Ant", "InvertedPendulum",
                        "InvertedDoublePendulum")
    assert set(rm.TASKS) <= set(rm.FIG2.known_tasks())
    assert set(rm.DEFAULT_STEPS) == set(rm.TASKS)
    args = rm.parse_args([])
    assert args.tasks == list(rm.TASKS) and args.seed_list == [0, 1, 2, 3, 4] and args.labels == [700]


def test_seed_flags_mean_a_count_or_a_list():
    assert rm.parse_args(["--seeds", "3"]).seed_list == [0, 1, 2]
    assert rm.parse_args(["--seed-list", "3", "4"]).seed_list == [3, 4]
    with pytest.raises(SystemExit):
        rm.parse_args(["--seeds", "2", "--seed-list", "3"])


def test_unknown_task_is_a_clear_error(grid, capsys):
    root, argv, fake = grid
    assert rm.main(argv + ["--tasks", "Hopper", "Cartwheel"]) == 2
    err = capsys.readouterr().err
    assert "Cartwheel" in err and "Hopper" in err.split("supported:")[1]
    assert fake.calls == []


@pytest.mark.parametrize("flags, says", [
    (["--tasks", "Hopper", "hopper"], "--tasks names a task twice"),  # one task in two spellings
    (["--labels", "0"], "--labels must be positive"),
    (["--seed-list", "1", "1"], "non-negative and distinct"),
    (["--seed-list", "-1"], "non-negative and distinct"),
    (["--seeds", "0"], "non-negative and distinct"),
    (["--steps", "0"], "--steps must be positive"),
    (["--jobs", "0"], "--jobs must be at least 1")])
def test_flags_that_make_no_grid_are_refused_in_one_line_before_any_run(grid, capsys, flags, says):
    root, argv, fake = grid
    assert rm.main(argv + ["--tasks", "Hopper", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert fake.calls == [] and not root.exists()


def test_finished_run_is_skipped_started_run_resumed_missing_run_started(grid, capsys):
    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0, finished=True)
    started = write_run(root, "Hopper", None, 0, finished=False)
    assert rm.main(argv + ["--tasks", "Hopper", "--seed-list", "0", "1"]) == 0
    assert fake.calls[0] == ["--resume", str(started), "--no-progress"]
    fresh = fake.calls[1:]
    assert len(fresh) == 2 and not any(c[0] == "--resume" for c in fresh)
    assert ["--env", "Hopper", "--seed", "1", "--steps", str(STEPS), "--out", str(mg.run_dir(root, "Hopper", 700, 1, STEPS)),
            "--labels", "700", "--no-progress"] in fresh
    assert any("--baseline" in c and str(mg.run_dir(root, "Hopper", None, 1, STEPS)) in c for c in fresh)
    out = capsys.readouterr().out
    assert "4 runs: 1 finished, 1 to resume, 2 to start" in out


def test_progress_line_after_each_run(grid, capsys):
    root, argv, fake = grid
    assert rm.main(argv + ["--tasks", "Swimmer", "--seeds", "1"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[")]
    # fake returns 10..60: the last five rows average 40
    assert lines[0].startswith("[1/2] Swimmer 700labels seed 0: final true return (mean of the last 5 rows) 40.0 (wall ")
    assert lines[1].startswith("[2/2] Swimmer baseline seed 0: final true return (mean of the last 5 rows) 40.0 (wall ")
    assert lines[1].endswith("about 0 min left") and "min left" in lines[0]


def test_time_left_costs_each_run_at_its_own_task_and_arm():
    """The grid's time left counted every run at the mean wall of those that had ended: after a
    Reacher baseline of 1M steps in 40 s, Ant's learning runs of 3M steps came out at 40 s each."""
    run = lambda task, labels, seed=0, steps=1_000_000: mg.Run(task, labels, seed, steps)
    rates = {run("Reacher", None): 40 / 1e6, run("Reacher", 700): 60 / 1e6, run("Ant", 700): 1000 / 3e6}
    # an Ant learning run of 3M at Ant's own learning rate; the Ant baseline at the baseline rate (no Ant
    # baseline ended); Hopper's learning run at the learning arm's mean; two jobs at a time
    left = [(run("Ant", 700, 1, 3_000_000), 3_000_000, 0.0), (run("Ant", None, 0, 3_000_000), 3_000_000, 0.0),
            (run("Hopper", 700), 1_000_000, 0.0)]
    assert mg.time_left(rates, left, jobs=2) == pytest.approx((1000 + 120 + (60 + 1000 / 3) / 2) / 2)
    # a running run counts what it has still to do; one past its estimate counts nothing
    assert mg.time_left(rates, [(run("Ant", 700, 1, 3_000_000), 3_000_000, 400.0)], 1) == pytest.approx(600)
    assert mg.time_left(rates, [(run("Reacher", None, 1), 1_000_000, 90.0)], 1) == 0.0
    # a variant's arm is its own (Ibarz's setups share a label budget)
    ibarz = lambda variant: mg.Run("Pong", 100, 0, 1_000, "atari", variant=variant)
    assert mg.time_left({ibarz("demos"): 1.0, ibarz("prefs"): 3.0}, [(ibarz("prefs"), 10, 0.0)], 1) == 30.0
    assert np.isnan(mg.time_left({}, left, 2))


def test_incomplete_directory_is_moved_aside_not_deleted(grid):
    root, argv, fake = grid
    broken = mg.run_dir(root, "Hopper", 700, 0, STEPS)
    (broken / "checkpoints").mkdir(parents=True)
    (broken / "config.json").write_text('{"env": "Hop')  # killed while writing it
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 0
    aside = [p for p in root.iterdir() if p.name.startswith(broken.name + ".incomplete-")]
    assert len(aside) == 1 and (aside[0] / "checkpoints").is_dir()
    assert (broken / "summary.json").exists()
    assert fake.calls[0][:2] == ["--env", "Hopper"]


def test_a_run_another_process_is_writing_stops_the_grid_before_any_run(grid, capsys):
    """Two grids over one root (or a run started by hand in it): the second must neither resume a
    run the first is training nor move an incomplete one aside under it."""
    root, argv, fake = grid
    started = write_run(root, "Hopper", 700, 0, finished=False)
    hold = ("import sys, time\nfrom rlhp_jax.runs import claimed\nwith claimed(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(started)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 2
        assert f"{started} is in use by another process" in capsys.readouterr().err
        assert fake.calls == [] and not (started / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 0  # free again once its holder is gone
    assert fake.calls[0] == ["--resume", str(started), "--no-progress"]


def test_an_incomplete_directory_taken_after_planning_is_neither_moved_nor_run(grid, tmp_path):
    """A grid reaches an incomplete run directory hours after planning it; if another process has
    begun writing there meanwhile, moving it aside would pull it from under that run."""
    root, argv, fake = grid
    broken = mg.run_dir(root, "Hopper", 700, 0, STEPS)
    (broken / "checkpoints").mkdir(parents=True)
    hold = ("import sys, time\nfrom rlhp_jax.runs import claimed\nwith claimed(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    run = mg.Run("Hopper", 700, 0, STEPS)
    holder = subprocess.Popen([sys.executable, "-c", hold, str(broken)], stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        assert holder.stdout.readline().strip() == "held"
        failed = mg.execute([(run, "restart")], root, jobs=1, log=lines.append)
    finally:
        holder.kill()
        holder.wait()
    assert failed == [run] and fake.calls == [] and broken.is_dir()
    assert not [p for p in root.iterdir() if ".incomplete-" in p.name]
    assert "in use by another process since the grid was planned" in lines[0]


@pytest.mark.parametrize("changes, key", [({"total_steps": 2 * STEPS}, "total_steps"), ({"labels": 350}, "labels"),
                                          ({"seed": 7}, "seed"), ({"env": "Walker2d"}, "env"),
                                          ({"reward_source": "true"}, "reward_source"),
                                          ({"pretrain_steps": 0}, "pretrain_steps")])  # a preset that changed
def test_config_mismatch_stops_before_any_run_naming_the_directory(grid, capsys, changes, key):
    root, argv, fake = grid
    wrong = write_run(root, "Hopper", 700, 0, finished=changes.get("labels") is None, config_changes=changes)
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert str(wrong) in err and key in err
    assert fake.calls == []


def test_a_root_that_is_a_file_is_refused_before_any_run(grid, capsys):
    root, argv, fake = grid
    root.write_text("mine")
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 2
    assert f"--root {root} is a file, not a directory" in capsys.readouterr().err
    assert fake.calls == [] and root.read_text() == "mine"


def test_config_mismatch_names_the_nested_field_that_differs(grid, capsys):
    """A run made with one agent setting changed is refused naming that setting, not the first 80
    characters of two dicts that agree there."""
    root, argv, fake = grid
    agent = dict(expected("Hopper", 700, 0, STEPS, root)["agent_config"])
    field = list(agent)[-1]
    agent[field] = "changed"
    write_run(root, "Hopper", 700, 0, config_changes={"agent_config": {**agent, "extra_knob": 1}})
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert f"agent_config.{field} is 'changed', asked for " in err
    assert "agent_config.extra_knob is 1, asked for None" in err
    assert "agent_config is {" not in err
    assert fake.calls == []


def test_baseline_config_keeps_its_unused_label_count_without_mismatch(grid):
    root, argv, fake = grid
    write_run(root, "Hopper", None, 0, config_changes={"labels": 1400})
    write_run(root, "Hopper", 700, 0)
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 0
    assert fake.calls == []


def test_env_options_named_at_the_tasks_default_are_the_default_run(grid, capsys):
    """A Hopper run that named the height reward before it became Hopper's default (and a pendulum run
    that named its 25 steps) is the run the default makes; one that named the range penalty is not."""
    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0, config_changes={"env_options": [["penalty_shape", "height"]]})
    write_run(root, "Hopper", None, 0, config_changes={"env_options": [["penalty_shape", "height"]]})
    write_run(root, "InvertedPendulum", None, 0, config_changes={"env_options": [["episode_steps", 25]]})
    write_run(root, "InvertedPendulum", 700, 0)
    assert rm.main(argv + ["--tasks", "Hopper", "InvertedPendulum", "--seeds", "1"]) == 0
    assert fake.calls == []
    wrong = write_run(root, "Walker2d", 700, 0, config_changes={"env_options": [["penalty_shape", "range"]]})
    assert rm.main(argv + ["--tasks", "Walker2d", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert str(wrong) in err and "env_options" in err and "range" in err


def test_failed_run_is_reported_and_the_others_still_run(grid, capsys):
    root, argv, fake = grid
    fake.fail = {mg.run_dir(root, "Hopper", None, 0, STEPS).name}
    assert rm.main(argv + ["--tasks", "Hopper", "Swimmer", "--seeds", "1"]) == 1
    captured = capsys.readouterr()
    log = mg.Run("Hopper", None, 0, STEPS).log_path(root)
    assert f"Hopper baseline seed 0: FAILED (exit 1); log: {log}" in captured.out
    assert str(log) in captured.err
    assert len(fake.calls) == 4
    for task, labels in [("Hopper", 700), ("Swimmer", 700), ("Swimmer", None)]:
        assert (mg.run_dir(root, task, labels, 0, STEPS) / "summary.json").exists()
    # the next invocation resumes the failed run and skips the others
    fake.fail = set()
    fake.calls.clear()
    assert rm.main(argv + ["--tasks", "Hopper", "Swimmer", "--seeds", "1"]) == 0
    assert fake.calls == [["--resume", str(mg.run_dir(root, "Hopper", None, 0, STEPS)), "--no-progress"]]


def test_jobs_runs_that_many_at_once(grid, monkeypatch):
    root, argv, fake = grid
    fake.delay = 2
    running, peak = [], [0]
    real_call = fake.__call__

    def counting(argv_, log_path, entry="mujoco"):
        proc = real_call(argv_, log_path, entry)
        running.append(proc)
        peak[0] = max(peak[0], sum(1 for p in running if p.delay > 0))
        return proc

    monkeypatch.setattr(mg, "launch", counting)
    assert rm.main(argv + ["--tasks", "Hopper", "Swimmer", "--seeds", "2", "--jobs", "3"]) == 0
    assert len(running) == 8 and peak[0] == 3


@pytest.mark.parametrize("order, expected", [
    ("seeds", [("Swimmer", 0), ("Hopper", 0), ("Swimmer", 1), ("Hopper", 1)]),
    ("tasks", [("Swimmer", 0), ("Swimmer", 1), ("Hopper", 0), ("Hopper", 1)])])
def test_order_runs_seed_by_seed_or_task_by_task(grid, order, expected):
    root, argv, fake = grid
    assert rm.main(argv + ["--tasks", "Swimmer", "Hopper", "--seeds", "2", "--order", order]) == 0
    flags = [dict(zip(call, call[1:])) for call in fake.calls]
    launched = [(f["--env"], int(f["--seed"]), "--baseline" in call) for f, call in zip(flags, fake.calls)]
    # each cell's learned arm, then its true-reward arm
    assert launched == [(task, seed, baseline) for task, seed in expected for baseline in (False, True)]


def test_dry_run_runs_nothing_and_moves_nothing(grid, capsys):
    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0)
    write_run(root, "Hopper", None, 0, finished=False)
    broken = mg.run_dir(root, "Swimmer", 700, 0, STEPS)
    (broken / "checkpoints").mkdir(parents=True)
    before = sorted(p.name for p in root.iterdir())
    assert rm.main(argv + ["--tasks", "hopper-v4", "Swimmer", "--seeds", "1", "--dry-run"]) == 0  # any spelling
    out = capsys.readouterr().out
    assert "4 runs: 1 finished, 1 to resume, 2 to start (1 of them after moving an incomplete directory aside)" in out
    assert fake.calls == [] and sorted(p.name for p in root.iterdir()) == before
    assert not Path(argv[argv.index("--results-md") + 1]).exists()


def test_a_second_grid_on_the_same_root_is_refused_at_once(grid, capsys):
    """Two grids on one --root leapfrogged: each failed the runs the other was doing ("in use", or
    "continue it with --resume" for a run the other had just finished), and both rewrote the table.
    A grid holds its root while it plans and runs; --dry-run and --plot-only only read."""
    import fcntl
    import os

    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0)
    write_run(root, "Hopper", None, 0)
    fd = os.open(root, os.O_RDONLY)  # what the other grid's claim holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "2"]) == 2
        assert f"{root} is in use by another process (another grid of it is writing there now)" in \
            capsys.readouterr().err
        assert fake.calls == []
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "2", "--dry-run"]) == 0
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1", "--plot-only"]) == 0
    finally:
        os.close(fd)
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "2"]) == 0
    assert "done: 2 skipped (finished before), 0 resumed, 2 started; 0 of them failed" in capsys.readouterr().out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_terminated_grid_stops_its_runs(grid, capsys, monkeypatch, sig):
    """SIGTERM (``kill``, ``timeout``, a scheduler) or SIGHUP (a closed terminal) ended the grid and
    left its runs training, unwatched; only Ctrl-C stopped them."""
    import os
    import signal

    root, argv, fake = grid
    procs = []

    class Killed(FakeProc):
        def poll(self):
            os.kill(os.getpid(), getattr(signal, sig))  # arrives while the grid waits on its runs
            return None

    def launch(argv_, log_path, entry="mujoco"):
        fake(argv_, log_path, entry)
        procs.append(Killed(0))
        return procs[-1]

    monkeypatch.setattr(mg, "launch", launch)
    before = signal.getsignal(getattr(signal, sig))
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 130
    assert "the runs it started were stopped" in capsys.readouterr().err
    assert [p.rc for p in procs] == [-15] and signal.getsignal(getattr(signal, sig)) is before


@pytest.mark.parametrize("damage, why", [
    ("cut", "ends at iteration 3, env_steps 300, but the run's summary.json says it finished at env_steps 800"),
    ("deleted", "metrics.jsonl is missing"),
    ("gap", "rows are not iterations 1, 2, … once each, in order"),
])
def test_a_finished_run_whose_metrics_were_damaged_is_not_counted(grid, capsys, damage, why):
    """A finished run whose metrics.jsonl was cut short by hand counted as finished: the table showed
    the mean of its first iterations as its final return (−14.4 where the run ended at −21.0); deleted,
    the seed dropped out of the mean without a word.  Refused at the plan, --plot-only included."""
    root, argv, fake = grid
    run = write_run(root, "Hopper", 700, 0, returns=[float(i) for i in range(8)])
    write_run(root, "Hopper", None, 0)
    rows = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    if damage == "deleted":
        (run / "metrics.jsonl").unlink()
    else:
        (run / "metrics.jsonl").write_text("".join(rows[:3] if damage == "cut" else rows[:3] + rows[4:]))
    for extra in ([], ["--plot-only"]):
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1", *extra]) == 2
        err = capsys.readouterr().err
        assert f"{run} says it finished, but" in err and why in err and "move the directory aside" in err
    assert fake.calls == [] and not Path(argv[argv.index("--results-md") + 1]).exists()


@pytest.mark.parametrize("learned, rl, ok", [(90.0, 100.0, True), (89.9, 100.0, False), (150.0, 100.0, True),
                                             (-11.0, -10.0, True), (-11.1, -10.0, False), (-5.0, -10.0, True),
                                             (0.0, 0.0, True), (-0.1, 0.0, False)])
def test_meets_target_for_positive_and_nonpositive_rl(learned, rl, ok):
    assert figures.meets_target(learned, rl) is ok


def test_final_return_is_the_mean_of_the_last_five_rows():
    rows = [{"true_return": v} for v in [100.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
    assert mg.final_return(rows) == 3.0
    assert mg.final_return(rows[-2:]) == 4.5
    assert mg.final_return([{"true_return": None}, {"true_return": 7.0}]) == 7.0
    assert mg.final_return([]) is None


def test_results_section_is_replaced_between_markers_and_nothing_else_changes(tmp_path):
    md = tmp_path / "results.md"
    before = "# Results\n\nintro\n\n## Fig. 2\n\n"
    after = "\n\n## Pong\n\ntext with a | pipe\n"
    md.write_text(f"{before}{rm.TABLE_BEGIN}\nold table\n{rm.TABLE_END}{after}")
    rm.write_results_section(md, "| new | table |")
    assert md.read_text() == f"{before}{rm.TABLE_BEGIN}\n| new | table |\n{rm.TABLE_END}{after}"
    rm.write_results_section(md, "second")
    assert md.read_text() == f"{before}{rm.TABLE_BEGIN}\nsecond\n{rm.TABLE_END}{after}"
    assert [p.name for p in tmp_path.iterdir()] == ["results.md"]  # no temporary file left behind


def test_results_section_is_appended_when_the_markers_are_absent(tmp_path):
    md = tmp_path / "results.md"
    md.write_text("# Results\n\nsomething")
    rm.write_results_section(md, "the table")
    assert md.read_text() == (f"# Results\n\nsomething\n\n{rm.SECTION_TITLE}\n\n"
                              f"{rm.TABLE_BEGIN}\nthe table\n{rm.TABLE_END}\n")
    rm.write_results_section(md, "again")  # now the markers are there: replaced, not appended twice
    assert md.read_text().count(rm.SECTION_TITLE) == 1 and "again" in md.read_text()


def test_results_section_refuses_broken_markers(tmp_path):
    md = tmp_path / "results.md"
    text = f"a\n{rm.TABLE_END}\nb\n{rm.TABLE_BEGIN}\n"
    md.write_text(text)
    with pytest.raises(mg.GridError, match="markers"):
        rm.write_results_section(md, "x")
    assert md.read_text() == text


def test_table_counts_finished_seeds_only_and_checks_the_targets(tmp_path):
    root = tmp_path
    for seed in (0, 1):
        write_run(root, "Hopper", 700, seed, returns=[95.0 + 10 * seed])  # 95, 105: mean 100
        write_run(root, "Hopper", None, seed, returns=[100.0])
        write_run(root, "Hopper", 1400, seed, returns=[90.0])
        write_run(root, "Swimmer", 700, seed, returns=[50.0])
    write_run(root, "Hopper", None, 2, returns=[-1000.0], finished=False)  # still going: not in the table
    write_run(root, "Swimmer", None, 0, returns=[100.0])
    table = rm.results_table(root, ["Hopper", "Swimmer", "Ant"], [700, 1400], [0, 1, 2], lambda _: STEPS)
    lines = table.splitlines()
    assert lines[0] == ("| task | 700 labels | 1400 labels | RL on the true reward | 700 labels vs RL "
                        "| 700-label seeds at target | 1400 ≥ 700 |")
    # the difference of the means with its standard error: √(50/2 + 0/2) = 5 (sample variances);
    # both 700-label seeds (95 and 105) reach 90 % of RL's 100 on their own
    assert lines[2] == ("| Hopper | 100 ± 5 (2 seeds) | 90.0 ± 0.0 (2 seeds) | 100 ± 0 (2 seeds) | PASS "
                        "| 2 of 2 (RL 2 of 2) | no (-10 ± 5) |")
    assert lines[3] == "| Swimmer | 50.0 ± 0.0 (2 seeds) | – | 100 ± 0 (1 seed) | FAIL | 0 of 2 (RL 1 of 1) | – |"
    assert lines[4] == "| Ant | – | – | – | – | – | – |"
    assert "1400" not in rm.results_table(root, ["Hopper"], [700], [0, 1], lambda _: STEPS).splitlines()[0]
    # how to read the brackets is said under a table that has them, and only there
    legend = "difference ± its standard error"
    assert legend in rm.section_markdown(table, "cmd", lambda _: STEPS, ["Hopper"], "fig.png")
    plain = rm.results_table(root, ["Hopper"], [700], [0, 1], lambda _: STEPS)
    assert legend not in rm.section_markdown(plain, "cmd", lambda _: STEPS, ["Hopper"], "fig.png")


def test_seeds_at_target_counts_each_seed_against_rls_mean():
    from experiments.figures import seeds_at_target

    # a mean carried by one seed: 95 passes against RL's 100 (at least 90), 60 and 61 do not; the mean 205 passes
    assert seeds_at_target([60.0, 61.0, 95.0, 604.0], [100.0, 100.0]) == "2 of 4 (RL 2 of 2)"
    # the boundary is the target's own; RL's seeds are counted against their own mean (100): 85 falls short
    assert seeds_at_target([89.9, 90.0], [85.0, 115.0]) == "1 of 2 (RL 1 of 2)"
    # negative returns: within 10 % of |RL| below it (RL −7: down to −7.7)
    assert seeds_at_target([-7.7, -7.8, -6.0], [-7.0]) == "2 of 3 (RL 1 of 1)"
    assert seeds_at_target([], [1.0]) == "–" and seeds_at_target([1.0], []) == "–"


def test_the_budgets_difference_carries_its_standard_error():
    from experiments.figures import difference

    assert difference([110.0, 130.0], [100.0, 100.0]) == "+20 ± 10"  # √(200/2 + 0/2), sample variances
    assert difference([1.0, 2.0, 3.0], [2.5, 3.5]) == "-1.0 ± 0.8"  # √(1/3 + 0.5/2) = 0.76, to 1 decimal
    assert difference([3.0], [1.0, 2.0]) == "+1.5"  # one seed has no spread to speak of
    # at a task's ceiling (InvertedPendulum, 25.0) one decimal would print "-0.0 ± 0.0"
    assert difference([25.0, 25.0, 25.0, 24.87, 25.0], [25.0] * 5) == "-0.03 ± 0.03"
    assert difference([25.0] * 5, [25.0] * 5) == "+0.0 ± 0.0"  # nothing finer to show


def test_grid_writes_figures_and_the_results_section(grid):
    root, argv, fake = grid
    fake.returns = {700: [10.0] * 6, None: [10.5] * 6, 350: [1.0, 2.0, 3.0]}
    results_md = Path(argv[argv.index("--results-md") + 1])
    results_md.parent.mkdir(parents=True)
    results_md.write_text("# Results\n")
    assert rm.main(argv + ["--tasks", "Hopper", "Reacher", "Ant", "--seeds", "2", "--labels", "700", "350"]) == 0
    docs = Path(argv[argv.index("--docs") + 1])
    for name in ["mujoco_Hopper.png", "mujoco_Reacher.png", "mujoco_Ant.png", "mujoco_fig2.png"]:
        assert (docs / name).stat().st_size > 1000, name
    text = results_md.read_text()
    assert text.startswith("# Results\n\n" + rm.SECTION_TITLE)
    assert "| Hopper | 2.0 ± 0.0 (2 seeds) | 10.0 ± 0.0 (2 seeds) | 10.5 ± 0.0 (2 seeds) | PASS | 2 of 2 (RL 2 of 2) |" in text
    assert ("`python -m experiments.reproduce_mujoco --tasks Hopper Reacher Ant --seeds 2 --labels 350 700 "
            f"--steps {STEPS}`") in text
    assert all(f"- {item}" in text for item in rm.A1_DIFFERENCES)
    assert "](results/mujoco_fig2.png)" in text


def test_a_panel_draws_every_seed_beside_the_arms_mean(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # two learned seeds that split (a slow and a fast outcome) and one RL seed: the band alone would hide the split
    write_run(tmp_path, "Swimmer", 700, 0, returns=[40.0] * 6)
    write_run(tmp_path, "Swimmer", 700, 1, returns=[300.0] * 6)
    write_run(tmp_path, "Swimmer", None, 0, returns=[100.0] * 6)
    fig, ax = plt.subplots()
    drawn = rm.FIG2.draw_task(ax, tmp_path, "Swimmer", [700], [0, 1], STEPS)
    levels = sorted(round(float(line.get_ydata()[-1])) for line in ax.lines)
    assert levels == [40, 100, 100, 170, 300]  # each seed, and each arm's mean (RL's one seed is its mean)
    assert [n for _, n in drawn.values()] == [2, 1]
    plt.close(fig)


def test_plot_only_runs_nothing_and_redraws_from_what_exists(grid):
    root, argv, fake = grid
    write_run(root, "Swimmer", 700, 0, returns=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    write_run(root, "Swimmer", 700, 1, returns=[1.0, 2.0, 3.0], finished=False)  # shorter: common prefix
    assert rm.main(argv + ["--tasks", "Swimmer", "--seeds", "3", "--plot-only"]) == 0
    assert fake.calls == []
    docs = Path(argv[argv.index("--docs") + 1])
    assert (docs / "mujoco_Swimmer.png").stat().st_size > 1000 and (docs / "mujoco_fig2.png").exists()
    assert "| Swimmer | 5.0 ± 0.0 (1 seed) | – | – |" in Path(argv[argv.index("--results-md") + 1]).read_text()


def test_plot_only_over_a_root_without_runs_refuses_and_keeps_the_results(grid, capsys):
    root, argv, fake = grid
    results_md = Path(argv[argv.index("--results-md") + 1])
    results_md.parent.mkdir(parents=True)
    results_md.write_text("# Results\n\nthe table of an earlier grid\n")
    assert rm.main(argv + ["--tasks", "Swimmer", "--seeds", "2", "--plot-only"]) == 2
    assert "no run of this grid under" in capsys.readouterr().err
    assert results_md.read_text() == "# Results\n\nthe table of an earlier grid\n" and fake.calls == []
    assert not Path(argv[argv.index("--docs") + 1]).exists()



@pytest.mark.parametrize("flag, kind", [("--docs", "file"), ("--docs", "below_a_file"), ("--docs", "directory"),
                                        ("--results-md", "directory"), ("--results-md", "below_a_file"),
                                        ("--results-md", "broken_markers"), ("--results-md", "not_utf8"),
                                        ("--results-md", "file")])
def test_outputs_that_cannot_be_written_stop_the_grid_before_any_run(grid, capsys, tmp_path, flag, kind):
    """Where the figures (--docs) or the table (--results-md) cannot go -- a --docs that is a file,
    a --results-md that is a directory, either below a file, a results.md with broken markers or
    not UTF-8 -- the grid is refused before any run starts, in one line, every file as it was.  It
    used to run the whole grid (hours) and then fail at the end, with a traceback for all but the
    markers."""
    root, argv, fake = grid
    target = tmp_path / "target"
    if kind == "directory":
        target.mkdir()
    elif kind == "file":
        target.write_text("mine")
    elif kind == "below_a_file":
        (tmp_path / "notes.txt").write_text("mine")
        target = tmp_path / "notes.txt" / "results.md"
    elif kind == "broken_markers":
        target.write_text(f"mine\n{rm.TABLE_END}\n{rm.TABLE_BEGIN}\n")
    else:
        target.write_bytes(b"# R\xe9sultats\n")
    fine = (flag, kind) in (("--docs", "directory"), ("--results-md", "file"))  # a folder; a Markdown file
    argv = list(argv)
    argv[argv.index(flag) + 1] = str(target)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code = rm.main(argv + ["--tasks", "Swimmer", "--seeds", "1", "--labels", "700"])
    err = capsys.readouterr().err
    if fine:
        assert code == 0, err
        return
    assert code == 2 and fake.calls == [] and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(target) in lines[0], err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

def test_seed_curves_smooth_over_five_points_and_cut_to_the_common_prefix(tmp_path):
    write_run(tmp_path, "Hopper", 700, 0, returns=[0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0])
    write_run(tmp_path, "Hopper", 700, 1, returns=[5.0] * 6, finished=False)
    x, ys = rm.seed_curves(tmp_path, "Hopper", 700, [0, 1, 2], STEPS)
    assert list(x) == [500.0, 600.0]
    assert ys.tolist() == [[10.0, 15.0], [5.0, 5.0]]
    assert rm.seed_curves(tmp_path, "Hopper", None, [0, 1], STEPS) is None


def test_launch_starts_experiments_mujoco_with_its_output_in_the_log(tmp_path):
    """The real seam, with flags experiments.mujoco refuses at once (no run, no compile)."""
    log = tmp_path / "runs" / "x.log"
    proc = mg.launch(["--env", "NoSuchTask", "--no-progress"], log)
    assert proc.wait(timeout=120) == 2
    text = log.read_text()
    assert "$ python -m experiments.mujoco --env NoSuchTask --no-progress" in text
    assert "Unknown environment 'NoSuchTask'" in text


def test_a_sigkilled_grid_takes_its_runs_with_it(tmp_path):
    """A grid killed by SIGKILL (``kill -9``, the OOM killer) left its runs training on, unwatched
    and holding their directories, so the next grid refused them as in use.  Now each run gets a
    SIGTERM when its grid dies, and its directory is free for the next grid to resume."""
    import os
    import signal
    import time

    from rlhp_jax.runs import in_use

    run = tmp_path / "run"
    code = ("import sys, time; from pathlib import Path; from experiments import grid; "
            "p = grid.launch(['--env', 'CartPole-v1', '--steps', '100000000', '--no-progress', '--out', sys.argv[1]], "
            "Path(sys.argv[2]), entry='classic'); print(p.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(run), str(tmp_path / "run.log")],
                              cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 180
        while not in_use(run):  # the run has claimed its directory: it is training
            assert time.monotonic() < deadline and parent.poll() is None, (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 60
        while in_use(run):
            assert time.monotonic() < deadline, "the run trains on after its grid was killed"
            time.sleep(0.2)
        assert not (run / "summary.json").exists()
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_run_whose_grid_is_already_gone_does_not_start(tmp_path):
    """The grid died between starting the process and its request to be told: the run sees a
    parent that is not its grid and stops before anything is written."""
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", mg._DIE_WITH_GRID, "1", "experiments.classic", "--env", "CartPole-v1",
                           "--out", str(run)], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "the grid that started this run (pid 1) is gone: not started" in done.stderr
    assert not run.exists()


def test_a_grid_of_another_entry_point_starts_and_checks_runs_with_it(tmp_path):
    """Run.entry names the entry point: its runs start with it and are checked against its config."""
    log = tmp_path / "runs" / "x.log"
    proc = mg.launch(["--env", "NoSuchGame", "--no-progress"], log, entry="atari")
    assert proc.wait(timeout=120) == 2
    assert "$ python -m experiments.atari --env NoSuchGame --no-progress" in log.read_text()
    pong = mg.grid(["Pong"], [5500], [0], lambda task: 40_000, entry="atari")
    assert [r.entry for r in pong] == ["atari", "atari"] and pong[0].directory(tmp_path).name == "Pong-5500labels-40k-seed0"
    config = mg.expected_config(pong[0], tmp_path)
    assert config["agent"] == "a2c" and config["env"] == "Pong" and config["labels"] == 5500
    assert mg.expected_config(pong[1], tmp_path)["reward_source"] == "true"


def test_runs_of_another_step_budget_live_in_their_own_directory(tmp_path):
    """A finished 1,000-step run neither blocks nor counts for a 2,000-step grid of the same cell."""
    root = tmp_path / "runs"
    write_run(root, "Hopper", 700, 0, returns=(5.0,))
    short, long = mg.Run("Hopper", 700, 0, STEPS), mg.Run("Hopper", 700, 0, 2 * STEPS)
    assert short.directory(root) != long.directory(root)
    assert short.directory(root).name == "Hopper-700labels-1k-seed0"
    assert mg.run_state(short, root) == "finished" and mg.run_state(long, root) == "start"
    assert rm.finished_finals(root, "Hopper", 700, [0], STEPS) == [5.0]
    assert rm.finished_finals(root, "Hopper", 700, [0], 2 * STEPS) == []


def test_the_committed_table_lists_exactly_the_differences_the_code_writes():
    """docs/results.md's block between the markers is what ``--plot-only`` rewrites: a difference
    written there by hand and missing from ``A1_DIFFERENCES`` would vanish at the next redraw."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text(encoding="utf-8")
    begin, end = "<!-- reproduce_mujoco:table:begin -->", "<!-- reproduce_mujoco:table:end -->"
    block = text[text.index(begin):text.index(end)]
    listed = block[block.index("Remaining differences from appendix A.1:"):].split("\n\n")[1]
    assert [line[2:] for line in listed.splitlines()] == rm.A1_DIFFERENCES


@pytest.mark.parametrize("run_args, says", [("--agent-config vf_recentr=True", "vf_recentr"),
                                           ("--no-such-flag 3", "not flags of python -m experiments.mujoco"),
                                           ("--seed 3", "--seed is the grid's own"),  # every seed a copy of seed 3
                                           ("--out=/tmp/elsewhere --steps 5", "--out, --steps are the grid's own"),
                                           # a paused run exits 0 without a summary: not a run that ended
                                           ("--pause-at 3", "--pause-at stops a run part-way")])
def test_run_args_the_entry_point_refuses_stop_the_grid_before_any_run(grid, capsys, run_args, says):
    root, argv, fake = grid
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "2", "--run-args", run_args]) == 2
    assert fake.calls == [] and not root.exists()
    assert says in capsys.readouterr().err


def test_the_written_command_carries_the_run_args_the_runs_were_made_with(grid):
    root, argv, fake = grid
    results_md = Path(argv[argv.index("--results-md") + 1])
    results_md.parent.mkdir(parents=True)
    results_md.write_text("# Results\n")
    flags = ["--tasks", "Hopper", "--seeds", "1", "--run-args", "--agent-config vf_recenter=True"]
    assert rm.main(argv + flags) == 0
    assert all("vf_recenter=True" in " ".join(call) for call in fake.calls) and len(fake.calls) == 2
    assert (f"`python -m experiments.reproduce_mujoco --tasks Hopper --seeds 1 --labels 700 --steps {STEPS} "
            "--run-args='--agent-config vf_recenter=True'`") in results_md.read_text()


def test_a_runs_log_replaces_a_symlink_planted_at_its_name_never_appends_through_it(tmp_path):
    """A root may come from someone else (a grid continued on another machine): a link at a run's
    log name must not get the run's output appended to the file it points at."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    log = mg.Run("Hopper", 700, 0, STEPS).log_path(tmp_path / "runs")
    log.parent.mkdir()
    log.symlink_to(victim)
    assert mg.launch(["--nothing"], log, entry="grid").wait() == 0  # python -m experiments.grid: runs nothing
    assert victim.read_text() == "mine\n"
    assert not log.is_symlink() and "$ python -m experiments.grid --nothing" in log.read_text()


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_something_not_a_directory_at_a_runs_path_is_refused_not_moved_aside(grid, tmp_path, kind, capsys):
    """A file (or a link to nothing) where a run directory goes is someone's, not an incomplete run:
    the grid names it and starts nothing, and leaves it where it is."""
    root, argv, fake = grid
    path = mg.run_dir(root, "Hopper", 700, 0, STEPS)
    root.mkdir()
    if kind == "file":
        path.write_text("my notes\n")
    else:
        path.symlink_to(tmp_path / "nowhere")
    for extra in (["--dry-run"], []):
        assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path} is not a directory") and err.count("\n") == 1
    assert fake.calls == [] and sorted(p.name for p in root.iterdir()) == [path.name]
    assert path.is_symlink() if kind != "file" else path.read_text() == "my notes\n"


def test_a_run_that_cannot_be_launched_fails_alone(grid, capsys):
    """A run whose log cannot be opened (a directory at its name) or whose directory vanished before
    it was moved aside is reported as failed; the grid goes on with the others, no traceback."""
    root, argv, fake = grid
    hopper = mg.Run("Hopper", 700, 0, STEPS)
    hopper.log_path(root).mkdir(parents=True)  # a directory where the log goes
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1"]) == 1
    out = capsys.readouterr().out
    assert "Hopper 700labels seed 0: FAILED: cannot start it: " in out and str(hopper.log_path(root)) in out
    assert (mg.Run("Hopper", None, 0, STEPS).directory(root) / "summary.json").exists()  # the other run went on
    lines = []
    gone = mg.Run("Swimmer", 700, 0, STEPS)  # planned as incomplete, removed by someone before its turn
    assert mg.execute([(gone, "restart")], root, jobs=1, log=lines.append) == [gone]
    assert "FAILED" in lines[0] and str(gone.directory(root)) in lines[0]


def test_plots_replace_a_symlink_planted_in_docs_never_write_through_it(grid, tmp_path):
    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0)
    write_run(root, "Hopper", None, 0)
    docs = tmp_path / "docs" / "results"
    docs.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (docs / "mujoco_fig2.png").symlink_to(victim)
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1", "--plot-only"]) == 0
    assert victim.read_text() == "mine\n"
    assert not (docs / "mujoco_fig2.png").is_symlink() and (docs / "mujoco_fig2.png").read_bytes()[:4] == b"\x89PNG"


def test_budgets_that_round_alike_keep_their_own_directories():
    """1,000,000 and 1,000,001 steps shared the directory ``…-1M-…`` (the tick text's six digits),
    and the second was then refused as another run, against the promise of a directory per budget."""
    names = {n: mg.run_dir(Path("r"), "Hopper", 700, 0, n).name for n in (1_000_000, 1_000_001, 98_304, 1_500_000)}
    assert names == {1_000_000: "Hopper-700labels-1M-seed0", 1_000_001: "Hopper-700labels-1000001-seed0",
                     98_304: "Hopper-700labels-98.304k-seed0", 1_500_000: "Hopper-700labels-1.5M-seed0"}


def test_how_often_a_run_saved_does_not_make_it_another_run(grid, capsys):
    """A grid rerun with --checkpoint-every 2 in --run-args refused every run made with 1 ("holds
    another run"), though how often a run saves does not change what it computes."""
    root, argv, fake = grid
    write_run(root, "Hopper", 700, 0, config_changes={"checkpoint_every": 7, "keep_checkpoints": 1})
    write_run(root, "Hopper", None, 0, finished=False, config_changes={"checkpoint_every": 7})
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "1", "--dry-run"]) == 0
    assert "2 runs: 1 finished, 1 to resume, 0 to start" in capsys.readouterr().out
    write_run(root, "Hopper", 700, 1, config_changes={"segment_length": 7})  # what it computes: refused
    assert rm.main(argv + ["--tasks", "Hopper", "--seeds", "2", "--dry-run"]) == 2
    assert "segment_length is 7" in capsys.readouterr().err
