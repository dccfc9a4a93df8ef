"""Crash-safe checkpoints of a training run: one pytree of arrays plus a JSON ``meta`` dict per step.

Usage::

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, state, {"step": step, "labels": answered, "config": asdict(cfg)})
    ...
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(template_state)   # template: a freshly initialised state
    ckpt.unused()   # True: nothing was ever committed here (a run killed before its first save)

``state`` is any pytree whose leaves are JAX arrays (PRNG keys from ``jax.random.PRNGKey`` and typed
keys from ``jax.random.key`` included), NumPy arrays or NumPy/Python scalars: flax struct
dataclasses, optax states, dicts, NamedTuples, ``None`` subtrees.  ``restore`` returns a state with
exactly the template's pytree structure (its static fields too), dtypes, shapes and leaf types
(NumPy stays NumPy, JAX stays JAX, Python scalars stay Python scalars).

Directory layout::

    directory/
      RLHP_CHECKPOINTS            marks the directory as ours (written before the first step)
      200/                        one orbax step directory per checkpoint (``state/``, ``meta/``, ...)
        rlhp_commit.json          our commit record, written last: makes the step complete
      300.orbax-checkpoint-tmp/   an orbax save in progress (or killed): never read
      .rlhp-trash-100-1a2b3c/     a step being deleted: never read

How a save is made atomic and durable
-------------------------------------
1. orbax (``CheckpointManager``, synchronous) writes the step into ``<step>.orbax-checkpoint-tmp``
   and renames it to ``<step>`` when every item is written.  TensorStore fsyncs the array data
   (``file_io_sync``), but orbax writes its JSON/metadata files without fsync and does not fsync the
   parent directory after the rename, so after a power cut the renamed directory may hold empty or
   missing metadata.  The rename alone does protect against a killed *process* (the page cache
   survives SIGKILL).
2. We then read every file of the step back, computing its size and CRC-32, and ``fsync`` it, then
   fsync every directory of the step and the checkpoint directory itself.
3. We write ``rlhp_commit.json`` (step, a description of every leaf: key path, shape, dtype, the
   file list with sizes and CRCs, and a CRC of the record itself) to a temporary file, fsync it,
   ``os.replace`` it into the step directory and fsync that directory.  Only steps with a valid
   commit record exist for :meth:`Checkpointer.all_steps`, :meth:`latest_step` and
   :meth:`restore`; when ``save`` returns, the checkpoint is on disk.
4. Old steps are pruned only *after* the new one is committed, by an atomic rename to a
   ``.rlhp-trash-*`` name followed by ``rmtree``, so a kill during pruning never leaves a
   half-deleted directory that still looks complete.  (orbax's own ``max_to_keep`` is not used: it
   counts steps that orbax finalised but we have not committed, and so could delete the last
   complete checkpoint in favour of one that is not.)
5. The next ``save`` (never ``restore``, which only reads) removes what a killed process left
   behind: orbax temporary directories (orbax reuses the fixed name ``<step>.orbax-checkpoint-tmp``
   and would refuse to save that step again), uncommitted step directories and trash.

Corruption: ``restore`` checks the commit record's own CRC, then the size and CRC-32 of every file
against the record (about 0.1 s per 500 MB), before orbax reads anything, so a truncated or garbled
file is reported as such instead of being silently restored (orbax happily reads a garbled chunk
and casts a float32 array into a float16 template).  Without an explicit ``step``, a corrupt
checkpoint is skipped with a :func:`warnings.warn` and the next older complete one is restored.

The template is compared with the recorded leaf descriptions *before* orbax is called, because
orbax raises a ValueError for a shape mismatch (after printing asyncio noise) and silently casts
on a dtype mismatch.  A mismatch raises :class:`CheckpointError` listing the differences.

orbax sees the state as a flat dict ``{"00000_params_dense_kernel": leaf, ...}`` (the index keeps
names unique, the rest makes them readable) plus a ``step`` entry, so the pytree classes of the
state never need to be known to orbax and an empty state can still be saved.

One process writes a directory at a time (the driver); any number may read it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import warnings
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlhp_jax.files import fsync_dir, own_folder, refuse_link, write_atomic

# The name orbax gives a step directory while it is being written (orbax-checkpoint 0.12's
# ``TMP_DIR_SUFFIX``; tests/test_checkpoint.py checks it against the installed orbax).  A constant,
# not read from orbax: importing orbax (~0.3-0.7 s, with tensorstore and scipy) is left to the
# first save, on the checkpoint thread, or to a restore, so a fresh run's start does not pay it.
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"

__all__ = ["CheckpointError", "Checkpointer"]

COMMIT_FILE = "rlhp_commit.json"
ROOT_MARKER = "RLHP_CHECKPOINTS"
TRASH_PREFIX = ".rlhp-trash-"
FORMAT_VERSION = 1
_STEP_LEAF = "step"
_MAX_LISTED = 12


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message says which path and what to do.  A
    ``ValueError``, as every other refusal of a user's input is: a command that reports those in one
    line reports this one too."""


class _Corrupt(Exception):
    """Internal: one step's files fail verification (restore falls back to an older step)."""


# ----------------------------------------------------------------------------- leaves
def _leaf_kind(x: Any) -> str | None:
    """How a leaf is stored and given back: 'jax' | 'numpy' | 'npscalar' | 'py' (None: unsupported)."""
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return "jax"
    if isinstance(x, np.ndarray):
        return "numpy" if x.dtype.kind in "biufc" else None
    if isinstance(x, np.generic):
        return "npscalar" if x.dtype.kind in "biufc" else None
    if isinstance(x, (bool, int, float, complex)):
        return "py"
    return None


def _spec(x: Any, kind: str) -> tuple[list[int], str]:
    if kind == "py":
        a = np.asarray(x)
        if a.dtype == object:
            raise OverflowError
        return [], str(a.dtype)
    return [int(d) for d in x.shape], str(x.dtype)


def _name(i: int, path: str) -> str:
    slug = re.sub(r"[^0-9A-Za-z]+", "_", path).strip("_")[:80]
    return f"{i:05d}_{slug}" if slug else f"{i:05d}"


def _flatten(tree: Any, what: str) -> tuple[list[str], list[Any], list[str], list[list], Any]:
    """Names, leaves, kinds and [path, shape, dtype, kind] descriptions of a state or template."""
    try:
        pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    except Exception as e:  # a pytree node whose flatten function fails
        raise CheckpointError(f"cannot flatten the {what} as a pytree: {e}") from e
    names, leaves, kinds, specs = [], [], [], []
    for i, (path, leaf) in enumerate(pairs):
        p = jax.tree_util.keystr(path)
        kind = _leaf_kind(leaf)
        try:
            if kind is None:
                raise TypeError
            shape, dtype = _spec(leaf, kind)
        except (TypeError, OverflowError):
            raise CheckpointError(
                f"the {what} leaf {p or '<root>'} is a {type(leaf).__name__} ({leaf!r:.60}); a checkpointed "
                "state may hold only arrays and numbers. Put other values (strings, config) into `meta`, "
                "or mark them as static fields (flax.struct.field(pytree_node=False))."
            ) from None
        names.append(_name(i, p))
        leaves.append(leaf)
        kinds.append(kind)
        specs.append([p, shape, dtype, kind])
    return names, leaves, kinds, specs, treedef


def _to_orbax(leaf: Any, kind: str) -> Any:
    """What orbax is given to save (or as a restore template) for one leaf."""
    if kind in ("py", "npscalar"):
        return np.asarray(leaf)
    return leaf


def _from_orbax(value: Any, template: Any, kind: str) -> Any:
    if kind == "py":
        return type(template)(np.asarray(value).item())
    if kind == "npscalar":
        return np.asarray(value, dtype=template.dtype)[()]
    if kind == "numpy":
        return np.asarray(value)
    if isinstance(template, jax.Array) and not template.committed:
        # orbax places each array on the template's device, committed there; the fresh state a run
        # saves is uncommitted (created without naming a device), and jit lowers a committed
        # argument with a sharding annotation the fresh run's programs lack.  A resumed run would
        # then miss every program in the compilation cache and compile it all again (7.7 s of
        # compiling on resuming a small CartPole run, 0.95 s without; BUILD_NOTES, Pitfalls).
        # Restored as the fresh state was made: uncommitted.
        return _uncommitted(value)
    return value if isinstance(value, jax.Array) else jax.numpy.asarray(value)


def _uncommitted(value: jax.Array) -> jax.Array:
    """``value`` copied through the host into an array on the default device, not committed to it
    (a typed PRNG key through its key data)."""
    if jax.numpy.issubdtype(value.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_uncommitted(jax.random.key_data(value)), impl=jax.random.key_impl(value))
    return jax.numpy.asarray(np.asarray(value))


def _fmt(shape, dtype) -> str:
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def _compatible(saved: list, template: list) -> bool:
    """Same shape and dtype; a Python scalar on either side matches any scalar of its kind (float, int,
    bool), since ``jax.eval_shape`` turns a Python float leaf into a float32 ShapeDtypeStruct."""
    (_, s_shape, s_dtype, s_kind), (_, t_shape, t_dtype, t_kind) = saved, template
    if list(s_shape) != list(t_shape):
        return False
    if s_dtype == t_dtype:
        return True
    if "py" in (s_kind, t_kind) and not s_shape:
        try:
            return np.dtype(s_dtype).kind == np.dtype(t_dtype).kind
        except TypeError:  # a PRNG key dtype
            return False
    return False


def _differences(saved: list[list], template: list[list]) -> list[str]:
    """Human-readable differences between the recorded leaf specs and the template's."""
    s = {x[0]: x for x in saved}
    t = {x[0]: x for x in template}
    out = []
    for p, spec in t.items():
        shape, dtype = spec[1], spec[2]
        if p not in s:
            out.append(f"{p or '<root>'}: in the template ({_fmt(shape, dtype)}) but not in the checkpoint")
        elif not _compatible(s[p], spec):
            out.append(f"{p or '<root>'}: checkpoint has {_fmt(*s[p][1:3])}, template has {_fmt(shape, dtype)}")
    out += [f"{p or '<root>'}: in the checkpoint ({_fmt(*v[1:3])}) but not in the template"
            for p, v in s.items() if p not in t]
    if not out and [x[0] for x in saved] != [x[0] for x in template]:
        out.append("the leaves are the same but in another order (a differently ordered container)")
    return out


# ----------------------------------------------------------------------------- files
def _json_default(x):
    if isinstance(x, (np.generic, np.ndarray)) and np.ndim(x) == 0:
        return x.item()
    if isinstance(x, (np.ndarray, jax.Array)):
        return np.asarray(x).tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def _crc_file(path: Path, fsync: bool = False) -> tuple[int, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return size, crc


def _sync_and_checksum(step_dir: Path) -> dict[str, list[int]]:
    """fsync every file and directory below ``step_dir``; {relative path: [size, crc32]}."""
    files: dict[str, list[int]] = {}
    dirs = []
    for root, _, names in os.walk(step_dir):
        dirs.append(Path(root))
        for n in sorted(names):
            p = Path(root) / n
            if n == COMMIT_FILE and p.parent == step_dir:
                continue
            files[p.relative_to(step_dir).as_posix()] = list(_crc_file(p, fsync=True))
    for d in reversed(dirs):
        fsync_dir(d)
    return files


def _record_crc(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _is_step_name(name: str) -> bool:
    return name.isascii() and name.isdigit()


# ----------------------------------------------------------------------------- the checkpointer
class Checkpointer:
    """Saves and restores numbered checkpoints of a pytree ``state`` and a JSON ``meta`` in ``directory``.

    ``keep``: how many of the newest complete checkpoints to keep (``None``: all).  ``save`` is
    synchronous: when it returns, the checkpoint is complete and fsynced; with ``background=True``
    it returns at once and the write runs on a thread, complete when the next ``save``, ``wait``,
    ``restore`` or ``close`` returns (the trainer's checkpoints: see ``save``).  See the module docstring
    for the atomicity and corruption guarantees.  After a ``restore``, ``restored_step`` tells
    which step it was (it may be older than ``latest_step()`` if a newer one was corrupt).
    """

    def __init__(self, directory: str | os.PathLike, keep: int | None = 3, background: bool = False):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise CheckpointError(f"keep must be a positive int or None (keep all), got {keep!r}")
        self.directory = Path(directory).absolute()
        refuse_link(self.directory, "folder")  # read or written: either way another place than the run's
        self.keep = keep
        self.background = background
        self.restored_step: int | None = None
        self._manager = None
        self._pool = None  # the one writer thread of background saves
        self._pending = None  # the background save in flight (a Future)

    def __repr__(self) -> str:
        return f"Checkpointer({str(self.directory)!r}, keep={self.keep})"

    # ------------------------------------------------------------------ listing
    def _step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def _step_dirs(self) -> dict[int, Path]:
        if not self.directory.is_dir():
            return {}
        return {int(p.name): p for p in self.directory.iterdir() if _is_step_name(p.name) and p.is_dir()}

    def all_steps(self) -> list[int]:
        """Steps with a complete (committed) checkpoint, oldest first.  Files are not verified here."""
        return sorted(s for s, p in self._step_dirs().items() if (p / COMMIT_FILE).is_file())

    def latest_step(self) -> int | None:
        """The newest committed step, or None if there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def unused(self) -> bool:
        """True when no checkpoint was ever committed here and nothing foreign is in the way: the
        directory does not exist, or holds no committed step and is either ours (the marker:
        what a save killed before its commit leaves — orbax temporaries, an uncommitted step,
        trash) or holds no step directory at all.  A run killed before its first checkpoint
        looks like this; its next ``save`` cleans the leftovers up."""
        if not self.directory.exists():
            return True
        if not self.directory.is_dir() or self.all_steps():
            return False
        return (self.directory / ROOT_MARKER).is_file() or not self._step_dirs()

    # ------------------------------------------------------------------ orbax
    def _orbax(self):
        import orbax.checkpoint as ocp

        if self._manager is None:
            options = ocp.CheckpointManagerOptions(
                enable_async_checkpointing=False,  # save() must be durable when it returns
                max_to_keep=None,  # we prune ourselves, counting only committed steps
                create=False,
                save_root_metadata=False,
                cleanup_tmp_directories=False,  # we clean up, and only when saving
            )
            self._manager = ocp.CheckpointManager(self.directory, item_names=("state", "meta"), options=options)
        else:
            self._manager.reload()  # another process (or our pruning) may have changed the directory
        return self._manager, ocp

    def close(self) -> None:
        """Finishes a background save (raising its error), then releases orbax's resources
        (threads); the object stays usable."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._manager is not None:
                self._manager.close()
                self._manager = None

    def wait(self) -> None:
        """Until the background save in flight (if any) is committed; raises its
        :class:`CheckpointError` if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: Any, meta: dict | None = None) -> Path:
        """Writes checkpoint ``step`` of ``state`` with ``meta`` and returns its directory.

        Durable when it returns — or, with ``background=True``, when the next ``save``,
        ``wait``, ``restore`` or ``close`` returns: the write runs on one thread beside the
        caller (JAX arrays are immutable; NumPy leaves are copied first), a save first waits for
        the one before it, and a failed write raises there.  A process killed mid-write leaves
        an uncommitted step, which is never read: the previous checkpoint stands.  An existing
        checkpoint of the same step is replaced; older ones beyond ``keep`` are deleted after
        the new one is committed.
        """
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
            raise CheckpointError(f"step must be a non-negative int, got {step!r}")
        step = int(step)
        try:
            meta_json = json.loads(json.dumps({} if meta is None else meta, default=_json_default,
                                              allow_nan=True))
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"meta for step {step} must be JSON-serializable (numbers, strings, "
                                  f"lists, dicts): {e}") from e
        if not isinstance(meta_json, dict):
            raise CheckpointError(f"meta must be a dict, got {type(meta).__name__}")
        names, leaves, kinds, specs, _ = _flatten(state, "state")
        items = {n: _to_orbax(x, k) for n, x, k in zip(names, leaves, kinds)}
        items[_STEP_LEAF] = np.asarray(step, np.int64)
        self.wait()
        if not self.background:
            return self._write(step, items, meta_json, names, specs)
        items = {n: np.array(x, copy=True) if isinstance(x, np.ndarray) else x for n, x in items.items()}
        if self._pool is None:
            import concurrent.futures

            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending = self._pool.submit(self._write, step, items, meta_json, names, specs)
        return self._step_dir(step)

    def _write(self, step: int, items: dict, meta_json: dict, names: list, specs: list) -> Path:
        self._prepare_directory()
        committed = self.all_steps()
        if step in committed:
            self._discard(self._step_dir(step))
        elif committed and step < committed[-1]:
            warnings.warn(f"saving step {step} to {self.directory}, which already holds the newer step "
                          f"{committed[-1]}; latest_step() and restore() will still return that one",
                          stacklevel=2)

        manager, ocp = self._orbax()
        step_dir = self._step_dir(step)
        try:
            saved = manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(items),
                                                               meta=ocp.args.JsonSave(meta_json)), force=True)
            manager.wait_until_finished()
        except Exception as e:
            raise CheckpointError(f"saving step {step} to {step_dir} failed: {type(e).__name__}: {e} "
                                  "(check free disk space and permissions; the partial files are removed "
                                  "by the next save)") from e
        if not saved or not step_dir.is_dir():
            raise CheckpointError(f"orbax did not write step {step} to {step_dir}")

        files = _sync_and_checksum(step_dir)
        fsync_dir(self.directory)  # persists orbax's rename of the temporary directory
        body = {"format": FORMAT_VERSION, "step": step, "time": time.time(), "leaves": specs,
                "names": names, "files": files}
        write_atomic(step_dir / COMMIT_FILE, json.dumps({"body": body, "crc32": _record_crc(body)}))
        self._prune()
        return step_dir

    def _prepare_directory(self) -> None:
        """Creates or checks the directory and removes what interrupted saves and deletions left."""
        marker = self.directory / ROOT_MARKER
        refuse_link(self.directory, "folder")  # a run's checkpoints are its own: pruning through a link deletes others'
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(f"{self.directory} exists and is not a directory")
        if not marker.is_file():
            foreign = sorted(self._step_dirs())
            if foreign:
                raise CheckpointError(
                    f"{self.directory} already holds step directories {foreign[:_MAX_LISTED]} that were not "
                    "written by rlhp_jax.checkpoint (no RLHP_CHECKPOINTS file); refusing to save there, "
                    "since interrupted saves would be cleaned up. Use another directory.")
            own_folder(self.directory)
            fsync_dir(self.directory.parent)
            write_atomic(marker, f"rlhp_jax checkpoints, format {FORMAT_VERSION}\n")
        for p in list(self.directory.iterdir()):
            if p.name.startswith(TRASH_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.startswith(f".{ROOT_MARKER}.") and p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)  # a marker write that was interrupted
            elif ORBAX_TMP_SUFFIX in p.name or (_is_step_name(p.name) and p.is_dir()
                                                 and not (p / COMMIT_FILE).is_file()):
                self._discard(p)

    def _discard(self, path: Path) -> None:
        """Deletes a step directory so that no kill can leave it half-deleted under its own name."""
        trash = self.directory / f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
        os.replace(path, trash)
        fsync_dir(self.directory)
        shutil.rmtree(trash, ignore_errors=True)

    def _prune(self) -> None:
        if self.keep is None:
            return
        steps = self.all_steps()
        for s in steps[: max(len(steps) - self.keep, 0)]:
            self._discard(self._step_dir(s))

    # ------------------------------------------------------------------ restore
    def restore(self, template_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Returns ``(state, meta)`` of checkpoint ``step`` (default: the newest valid one).

        ``template_state`` gives the structure, shapes, dtypes and leaf types (a freshly
        initialised state, or its ``jax.eval_shape``).  Raises :class:`CheckpointError` if there
        is no checkpoint, if the checkpoint does not match the template, or if ``step`` (or every
        checkpoint, when ``step`` is None) is corrupt.  A corrupt newest checkpoint is skipped with
        a warning when ``step`` is None.
        """
        self.wait()
        names, leaves, kinds, specs, treedef = _flatten(template_state, "template")
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(self._nothing_message())
            candidates = steps[::-1]
        else:
            if step not in steps:
                raise CheckpointError(
                    f"no complete checkpoint of step {step} in {self.directory}"
                    + (f"; complete steps: {steps}" if steps else f" ({self._nothing_message()})"))
            candidates = [step]

        failures = []
        for s in candidates:
            try:
                record = self._read_record(s)
                diff = _differences(record["leaves"], specs)
                if diff:
                    shown = "\n  ".join(diff[:_MAX_LISTED])
                    more = f"\n  ... and {len(diff) - _MAX_LISTED} more" if len(diff) > _MAX_LISTED else ""
                    raise CheckpointError(
                        f"checkpoint {self._step_dir(s)} does not match the template state "
                        f"({len(diff)} difference{'s' if len(diff) > 1 else ''}):\n  {shown}{more}\n"
                        "It was probably written by a run with another environment or config. Restore with "
                        "a template built from that run's config, or start the new run in another directory.")
                self._verify_files(s, record)
                state, meta = self._restore_verified(s, record, names, leaves, kinds, treedef)
            except _Corrupt as e:
                failures.append(f"step {s}: {e}")
                if step is not None:
                    raise CheckpointError(f"checkpoint {self._step_dir(s)} is corrupt: {e}. "
                                          f"Restore another step (complete steps: {steps}).") from None
                older = [x for x in candidates if x < s]
                warnings.warn(f"checkpoint {self._step_dir(s)} is corrupt ({e}); "
                              + (f"falling back to the older step {older[0]}" if older
                                 else "and there is no older one"), stacklevel=2)
                continue
            self.restored_step = s
            return state, meta
        raise CheckpointError(f"no valid checkpoint in {self.directory}; every complete one is corrupt:\n  "
                              + "\n  ".join(failures))

    def _nothing_message(self) -> str:
        if not self.directory.exists():
            return f"no checkpoint: {self.directory} does not exist"
        partial = sorted(s for s, p in self._step_dirs().items() if not (p / COMMIT_FILE).is_file())
        tmp = [p.name for p in self.directory.iterdir() if ORBAX_TMP_SUFFIX in p.name]
        msg = f"no complete checkpoint in {self.directory}"
        if partial or tmp:
            msg += (f" (found incomplete ones: {partial + tmp}, left by an interrupted save or written by "
                    "another tool; they are never restored)")
        return msg + "; start the run from scratch or point to the right directory"

    def _read_record(self, step: int) -> dict:
        path = self._step_dir(step) / COMMIT_FILE
        try:
            outer = json.loads(path.read_text(encoding="utf-8"))
            body = outer["body"]
            if outer["crc32"] != _record_crc(body):
                raise _Corrupt(f"{path} fails its checksum")
            if body["format"] != FORMAT_VERSION:
                raise CheckpointError(f"{path} has format {body['format']}, this code reads format "
                                      f"{FORMAT_VERSION}; use the rlhp_jax version that wrote it")
            if body["step"] != step or len(body["names"]) != len(body["leaves"]):
                raise _Corrupt(f"{path} is inconsistent")
            return body
        except CheckpointError:
            raise  # (a ValueError too: not to be taken for a damaged record)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _Corrupt(f"unreadable commit record {path}: {type(e).__name__}: {e}") from None

    def _verify_files(self, step: int, record: dict) -> None:
        step_dir = self._step_dir(step)
        if step_dir.is_symlink():  # os.walk would follow it: the step itself must be what the save wrote
            raise _Corrupt(f"{step_dir.name} is a symbolic link, which no save writes")
        found = set()
        for root, dirs, names in os.walk(step_dir):  # exactly what the commit wrote: nothing added, no link
            for n in dirs + names:
                p = Path(root) / n
                rel = p.relative_to(step_dir).as_posix()
                if p.is_symlink():
                    raise _Corrupt(f"{rel} is a symbolic link, which no save writes")
                if n in names and rel not in record["files"] and rel != COMMIT_FILE:
                    raise _Corrupt(f"file {rel} was not written by the save its commit record describes")
                if n in names:
                    found.add(rel)
        for rel in record["files"]:  # and nothing else: a record naming /dev/zero or ../x is no save's
            if rel not in found:
                raise _Corrupt(f"its record names {rel!r}, which the step does not hold")
        for rel, (size, crc) in record["files"].items():
            p = step_dir / rel
            try:
                actual = p.stat().st_size
            except OSError:
                raise _Corrupt(f"file {rel} is missing") from None
            if actual != size:
                raise _Corrupt(f"file {rel} has {actual} bytes, {size} were written (truncated?)")
            if _crc_file(p)[1] != crc:
                raise _Corrupt(f"file {rel} fails its CRC-32 check (garbled)")

    def _restore_verified(self, step, record, names, leaves, kinds, treedef):
        manager, ocp = self._orbax()
        saved_names = record["names"]  # same paths in the same order as the template (checked)
        template = {n: _to_orbax(x, k) for n, x, k in zip(saved_names, leaves, kinds)}
        template[_STEP_LEAF] = np.asarray(step, np.int64)
        try:
            out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(template),
                                                                meta=ocp.args.JsonRestore()))
            flat, meta = out["state"], out["meta"]
            values = [flat[n] for n in saved_names]
        except Exception as e:  # the files passed their checksums: an orbax-level inconsistency
            raise _Corrupt(f"orbax could not read it: {type(e).__name__}: {str(e)[:300]}") from None
        if int(np.asarray(flat[_STEP_LEAF])) != step or not isinstance(meta, dict):
            raise _Corrupt("its contents belong to another step")
        restored = [_from_orbax(v, t, k) for v, t, k in zip(values, leaves, kinds)]
        for t, v, k in zip(leaves, restored, kinds):  # defensive: orbax must honour the template
            if _spec(v, k) != _spec(t, k):
                raise _Corrupt(f"a leaf came back as {_fmt(*_spec(v, k))}, expected {_fmt(*_spec(t, k))}")
        return jax.tree_util.tree_unflatten(treedef, restored), meta
