"""experiments.reproduce_atari (Christiano Fig. 3): the figure's settings, and the command end to
end on a CPU smoke budget — real experiments.atari runs as subprocesses, the table in results.md,
the plots, and a second call that skips both finished runs — and the warm-up command that the
wall-time estimate runs."""

from __future__ import annotations

import json

import pytest

from conftest import run_outputs_ok
from experiments import grid as mg
from experiments import reproduce_atari as ra

SMOKE = "--iteration-steps 160 --pretrain-epochs 2 --ensemble.num-members 1 --agent-config num_envs=2"


def test_fig3_is_the_papers_seven_games_three_seeds_and_its_budgets():
    assert ra.TASKS == ("BeamRider", "Breakout", "Enduro", "Pong", "Qbert", "Seaquest", "SpaceInvaders")
    assert set(ra.TASKS) <= set(ra.FIG3.known_tasks())
    assert ra.FIG3.default_seeds == 3 and ra.FIG3.default_labels == (3300, 5500)
    assert all(ra.DEFAULT_STEPS[t] == 50_000_000 for t in ra.TASKS)  # A.2: "only 50 million timesteps"
    assert ra.FIG3.metric == "episode_return" and ra.FIG3.entry == "atari"
    # each run is an experiments.atari run with A.2's preset: A2C, and the RL arm on the clipped game reward
    learned, rl = mg.grid(["Pong"], [5500], [0], ra.DEFAULT_STEPS.__getitem__, entry="atari")
    config = mg.expected_config(learned, mg.Path("unused"))
    assert config["agent"] == "a2c" and config["initial_label_count"] == 500 and config["rate_step"] == 5_000_000
    assert mg.expected_config(rl, mg.Path("unused"))["baseline_reward"] == "clipped_game"


def test_the_warm_up_is_three_iterations_of_the_first_learning_run_without_its_pretraining(tmp_path):
    """The command the wall-time estimate runs (the smoke test below skips it: the warm-up itself
    runs end to end in test_reproduce_ibarz.py's smoke test) is an experiments.atari run: the
    grid's first learning run, cut to three iterations, with the label schedule of its whole budget."""
    learned, _ = mg.grid(["Pong"], [5500], [0], ra.DEFAULT_STEPS.__getitem__, entry="atari")
    argv = ra.FIG3.warmup_argv(learned, tmp_path / "run")
    config, run = mg.config_of("atari", argv), mg.expected_config(learned, tmp_path)
    assert config["total_steps"] == 3 * run["iteration_steps"] and config["label_horizon"] == 50_000_000
    assert config["pretrain_epochs"] == 0 and not config["distinct_initial_clips"] and run["distinct_initial_clips"]
    changed = ("total_steps", "label_horizon", "pretrain_epochs", "distinct_initial_clips")
    assert {k: v for k, v in config.items() if k not in changed} == {k: v for k, v in run.items() if k not in changed}


def test_final_score_reads_episode_returns_where_episodes_ended():
    rows = [{"episode_return": None}, {"episode_return": -21.0}, {"episode_return": None}, {"episode_return": -19.0}]
    assert mg.final_return(rows, "episode_return") == -20.0
    assert mg.final_return([{"episode_return": None}], "episode_return") is None


def test_reproduce_atari_end_to_end_on_a_smoke_budget(tmp_path, capsys):
    root, md = tmp_path / "runs", tmp_path / "results.md"
    argv = ["--tasks", "Pong", "--seeds", "1", "--labels", "6", "--steps", "480", "--run-args", SMOKE,
            "--root", str(root), "--docs", str(tmp_path / "docs"), "--results-md", str(md), "--no-estimate"]
    assert ra.main(argv) == 0
    assert "estimate" not in capsys.readouterr().out
    for tag in ("6labels", "baseline"):
        run = root / f"Pong-{tag}-480-seed0"
        rows, summary = run_outputs_ok(run, 3)  # each run is experiments.atari end to end
        config = json.loads((run / "config.json").read_text())
        assert config["agent"] == "a2c" and config["iteration_steps"] == 160  # --run-args reached the run
        if tag == "6labels":  # A.2's label settings; the initial labels are capped at the budget, so
            # every label came from the untrained policy
            assert summary["agent"] == "a2c" and summary["labels"] == 6 and rows[0]["labels"] == 6
            assert (config["label_capacity"] == 3000 and config["initial_label_count"] == 500
                    and config["rate_constant"] == 5e6)
    text = md.read_text()
    assert text.startswith(ra.FIG3.section_title) and ra.FIG3.table_begin in text and "| Pong |" in text
    assert all(f"- {item}" in text for item in ra.A2_DIFFERENCES)
    assert (tmp_path / "docs" / "atari_fig3.png").stat().st_size > 10_000
    # again: both runs finished, nothing runs
    assert ra.main(argv) == 0
    assert "2 runs: 2 finished" in capsys.readouterr().out
    # the same directories with other run flags are refused, not mixed in
    assert ra.main([*argv[:9], "--iteration-steps 320", *argv[10:], "--dry-run"]) == 2
    assert "holds another run" in capsys.readouterr().err


def test_bad_run_args_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit):
        ra.FIG3.parse_args(["--run-args", "--iteration-steps '160"])
    assert "--run-args" in capsys.readouterr().err
