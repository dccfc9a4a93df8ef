"""experiments.profile_run: the time breakdown read from a run's metrics rows."""

from __future__ import annotations

import pytest

from experiments.profile_run import COMPILE_LOG, breakdown, programs, programs_text, table

ROWS = [  # two iterations of a host-driver run: the first compiles
    dict(iteration=1, wall_s=5.0, time_agent_s=2.0, time_fit_s=1.0, time_labels_s=0.5),
    dict(iteration=2, wall_s=6.0, time_agent_s=0.25, time_fit_s=0.5, time_labels_s=0.125, time_eval_s=0.05),
    dict(iteration=3, wall_s=7.0, time_agent_s=0.75, time_fit_s=0.5, time_labels_s=0.125),
]


def test_breakdown_totals_startup_and_rest():
    b = breakdown(ROWS, process_s=10.0)
    assert b["startup_s"] == pytest.approx(3.0)  # the process outlived the loop's clock by 3 s
    assert b["loop_s"] == 7.0 and b["iterations"] == 3
    c = b["components"]
    assert set(c) == {"agent", "fit", "labels", "eval"}
    assert c["agent"]["total_s"] == pytest.approx(3.0) and c["agent"]["first_s"] == 2.0
    assert c["agent"]["median_ms"] == pytest.approx(500.0)  # median of the later iterations (0.25, 0.75)
    assert c["eval"]["first_s"] == 0.0 and c["eval"]["median_ms"] == pytest.approx(50.0)
    assert b["other_s"] == pytest.approx(7.0 - (3.0 + 2.0 + 0.75 + 0.05))
    text = table(b)
    assert text.index("| agent |") < text.index("| fit |") < text.index("| labels |")  # largest first
    assert "| start-up | 3.00 | 30 %" in text and "| finish (last checkpoint, summary, plots, exit) | 0.00 |" in text
    # what the process did after its last row (the plot, the exit) is its finish, not its start-up
    b = breakdown(ROWS, process_s=10.0, finish_s=1.25)
    assert b["startup_s"] == pytest.approx(1.75) and b["finish_s"] == 1.25 and b["loop_s"] == 7.0
    assert "| finish (last checkpoint, summary, plots, exit) | 1.25 | 12 %" in table(b)


def test_breakdown_refuses_a_run_without_rows():
    with pytest.raises(ValueError, match="no metrics rows"):
        breakdown([], 1.0)


LOG = """WARNING:jax._src.dispatch:Finished tracing fit for jit in 0.25 sec
WARNING:jax._src.interpreters.pxla:Compiling jit(fit) with global shapes and types (ShapedArray(float32[3,64]),).
WARNING:jax._src.dispatch:Finished jaxpr to MLIR module conversion jit(fit) in 0.5 sec
WARNING:jax._src.compiler:Persistent compilation cache hit for 'jit_fit' with key 'jit_fit-12ab'
WARNING:jax._src.dispatch:Finished XLA compilation of jit(fit) in 0.125 sec
WARNING:jax._src.dispatch:Finished tracing + transforming iteration for pjit in 0.5 sec
WARNING:jax._src.dispatch:Finished jaxpr to MLIR module conversion jit(iteration) in 0.25 sec
WARNING:jax._src.dispatch:Finished XLA compilation of jit(iteration) in 2.0 sec
a line the run printed
""".splitlines()


def test_programs_count_each_stage_and_the_cache_hits():
    p = programs(LOG)
    assert p["traced"] == dict(count=2, seconds=0.75) and p["lowered"] == dict(count=2, seconds=0.75)
    assert p["compiled"] == dict(count=2, seconds=2.125) and p["from_cache"] == 1
    assert p["costliest"] == [("iteration", 2.25), ("fit", 0.625)]
    assert "2 traced (0.75 s)" in programs_text(p) and "1 from the persistent cache" in programs_text(p)
    # what the compile log is, and what the run says (shown on the screen, not swallowed)
    assert [bool(COMPILE_LOG.search(line)) for line in LOG] == [True] * 8 + [False]


def test_a_resumed_run_is_profiled_from_the_rows_it_added():
    from experiments.profile_run import rows_added

    before = ROWS[:2] + [dict(iteration=3, wall_s=6.5)]  # iteration 3 was written, then the run was killed
    after = ROWS[:2] + [dict(iteration=3, wall_s=9.0, time_agent_s=1.0), dict(iteration=4, wall_s=10.0)]
    added, wall_before = rows_added(before, after)
    assert [r["iteration"] for r in added] == [3, 4] and wall_before == 6.0  # the resume redid iteration 3
    b = breakdown(added, process_s=5.0, wall_before=wall_before)
    assert b["loop_s"] == pytest.approx(4.0) and b["startup_s"] == pytest.approx(1.0) and b["iterations"] == 2
    assert rows_added(after, after) == ([], 10.0)  # a finished run adds nothing
    assert rows_added([], ROWS) == (ROWS, 0.0)  # a fresh run: every row, from the clock's zero


IMPORTS = """import time: self [us] | cumulative | imported package
import time:       862 |     313364 |     tensorboardX.record_writer
import time:      1802 |     622582 | tensorboardX
import time:       120 |      40000 | json
import time:      5000 |    1340000 | torch
a line the run printed
""".splitlines()


def test_imports_lists_the_slow_top_level_ones_slowest_first():
    from experiments.profile_run import imports

    # nested imports count inside their importer; under the threshold (50 ms) is left out
    assert imports(IMPORTS) == [("torch", 1.34), ("tensorboardX", 0.622582)]
    assert imports(IMPORTS, min_s=1.0) == [("torch", 1.34)]
    b = dict(breakdown(ROWS, process_s=10.0), imports=imports(IMPORTS))
    assert "(top level, any thread, with what they import): torch 1.34 s, tensorboardX 0.62 s" in table(b)
    assert "imports of" not in table(breakdown(ROWS, process_s=10.0))  # only when asked for


def test_a_run_that_fails_is_refused_in_one_line(capsys):
    """The run's own error goes to the screen; the profiler says, as every command does, that
    there is nothing to profile (``error:``, exit 2), not a SystemExit message with exit 1."""
    from experiments.profile_run import main

    assert main(["experiments.classic", "--env", "Nope"]) == 2
    err = capsys.readouterr().err
    assert "error: the run failed (exit 2); nothing to profile" in err and "Traceback" not in err


def test_same_results_refuses_an_earlier_check_s_directory_and_a_missing_digest_file(tmp_path, capsys):
    """A second check into the same --out used to end in CalledProcessError's traceback (the run
    refuses its existing directory); nothing runs now."""
    from experiments.same_results import main

    (tmp_path / "CartPole-ppo-baseline").mkdir()
    assert main(["--out", str(tmp_path), "--only", "CartPole-ppo-baseline"]) == 2
    assert main(["--out", str(tmp_path / "new"), "--check", str(tmp_path / "nowhere.json")]) == 2
    err = capsys.readouterr().err
    assert "holds the runs CartPole-ppo-baseline of an earlier check" in err and "--check" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CartPole-ppo-baseline"]
