"""Run directories: where a run's configuration, checkpoints, metrics and summary live, and how a
run starts, resumes and ends there — one home for both protocols' drivers and every tool that
reads a run (``--resume``, demo recording, ``--frozen-reward``, the labeling app, diagnostics).

A run directory holds ``config.json`` (written once, at a fresh start), ``checkpoints/`` (orbax,
:mod:`rlhp_jax.checkpoint`), ``metrics.jsonl`` (one row per iteration or stage), ``tensorboard/``,
and at the end ``summary.json`` and ``learning_curve.png``.  While a run (or a sweep) writes there, it
holds the directory alone (:func:`claimed`): a second process given the same directory is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # not a POSIX system: runs go unlocked
    fcntl = None

from rlhp_jax.config import config_from_json, config_to_json, ibarz_config_from_json
from rlhp_jax.config_fields import MAX_CONFIG_BYTES, describe, is_sweep_config
from rlhp_jax.files import remove_stale_temporaries, write_atomic
from rlhp_jax.metrics import MetricsWriter, TensorBoardWriter, read_jsonl
from rlhp_jax.refusal import check_out_directory


def read_run_config(run_dir: str | Path):
    """The configuration a run directory was started with (its ``config.json``): a
    :class:`RunConfig`, or an :class:`IbarzConfig` where the file says ``"protocol": "ibarz"``,
    with ``out`` set to ``run_dir`` (what ``--resume``, demo recording and ``--frozen-reward`` read).

    The file must be what a run wrote: UTF-8 JSON holding every field of the config with a value
    of the field's type (``rlhp_jax.config_fields``).  Anything else — a damaged, truncated or
    hand-edited file, one from another version — is a one-line ``ValueError``."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{run_dir}: no config.json there (is it a run directory?)")
    not_runnable = lambda e: ValueError(f"{path} is not a configuration this version can run ({e})")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise not_runnable(f"{path.stat().st_size:,} bytes: a run's config.json is a few kB")
    try:
        saved = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise not_runnable(e) from None
    if is_sweep_config(saved):
        raise ValueError(f"{run_dir} is a sweep's directory (python -m experiments.sweep), not a run's: a sweep is "
                         "not resumed or read as a run; run it again with another --out")
    try:
        protocol = saved.get("protocol", "christiano") if isinstance(saved, dict) else None
        if protocol == "ibarz":
            cfg = ibarz_config_from_json(saved)
        elif protocol in ("christiano", None):
            cfg = config_from_json(saved)
        else:
            raise ValueError(f"unknown protocol {describe(protocol)} (this version runs 'ibarz' and Christiano "
                             "et al.'s, which names none)")
    except (ValueError, RecursionError) as e:
        raise not_runnable(e) from None
    return dataclasses.replace(cfg, out=str(run_dir))


@contextlib.contextmanager
def claimed(out, flag: str = "--out", holder: str = "a run, a --resume of it or a sweep") -> Iterator[Path]:
    """``out`` as this process's run directory while the block runs: refused where it cannot be a
    directory (:func:`check_out_directory`), made, and locked against every other process (an
    exclusive ``flock`` on the directory itself, so no lock file is left behind, and the kernel drops
    it when the process ends, however it ends, SIGKILL included).  Another run, a ``--resume`` or a
    sweep given the same directory meanwhile is refused in one line instead of writing into it: two
    writers would interleave one run's checkpoints, metrics and label store with the other's.  A
    process may claim a directory it holds already (a command claims it before opening the labeling
    page there, then its driver does).  Taking the directory removes the temporary files that writes
    killed before their rename left in it (:func:`rlhp_jax.files.remove_stale_temporaries`).  A file
    system that cannot lock (some network mounts) leaves the run unlocked, as before."""
    check_out_directory(out, flag)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(out)
    with _claims_lock:
        if key in _claims:  # this process holds it already (the command around the driver): nested, not refused
            _claims[key][1] += 1
            taken = False
        else:
            try:
                fd = _flock(out)
            except _Held:
                other = "" if flag == "--resume" else f", or choose another {flag}"
                raise ValueError(f"{out} is in use by another process ({holder} is writing there now): wait for "
                                 f"it to end{other}.") from None
            _claims[key] = [fd, 1]
            taken = True
    try:
        if taken:
            remove_stale_temporaries(out)  # what writes killed before their rename left (files.py)
        yield out
    finally:
        with _claims_lock:
            _claims[key][1] -= 1
            if _claims[key][1] == 0:
                fd = _claims.pop(key)[0]
                if fd is not None:
                    os.close(fd)  # the lock goes with the descriptor


_claims: dict[str, list] = {}  # the directories this process holds: real path -> [descriptor, depth]
_claims_lock = threading.Lock()


def in_use(directory: str | os.PathLike) -> bool:
    """Whether another process holds ``directory`` (:func:`claimed`) right now: a run, a resume or a
    sweep is writing there.  False where it is not a directory or the file system has no locks."""
    if not Path(directory).is_dir() or os.path.realpath(directory) in _claims:  # (ours)
        return False
    try:
        fd = _flock(directory)
    except _Held:
        return True
    if fd is not None:
        os.close(fd)  # a lock just taken goes with it
    return False


class _Held(Exception):
    """Another process holds the directory's lock."""


def _flock(directory) -> int | None:
    """A descriptor of ``directory`` holding an exclusive, non-blocking ``flock`` on it, or None where
    there are no such locks (no ``fcntl``; a file system without them leaves the descriptor
    unlocked); raises :class:`_Held` where another process holds it."""
    if fcntl is None:
        return None
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise _Held from None
    return fd


# the data a run or a sweep writes at its top level (its plots are derived: drawn again from these)
RESULT_FILES = ("config.json", "metrics.jsonl", "metrics.csv", "summary.json")


def results_held(out) -> list[str]:
    """The :data:`RESULT_FILES` names ``out`` holds already: another run's or sweep's files, or
    someone's of the same name, which a fresh start there would write over."""
    return [name for name in RESULT_FILES if (Path(out) / name).exists()]


def continues_from_checkpoint(ckpt, out: Path, resume: bool, log: Callable[[str], None]) -> bool:
    """Whether a run in ``out`` (checkpoints in ``ckpt``) continues from a checkpoint (True) or
    starts from its config (False); shared by both protocols' drivers.

    * ``resume`` and a checkpoint was committed: continue from it (``ckpt.restore`` says what is
      wrong when every one is corrupt, or when the directory holds foreign steps).
    * ``resume`` of a run stopped before its first checkpoint (``ckpt.unused()``): start it again
      in the same directory from its config.json — same seed, so the same run for the synthetic
      oracle; a human teacher's label store keeps every answer and open pair — and say so.
    * a fresh start: refused where a run's checkpoints already are, or another run's or a sweep's
      files (``RESULT_FILES``): nothing is overwritten."""
    if ckpt.unused():
        if resume:
            log(f"{out} has no checkpoint yet (the run was stopped before its first one, or its checkpoints were "
                "removed): starting it again from its config.json, with the same seed")
        elif held := results_held(out):
            raise ValueError(f"{out} already holds another run's or a sweep's {' and '.join(held)}: choose another "
                             f"--out (a run stopped before its first checkpoint starts again with --resume {out}).")
        return False
    if resume:
        return True
    if ckpt.latest_step() is not None:
        raise ValueError(f"{out} already holds a run with checkpoints: continue it with --resume {out}, "
                         "or choose another --out.")
    raise ValueError(f"{ckpt.directory} holds step directories that this run did not write: choose another --out.")


def finished_line(out: Path, where: str) -> str:
    """What a driver logs when ``--resume`` restores ``out`` at its last checkpoint (killed after it,
    or resumed again): ``where`` names that checkpoint in the driver's own units."""
    return f"{out} had finished ({where}): nothing left to train; writing its summary and plots again"


def _number_of(row: dict, key: str) -> int | None:
    """``row[key]`` where it is a whole number (a damaged or hand-edited row's text or float is not)."""
    v = row.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class MissingRows(ValueError):
    """``metrics.jsonl`` lacks rows its run's checkpoint covers: a resume cannot make them again."""


def covered_rows(path: Path, key: str, last: int) -> list[dict]:
    """The rows of ``metrics.jsonl`` at ``path`` that a checkpoint taken after row ``last`` covers:
    rows whose ``key`` (``iteration``, or Ibarz's ``stage``) is 1 … ``last``, each exactly once, in
    order (rows after ``last``, a killed attempt's, are dropped).  Where any of those is missing (a file
    cut short, deleted or edited by hand) :class:`MissingRows` says which: continuing would leave a gap
    that the run's curve, its summary and every table read as if it were whole."""
    rows = [r for r in read_jsonl(path) if (n := _number_of(r, key)) is not None and 1 <= n <= last] \
        if path.exists() else []
    seen = [r[key] for r in rows]
    if seen != list(range(1, last + 1)):
        missing = sorted(set(range(1, last + 1)) - set(seen))
        what = (f"lacks {len(missing)} of them ({_spans(missing)})" if missing else
                "holds some of them twice or out of order")
        raise MissingRows(f"{path} {what} but the run's checkpoint covers {key}s 1–{last}: a resume cannot compute "
                          "them again. Restore the file, or move the directory aside and start the run again.")
    return rows


def _spans(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1–3, 7``."""
    spans, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            spans.append(f"{start}" if start == n else f"{start}–{n}")
            start = None
    return ", ".join(spans)


def whole_run_problem(directory: str | os.PathLike) -> str | None:
    """Why the metrics of a finished run (one with ``summary.json``) do not cover the run it says it
    finished, or None where they do: every row of its ``iteration`` (Ibarz's ``stage``) from 1 to
    the last once, in order, the last at the summary's ``env_steps``.  A ``metrics.jsonl`` cut short,
    deleted or edited by hand afterwards is otherwise read as the whole run (a table's final return
    from its first iterations, a seed silently missing from a mean)."""
    directory = Path(directory)
    path = directory / "metrics.jsonl"
    if not path.is_file():
        return f"{path} is missing"
    rows = read_jsonl(path)
    key = "stage" if rows and "stage" in rows[0] else "iteration"
    numbers = [_number_of(r, key) for r in rows]
    if not rows or numbers != list(range(1, len(rows) + 1)):
        return f"{path}'s rows are not {key}s 1, 2, … once each, in order"
    try:
        summary = json.loads((directory / "summary.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return f"{directory / 'summary.json'} is not the JSON a run writes"
    want = summary.get("env_steps") if isinstance(summary, dict) else None
    if rows[-1].get("env_steps") != want:
        return (f"{path} ends at {key} {len(rows)}, env_steps {rows[-1].get('env_steps')}, but the run's summary.json "
                f"says it finished at env_steps {want}")
    return None


def open_run(out: Path, cfg, *, restoring: bool, resume: bool, covered: tuple[str, int],
             purge_step: int) -> tuple[MetricsWriter, TensorBoardWriter]:
    """Make ``out`` ready for the run and open its metrics writers.

    Continuing from a checkpoint (``restoring``), ``metrics.jsonl`` is cut back to the rows the
    checkpoint covers (``covered`` = (key, last): :func:`covered_rows`, which refuses a file that lacks
    any of them) and new rows are appended; otherwise the directory is created and, on a fresh start
    (not ``resume``), ``config.json`` written (a resume keeps the one it was started from).
    TensorBoard hides every event at or after ``purge_step`` (the first step this attempt logs) that
    a killed attempt left, so no row shows twice."""
    out = Path(out)
    if restoring:
        path = out / "metrics.jsonl"
        rows = covered_rows(path, *covered)
        # whole or not at all: a kill here must not cut the rows the checkpoint covers
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    else:
        out.mkdir(parents=True, exist_ok=True)
        if not resume:
            write_atomic(out / "config.json", json.dumps(config_to_json(cfg), indent=2))
    return MetricsWriter(out / "metrics.jsonl", append=restoring), TensorBoardWriter(out / "tensorboard",
                                                                                      purge_step=purge_step)


def write_summary(out: Path, summary: dict) -> None:
    """``summary.json``: what the run ended with (its presence marks the run finished, so it is the
    run's last file: the learning curve is drawn before it)."""
    write_atomic(Path(out) / "summary.json", json.dumps(summary, indent=2))
