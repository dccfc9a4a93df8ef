"""Labeled sets in and out of a label store, as JSONL (one pair per line).

A line::

    {"id": "q…", "env": "CartPole-v1", "created": 1.7e9, "wanted": 1, "withdrawn": null,
     "left_clip": "clips/q…-left.mp4", "right_clip": "clips/q…-right.mp4",   # relative to the JSONL file
     "info": {"env_steps": 4096, "true_returns": [12.0, 7.5], …},
     "segments": "<base64 of an .npz with obs, action, true_reward, render [2, T, …]>" | null,
     "labels": [{"labeler": "ann", "choice": "left", "mu": 1.0, "created": …, "offered": …, "response_s": 2.4}]}

The segment arrays travel inside the file, so an exported set trains another reward model
anywhere (``load_labeled``); clips are files in the file's folder.  An export copies every clip
that lies outside that folder into ``<name>_clips/`` beside the file, so the folder holds the
whole set and can be moved or sent as one.

Importing (``import_jsonl``; or ``read_pairs`` then ``import_pairs``, to check a file before a
store is even opened) is

* safe: a clip path is relative to the file and must resolve (symlinks followed) inside the
  file's folder, into a ``clips/`` or ``NAME_clips/`` folder there, to a regular ``.mp4`` file
  that starts like an MP4 video (an ISO-BMFF ``ftyp`` box of a video brand).  An absolute path, a
  ``..`` or a symlink out of the folder, any other file beside the JSONL (a set saved into a
  Downloads folder must not have its photos served, or sent back by the next export), a
  directory, a FIFO, a device or a file that is not video is refused.  Segments are read within a
  memory budget (``teacher.read_segments``): a compression bomb is refused before it expands.
  A pair whose id the store holds already must be that pair (the same segments and clips), or its
  answers would be taken for answers about another pair.
* checked, line by line, before anything is written: UTF-8, one JSON object per line, every
  field of its type (``_PAIR_FIELDS``, ``_INFO_FIELDS``, ``_LABEL_FIELDS``), ids unique in the
  file, segments a readable ``.npz`` of a pair (``teacher.check_pair``); and, into a training run
  (a directory with the trainer's ``config.json``, whose ``labels.sqlite`` it learns from), every
  pair with segments and naming the run's task.  The first problem raises :class:`LabeledSetError`
  (a ValueError), one line naming the file, the line, the field and what it must be.
* all or nothing: then the clips outside the store and the segments are written (each under a
  temporary name, renamed into place, never over an existing file) and every pair and answer is
  inserted in one transaction (``LabelStore.transaction``).  If that fails, the files written are
  removed again and the store is as it was.

Importing is idempotent: a pair or an answer already in the store is skipped.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import filecmp
import io
import json
import math
import os
import secrets
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import numpy as np

from rlhp_jax.config_fields import config_object, is_sweep_config
from rlhp_jax.files import own_folder, refuse_link, write_atomic
from rlhp_jax.human.store import (CHOICES, MU, LabelStore, StoreError, UnknownQuery, check_labeler,
                                  check_query_id)
from rlhp_jax.human.teacher import TRAIN_KEYS, check_pair, read_segments

MAX_WANTED = 1_000_000  # answers wanted per pair (0: every labeler)


class LabeledSetError(ValueError):
    """A labeled-set file that cannot be read or imported; one line naming the file (and the line)."""


# ------------------------------------------------------------------ export
def pair_lines(store: LabelStore, base: str | os.PathLike, labeled_only: bool = False, embed_segments: bool = True):
    """The store's pairs as JSONL records (clip paths relative to ``base``), oldest first."""
    base = Path(base).resolve()
    for q in store.all_queries():
        labels = store.labels_for(q["id"])
        if labeled_only and not labels:
            continue
        info = json.loads(q["info"])
        segments = None
        if embed_segments and q["segments"]:
            segments = base64.b64encode(store.resolve(q["segments"]).read_bytes()).decode("ascii")
        yield dict(
            id=q["id"], env=info.get("env"), created=q["created"], wanted=q["wanted"], withdrawn=q["withdrawn"],
            left_clip=os.path.relpath(store.resolve(q["left_clip"]), base),
            right_clip=os.path.relpath(store.resolve(q["right_clip"]), base),
            info=info, segments=segments,
            labels=[dict(labeler=lab.labeler, choice=lab.choice, mu=lab.mu, created=lab.created,
                         offered=lab.offered, response_s=lab.response_s) for lab in labels])


def export_jsonl(store: LabelStore, path: str | os.PathLike, labeled_only: bool = False,
                 embed_segments: bool = True, overwrite: bool = True) -> int:
    """Write every pair of ``store`` (or only answered ones) to ``path``; returns the line count.
    Clips outside ``path``'s folder are copied into ``<stem>_clips/`` beside it.  ``overwrite=False``:
    a file at ``path`` by the time it is written (another export's, since ``path`` was checked) is
    left as it was (``FileExistsError``), and so is a clip copy already there unless it holds the
    same bytes (an earlier export of the same pair).  An export that fails leaves no clip copy it
    made (nor the folder, where it made it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent.resolve()
    clips = folder / f"{path.stem}_clips"
    made_folder = not os.path.lexists(clips)
    made: list[Path] = []
    n = 0

    def write(f: IO[bytes]) -> None:
        nonlocal n
        for line in pair_lines(store, folder, labeled_only, embed_segments):
            for side in ("left", "right"):
                line[f"{side}_clip"] = _in_folder(folder, line[f"{side}_clip"], clips / f"{line['id']}-{side}.mp4",
                                                  overwrite, made)
            f.write((json.dumps(line) + "\n").encode("utf-8"))
            n += 1

    try:
        write_atomic(path, write, replace=overwrite)
    except BaseException:
        for copy in made:
            copy.unlink(missing_ok=True)
        if made_folder:
            with contextlib.suppress(OSError):  # (not empty: someone else's files arrived; kept)
                clips.rmdir()
        raise
    return n


def _in_folder(folder: Path, rel: str, copy: Path, replace: bool, made: list[Path]) -> str:
    """A clip path for an export in ``folder``: ``rel`` if the clip lies in it, else the path of
    the clip copied to ``copy`` (appended to ``made`` where this export placed it).  A different
    file already at ``copy`` is replaced only when ``replace``."""
    src = (folder / rel).resolve()
    if src.is_relative_to(folder):
        return rel
    own_folder(copy.parent)
    new = not os.path.lexists(copy)
    with open(src, "rb") as f:
        try:
            write_atomic(copy, lambda out: shutil.copyfileobj(f, out, 1 << 20), replace=replace)
            if new:  # (one it replaced, --overwrite's, is not removed if the export fails)
                made.append(copy)
        except FileExistsError:
            if not _same_bytes(src, copy):
                raise FileExistsError(f"{copy} already holds another clip (another export's?): "
                                      "choose another --out, or --overwrite to replace it") from None
    return copy.relative_to(folder).as_posix()


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether ``b`` is a regular file (not a link) holding ``a``'s bytes."""
    return not b.is_symlink() and b.is_file() and filecmp.cmp(a, b, shallow=False)


# ------------------------------------------------------------------ reading and checking
class _Bad(Exception):
    """What is wrong with one line (turned into a :class:`LabeledSetError` naming the line)."""

    def __init__(self, field: str | None, problem: str):
        super().__init__(f"{field}: {problem}" if field else problem)


def _show(value: Any, limit: int = 40) -> str:
    """A value as it looks in the file, on one short line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _number(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def _or_null(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_WANTED


def _pair_id(v: Any) -> bool:
    return isinstance(v, str) and bool(check_query_id(v))  # check_query_id says what is wrong


def _labeler(v: Any) -> bool:
    return isinstance(v, str) and bool(check_labeler(v))  # check_labeler says what is wrong


def _two_numbers(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(map(_number, v))


# name: (test, what it must be, required).  A test may raise StoreError/ValueError saying what is wrong.
_PAIR_FIELDS = {
    "id": (_pair_id, "a pair id", True),
    "left_clip": (_text, "a path relative to the JSONL file", True),
    "right_clip": (_text, "a path relative to the JSONL file", True),
    "env": (_or_null(_text), "a task name or null", False),
    "created": (_or_null(_number), "a finite number (seconds since 1970) or null", False),
    "wanted": (_or_null(_count), f"a whole number of answers from 0 (every labeler) to {MAX_WANTED}, or null", False),
    "withdrawn": (_or_null(_number), "a finite number (when it was withdrawn) or null", False),
    "info": (_or_null(lambda v: isinstance(v, dict)), "an object or null", False),
    "segments": (_or_null(_text), "base64 of an .npz of the pair's arrays, or null", False),
    "labels": (_or_null(lambda v: isinstance(v, list)), "a list of answers or null", False),
}
_INFO_FIELDS = {  # the keys of ``info`` that code reads; any others are kept as they are
    "env": (_or_null(_text), "a task name or null", False),
    "env_steps": (_number, "a finite number of environment steps", False),
    "true_returns": (_or_null(_two_numbers), "two finite numbers [left, right] or null", False),
}
_LABEL_FIELDS = {
    "labeler": (_labeler, "a labeler name", True),
    "choice": (lambda v: isinstance(v, str) and v in CHOICES, f"one of {', '.join(CHOICES)}", True),
    "created": (_or_null(_number), "a finite number (seconds since 1970) or null", False),
    "offered": (_or_null(_number), "a finite number (seconds since 1970) or null", False),
    "response_s": (_or_null(_number), "a finite number of seconds or null", False),
}


def _check_fields(obj: dict, fields: dict, prefix: str = "") -> None:
    for name, (test, what, required) in fields.items():
        where = prefix + name
        if name not in obj:
            if required:
                raise _Bad(where, f"missing (must be {what})")
            continue
        value = obj[name]
        try:
            problem = None if test(value) else f"must be {what}"
        except (StoreError, ValueError) as e:
            problem = str(e)
        if problem:
            raise _Bad(where, f"{problem}, got {_show(value)}")


def _check_record(d: Any) -> None:
    if not isinstance(d, dict):
        raise _Bad(None, f"must be a JSON object (one pair), got {_show(d)}")
    _check_fields(d, _PAIR_FIELDS)
    _check_fields(d.get("info") or {}, _INFO_FIELDS, "info.")
    for j, lab in enumerate(d.get("labels") or []):
        if not isinstance(lab, dict):
            raise _Bad(f"labels[{j}]", f"must be an answer object, got {_show(lab)}")
        _check_fields(lab, _LABEL_FIELDS, f"labels[{j}].")


def _parse(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(None, f"not UTF-8 text (byte {e.start + 1} of the line)") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _Bad(None, f"not JSON ({e.msg}: column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits; nesting too deep
        raise _Bad(None, f"not JSON this reader accepts ({type(e).__name__}: {' '.join(str(e).split())[:80]})") \
            from None


@contextlib.contextmanager
def _at(path: Path, line: int):
    """Name the file and ``line`` in what a check inside raises."""
    try:
        yield
    except _Bad as e:
        raise LabeledSetError(f"{path}, line {line}: {e}") from None


def _records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-blank line of ``path``, every field checked."""
    path = Path(path)
    if not path.is_file():
        raise LabeledSetError(f"{path}: no such file")
    first: dict[str, int] = {}
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            with _at(path, i):
                d = _parse(raw)
                if d is None:
                    continue
                _check_record(d)
                if d["id"] in first:
                    raise _Bad("id", f"{_show(d['id'])} is on line {first[d['id']]} already")
            first[d["id"]] = i
            yield i, d


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Lines of a labeled-set file, checked: a clear error names the first bad line."""
    return [d for _, d in _records(path)]


def _segments(text: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """A line's ``segments``: the ``.npz`` bytes and their arrays, checked (``check_pair``)."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _Bad("segments", f"must be base64 of an .npz or null, got {_show(text)}") from None
    try:
        arrays = read_segments(io.BytesIO(data))
        check_pair(arrays)
    except ValueError as e:
        raise _Bad("segments", f"not the arrays of a pair: {e}") from None
    return data, arrays


# ------------------------------------------------------------------ import
@dataclasses.dataclass(frozen=True)
class CheckedPair:
    """One line of a labeled set, checked and ready to write."""

    line: int
    id: str
    clips: tuple[Path, Path]  # resolved files inside the set's folder
    segments: bytes | None  # a checked .npz
    info: dict[str, Any]
    wanted: int
    created: float | None
    withdrawn: float | None
    labels: tuple[tuple[str, str, float | None, float | None, float | None], ...]  # add_label's arguments


@dataclasses.dataclass(frozen=True)
class CheckedSet:
    path: Path
    pairs: list[CheckedPair]


def is_training_run(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a training run (the trainer's ``config.json``; a sweep's is not
    one).  A ``config.json`` that cannot be read counts: what reads the run then says what is wrong."""
    return (Path(directory) / "config.json").is_file() and not is_sweep_config(config_object(directory))


def _run_task(run: Path) -> str | None:
    config = config_object(run)
    if config is None:
        raise LabeledSetError(f"{run / 'config.json'}: not a run's configuration (no readable JSON object)")
    env = config.get("env")
    return env if isinstance(env, str) else None


def read_pairs(path: str | os.PathLike, training_run: str | os.PathLike | None = None) -> CheckedSet:
    """Read and check every line of ``path`` (see the module docstring) and its clips; nothing is
    written.  ``training_run``: the run directory the pairs are for, if they are for a trainer."""
    path = Path(path)
    folder = path.parent.resolve()
    task = _run_task(Path(training_run)) if training_run is not None else None
    pairs = []
    for i, d in list(_records(path)):  # every line's fields first, then each pair's segments and clips
        with _at(path, i):
            pairs.append(_checked_pair(i, d, folder, training_run is not None, task))
    return CheckedSet(path, pairs)


def _checked_pair(line: int, d: dict, folder: Path, training: bool, task: str | None) -> CheckedPair:
    info = dict(d.get("info") or {})
    if d.get("env"):
        info.setdefault("env", d["env"])
    if task is not None and info.get("env") != task:
        raise _Bad("env", f"this run learns {task}, the pair is from {_show(info['env'])}" if info.get("env") else
                   f"null, but a training run learns only from pairs of its own task ({task}): name the pair's")
    segments = None
    if d.get("segments") is not None:
        segments, _ = _segments(d["segments"])
    elif training:
        raise _Bad("segments", "null (a display-only pair), but a training run learns from every pair it holds: "
                               "import it into a store of its own (label --queue)")
    clips = tuple(_clip_source(folder, d[k], k) for k in ("left_clip", "right_clip"))
    num = lambda v: None if v is None else float(v)
    labels = tuple((lab["labeler"], lab["choice"], num(lab.get("created")), num(lab.get("offered")),
                    num(lab.get("response_s"))) for lab in d.get("labels") or [])
    wanted = d.get("wanted")
    return CheckedPair(line, d["id"], clips, segments, info, 1 if wanted is None else wanted, num(d.get("created")),
                       num(d.get("withdrawn")), labels)


def _clip_source(folder: Path, rel: str, field: str) -> Path:
    """The file a clip path names, resolved, if it is an MP4 file inside ``folder``; else :class:`_Bad`."""
    if not rel or "\x00" in rel or os.path.isabs(rel):
        raise _Bad(field, f"must be a path relative to the JSONL file, got {_show(rel)}")
    try:
        src = (folder / rel).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise _Bad(field, f"{_show(rel)} cannot be resolved ({e})") from None
    if not src.is_relative_to(folder):
        raise _Bad(field, f"{_show(rel)} leads out of the JSONL file's folder (clips must lie in it)")
    # a set's clips lie in its clips folder (``clips/``, or ``NAME_clips/`` beside an export): a line
    # naming any other file in the folder it was saved to (a Downloads folder of photos, videos and
    # documents) would have the page serve it and the next export send it back
    if not src.exists():
        raise _Bad(field, f"{_show(rel)} not found (paths are relative to the JSONL file)")
    parents = src.relative_to(folder).parts[:-1]
    if src.suffix.lower() != ".mp4" or not any(part == "clips" or part.endswith("_clips") for part in parents):
        raise _Bad(field, f"{_show(rel)} is not a clip of the set: clips are .mp4 files in a clips/ or "
                          "NAME_clips/ folder beside the JSONL file")
    with _open_clip(src, field, rel):
        return src


# the major brands of an MP4 video (ISO base media; the clips the project encodes say isom), not those
# of the other formats that share the container: heic/mif1/avif photos, "M4A " audio, "qt  " movies, raw photos
_VIDEO_BRANDS = frozenset({b"isom", b"iso2", b"iso3", b"iso4", b"iso5", b"iso6", b"mp41", b"mp42", b"avc1", b"M4V "})


def _open_clip(src: Path, field: str, rel: str) -> IO[bytes]:
    """``src`` open for reading, if it is a regular file that starts like an MP4 (checked again at
    the copy: the file may have changed since); else :class:`_Bad`.  Never opens a FIFO or device."""
    shown = _show(rel)
    try:
        if not stat.S_ISREG(os.stat(src).st_mode):
            raise _Bad(field, f"{shown} is not a regular file")
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise _Bad(field, f"{shown} not found (paths are relative to the JSONL file)") from None
    except OSError as e:
        raise _Bad(field, f"{shown} cannot be read ({e.strerror or e})") from None
    f = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Bad(field, f"{shown} is not a regular file")
        head = f.read(12)
        if head[4:8] != b"ftyp" or head[8:12] not in _VIDEO_BRANDS:
            raise _Bad(field, f"{shown} is not an MP4 video (its start is no ftyp box of an MP4 video brand: "
                              "a HEIC or AVIF photo, M4A audio or a QuickTime movie starts with one too)")
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f


def import_pairs(store: LabelStore, checked: CheckedSet, wanted: int | None = None) -> dict[str, int]:
    """Write a checked set into ``store``, all or nothing; ``wanted`` overrides each pair's.
    Returns the counts of pairs and answers added and skipped (already there)."""
    if wanted is not None and not _count(wanted):
        raise ValueError(f"wanted must be a whole number from 0 to {MAX_WANTED}, got {wanted!r}")
    new = [p for p in checked.pairs if not _known(store, p.id)]
    fresh = {p.id for p in new}
    for p in checked.pairs:
        if p.id not in fresh and not _same_pair(store, p):
            raise LabeledSetError(f"{checked.path}, line {p.line}: id: {_show(p.id)} is a pair of this store "
                                  "already, with other clips or segments: its answers would be taken for answers "
                                  "about that pair (nothing imported)")
    written: list[Path] = []
    try:
        placed = {p.id: _place_files(store, checked.path, p, written) for p in new}
        with store.transaction():
            return _insert(store, checked.pairs, placed, wanted)
    except BaseException as e:
        for path in reversed(written):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        if isinstance(e, (StoreError, sqlite3.Error, OSError)):
            raise LabeledSetError(f"{checked.path}: nothing imported ({' '.join(str(e).split())})") from e
        raise


def import_jsonl(store: LabelStore, path: str | os.PathLike, wanted: int | None = None) -> dict[str, int]:
    """Add the pairs and answers of ``path`` to ``store`` (checked first, then all or nothing);
    ``wanted`` overrides each pair's.  Into a run's store (``labels.sqlite`` beside the trainer's
    ``config.json``) only pairs a trainer can learn from are accepted."""
    trains = store.path.resolve() == (store.root / LabelStore.FILENAME) and is_training_run(store.root)
    return import_pairs(store, read_pairs(path, store.root if trains else None), wanted)


def _known(store: LabelStore, query_id: str) -> bool:
    try:
        store.query(query_id)
        return True
    except UnknownQuery:
        return False


def _same_pair(store: LabelStore, p: CheckedPair) -> bool:
    """Whether the store's pair of ``p``'s id shows and holds what ``p`` does (an earlier import or
    an export of it): the same segments and the same bytes in both clips."""
    q = store.query(p.id)
    try:
        if (p.segments is None) != (not q["segments"]) or (
                p.segments is not None and store.resolve(q["segments"]).read_bytes() != p.segments):
            return False
        return all(store.resolve(q[f"{side}_clip"]).read_bytes() == src.read_bytes()
                   for side, src in zip(("left", "right"), p.clips))
    except (OSError, StoreError):  # a file of the store's own gone missing: not known to be the same
        return False


def _place_files(store: LabelStore, source: Path, p: CheckedPair, written: list[Path]):
    """The pair's clips (copied in unless already inside the store) and segments as files of the
    store; every file and folder made is added to ``written`` (and only those: a name another
    import took meanwhile is never written over, nor removed if this import fails)."""
    clips = []
    for side, src in zip(("left", "right"), p.clips):
        if src.is_relative_to(store.root):
            clips.append(src)
            continue

        def copy(out, side=side, src=src):
            with _at(source, p.line), _open_clip(src, f"{side}_clip", str(src)) as f:
                shutil.copyfileobj(f, out, 1 << 20)

        clips.append(_write_new(store.root, store.root / "clips" / "imported", f"{p.id}-{side}", ".mp4", copy,
                                written))
    seg = None
    if p.segments is not None:
        seg = _write_new(store.root, store.root / "segments", p.id, ".npz", p.segments, written)
    return clips[0], clips[1], seg


def _write_new(root: Path, folder: Path, stem: str, suffix: str, content, written: list[Path]) -> Path:
    """``content`` (``files.write_atomic``'s) as a new file in ``folder`` below the store's ``root``
    (made if needed; no link on the way) under a name no file has: ``STEM.SUFFIX``, else
    ``STEM-XXXXXX.SUFFIX``.  What it makes goes into ``written``."""
    for parent in reversed([folder, *folder.parents]):
        if parent.is_relative_to(root) and parent != root:
            refuse_link(parent, "folder")  # clips/ or segments/ a link out of a store from someone else
        if not parent.exists():
            try:
                parent.mkdir()
            except FileExistsError:  # another import's, made meanwhile: not ours to remove
                continue
            written.append(parent)
    path = folder / f"{stem}{suffix}"
    while True:
        try:
            write_atomic(path, content, replace=False)
        except FileExistsError:  # there before, or placed by another import since
            path = folder / f"{stem}-{secrets.token_hex(3)}{suffix}"
            continue
        written.append(path)
        return path


def _insert(store: LabelStore, pairs: Iterable[CheckedPair], placed: dict, wanted: int | None) -> dict[str, int]:
    added = dict(pairs=0, labels=0, skipped_pairs=0, skipped_labels=0)
    for p in pairs:
        if p.id in placed and not _known(store, p.id):  # not added by someone else since it was checked
            left, right, seg = placed[p.id]
            store.add_query(left, right, seg, p.info, wanted=p.wanted if wanted is None else wanted, query_id=p.id,
                            created=p.created)
            if p.withdrawn is not None:
                store.withdraw([p.id])
            added["pairs"] += 1
        else:
            added["skipped_pairs"] += 1
        for lab in p.labels:
            added["labels" if store.add_label(p.id, *lab) else "skipped_labels"] += 1
    return added


# ------------------------------------------------------------------ training offline
def load_labeled(path: str | os.PathLike, labeler: str | None = None):
    """Training data from a labeled-set file: ``(arrays, mu, env)`` with ``arrays`` holding
    ``obs``/``action``/``true_reward`` ``[n, 2, T, …]`` and ``mu`` ``[n]`` — one row per answer
    (of ``labeler`` only, if given) that can be trained on ("can't tell" and pairs without
    segments are left out).  Every pair trained on must have the shapes of the first."""
    rows, mus, envs = [], [], set()
    shapes = None
    for i, d in _records(path):
        answers = [lab for lab in d.get("labels") or []
                   if MU[lab["choice"]] is not None and (labeler is None or lab["labeler"] == labeler)]
        if d.get("segments") is None or not answers:
            continue
        with _at(Path(path), i):
            _, arrays = _segments(d["segments"])
            try:
                check_pair(arrays, shapes)
            except ValueError as e:
                raise _Bad("segments", f"{e}, as the pairs before it") from None
        shapes = shapes or {k: arrays[k].shape for k in TRAIN_KEYS}
        for lab in answers:
            rows.append({k: arrays[k] for k in TRAIN_KEYS})
            mus.append(MU[lab["choice"]])
            envs.add(d.get("env") or (d.get("info") or {}).get("env"))
    if not rows:
        raise ValueError(f"{path}: no answers that can be trained on (left, right or tie with saved segments)")
    if len(envs) > 1:
        raise ValueError(f"{path}: pairs from several tasks ({', '.join(map(str, envs))}); train one task at a time")
    out = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return out, np.asarray(mus, np.float32), envs.pop()


def agreement_stats(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per labeler: answers, share of each choice, median response time, agreement with the
    oracle (pairs whose ``info.true_returns`` differ; ties and "can't tell" excluded); and for
    every two labelers, how often they gave the same answer on the pairs both answered."""
    per: dict[str, dict[str, Any]] = {}
    answers: dict[str, dict[str, str]] = {}
    for d in lines:
        true = (d.get("info") or {}).get("true_returns")
        for lab in d.get("labels") or []:
            s = per.setdefault(lab["labeler"], dict(answers=0, choices={c: 0 for c in CHOICES}, times=[],
                                                    oracle_same=0, oracle_compared=0))
            s["answers"] += 1
            s["choices"][lab["choice"]] += 1
            if lab.get("response_s") is not None:
                s["times"].append(lab["response_s"])
            if true and len(true) == 2 and true[0] != true[1] and lab["choice"] in ("left", "right"):
                s["oracle_compared"] += 1
                s["oracle_same"] += int((lab["choice"] == "left") == (true[0] > true[1]))
            answers.setdefault(lab["labeler"], {})[d["id"]] = lab["choice"]
    labelers = {}
    for name, s in sorted(per.items()):
        labelers[name] = dict(
            answers=s["answers"], choices=s["choices"],
            median_response_s=float(np.median(s["times"])) if s["times"] else None,
            oracle_agreement=s["oracle_same"] / s["oracle_compared"] if s["oracle_compared"] else None,
            oracle_compared=s["oracle_compared"])
    pairs = {}
    names = sorted(answers)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = set(answers[a]) & set(answers[b])
            if shared:
                same = sum(answers[a][q] == answers[b][q] for q in shared)
                pairs[f"{a} vs {b}"] = dict(shared=len(shared), agreement=same / len(shared))
    return dict(pairs=len(lines), answers=sum(s["answers"] for s in per.values()), labelers=labelers,
                between_labelers=pairs)
