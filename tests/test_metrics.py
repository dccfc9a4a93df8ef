"""TensorBoardWriter: the files it writes are read back by TensorBoard's own reader."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax.metrics import TensorBoardWriter

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_round_trip_through_tensorboard_reader(tmp_path):
    logdir = tmp_path / "tb"
    with TensorBoardWriter(logdir) as w:
        for it in range(1, 4):
            w.scalars(it * 100, {
                "true_return": 1.5 * it,                 # float
                "labels": it * 10,                       # int
                "val_accuracy": np.float32(0.25 * it),   # NumPy scalar
                "rm_loss": jnp.asarray(2.0 / it),        # 0-d JAX array
                "ppo": {"entropy": 0.5},                 # nested -> "ppo/entropy"
                "reward_correlation": float("nan"),      # skipped: not finite
                "eval_return": None,                     # skipped
                "env": "CartPole-v1",                    # skipped
                "done": True,                            # skipped: a flag, not a measurement
                "hist": np.ones(3),                      # skipped: not a scalar
            })
    assert list(logdir.glob("events.out.tfevents.*"))
    got = read_scalars(logdir)
    assert set(got) == {"true_return", "labels", "val_accuracy", "rm_loss", "ppo/entropy"}
    assert got["true_return"] == [(100, 1.5), (200, 3.0), (300, 4.5)]
    assert got["labels"] == [(100, 10.0), (200, 20.0), (300, 30.0)]
    assert [s for s, _ in got["rm_loss"]] == [100, 200, 300]
    np.testing.assert_allclose([v for _, v in got["rm_loss"]], [2.0, 1.0, 2.0 / 3], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in got["val_accuracy"]], [0.25, 0.5, 0.75])
    assert got["ppo/entropy"] == [(100, 0.5), (200, 0.5), (300, 0.5)]


def test_resume_appends_to_the_same_logdir(tmp_path):
    logdir = tmp_path / "tb"
    w = TensorBoardWriter(logdir)
    for step in (1, 2, 3, 4):
        w.scalars(step, {"loss": float(step)})
    w.close()
    # the run crashed after step 4 and resumes from a checkpoint taken at step 2
    w = TensorBoardWriter(logdir, purge_step=3)
    for step in (3, 4, 5):
        w.scalars(step, {"loss": 10.0 * step})
    w.close()
    files = sorted(logdir.glob("events.out.tfevents.*"))  # TensorBoard reads them in name order
    assert len(files) == 2 and files[0].stat().st_mtime_ns <= files[1].stat().st_mtime_ns
    assert read_scalars(logdir)["loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_a_true_reward_run_plots_without_an_empty_legend(tmp_path):
    """A run on the true reward has no reward-model curves: its plot says so instead of asking
    matplotlib for a legend of nothing (which warns)."""
    import warnings

    from rlhp_jax.metrics import plot_learning_curve

    rows = [dict(iteration=i, env_steps=1000 * i, true_return=float(i), predicted_return=float(i), labels=0,
                 episode_return=float(i)) for i in (1, 2, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_learning_curve(rows, tmp_path / "curve.png", title="baseline")
    assert path.stat().st_size > 0


def test_a_true_reward_sweep_plots_no_empty_correlation_panel(tmp_path):
    """A sweep on the true reward has no r̂: its figure leaves the corr(r̂, true) panel out
    rather than drawing an empty one; with r̂ the panel is there."""
    import matplotlib.image

    from rlhp_jax.metrics import plot_sweep

    steps = np.array([1000, 2000, 3000])
    curves = dict(eval_return=np.ones((2, 3)), true_return=np.ones((2, 3)))
    nan = np.full((2, 3), np.nan)
    widths = []
    for corr in (nan, np.zeros((2, 3))):
        path = plot_sweep({"a": dict(curves, reward_correlation=corr)}, steps, tmp_path / f"{len(widths)}.png")
        widths.append(matplotlib.image.imread(path).shape[1])
    assert widths == [2 * 550, 3 * 550]  # 5 inches a panel at 110 dpi


OPTIONAL_IMPORTS_CHECK = r"""
import sys
from rlhp_jax.metrics import TensorBoardWriter

with TensorBoardWriter(sys.argv[1]) as writer:
    writer.scalars(1, {"a": 1.0})
print("torch" in sys.modules, type(sys.modules["boto3"]).__name__)
import torch, boto3  # both importable afterwards: torch as usual, boto3 through its placeholder
print(torch.MARK, boto3.MARK)
"""


def test_tensorboard_writer_imports_neither_torch_nor_boto3(tmp_path):
    """tensorboardX imports PyTorch (for a type annotation) and boto3 (for s3:// directories)
    when they are installed: over a second of every run's start.  Stand-ins for both on the path
    show the writer imports neither, and that both import normally afterwards."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    for name in ("torch", "boto3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MARK = 'stand-in {name}'\nclass Tensor: pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    out = subprocess.run([sys.executable, "-c", OPTIONAL_IMPORTS_CHECK, str(tmp_path / "tb")], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["False Deferred", "stand-in torch stand-in boto3"], out.stdout
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_a_run_s_outputs_replace_a_planted_symlink_never_write_through_it(tmp_path):
    """A run directory someone else made may hold symlinks where a run writes its outputs
    (``metrics.jsonl``, ``metrics.csv``, ``learning_curve.png``, a sweep's ``curves.png``): a
    ``--resume`` of it, or a sweep started again there, replaces each link by a file of the run
    and leaves the file it pointed at as it was (it used to write the CSV and the plot through
    the links, and truncate a fresh metrics.jsonl's target)."""
    from rlhp_jax.metrics import MetricsWriter, plot_learning_curve, plot_sweep

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    names = ("metrics.jsonl", "metrics.csv", "learning_curve.png", "curves.png")
    for name in names:
        (elsewhere / name).write_text(f"someone's {name}")
        (run / name).symlink_to(elsewhere / name)
    rows = [dict(iteration=i, env_steps=1000 * i, true_return=float(i), labels=0) for i in (1, 2)]
    writer = MetricsWriter(run / "metrics.jsonl")  # a fresh start there (a sweep started again)
    for row in rows:
        writer.write(row)
    writer.close()  # writes metrics.csv
    plot_learning_curve(rows, run / "learning_curve.png")
    curves = {k: np.ones((1, 2)) for k in ("eval_return", "true_return", "reward_correlation")}
    plot_sweep({"a": curves}, np.array([1000, 2000]),
               run / "curves.png")
    for name in names:
        assert (elsewhere / name).read_text() == f"someone's {name}", name
        assert not (run / name).is_symlink() and (run / name).stat().st_size > 0, name
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run / "metrics.csv").read_text().startswith("iteration,env_steps,true_return,labels")


@pytest.mark.parametrize("name, head", [("falls.png", b"\x89PNG"), ("falls.svg", b"<?xml"), ("falls.pdf", b"%PDF"),
                                        ("falls", b"\x89PNG")])
def test_a_figure_s_bytes_are_the_format_its_name_says(tmp_path, name, head):
    """``--out falls.svg`` of a diagnostic is an SVG file, not PNG bytes under an SVG name."""
    from rlhp_jax.metrics import pyplot, save_png

    fig = pyplot().figure(figsize=(2, 2))
    fig.gca().plot([0, 1], [1, 0])
    assert save_png(fig, tmp_path / name).read_bytes()[:len(head)] == head


def test_a_metrics_writer_never_appends_through_a_link(tmp_path):
    """A link at ``metrics.jsonl`` when a writer opens it to append (one planted after the run's
    cut-back) is replaced: the file it points at, outside the run, gets no row."""
    from rlhp_jax.metrics import MetricsWriter, read_jsonl

    outside = tmp_path / "mine.jsonl"
    outside.write_text('{"mine": 1}\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(outside)
    writer = MetricsWriter(run / "metrics.jsonl", append=True)
    writer.write({"iteration": 1})
    writer.close()
    assert outside.read_text() == '{"mine": 1}\n' and not (run / "metrics.jsonl").is_symlink()
    assert read_jsonl(run / "metrics.jsonl") == [{"iteration": 1}]


def test_a_damaged_metrics_file_gives_its_readers_only_rows(tmp_path):
    """``[1, 2]`` or a 400-digit number in ``metrics.jsonl`` (a damaged or hand-edited file) ended a
    resume, the falls plot and a figure's --plot-only in a traceback: every reader meets dicts."""
    from rlhp_jax.metrics import read_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"iteration": 1}\n[1, 2]\n3\n"x"\n{"iteration": 2, "big": ' + b"9" * 5000 + b"}\n"
                     b"[[[[" * 100_000 + b"\n\xff\xfe\n" + b'{"iteration": 3}\n{"iteration": 4, "cut')
    assert read_jsonl(path) == [{"iteration": 1}, {"iteration": 3}]
