"""Expert demonstrations (layer 4: data), Ibarz et al. 2018 §2.1 and §2.5.

A demonstration set is one ``.npz`` file (format ``rlhp_jax.demos/1``) holding whole episodes of
observations, actions and, when known, the true rewards.  Frames are stored once, not once per
stack: an Atari observation is a stack of the 4 newest 84×84 frames, so consecutive observations
share 3 of them.

=================  ===============  ==========================================================
key                shape / dtype    meaning
=================  ===============  ==========================================================
``meta``           str (JSON)       ``format``, ``env``, ``obs_shape``, ``frame_shape``,
                                    ``stack``, ``obs_dtype``, ``num_actions``, ``mask_sha1``
                                    (digest of the score-blanking mask the frames went
                                    through), ``source``, ``fps``, ``created``
``frames``         [F, *frame]      every distinct frame, in recording order
``obs_frame``      [N] int64        index in ``frames`` of the newest frame of step t's
                                    observation: ``obs_t = frames[i-stack+1 : i+1]`` stacked on
                                    the last axis (for ``stack == 1``: ``frames[i]`` itself)
``actions``        [N] int32        the action taken in ``obs_t``
``rewards``        [N] float32      the task's reward for the step (optional; absent if unknown)
``episode_lengths`` [E] int64       steps per episode; episodes are consecutive in N
=================  ===============  ==========================================================

Frames are written already blanked (score area, ``rlhp_jax.atari_masks``) by the same
environment wrapper the agent sees, so demos and agent frames are blanked identically (Ibarz
H.7: a misalignment there drove DQfD's scores to zero).  ``read_demos(path)`` refuses, with a
one-line :class:`DemoError` naming the file, anything that is not a whole, consistent demo set
(another file type, a damaged archive, a meta field or array missing or of the wrong kind);
``load_demos(path, env)`` also refuses demos from another game, another frame format, another
action set or another blanking mask.

Also here: :func:`autolabels` (Ibarz §2.5: each initial clip paired with a random demo clip,
the demo preferred) and :func:`record_policy` (demos from any policy, e.g. a trained checkpoint:
:func:`rlhp_jax.trained.load_policy`; on the command line ``python -m rlhp_jax.demos_cli``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any, Callable, Collection

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax import labels as labels_lib
from rlhp_jax.files import write_atomic
from rlhp_jax.refusal import check_new_file

FORMAT = "rlhp_jax.demos/1"


class DemoError(ValueError):
    """A demo file that cannot be used for this run: the message says why and what to do."""


# ---------------------------------------------------------------------------- frame format
@dataclasses.dataclass(frozen=True)
class FrameFormat:
    """How an environment's observations are built from frames, and how they were blanked."""

    env: str
    obs_shape: tuple[int, ...]
    frame_shape: tuple[int, ...]
    stack: int
    obs_dtype: str
    num_actions: int
    mask_sha1: str  # "none" where nothing is blanked

    def describe(self) -> str:
        frame = "×".join(map(str, self.frame_shape))
        stacked = f"stacks of {self.stack} {frame} frames" if self.stack > 1 else f"{frame} observations"
        return f"{stacked} ({self.obs_dtype}), {self.num_actions} actions"


def frame_format(env) -> FrameFormat:
    """The frame format of a ``VecEnv``: Atari stacks 4 newest frames on the last axis; every
    other task's observation is one frame."""
    spec = env.spec
    mask = getattr(env, "score_mask", None)
    digest = "none" if mask is None else hashlib.sha1(np.ascontiguousarray(mask, bool).tobytes()).hexdigest()
    obs_shape = tuple(int(x) for x in spec.obs_shape)
    if getattr(env, "domain", None) == "atari":
        frame_shape, stack, dtype = obs_shape[:-1], obs_shape[-1], "uint8"
    else:
        frame_shape, stack, dtype = obs_shape, 1, "float32"
    return FrameFormat(env=spec.name, obs_shape=obs_shape, frame_shape=frame_shape, stack=stack, obs_dtype=dtype,
                       num_actions=int(spec.num_actions), mask_sha1=digest)


def stack_frames(frames: np.ndarray, newest: np.ndarray, stack: int, stack_last: bool = True) -> np.ndarray:
    """Observations from a frame store: ``newest`` [B] indices -> [B, *frame_shape, stack]
    (``stack_last=False``: [B, stack, *frame_shape], which skips a slow host-side transpose)."""
    newest = np.asarray(newest, np.int64)
    if stack == 1:
        return frames[newest]
    idx = newest[:, None] + np.arange(1 - stack, 1)[None, :]  # [B, stack], oldest first
    return np.moveaxis(frames[idx], 1, -1) if stack_last else frames[idx]


# ---------------------------------------------------------------------------- the demo set
@dataclasses.dataclass(frozen=True)
class Demos:
    """A loaded demonstration set (numpy arrays; see the module docstring for the format)."""

    meta: dict
    frames: np.ndarray
    obs_frame: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray | None
    episode_lengths: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_episodes(self) -> int:
        return int(self.episode_lengths.shape[0])

    @property
    def stack(self) -> int:
        return int(self.meta["stack"])

    @property
    def episode_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.episode_lengths)[:-1]]).astype(np.int64)

    @property
    def episode_end(self) -> np.ndarray:
        """[N] bool: the last step of its episode (DQfD: discount 0 after it)."""
        end = np.zeros(self.num_steps, bool)
        end[np.cumsum(self.episode_lengths) - 1] = True
        return end

    def obs(self, steps, stack_last: bool = True) -> np.ndarray:
        """Observations of the given step indices: [B, *obs_shape] (see ``stack_frames``)."""
        return stack_frames(self.frames, self.obs_frame[np.asarray(steps, np.int64)], self.stack, stack_last)

    def episode_returns(self) -> np.ndarray | None:
        if self.rewards is None:
            return None
        ends = np.cumsum(self.episode_lengths)
        return np.array([self.rewards[s:e].sum() for s, e in zip(ends - self.episode_lengths, ends)])

    def subset(self, fraction: float) -> "Demos":
        """The first episodes holding at least ``fraction`` of the steps (at least one episode):
        Ibarz's "20 % of the demos" experiment."""
        if not 0.0 < fraction <= 1.0:
            raise DemoError(f"--demo-fraction must be in (0, 1], got {fraction}")
        if fraction == 1.0:
            return self
        cum = np.cumsum(self.episode_lengths)
        keep = int(np.searchsorted(cum, fraction * self.num_steps - 1e-9)) + 1
        keep = min(max(keep, 1), self.num_episodes)
        n = int(cum[keep - 1])
        last_frame = int(self.obs_frame[n - 1]) + 1
        return dataclasses.replace(
            self, frames=self.frames[:last_frame], obs_frame=self.obs_frame[:n], actions=self.actions[:n],
            rewards=None if self.rewards is None else self.rewards[:n], episode_lengths=self.episode_lengths[:keep],
            meta={**self.meta, "subset_of_steps": self.num_steps})

    def segment_starts(self, length: int) -> np.ndarray:
        """Every step where a clip of ``length`` steps fits inside one episode."""
        starts = [np.arange(s, s + n - length + 1) for s, n in zip(self.episode_starts, self.episode_lengths)
                  if n >= length]
        return np.concatenate(starts) if starts else np.zeros(0, np.int64)

    def segments(self, rng: np.random.Generator, num: int, length: int) -> dict[str, np.ndarray]:
        """``num`` clips of ``length`` steps drawn uniformly from within episodes:
        obs [num, length, *obs], action [num, length], true_reward [num, length] (0 if unknown)."""
        starts = self.segment_starts(length)
        if starts.size == 0:
            raise DemoError(f"no demo episode is {length} steps long: clips of {length} steps cannot be cut "
                            f"(longest episode: {int(self.episode_lengths.max())} steps)")
        t0 = rng.choice(starts, size=num)
        steps = t0[:, None] + np.arange(length)[None]
        obs = self.obs(steps.reshape(-1)).reshape(num, length, *self.meta["obs_shape"])
        rew = self.rewards[steps] if self.rewards is not None else np.zeros((num, length), np.float32)
        return dict(obs=obs, action=self.actions[steps], true_reward=rew.astype(np.float32))


# ---------------------------------------------------------------------------- writing
class DemoRecorder:
    """Builds a demo set step by step, writing each frame once.

    ``add(obs, action, reward)`` records one step of the current episode (``obs`` is the
    observation the action was taken in, as the agent sees it); ``end_episode()`` closes it.
    An observation whose older frames continue the previous one adds only its newest frame;
    any other (an episode's first, or after a discontinuity) adds its whole stack.
    """

    def __init__(self, fmt: FrameFormat, source: str, fps: float | None = None):
        self.fmt = fmt
        self.source = source
        self.fps = fps
        self._frames: list[np.ndarray] = []
        self._obs_frame: list[int] = []
        self._actions: list[int] = []
        self._rewards: list[float] = []
        self._lengths: list[int] = []
        self._open = 0  # steps in the episode being recorded
        self._prev: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return len(self._actions)

    @property
    def num_episodes(self) -> int:
        return len(self._lengths)

    def _frames_of(self, obs: np.ndarray) -> list[np.ndarray]:
        if self.fmt.stack == 1:
            return [obs]
        return [obs[..., i] for i in range(self.fmt.stack)]

    def add(self, obs, action: int, reward: float | None = None) -> None:
        obs = np.asarray(obs).astype(self.fmt.obs_dtype, copy=False)
        if obs.shape != self.fmt.obs_shape:
            raise DemoError(f"observation shape {obs.shape} is not the environment's {self.fmt.obs_shape}")
        if not 0 <= int(action) < self.fmt.num_actions:
            raise DemoError(f"action {action} outside 0..{self.fmt.num_actions - 1}")
        frames = self._frames_of(obs)
        continues = (self._open > 0 and self.fmt.stack > 1 and self._prev is not None
                     and np.array_equal(obs[..., :-1], self._prev[..., 1:]))
        self._frames.extend(frames[-1:] if continues else frames)
        self._obs_frame.append(len(self._frames) - 1)
        self._actions.append(int(action))
        self._rewards.append(np.nan if reward is None else float(reward))
        self._prev = obs
        self._open += 1

    def end_episode(self) -> None:
        if self._open:
            self._lengths.append(self._open)
        self._open = 0
        self._prev = None

    def arrays(self) -> dict[str, Any]:
        self.end_episode()
        rewards = np.asarray(self._rewards, np.float32)
        meta = dict(format=FORMAT, env=self.fmt.env, obs_shape=list(self.fmt.obs_shape),
                    frame_shape=list(self.fmt.frame_shape), stack=self.fmt.stack, obs_dtype=self.fmt.obs_dtype,
                    num_actions=self.fmt.num_actions, mask_sha1=self.fmt.mask_sha1, source=self.source,
                    fps=self.fps, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
        out = dict(meta=np.asarray(json.dumps(meta)),
                   frames=np.asarray(self._frames, self.fmt.obs_dtype).reshape(-1, *self.fmt.frame_shape),
                   obs_frame=np.asarray(self._obs_frame, np.int64), actions=np.asarray(self._actions, np.int32),
                   episode_lengths=np.asarray(self._lengths, np.int64))
        if rewards.size and not np.isnan(rewards).any():
            out["rewards"] = rewards
        return out

    def save(self, path: str | os.PathLike, overwrite: bool = True) -> Path:
        """Write the set atomically (temporary file, fsync, rename); refuses an empty set.
        ``overwrite=False``: never over a file at ``path`` (:func:`save_arrays`).  Returns the path written."""
        arrays = self.arrays()
        if arrays["actions"].size == 0:
            raise DemoError("no steps were recorded: nothing to save")
        return save_arrays(path, arrays, overwrite=overwrite)


def npz_path(path: str | os.PathLike) -> Path:
    """``path`` as the ``.npz`` file written for it (NumPy's suffix added where it is missing)."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def new_demo_path(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """The demo file a command is about to record into (``--out``; :func:`npz_path`), checked before
    anything is recorded (``refusal.check_new_file``): a demo set, perhaps played by a person over an
    hour, is never replaced by a mistyped ``--out``."""
    return check_new_file(npz_path(out), overwrite)


def save_arrays(path: str | os.PathLike, arrays: dict[str, Any], compressed: bool = True,
                overwrite: bool = True) -> Path:
    """Write an ``.npz`` atomically and durably (``files.write_atomic``); returns the path written.

    ``overwrite=False`` (a recording whose ``--out`` was found new when it began, perhaps an hour
    ago): a file that is at ``path`` by now, another session's written meanwhile, is kept, and the
    arrays go beside it under the first free name, ``NAME-2.npz``, ``NAME-3.npz``, …"""
    path = target = npz_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write = lambda f: (np.savez_compressed if compressed else np.savez)(f, **arrays)
    if overwrite:
        return write_atomic(path, write)
    for n in itertools.count(2):
        try:
            return write_atomic(target, write, replace=False)
        except FileExistsError:
            target = path.with_name(f"{path.stem}-{n}{path.suffix}")


def read_npz(source: str | os.PathLike | IO[bytes], max_bytes: int, names: Collection[str] | None = None
             ) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` someone may have sent (``names``: only those members; the others
    are never decompressed), or a ValueError saying why not.  Nothing it reads can take more memory
    than ``max_bytes``: each member must be stored or deflated (the two methods numpy writes; a
    bzip2 member of a kilobyte can expand to gigabytes), every member's size as the archive records
    it and its array's size as its header declares it are counted against ``max_bytes`` before a
    byte is decompressed, and a member longer than it says is cut at that length by ``zipfile``.
    No pickled object is ever loaded."""
    import zipfile

    from numpy.lib import format as npy

    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise ValueError(f"not a readable .npz archive ({_one_line(e)})") from None
    with archive:
        members = {}
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else None
            if name is None or (names is not None and name not in names):
                continue
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or info.flag_bits & 0x1:
                raise ValueError(f"{name} is compressed by a method numpy does not write (zip method "
                                 f"{info.compress_type}{', encrypted' if info.flag_bits & 0x1 else ''})")
            members[name] = info
        declared = sum(info.file_size for info in members.values())
        if declared > max_bytes:
            raise ValueError(f"its arrays would take {declared / 2**20:,.0f} MiB, more than the "
                             f"{max_bytes / 2**20:,.0f} MiB this reader allows")
        arrays = {}
        for name, info in members.items():
            try:
                with archive.open(info) as f:
                    version = npy.read_magic(f)
                    shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0)
                                       else npy.read_array_header_2_0)(f, max_header_size=10_000)
            except Exception as e:  # noqa: BLE001 — zlib.error, EOFError, struct.error, a bad header, …
                raise ValueError(f"{name} is damaged ({_one_line(e)})") from None
            if dtype.hasobject:
                raise ValueError(f"{name} holds Python objects (a pickle), which are never loaded")
            if math.prod(shape) * dtype.itemsize > info.file_size:
                raise ValueError(f"{name} is damaged (its header declares {math.prod(shape) * dtype.itemsize:,} "
                                 f"bytes, its member holds {info.file_size:,})")
            try:
                with archive.open(info) as f:
                    arrays[name] = npy.read_array(f, allow_pickle=False)
            except Exception as e:  # noqa: BLE001 — as above, and a bad CRC (BadZipFile)
                raise ValueError(f"{name} is damaged ({_one_line(e)})") from None
    return arrays


# ---------------------------------------------------------------------------- reading
REQUIRED_ARRAYS = ("meta", "frames", "obs_frame", "actions", "episode_lengths")
# the meta fields every reader relies on, with their kind ("shape": a list of positive ints)
META_FIELDS = {"format": str, "env": str, "obs_shape": "shape", "frame_shape": "shape", "stack": int,
               "obs_dtype": str, "num_actions": int, "mask_sha1": str}


def read_demos(path: str | os.PathLike) -> Demos:
    """Read and check a demo file on its own (no environment to compare with).

    Whatever the file is — not an ``.npz``, truncated or garbled, another format, a meta record
    or an array missing or of the wrong kind, arrays that do not fit together — it is either
    refused with a one-line :class:`DemoError` naming it, or read into a :class:`Demos` that
    supports everything this module does with one (observations, clips, subsets, ``describe``).
    The file is only read."""
    path = Path(path)
    if not path.exists():
        raise DemoError(f"demo file {path} does not exist")
    if path.is_dir():
        raise DemoError(f"{path} is a directory; pass the demo .npz file")
    data = _read_npz(path)
    missing = [k for k in REQUIRED_ARRAYS if k not in data]
    if missing:
        raise DemoError(f"{path} is not a demo file: it lacks {', '.join(missing)}")
    meta = _read_meta(path, data["meta"])
    demos = _demos_from_arrays(path, meta, data)
    _check_fit(path, demos)
    return dataclasses.replace(demos, actions=demos.actions.astype(np.int32))  # in range: checked as int64


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a demo file (those the format names; no pickles), or a DemoError.  A file whose
    arrays would not fit in half this machine's memory is refused before it is decompressed (an hour
    of Atari play is ~0.8 GB; a damaged or hostile archive can declare any size)."""
    try:
        return read_npz(path, _memory_budget(), names=(*REQUIRED_ARRAYS, "rewards"))
    except ValueError as e:
        raise DemoError(f"{path} is not a demo file (a .npz written by rlhp_jax.demos): {e}") from None


def _memory_budget() -> int:
    """Half of this machine's physical memory (1 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (AttributeError, ValueError, OSError):
        return 1 << 30


def _read_meta(path: Path, record: np.ndarray) -> dict:
    """The JSON meta record, with every field of :data:`META_FIELDS` present and of its kind."""
    if record.dtype.kind != "U" or record.ndim != 0:
        raise DemoError(f"{path}: its meta record is not a JSON text (a {record.dtype} array of shape {record.shape})")
    try:
        meta = json.loads(str(record))
    except (json.JSONDecodeError, RecursionError):
        raise DemoError(f"{path}: its meta record is not JSON") from None
    if not isinstance(meta, dict):
        raise DemoError(f"{path}: its meta record is a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != FORMAT:
        raise DemoError(f"{path} has format {meta.get('format')!r:.60}; this version reads {FORMAT!r}")
    missing = [k for k in META_FIELDS if k not in meta]
    if missing:
        raise DemoError(f"{path}: its meta record lacks {', '.join(missing)}")
    bad = [k for k, kind in META_FIELDS.items() if not _meta_value_ok(meta[k], kind)]
    if bad:
        raise DemoError(f"{path}: its meta record holds no valid {', '.join(bad)}")
    stacked = list(meta["frame_shape"]) + ([meta["stack"]] if meta["stack"] > 1 else [])
    if list(meta["obs_shape"]) != stacked:
        raise DemoError(f"{path}: its meta record's obs_shape {meta['obs_shape']} is not frame_shape "
                        f"{meta['frame_shape']} stacked {meta['stack']} times")
    return meta


def _meta_value_ok(value, kind) -> bool:
    positive_int = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1
    if kind == "shape":
        return isinstance(value, list) and all(positive_int(x) for x in value)
    if kind is int:
        return positive_int(value)
    return isinstance(value, kind)


def _demos_from_arrays(path: Path, meta: dict, data: dict[str, np.ndarray]) -> Demos:
    """The arrays, each checked for its kind (numbers / integers) and number of axes."""
    def array(name: str, kinds: str, ndim: int) -> np.ndarray:
        x = data[name]
        if x.dtype.kind not in kinds or x.ndim != ndim:
            want = "integer" if kinds == "iu" else "numeric"
            raise DemoError(f"{path} is damaged: {name} is a {x.dtype} array of shape {x.shape}, not a {want} array "
                            f"with {ndim} ax{'i' if ndim == 1 else 'e'}s")
        return x

    frames = array("frames", "biuf", 1 + len(meta["frame_shape"]))
    if str(frames.dtype) != meta["obs_dtype"]:
        raise DemoError(f"{path} is damaged: its frames are {frames.dtype}, the header says {meta['obs_dtype']}")
    rewards = array("rewards", "iuf", 1).astype(np.float32) if "rewards" in data else None
    return Demos(meta=meta, frames=frames, obs_frame=array("obs_frame", "iu", 1).astype(np.int64),
                 actions=array("actions", "iu", 1).astype(np.int64), rewards=rewards,
                 episode_lengths=array("episode_lengths", "iu", 1).astype(np.int64))


def _check_fit(path: Path, demos: Demos) -> None:
    """The arrays fit together: steps, episodes, frame indices, actions and rewards."""
    n, meta = demos.num_steps, demos.meta
    if n == 0 or demos.num_episodes == 0:
        raise DemoError(f"{path} holds no demonstration steps: record some first "
                        "(python -m rlhp_jax.demos_cli record --run RUN ..., or play: python -m rlhp_jax.human play)")
    problems = []
    if int(demos.episode_lengths.sum()) != n or (demos.episode_lengths < 1).any():
        problems.append("episode lengths do not add up to the number of steps")
    if demos.obs_frame.shape != (n,) or demos.obs_frame.min() < meta["stack"] - 1 \
            or demos.obs_frame.max() >= len(demos.frames):
        problems.append("frame indices point outside the stored frames")
    if tuple(demos.frames.shape[1:]) != tuple(meta["frame_shape"]):
        problems.append(f"frames have shape {demos.frames.shape[1:]}, the header says {meta['frame_shape']}")
    if demos.frames.dtype.kind == "f" and not np.isfinite(demos.frames).all():
        problems.append("frames hold NaN or infinite values")
    if (demos.actions < 0).any() or (demos.actions >= meta["num_actions"]).any():
        problems.append("actions outside the recorded action set")
    if demos.rewards is not None and (demos.rewards.shape != (n,) or not np.isfinite(demos.rewards).all()):
        problems.append("rewards are not one finite number per step")
    if problems:
        raise DemoError(f"{path} is damaged: " + "; ".join(problems))


DEMOS_RECORD = "demos.json"  # in a run directory: which demonstrations the run was made from


@functools.lru_cache(maxsize=64)
def _fingerprint(real: str, mtime_ns: int, size: int) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return dict(sha256=digest.hexdigest(), bytes=size)


def fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """The SHA-256 and size of a demo file (read once per version of the file in a process: a grid
    plans hundreds of runs over the same few files)."""
    st = os.stat(path)
    return _fingerprint(os.path.realpath(path), st.st_mtime_ns, st.st_size)


def record_demos(run_dir: str | os.PathLike, path: str | os.PathLike) -> None:
    """Write :data:`DEMOS_RECORD` in a fresh run's directory: the run's ``config.json`` names its
    demo file by a path (relative to where the command ran), which another directory, or the same
    file recorded again, would make other demonstrations."""
    write_atomic(Path(run_dir) / DEMOS_RECORD, json.dumps(dict(fingerprint(path), path=os.path.abspath(path)),
                                                          indent=2))


def demos_problem(run_dir: str | os.PathLike, path: str | os.PathLike) -> str | None:
    """Why the demo file at ``path`` is not the one the run in ``run_dir`` was made from (its
    :data:`DEMOS_RECORD`), or None (the same bytes; no file at ``path``, or a run from before the
    record: nothing to tell)."""
    record_path = Path(run_dir) / DEMOS_RECORD
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_bytes())
        made_from = str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return f"{record_path} is not the record a run writes"
    try:
        now = fingerprint(path)["sha256"]
    except OSError:  # no file to compare (a grid's --plot-only needs none; a run that reads it says why it cannot)
        return None
    if now != made_from:
        return (f"it was made from demonstrations of SHA-256 {made_from[:12]}… ({record.get('path')}), and {path} "
                f"now holds others ({now[:12]}…)")
    return None


def load_demos(path: str | os.PathLike, env) -> Demos:
    """Read a demo file and check it fits ``env``: same game, frame format, action set and
    score blanking.  Raises :class:`DemoError` saying what differs."""
    demos = read_demos(path)
    fmt, meta = frame_format(env), demos.meta
    if meta["env"] != fmt.env:
        raise DemoError(f"{path} holds demonstrations of {meta['env']}, but this run plays {fmt.env}: "
                        f"record demos of {fmt.env} or choose --env {meta['env']}")
    theirs = FrameFormat(env=meta["env"], obs_shape=tuple(meta["obs_shape"]), frame_shape=tuple(meta["frame_shape"]),
                         stack=int(meta["stack"]), obs_dtype=str(meta["obs_dtype"]),
                         num_actions=int(meta["num_actions"]), mask_sha1=str(meta["mask_sha1"]))
    if (theirs.obs_shape, theirs.stack, theirs.obs_dtype) != (fmt.obs_shape, fmt.stack, fmt.obs_dtype) \
            or str(demos.frames.dtype) != fmt.obs_dtype:
        raise DemoError(f"{path} was recorded as {theirs.describe()}; this run's agent sees {fmt.describe()}. "
                        "Record the demos with this version's environment wrapper.")
    if theirs.num_actions != fmt.num_actions:
        raise DemoError(f"{path} was recorded with {theirs.num_actions} actions and this environment has "
                        f"{fmt.num_actions} (minimal vs full action set?): record with the same action set")
    if theirs.mask_sha1 != fmt.mask_sha1:
        raise DemoError(f"{path} was blanked with another score-area mask than this run's frames: DQfD is "
                        "very sensitive to such differences (Ibarz et al. 2018, H.7). Record the demos again.")
    mask = getattr(env, "score_mask", None)
    if mask is not None and demos.frames[:, np.asarray(mask, bool)].any():
        raise DemoError(f"{path} has pixels inside the score area: its frames were not blanked like the agent's "
                        "(Ibarz et al. 2018, H.7). Record the demos again.")
    return demos


# ---------------------------------------------------------------------------- recording from a policy
def record_policy(env, act: Callable[[np.ndarray, jax.Array], np.ndarray], key: jax.Array, *,
                  episodes: int, max_steps: int, source: str, progress: Callable[[int, int], None] | None = None
                  ) -> DemoRecorder:
    """Record ``episodes`` episodes (at most ``max_steps`` steps in all) of ``act`` in the first
    environment of ``env`` (a ``VecEnv``).  ``act(obs [N, ...], key) -> actions [N]``.

    An episode ends where the task's own episode does (game over, or the time limit); the step
    after it that envpool spends on its deferred reset is not recorded.
    """
    rec = DemoRecorder(frame_format(env), source=source, fps=getattr(env, "fps", None))
    step = jax.jit(env.step)
    key, k_reset = jax.random.split(key)
    state, obs = env.reset(k_reset)
    ends_on_terminate = env.spec.on_terminate == "reset"
    while rec.num_episodes < episodes and rec.num_steps < max_steps:
        key, k_act, k_env = jax.random.split(key, 3)
        obs_np = np.asarray(obs)
        action = np.asarray(act(obs_np, k_act))
        state, out = step(k_env, state, jnp.asarray(action))
        if not bool(out.valid[0]):  # envpool's deferred reset: no transition
            rec.end_episode()
        else:
            rec.add(obs_np[0], int(action[0]), float(out.raw_reward[0]))
            if bool(out.boundary[0]) or (ends_on_terminate and bool(out.terminated[0])):
                rec.end_episode()
        obs = out.obs
        if progress is not None:
            progress(rec.num_episodes, rec.num_steps)
    rec.end_episode()
    return rec


# ---------------------------------------------------------------------------- autolabels
def autolabels(initial_pairs: labels_lib.SegmentPairs, demo_clips: dict[str, np.ndarray]
               ) -> tuple[labels_lib.SegmentPairs, np.ndarray]:
    """Ibarz §2.5 / A.4: every clip of every initial pair paired with a demo clip, the demo preferred.

    ``initial_pairs`` holds k pairs ``[k, 2, T, ...]``; ``demo_clips`` holds 2k clips
    (``obs [2k, T, ...]``, ``action``, ``true_reward``, e.g. from :meth:`Demos.segments`).
    Returns 2k pairs with the demo clip first and μ = 1 (σ¹ ≻ σ²) for every one.
    """
    k, two, t = initial_pairs.obs.shape[:3]
    if demo_clips["obs"].shape[0] != 2 * k or demo_clips["obs"].shape[1] != t:
        raise ValueError(f"autolabels needs {2 * k} demo clips of {t} steps, got {demo_clips['obs'].shape[:2]}")
    flat = lambda x: np.asarray(x).reshape(2 * k, *np.asarray(x).shape[2:])
    pairs = labels_lib.SegmentPairs(
        obs=np.stack([np.asarray(demo_clips["obs"], np.asarray(initial_pairs.obs).dtype), flat(initial_pairs.obs)], 1),
        action=np.stack([np.asarray(demo_clips["action"], np.asarray(initial_pairs.action).dtype),
                         flat(initial_pairs.action)], 1),
        true_reward=np.stack([np.asarray(demo_clips["true_reward"], np.float32), flat(initial_pairs.true_reward)], 1))
    return pairs, np.ones(2 * k, np.float32)


def describe(demos: Demos) -> dict[str, Any]:
    """A summary for people (the ``info`` command)."""
    returns = demos.episode_returns()
    return dict(env=demos.meta["env"], source=demos.meta.get("source"), episodes=demos.num_episodes,
                steps=demos.num_steps, frames_stored=int(demos.frames.shape[0]),
                frame_format=f"{demos.meta['frame_shape']} × stack {demos.meta['stack']} ({demos.meta['obs_dtype']})",
                num_actions=demos.meta["num_actions"],
                episode_returns=None if returns is None else [float(r) for r in returns],
                mean_return=None if returns is None else float(np.mean(returns)), created=demos.meta.get("created"))
