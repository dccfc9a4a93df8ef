"""rlhp_jax.files: a file is written whole or not at all; a run's files stay whole across a kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlhp_jax import runs
from rlhp_jax.files import remove_stale_temporaries, write_atomic

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("content, expected", [(b"\x00bytes\xff", b"\x00bytes\xff"), ("text é", "text é".encode()),
                                               (lambda f: f.write(b"by a writer"), b"by a writer")],
                         ids=["bytes", "text", "writer"])
@pytest.mark.parametrize("durable", [True, False])
def test_the_new_content_replaces_the_old_and_nothing_else_is_left(tmp_path, content, expected, durable):
    path = tmp_path / "f.json"
    path.write_bytes(b"old")
    assert write_atomic(path, content, durable=durable) == path
    assert path.read_bytes() == expected
    assert os.listdir(tmp_path) == ["f.json"]



@pytest.mark.parametrize("there", ["file", "symlink", "dangling_symlink", "directory"])
def test_a_new_file_is_never_placed_over_one_that_appeared_meanwhile(tmp_path, there):
    """``replace=False`` (a data file a command checked was new when it started, perhaps an hour of
    play ago): whatever appeared at the name meanwhile (another session's demos, a link) is left
    as it was, FileExistsError is raised and no temporary file is left; an absent name is written."""
    path, other = tmp_path / "demos.npz", tmp_path / "other.npz"
    other.write_bytes(b"someone's")
    if there == "file":
        path.write_bytes(b"appeared meanwhile")
    elif there == "directory":
        path.mkdir()
    else:
        path.symlink_to(other if there == "symlink" else tmp_path / "nowhere")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FileExistsError):
        write_atomic(path, b"new", replace=False)
    assert sorted(os.listdir(tmp_path)) == before and other.read_bytes() == b"someone's"
    assert there != "file" or path.read_bytes() == b"appeared meanwhile"
    assert write_atomic(tmp_path / "new.npz", b"new", replace=False).read_bytes() == b"new"

def test_a_writer_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("row 1\nrow 2\n")

    def half(f):
        f.write(b"row 1\n")
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        write_atomic(path, half)
    assert path.read_text() == "row 1\nrow 2\n" and os.listdir(tmp_path) == ["metrics.jsonl"]


def test_a_kill_while_a_resume_cuts_metrics_back_loses_no_row(tmp_path):
    """A resume rewrites metrics.jsonl with the rows its checkpoint covers (``runs.open_run``).  It
    used to open the file for writing and then write the rows: a SIGKILL between the two (here: the
    child stops itself once the file is open for writing) left it empty, and the rows of every
    iteration before the checkpoint, which a resume does not compute again, were gone."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [dict(iteration=i, eval_return=float(i)) for i in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    child = textwrap.dedent(f"""
        import builtins, io, os, signal, sys
        from pathlib import Path
        from rlhp_jax import runs

        opened = builtins.open
        def open_then_die(file, mode="r", *args, **kwargs):
            f = opened(file, mode, *args, **kwargs)
            if "w" in mode and Path(file).name.startswith((".metrics.jsonl", "metrics.jsonl")):
                os.kill(os.getpid(), signal.SIGKILL)  # killed with the file open for writing, nothing written
            return f
        builtins.open = open_then_die
        io.open = open_then_die
        runs.open_run(Path({str(run)!r}), None, restoring=True, resume=True,
                      covered=("iteration", 3), purge_step=4)
    """)
    proc = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    kept = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert kept == rows  # all five: the cut had not happened yet, and nothing was lost
    left = [p.name for p in run.iterdir() if p.name.startswith(".metrics.jsonl.")]
    assert len(left) == 1  # the killed write's temporary file, which nobody could remove
    with runs.claimed(run):  # the next run, resume or sweep to take the directory removes it
        assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
    # the same call, not killed, keeps exactly the rows the checkpoint covers
    writer, board = runs.open_run(run, None, restoring=True, resume=True, covered=("iteration", 3),
                                  purge_step=4)
    writer.close()
    board.close()
    assert [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] == rows[:3]


def test_only_a_dead_process_s_temporary_files_are_removed(tmp_path):
    """A live writer's temporary file (this process's, a running child's) is its own to rename;
    a dead one's is litter; a user's dot-file that merely looks alike is kept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "clips").mkdir()
        names = {f".config.json.{dead.pid}.0a1b2c3d.tmp": False, f"clips/.1-left.mp4.{dead.pid}.deadbeef.tmp.mp4": False,
                 f".summary.json.{os.getpid()}.0a1b2c3d.tmp": True, f".summary.json.{live.pid}.0a1b2c3d.tmp": True,
                 f".notes.{dead.pid}.tmp": True, "config.json": True, ".config.json.0.0a1b2c3d.tmp": False}
        for name in names:
            (tmp_path / name).write_text("x")
        removed = remove_stale_temporaries(tmp_path)
        assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == sorted(n for n, k in names.items() if not k)
        assert all((tmp_path / name).exists() == kept for name, kept in names.items())
    finally:
        live.kill()
        live.wait()


def test_a_temporary_file_that_cannot_be_removed_neither_fails_the_run_nor_keeps_its_directory(tmp_path, monkeypatch):
    """The clean-up is best effort: a dead writer's file this user may not remove (another user's, a
    read-only folder) is left, the run goes on, and the directory is free again when it ends.
    Nothing deeper than a run's own writes is walked (a mistaken ``--out ~`` stays quick)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    (run / "checkpoints" / "3" / "agent" / "deep").mkdir(parents=True)
    stuck = run / f".config.json.{dead.pid}.0a1b2c3d.tmp"
    deep = run / "checkpoints" / "3" / "agent" / "deep" / stuck.name
    for p in (stuck, deep, run / "checkpoints" / "3" / stuck.name):
        p.write_text("x")
    real_unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied"))
                        if self == stuck else real_unlink(self, *a, **k))
    with runs.claimed(run):
        assert stuck.exists() and deep.exists() and not (run / "checkpoints" / "3" / stuck.name).exists()
    assert not runs.in_use(run) and str(os.path.realpath(run)) not in runs._claims
    with runs.claimed(run):  # claimed again at once: the first claim's lock went with its block
        pass


def test_the_clip_encoder_s_temporary_file_is_one_the_clean_up_recognises(tmp_path, monkeypatch):
    """ffmpeg writes a clip's temporary file itself; its name must carry the process id too, or a
    clip encoder killed mid-write would leave litter no run removes."""
    from rlhp_jax.render import video

    renamed, replace = [], os.replace
    monkeypatch.setattr(video.os, "replace", lambda src, dst: (renamed.append(Path(src)), replace(src, dst))[1])
    video.encode_mp4(np.zeros((2, 8, 8), np.uint8), tmp_path / "a.mp4", 10)
    [tmp] = renamed
    assert tmp.parent == tmp_path and tmp.name.startswith(f".a.mp4.{os.getpid()}.") and tmp.suffix == ".mp4"
    stale = tmp.with_name(tmp.name.replace(f".{os.getpid()}.", ".0."))  # the same name, a writer that is gone
    stale.write_text("x")
    assert remove_stale_temporaries(tmp_path) == [stale] and os.listdir(tmp_path) == ["a.mp4"]


def test_a_run_s_folders_and_label_store_are_never_reached_through_a_link(tmp_path):
    """A run directory from someone else may hold ``checkpoints -> ../your-run/checkpoints`` (a
    resume there pruned your run's steps and wrote its own), ``tensorboard -> elsewhere`` or
    ``labels.sqlite -> a database of yours`` (``human stats`` turned it into a label store): each is
    refused, and nothing is written where the link points."""
    from rlhp_jax.checkpoint import Checkpointer
    from rlhp_jax.files import ForeignLink
    from rlhp_jax.human.store import LabelStore, StoreUnavailable
    from rlhp_jax.metrics import TensorBoardWriter

    victim = tmp_path / "victim"
    Checkpointer(victim / "checkpoints", keep=3).save(1, {"x": np.zeros(3, np.float32)}, {"step": 1})
    (victim / "tb").mkdir()
    (victim / "mine.sqlite").write_bytes(b"")
    before = snapshot_tree(victim)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for name, target in (("checkpoints", victim / "checkpoints"), ("tensorboard", victim / "tb"),
                         ("labels.sqlite", victim / "mine.sqlite")):
        (foreign / name).symlink_to(target)
    with pytest.raises(ForeignLink, match="checkpoints is a symbolic link"):
        Checkpointer(foreign / "checkpoints", keep=1)
    with pytest.raises(ForeignLink, match="tensorboard is a symbolic link"):
        TensorBoardWriter(foreign / "tensorboard")
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        LabelStore(foreign)
    (foreign / "labels.sqlite").unlink()
    (foreign / "labels.sqlite-wal").symlink_to(victim / "mine.sqlite")  # SQLite would write its journal there
    with pytest.raises(StoreUnavailable, match="labels.sqlite-wal is a symbolic link"):
        LabelStore(foreign)
    assert snapshot_tree(victim) == before


def snapshot_tree(root: Path):
    return sorted((p.relative_to(root).as_posix(), p.read_bytes() if p.is_file() else None) for p in root.rglob("*"))


def test_a_config_json_that_is_a_fifo_or_huge_is_no_run_s(tmp_path):
    """``sweep --compare``, ``human serve`` and a grid's plan read ``config.json`` of directories
    someone else made: a FIFO there hung them, reading for ever."""
    from rlhp_jax.config_fields import MAX_CONFIG_BYTES, config_object

    os.mkfifo(tmp_path / "config.json")
    assert config_object(tmp_path) is None
    with pytest.raises(ValueError, match="no config.json"):
        runs.read_run_config(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text('{"pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    assert config_object(tmp_path) is None
    with pytest.raises(ValueError, match="a few kB"):
        runs.read_run_config(tmp_path)


@pytest.mark.parametrize("field, value", [("total_steps", 10**20), ("eval_episodes", 10**12),
                                          ("iteration_steps", 2**40), ("labels_per_rl_step", float("inf"))])
def test_a_config_asking_for_absurd_sizes_is_refused_in_one_line(tmp_path, field, value, capsys):
    """A hand-edited or received ``config.json`` asking for 10**20 steps ended a --resume in a NumPy
    traceback (an array of 173 PiB), 2**40 iteration steps in an XLA overflow."""
    from experiments import classic
    from rlhp_jax.config import RunConfig, config_to_json

    cfg = config_to_json(RunConfig.paper("CartPole-v1", 20, 0))
    cfg[field] = value
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg))
    assert classic.main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and field in err and "Traceback" not in err


def test_a_resume_keeps_the_rows_it_can_judge(tmp_path):
    """A metrics row without ``iteration`` (a damaged file) ended a resume in a KeyError; rows it
    cannot judge are dropped, a killed attempt's rows after the checkpoint cut."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n{"x": 2}\n{"iteration": "two"}\n{"iteration": 2}\n'
                                       '{"iteration": 3}\n')
    writer, board = runs.open_run(run, None, restoring=True, resume=True, covered=("iteration", 2), purge_step=3)
    writer.close()
    board.close()
    from rlhp_jax.metrics import read_jsonl

    assert read_jsonl(run / "metrics.jsonl") == [{"iteration": 1}, {"iteration": 2}]


@pytest.mark.parametrize("lines, why", [
    ([1, 2, 3], "lacks 27 of them (4–30)"),  # cut short by hand
    ([], "lacks 30 of them (1–30)"),  # deleted
    ([1, 2, 4, 5] + list(range(7, 31)), "lacks 2 of them (3, 6)"),
    (list(range(1, 31)) + [30], "holds some of them twice or out of order"),
])
def test_a_resume_refuses_metrics_that_lack_rows_its_checkpoint_covers(tmp_path, lines, why):
    """A run whose metrics.jsonl lost rows the checkpoint covers resumed on the gap: it finished with
    rows [1, 2, 3, 31, 32], and its summary, curve and every figure's table read them as a whole run
    (a grid's final return from iterations 2, 3, 31, 32).  Refused in one line, the file unchanged."""
    run = tmp_path / "run"
    run.mkdir()
    text = "".join(json.dumps(dict(iteration=i)) + "\n" for i in lines)
    if lines:
        (run / "metrics.jsonl").write_text(text)
    with pytest.raises(runs.MissingRows, match=re.escape(why) + ".*covers iterations 1–30: a resume cannot"):
        runs.open_run(run, None, restoring=True, resume=True, covered=("iteration", 30), purge_step=31)
    assert sorted(p.name for p in run.iterdir()) == (["metrics.jsonl"] if lines else [])
    if lines:
        assert (run / "metrics.jsonl").read_text() == text


