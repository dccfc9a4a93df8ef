"""experiments.reproduce_ibarz (Ibarz et al. Fig. 1): the figure's games, setups and schedules;
each cell's run is the Ibarz protocol with the setup's flags; missing demonstrations stop the
command before anything runs; the table and bars from finished runs; and the command end to end
on a CPU smoke budget (a real --agent dqfd run as a subprocess, the warm-up estimate, a second
call that skips the finished run)."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

from experiments import grid as mg
from experiments import reproduce_ibarz as ri
from rlhp_jax import demos as D

SMOKE = ("--iteration-steps 50 --bc-batches 3 --rm-pretrain-batches 3 --second-pretrain-batches 3 "
         "--rm-batches-per-iteration 3 --replay.capacity 1000 --model-reward-samples 64")


def _args(*extra):
    return ri.FIG1.parse_args(["--games", "Pong", "--seeds", "1", *extra])


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """DIR/Breakout-MinAtar.npz: one episode of the scripted MinAtar player."""
    from experiments.minatar_demonstrator import minatar_tracker
    from rlhp_jax.envs import make_env

    rec = D.record_policy(make_env("Breakout-MinAtar", 1), minatar_tracker, jax.random.PRNGKey(0), episodes=1,
                          max_steps=300, source="tracker")
    directory = tmp_path_factory.mktemp("demos")
    rec.save(directory / "Breakout-MinAtar.npz")
    return directory


def test_fig1_is_the_papers_nine_games_five_setups_four_schedules_three_seeds():
    assert ri.TASKS == ("BeamRider", "Breakout", "Enduro", "Hero", "MontezumaRevenge", "Pong", "PrivateEye",
                        "Qbert", "Seaquest")
    assert set(ri.TASKS) <= set(ri.FIG1.known_tasks())
    assert ri.SCHEDULES == (6800, 3400, 1700, 1133)  # A.3: the full schedule and its reductions by 2, 4, 6
    assert ri.FIG1.default_seeds == 3 and all(ri.DEFAULT_STEPS[t] == 50_000_000 for t in ri.TASKS)
    assert [s.name for s in ri.SETUPS] == ["imitation", "no_demos", "demos+prefs", "demos+prefs+autolabels",
                                           "20%demos+prefs"]


def test_each_cell_runs_the_ibarz_protocol_with_its_setup(tmp_path):
    args = _args("--demos", str(tmp_path))
    runs = ri.FIG1.runs(args, ri.DEFAULT_STEPS.__getitem__)
    # imitation once (no labels), every other setup once per schedule
    assert len(runs) == 1 + 4 * len(ri.SCHEDULES)
    by = {(r.variant, r.labels): r for r in runs}
    assert ("imitation", None) in by and ("imitation", 6800) not in by
    configs = {key: mg.expected_config(run, tmp_path) for key, run in by.items()}
    for (variant, labels), config in configs.items():
        assert config["protocol"] == "ibarz" and config["total_steps"] == 50_000_000
        assert config["setup"] == ri.BY_NAME[variant].setup
        assert config["demos"] == (None if variant == "no_demos" else str(tmp_path / "Pong.npz"))
        if labels is not None:
            assert config["labels"] == labels
    assert configs[("20%demos+prefs", 3400)]["demo_fraction"] == 0.2
    assert configs[("demos+prefs", 3400)]["demo_fraction"] == 1.0
    assert by[("20%demos+prefs", 1133)].directory(tmp_path).name == "Pong-20%demos+prefs-1133labels-50M-seed0"
    assert by[("imitation", None)].directory(tmp_path).name == "Pong-imitation-50M-seed0"
    assert "--baseline" not in by[("imitation", None)].fresh_argv(tmp_path)


def test_missing_demonstrations_stop_the_command_before_anything_runs(tmp_path, capsys):
    root = tmp_path / "runs"
    assert ri.main(["--games", "Pong", "--seeds", "1", "--demos", str(tmp_path / "none"), "--root", str(root),
                    "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "none" / "Pong.npz") in err and "human play" in err and "demos_cli record" in err
    assert not root.exists()
    # preferences alone need no demonstrations
    assert ri.main(["--games", "Pong", "--seeds", "1", "--setups", "no_demos", "--demos", str(tmp_path / "none"),
                    "--root", str(root), "--dry-run"]) == 0
    assert "4 runs: 0 finished" in capsys.readouterr().out


def _finish(run: mg.Run, root, scores):
    """A finished run directory as experiments.atari writes one: its config, iteration rows, summary."""
    directory = run.directory(root)
    directory.mkdir(parents=True)
    config = {**mg.expected_config(run, root), "out": str(directory)}
    (directory / "config.json").write_text(json.dumps(config))
    rows = [{"stage": i + 1, "phase": "iteration", "env_steps": 100 * (i + 1), "episode_return": s, "wall_s": float(i)}
            for i, s in enumerate(scores)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "summary.json").write_text(json.dumps({"env_steps": 100 * len(scores)}))


def test_table_and_bars_from_finished_runs(tmp_path, capsys):
    root, docs, md = tmp_path / "runs", tmp_path / "docs", tmp_path / "results.md"
    flags = ["--games", "Pong", "--seeds", "2", "--setups", "imitation", "no_demos", "--labels", "6800", "1133",
             "--steps", "1000", "--demos", str(tmp_path), "--root", str(root), "--docs", str(docs),
             "--results-md", str(md)]
    args = ri.FIG1.parse_args(flags)
    runs = {(r.variant, r.labels, r.seed): r for r in ri.FIG1.runs(args, lambda _: 1000)}
    # the final score is the mean of the last 5 iterations that had an episode end
    _finish(runs[("no_demos", 6800, 0)], root, [-21, -21, None, 10, 12, 14, None, 16, 18])  # final 14
    _finish(runs[("no_demos", 6800, 1)], root, [0, 2, 4, 6, 8])  # final 4
    _finish(runs[("imitation", None, 0)], root, [-5, -3])  # final -4; seed 1 not finished
    assert ri.main([*flags, "--plot-only"]) == 0
    text = md.read_text()
    assert ri.FIG1.table_begin in text and "| Pong | no demos | 9.0 ± 5.0 (2 seeds) | – |  |" in text
    assert "| Pong | imitation |  |  | -4.0 ± 0.0 (1 seed) |" in text
    assert "--setups imitation no_demos" in text and all(f"- {item}" in text for item in ri.IBARZ_DIFFERENCES)
    assert (docs / "ibarz_fig1.png").stat().st_size > 10_000 and (docs / "ibarz_Pong.png").exists()
    # plot-only needs no demonstrations (the directory named holds none)
    assert not (tmp_path / "Pong.npz").exists()


def test_reproduce_ibarz_end_to_end_on_a_smoke_budget(demo_dir, tmp_path, capsys):
    """The figure's command on Breakout-MinAtar through experiments.classic (the same protocol and
    grid; an Atari DQfD run costs about three times as long on CPU, and test_ibarz runs one): the
    warm-up estimate, a real run with the setup's flags and demonstrations, its score in the table,
    then a second call that finds it finished."""
    fig = dataclasses.replace(ri.FIG1, entry="classic", tasks=("Breakout-MinAtar",),
                              default_steps={"Breakout-MinAtar": 100})
    root, md = tmp_path / "runs", tmp_path / "results.md"
    argv = ["--seeds", "1", "--setups", "20%demos+prefs", "--labels", "4", "--demos", str(demo_dir),
            "--run-args", SMOKE, "--root", str(root), "--docs", str(tmp_path / "docs"), "--results-md", str(md)]
    assert fig.main(argv) == 0
    out = capsys.readouterr().out
    assert "estimate on this device (cpu), from a" in out and "20%demos+prefs-4labels" in out
    run = root / "Breakout-MinAtar-20%demos+prefs-4labels-100-seed0"
    assert (run / "summary.json").exists()
    config = json.loads((run / "config.json").read_text())
    assert config["setup"] == "demos+prefs" and config["demo_fraction"] == 0.2 and config["iteration_steps"] == 50
    assert config["demos"] == str(demo_dir / "Breakout-MinAtar.npz") and config["labels"] == 4
    score = mg.final_return(mg.run_metrics(run), "episode_return")
    assert score is not None and f"| Breakout-MinAtar | 20% demos + preferences | {score:.1f} ± 0.0 (1 seed) |" in md.read_text()
    assert (tmp_path / "docs" / "ibarz_fig1.png").exists()
    assert fig.main(argv) == 0  # again: finished, nothing runs, no warm-up
    again = capsys.readouterr().out
    assert "1 runs: 1 finished" in again and "estimate" not in again
    # the run records the demonstrations it was made from; a grid whose --demos names other bytes at the
    # same path (re-recorded, or a command run from another directory) does not count it as its own
    record = json.loads((run / D.DEMOS_RECORD).read_text())
    assert record == dict(D.fingerprint(demo_dir / "Breakout-MinAtar.npz"), path=record["path"])
    (run / D.DEMOS_RECORD).write_text(json.dumps(dict(record, sha256="0" * 64)))
    assert fig.main(argv + ["--dry-run"]) == 2
    assert "demos: it was made from demonstrations of SHA-256 000000000000…" in capsys.readouterr().err
