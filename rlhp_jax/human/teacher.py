"""The trainer's side of human feedback (layer 5): ask people about pairs, collect their answers.

Unlike the synthetic oracle, a person answers minutes later, so the human teacher is
asynchronous and the driver never waits on it (except, optionally, for the first labels):

* ``ask(pairs)`` hands selected pairs to a background worker that saves each pair's arrays
  (``segments/ID.npz``), renders and encodes its two clips (``clips/ID-left.mp4`` …) and only
  then inserts the query into the label store, so the page never offers a pair whose clips
  are missing.  Rendering and encoding never run on the training thread.
* ``collect(cursor)`` returns the answers recorded since ``cursor`` (the id of the last answer
  the trainer consumed, saved in its checkpoints) together with their pairs' arrays.  After a
  crash the trainer resumes from its checkpoint's cursor, so answers given while it was down,
  or after its last checkpoint, are picked up, and none is used twice.

Every file is written to a temporary name and renamed into place (a killed worker leaves no
half-written clip behind a query).
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlhp_jax.demos import save_arrays
from rlhp_jax.human.store import MU, LabelStore

SEGMENT_KEYS = ("obs", "action", "true_reward", "render")


def save_npz(path: Path, **arrays) -> None:
    save_arrays(path, arrays, compressed=False)


def load_pair(store: LabelStore, query: dict) -> dict[str, np.ndarray]:
    """The saved arrays of one query: ``obs``/``action``/``true_reward`` ``[2, T, ...]``."""
    if not query.get("segments"):
        raise ValueError(f"pair {query['id']} has no saved segments (a display-only pair): it cannot be trained on")
    with np.load(store.resolve(query["segments"])) as z:
        return {k: z[k] for k in z.files}


def write_clips(env: str, pair: dict[str, np.ndarray], left: Path, right: Path,
                render_fields: Sequence[str] = ()) -> None:
    """Render and encode the two clips of a pair (segment 0 on the left)."""
    from rlhp_jax.clips import encode_mp4, segment_frames

    for side, path in ((0, left), (1, right)):
        render = pair["render"][side] if "render" in pair else None
        frames, fps = segment_frames(env, pair["obs"][side], render, render_fields)
        tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp.mp4")
        encode_mp4(frames, tmp, fps)
        os.replace(tmp, path)


class HumanTeacher:
    """Asks through a :class:`LabelStore` in ``run_dir``; one rendering worker thread."""

    def __init__(self, run_dir: str | os.PathLike, env: str, render_fields: Sequence[str] = (), wanted: int = 1,
                 store: LabelStore | None = None):
        self.run_dir = Path(run_dir)
        self.env, self.render_fields, self.wanted = env, tuple(render_fields), wanted
        self.store = store or LabelStore(self.run_dir)
        (self.run_dir / "clips").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "segments").mkdir(parents=True, exist_ok=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="clips")
        self._inflight: list[concurrent.futures.Future] = []
        self._lock = threading.Lock()
        self.seconds_rendering = 0.0

    def ask(self, pairs: dict[str, np.ndarray], info: Sequence[dict[str, Any]]) -> list[str]:
        """Queue ``len(info)`` pairs (arrays ``[P, 2, T, ...]``, the first ``len(info)`` used)."""
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
        save_npz(seg, **pair)
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

    def collect(self, cursor: int) -> tuple[list, dict[str, np.ndarray] | None, np.ndarray, int]:
        """Answers after ``cursor``: ``(labels, pairs [n, 2, T, ...] or None, mu [n] (NaN: can't tell), new cursor)``."""
        self._check()
        labels = self.store.labels_since(cursor)
        if not labels:
            return [], None, np.zeros((0,), np.float32), cursor
        arrays = [load_pair(self.store, self.store.query(lab.query_id)) for lab in labels]
        keys = [k for k in SEGMENT_KEYS if all(k in a for a in arrays)]
        pairs = {k: np.stack([a[k] for a in arrays]) for k in keys}
        mu = np.asarray([np.nan if MU[lab.choice] is None else MU[lab.choice] for lab in labels], np.float32)
        return labels, pairs, mu, labels[-1].id

    def withdraw_older_than(self, env_steps: int) -> int:
        """Withdraw open pairs made before ``env_steps`` (their policy is long gone)."""
        old = [q for q in self.store.open_queries() if self.store.query(q)["info"].get("env_steps", 0) < env_steps]
        return self.store.withdraw(old)

    def wait_idle(self, timeout: float | None = None) -> None:
        with self._lock:
            futs = list(self._inflight)
        concurrent.futures.wait(futs, timeout=timeout)
        self._check()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._check()
