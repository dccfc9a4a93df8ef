"""The trainer's side of human feedback (layer 5): ask people about pairs, collect their answers.

Unlike the synthetic oracle, a person answers minutes later, so the human teacher is
asynchronous and the driver never waits on it (except, optionally, for the first labels):

It is the :class:`rlhp_jax.teachers.Teacher` of a run labeled by people (``ask`` / ``collect``);
underneath:

* ``queue(pairs)`` hands selected pairs to a background worker that saves each pair's arrays
  (``segments/ID.npz``), renders and encodes its two clips (``clips/ID-left.mp4`` …) and only
  then inserts the query into the label store, so the page never offers a pair whose clips
  are missing.  Rendering and encoding never run on the training thread.  An Atari run hands
  the teacher its ``render.atari.NativeFrames`` (``native_frames``): ``queue`` copies each
  pair's colour frames out of that ring on the calling thread, and people see native colour
  instead of the agent's 84×84 grayscale (``render.atari``).
* ``answers_since(cursor)`` returns the answers recorded since ``cursor`` (the id of the last answer
  the trainer consumed, saved in its checkpoints) together with their pairs' arrays.  After a
  crash the trainer resumes from its checkpoint's cursor, so answers given while it was down,
  or after its last checkpoint, are picked up, and none is used twice.  An answer whose pair
  cannot be learned from (``check_pair``: no saved segments, as an imported display-only pair
  has; an unreadable file; arrays not shaped as the run's ``pair_shapes``) is skipped with one
  warning per pair and the cursor moves past it: nothing in a store can stop the trainer, nor
  stop it again after a restart.

Every file is written to a temporary name and renamed into place (a killed worker leaves no
half-written clip behind a query).
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import threading
import time
import warnings
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

import jax
import numpy as np

from rlhp_jax.demos import read_npz, save_arrays
from rlhp_jax.files import own_folder
from rlhp_jax.human.store import MU, LabelStore, StoreError
from rlhp_jax.labels import padded_batches
from rlhp_jax.teachers import Answers

ANSWER_BATCH = 1024  # answers added to the label set in one compiled call (padded to a power of two)

TRAIN_KEYS = ("obs", "action", "true_reward")  # what the reward model learns from (``render`` only draws clips)


def save_npz(path: Path, **arrays) -> None:
    save_arrays(path, arrays, compressed=False)


MAX_PAIR_BYTES = 256 << 20  # a pair's arrays (an Atari pair with its render frames: ~5 MB)


def read_segments(source: str | os.PathLike | IO[bytes]) -> dict[str, np.ndarray]:
    """Every array of a saved pair (an ``.npz`` file or file object); ValueError if it is not an
    ``.npz`` archive of plain arrays, or would take more than :data:`MAX_PAIR_BYTES` of memory
    (``demos.read_npz``: a labeled set from someone else may carry a compression bomb; pickled
    objects are never loaded)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            f = open(source, "rb")
        except OSError as e:
            raise ValueError(f"cannot be read ({e.strerror or e})") from None
        with f:
            return read_segments(f)
    return read_npz(source, MAX_PAIR_BYTES)


def check_pair(arrays: Mapping[str, Any], shapes: Mapping[str, Sequence[int]] | None = None) -> None:
    """Raise ValueError unless ``arrays`` are a pair the reward model can learn from: ``obs``,
    ``action`` and ``true_reward`` numeric, finite, ``[2, T, ...]`` with one ``T`` >= 1
    (``true_reward`` ``[2, T]``) and, given ``shapes`` (see :func:`pair_shapes`), exactly those."""
    for k in TRAIN_KEYS:
        a = arrays.get(k)
        if not isinstance(a, np.ndarray):
            raise ValueError(f"no {k} array")
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{k} is not numeric (dtype {a.dtype})")
        if a.ndim < 2 or a.shape[0] != 2 or a.shape[1] < 1:
            raise ValueError(f"{k} has shape {a.shape}, not [2, T, ...] (two segments of T >= 1 steps)")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(f"{k} holds NaN or infinite values")
    if arrays["true_reward"].ndim != 2:
        raise ValueError(f"true_reward has shape {arrays['true_reward'].shape}, not [2, T]")
    if len({arrays[k].shape[1] for k in TRAIN_KEYS}) > 1:
        raise ValueError("obs, action and true_reward differ in length ("
                         + ", ".join(str(arrays[k].shape[1]) for k in TRAIN_KEYS) + " steps)")
    for k in TRAIN_KEYS if shapes is not None else ():
        if arrays[k].shape != tuple(shapes[k]):
            raise ValueError(f"{k} has shape {arrays[k].shape}, not {tuple(shapes[k])}")


def pair_shapes(spec, segment_length: int) -> dict[str, tuple[int, ...]]:
    """The shape of each array of one pair a run's label buffer holds, for :func:`check_pair`."""
    return dict(obs=(2, segment_length, *spec.obs_shape), action=(2, segment_length, *spec.action_shape),
                true_reward=(2, segment_length))


def load_pair(store: LabelStore, query: dict) -> dict[str, np.ndarray]:
    """The saved arrays of one query: ``obs``/``action``/``true_reward`` ``[2, T, ...]`` (unchecked)."""
    if not query.get("segments"):
        raise ValueError("it has no saved segments (a display-only pair)")
    return read_segments(store.resolve(query["segments"]))


def write_clips(env: str, pair: dict[str, np.ndarray], left: Path, right: Path,
                render_fields: Sequence[str] = ()) -> None:
    """Render and encode the two clips of a pair (segment 0 on the left), each whole or not at all."""
    from rlhp_jax.render import segment_frames
    from rlhp_jax.render.video import encode_mp4

    for side, path in ((0, left), (1, right)):
        render = pair["render"][side] if "render" in pair else None
        rgb = pair["rgb"][side] if "rgb" in pair else None  # Atari: native colour frames (HumanTeacher.queue)
        frames, fps = segment_frames(env, pair["obs"][side], render, render_fields, rgb=rgb)
        encode_mp4(frames, path, fps)  # whole or not at all: ffmpeg writes a temporary file, renamed into place


class HumanTeacher:
    """Asks through a :class:`LabelStore` in ``run_dir``; one rendering worker thread.

    ``pair_shapes`` (:func:`pair_shapes`): the arrays the trainer's label buffer takes; answers to
    pairs of other shapes are skipped.  None: the shapes of the first usable pair collected.
    ``max_pending``: the most pairs a run keeps open at once (the ``Teacher`` interface)."""

    asynchronous = True

    def __init__(self, run_dir: str | os.PathLike, env: str, render_fields: Sequence[str] = (), wanted: int = 1,
                 store: LabelStore | None = None, pair_shapes: Mapping[str, Sequence[int]] | None = None,
                 max_pending: int | None = None, native_frames: Any = None):
        self.max_pending = max_pending
        self.native_frames = native_frames  # Atari: the run's render.atari.NativeFrames (colour clips)
        self.responses = 0  # answers consumed, "can't tell" included
        self.cursor = 0  # the store id of the last answer consumed
        self.run_dir = Path(run_dir)
        self.env, self.render_fields, self.wanted = env, tuple(render_fields), wanted
        self.pair_shapes = None if pair_shapes is None else {k: tuple(pair_shapes[k]) for k in TRAIN_KEYS}
        self._skipped: set[str] = set()  # pairs already warned about
        self.store = store or LabelStore(self.run_dir)
        own_folder(self.run_dir / "clips")
        own_folder(self.run_dir / "segments")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="clips")
        self._inflight: list[concurrent.futures.Future] = []
        self._lock = threading.Lock()
        self.seconds_rendering = 0.0

    # ------------------------------------------------------------------ the Teacher interface
    def ask(self, pairs, render, take: int, keys, env_steps: int) -> None:
        """Queue the first ``take`` selected pairs for people (rendered off the training thread).
        ``render`` None: the clips are drawn from the observations alone (Ibarz's runs, whose
        clips come from the replay buffer)."""
        arrays = dict(obs=np.asarray(pairs.obs[:take]), action=np.asarray(pairs.action[:take]),
                      true_reward=np.asarray(pairs.true_reward[:take]))
        if render is not None:
            arrays["render"] = np.asarray(render[:take])
        self.queue(arrays, [dict(env_steps=env_steps)] * take)

    def collect(self, key) -> list[Answers]:
        """The answers recorded since the last call, in padded batches; "can't tell" is kept in
        the store and counted in ``responses`` but not trained on."""
        labels, pairs, mu, self.cursor = self.answers_since(self.cursor)
        self.responses += len(labels)
        out = []
        for batch, m, mask in padded_batches(pairs, mu, ANSWER_BATCH) if labels else ():
            key, k_add = jax.random.split(key)
            out.append(Answers(batch, m, mask, k_add))
        return out

    def publish(self, **facts) -> None:
        """What the page shows about the trainer (labels due, answers used, progress)."""
        self.store.set_meta(updated=time.time(), **facts)

    def meta(self) -> dict:
        return dict(responses=self.responses, human_cursor=self.cursor)

    def restore(self, meta: dict) -> None:
        self.responses = int(meta.get("responses", meta["labels"]))
        self.cursor = int(meta.get("human_cursor", 0))

    # ------------------------------------------------------------------ underneath
    def queue(self, pairs: dict[str, np.ndarray], info: Sequence[dict[str, Any]]) -> list[str]:
        """Queue ``len(info)`` pairs (arrays ``[P, 2, T, ...]``, the first ``len(info)`` used).  With
        ``native_frames``, the pairs' colour frames are copied out of its ring here, before the run
        moves on (``rgb``: shown, never saved)."""
        if self.native_frames is not None and "render" in pairs and "rgb" not in pairs:
            pairs = dict(pairs, rgb=self.native_frames.lookup(np.asarray(pairs["render"])[:len(info)]))
        ids = []
        for i, meta in enumerate(info):
            qid = f"q{int(time.time() * 1000):013d}-{secrets.token_hex(4)}"
            one = {k: np.asarray(v[i]) for k, v in pairs.items()}
            self._check()
            fut = self._pool.submit(self._prepare, qid, one, dict(meta))
            with self._lock:
                self._inflight.append(fut)
            ids.append(qid)
        return ids

    def _prepare(self, qid: str, pair: dict[str, np.ndarray], info: dict) -> str:
        t0 = time.perf_counter()
        seg = self.run_dir / "segments" / f"{qid}.npz"
        left, right = (self.run_dir / "clips" / f"{qid}-{side}.mp4" for side in ("left", "right"))
        save_npz(seg, **{k: v for k, v in pair.items() if k != "rgb"})  # rgb: 5 MB a pair, the clips show it
        write_clips(self.env, pair, left, right, self.render_fields)
        info = dict(info, env=self.env, segment_length=int(pair["obs"].shape[1]))
        if "true_reward" in pair:  # for diagnostics (agreement with the oracle); never shown on the page
            info["true_returns"] = [float(x) for x in np.asarray(pair["true_reward"], np.float64).sum(-1)]
        self.store.add_query(left, right, seg, info, wanted=self.wanted, query_id=qid)
        self.seconds_rendering += time.perf_counter() - t0
        return qid

    def _check(self) -> None:
        """Raise a worker's failure on the training thread (a broken renderer must not go unnoticed)."""
        with self._lock:
            done = [f for f in self._inflight if f.done()]
            self._inflight = [f for f in self._inflight if not f.done()]
        for f in done:
            f.result()

    def in_flight(self) -> int:
        self._check()
        with self._lock:
            return len(self._inflight)

    def pending(self) -> int:
        """Pairs asked but not answered: being rendered, or open in the store."""
        return self.in_flight() + len(self.store.open_queries())

    def answers_since(self, cursor: int) -> tuple[list, dict[str, np.ndarray] | None, np.ndarray, int]:
        """Answers after ``cursor`` that can be learned from: ``(labels, pairs {obs, action,
        true_reward: [n, 2, T, ...]} or None, mu [n] (NaN: can't tell), new cursor)``.  The new
        cursor is past every answer read, the skipped ones too (see the module docstring)."""
        self._check()
        answers = self.store.labels_since(cursor)
        if not answers:
            return [], None, np.zeros((0,), np.float32), cursor
        arrays: dict[str, dict[str, np.ndarray] | None] = {}
        for lab in answers:
            if lab.query_id not in arrays:
                arrays[lab.query_id] = self._trainable(lab.query_id)
        labels = [lab for lab in answers if arrays[lab.query_id] is not None]
        if not labels:
            return [], None, np.zeros((0,), np.float32), answers[-1].id
        pairs = {k: np.stack([arrays[lab.query_id][k] for lab in labels]) for k in TRAIN_KEYS}
        mu = np.asarray([np.nan if MU[lab.choice] is None else MU[lab.choice] for lab in labels], np.float32)
        return labels, pairs, mu, answers[-1].id

    def _trainable(self, query_id: str) -> dict[str, np.ndarray] | None:
        """The arrays of a pair to learn from, or None (with a warning, once per pair)."""
        try:
            arrays = load_pair(self.store, self.store.query(query_id))
            check_pair(arrays, self.pair_shapes)
        except (ValueError, StoreError) as e:
            if query_id not in self._skipped:
                self._skipped.add(query_id)
                warnings.warn(f"pair {query_id} cannot be trained on, its answers are skipped: {e}", stacklevel=3)
            return None
        if self.pair_shapes is None:
            self.pair_shapes = {k: arrays[k].shape for k in TRAIN_KEYS}
        return {k: arrays[k] for k in TRAIN_KEYS}

    def withdraw_older_than(self, env_steps: int) -> int:
        """Withdraw open pairs made before ``env_steps`` (their policy is long gone); a pair
        whose ``info.env_steps`` is missing or not a number counts as made at step 0."""
        old = [q for q in self.store.open_queries() if _made_at(self.store.query(q)["info"]) < env_steps]
        return self.store.withdraw(old)

    def wait_idle(self, timeout: float | None = None) -> None:
        with self._lock:
            futs = list(self._inflight)
        concurrent.futures.wait(futs, timeout=timeout)
        self._check()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._check()


def _made_at(info: Any) -> float:
    """The environment step a pair was made at, from its ``info`` (0 when unknown)."""
    steps = info.get("env_steps", 0) if isinstance(info, dict) else 0
    return steps if isinstance(steps, (int, float)) and not isinstance(steps, bool) else 0
