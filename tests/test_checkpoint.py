"""Checkpointer: round trips, pruning, errors, corruption fallback, and SIGKILL at any moment."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlhp_jax.checkpoint import COMMIT_FILE, ORBAX_TMP_SUFFIX, TRASH_PREFIX, CheckpointError, Checkpointer

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- a nested learner-like state
class Batch(NamedTuple):
    obs: jax.Array
    action: np.ndarray


@flax.struct.dataclass
class Learner:
    params: dict
    opt_state: object
    frames: np.ndarray  # uint8
    step: jax.Array  # int32
    key: jax.Array  # jax.random.PRNGKey (raw uint32[2])
    typed_key: jax.Array  # jax.random.key (key<fry>)
    batch: Batch
    scale: float
    name: str = flax.struct.field(pytree_node=False, default="learner")


def make_learner(v: int) -> Learner:
    params = {"dense": {"kernel": jnp.full((3, 4), v, jnp.float32), "bias": jnp.full((4,), -v, jnp.float32)}}
    opt_state = optax.adam(1e-3).init(params)
    return Learner(
        params=params,
        opt_state=opt_state,
        frames=np.full((2, 8, 8), v % 256, np.uint8),
        step=jnp.int32(v),
        key=jax.random.PRNGKey(v),
        typed_key=jax.random.key(v),
        batch=Batch(obs=jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + v, action=np.full(2, v, np.int32)),
        scale=0.5 * v,
    )


def _leaves(tree):
    out = []
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            out.append(("key", str(x.dtype), np.asarray(jax.random.key_data(x))))
        else:
            out.append((type(x).__name__, str(np.asarray(x).dtype), np.asarray(x)))
    return out


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (ta, da, xa), (tb, db, xb) in zip(_leaves(a), _leaves(b), strict=True):
        assert (ta, da, xa.shape) == (tb, db, xb.shape)
        np.testing.assert_array_equal(xa, xb)


def step_dirs(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != "RLHP_CHECKPOINTS")


# ----------------------------------------------------------------------------- basics
def test_orbax_is_imported_by_the_first_save_not_by_a_run_start(tmp_path):
    """The driver and the checkpointer import no orbax (~0.3-0.7 s of a start): the first save
    does, on the checkpoint thread.  The name orbax gives a step being written is ours as a
    constant, so it must be the installed orbax's."""
    from orbax.checkpoint._src.path.atomicity_types import TMP_DIR_SUFFIX

    assert ORBAX_TMP_SUFFIX == TMP_DIR_SUFFIX
    code = ("import sys, jax.numpy as jnp, rlhp_jax.driver, experiments.classic; "
            "from rlhp_jax.checkpoint import Checkpointer; "
            f"c = Checkpointer({str(tmp_path)!r}); assert c.latest_step() is None; assert 'orbax' not in sys.modules; "
            "c.save(1, {'x': jnp.ones(2)}, {}); c.close(); assert 'orbax.checkpoint' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_round_trip_nested_pytree_and_meta(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck")
    state = make_learner(7)
    meta = {"step": 7, "labels": 123, "config": {"env": "cartpole", "lr": 3e-4, "sizes": [64, 64]},
            "np_value": np.float32(1.5)}
    ckpt.save(7, state, meta)
    assert ckpt.all_steps() == [7] and ckpt.latest_step() == 7

    restored, meta2 = Checkpointer(tmp_path / "ck").restore(make_learner(0))
    assert_same(restored, state)
    assert isinstance(restored.frames, np.ndarray) and isinstance(restored.params["dense"]["kernel"], jax.Array)
    assert isinstance(restored.batch, Batch) and isinstance(restored.scale, float)
    assert jnp.issubdtype(restored.typed_key.dtype, jax.dtypes.prng_key)
    # the restored key generates the same numbers as the saved one
    np.testing.assert_array_equal(jax.random.uniform(restored.typed_key, (3,)),
                                  jax.random.uniform(state.typed_key, (3,)))
    assert meta2 == {**meta, "np_value": 1.5}

    # an abstract template (jax.eval_shape) works too
    abstract = jax.eval_shape(lambda: make_learner(0))
    restored2, _ = ckpt.restore(abstract)
    np.testing.assert_array_equal(restored2.params["dense"]["kernel"], state.params["dense"]["kernel"])


def test_restored_arrays_are_committed_as_the_template_was(tmp_path):
    """A fresh state is uncommitted (made without naming a device); orbax hands arrays back committed
    to a device, and jit compiles a committed argument into another program (a sharding annotation):
    a resumed run would miss every program the fresh run left in the compilation cache."""
    ckpt = Checkpointer(tmp_path / "ck")
    state = {"fresh": jnp.arange(3.0), "placed": jax.device_put(jnp.arange(2), jax.devices()[0]),
             "key": jax.random.key(3)}
    assert not state["fresh"].committed and state["placed"].committed and not state["key"].committed
    ckpt.save(1, state, {})
    restored, _ = ckpt.restore(state)
    assert not restored["fresh"].committed and restored["placed"].committed and not restored["key"].committed
    assert jax.random.key_impl(restored["key"]) == jax.random.key_impl(state["key"])
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    np.testing.assert_array_equal(restored["fresh"], state["fresh"])
    f = lambda s: s["fresh"] * 2 + s["placed"].sum()
    assert jax.jit(f).lower(restored).as_text() == jax.jit(f).lower(state).as_text()


def test_keep_prunes_oldest_and_restores_specific_step(tmp_path):
    d = tmp_path / "ck"
    ckpt = Checkpointer(d, keep=2)
    for s in (10, 20, 30, 40):
        ckpt.save(s, make_learner(s), {"step": s})
    assert ckpt.all_steps() == [30, 40]
    assert step_dirs(d) == ["30", "40"]
    state, meta = ckpt.restore(make_learner(0), step=30)
    assert meta["step"] == 30 and ckpt.restored_step == 30
    assert_same(state, make_learner(30))
    state, meta = ckpt.restore(make_learner(0))
    assert meta["step"] == 40
    assert_same(state, make_learner(40))
    with pytest.raises(CheckpointError, match=r"no complete checkpoint of step 10 .*complete steps: \[30, 40\]"):
        ckpt.restore(make_learner(0), step=10)
    # saving an existing step replaces it
    ckpt.save(40, make_learner(41), {"step": 41})
    assert ckpt.restore(make_learner(0))[1]["step"] == 41


@pytest.mark.parametrize("change, expected", [
    (lambda s: s.replace(frames=np.zeros((2, 8, 9), np.uint8)), r"\.frames: checkpoint has uint8\[2,8,8\], template has uint8\[2,8,9\]"),
    (lambda s: s.replace(step=jnp.float32(0)), r"\.step: checkpoint has int32\[\], template has float32\[\]"),
    (lambda s: s.replace(params={"dense": {"kernel": s.params["dense"]["kernel"]}}),
     r"\.params\['dense'\]\['bias'\]: in the checkpoint .* but not in the template"),
    (lambda s: s.replace(batch=(s.batch, jnp.zeros(3))), r"but not in the checkpoint"),
], ids=["shape", "dtype", "leaf_missing_from_template", "other_structure"])
def test_template_mismatch_raises(tmp_path, change, expected):
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(1, make_learner(1), {"step": 1})
    with pytest.raises(CheckpointError, match=expected) as info:
        ckpt.restore(change(make_learner(0)))
    assert str(tmp_path / "ck" / "1") in str(info.value)
    assert "another environment or config" in str(info.value)


def test_no_checkpoint_raises(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpointer(tmp_path / "missing").restore(make_learner(0))
    assert not (tmp_path / "missing").exists()  # restore never creates anything
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        Checkpointer(tmp_path / "empty").restore(make_learner(0))
    assert Checkpointer(tmp_path / "empty").latest_step() is None
    # a step whose commit record never got written (a save killed after orbax's rename)
    ckpt = Checkpointer(tmp_path / "partial")
    ckpt.save(5, make_learner(5), {"step": 5})
    (tmp_path / "partial" / "5" / COMMIT_FILE).unlink()
    assert ckpt.latest_step() is None
    with pytest.raises(CheckpointError, match=r"incomplete ones: \[5\]"):
        ckpt.restore(make_learner(0))


def test_bad_inputs_raise_clear_errors(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"\['name'\] is a str .*meta"):
        ckpt.save(1, {"w": jnp.ones(2), "name": "x"}, {})
    with pytest.raises(CheckpointError, match="JSON"):
        ckpt.save(1, {"w": jnp.ones(2)}, {"f": object()})
    with pytest.raises(CheckpointError, match="non-negative int"):
        ckpt.save(-1, {"w": jnp.ones(2)}, {})
    # an orbax directory we did not write is not ours to clean up
    (tmp_path / "foreign" / "3").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="not written by rlhp_jax"):
        Checkpointer(tmp_path / "foreign").save(4, {"w": jnp.ones(2)}, {})
    assert (tmp_path / "foreign" / "3").exists()


def test_a_checkpoint_of_another_format_says_so_and_is_a_value_error(tmp_path):
    """Commands report ValueErrors in one line: a checkpoint error is one.  A record of another
    format version is named as such, not taken for a damaged record."""
    from rlhp_jax.checkpoint import _record_crc

    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(1, {"w": jnp.ones(2)}, {})
    ckpt.wait()
    record = tmp_path / "ck" / "1" / COMMIT_FILE
    rec = json.loads(record.read_text())
    rec["body"]["format"] = 99
    rec["crc32"] = _record_crc(rec["body"])
    record.write_text(json.dumps(rec))
    assert issubclass(CheckpointError, ValueError)
    with pytest.raises(CheckpointError, match="has format 99, this code reads format") as e:
        Checkpointer(tmp_path / "ck").restore({"w": jnp.ones(2)}, step=1)
    assert "corrupt" not in str(e.value) and "unreadable" not in str(e.value)


def _largest_file(step_dir: Path) -> Path:
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(step_dir: Path):
    p = _largest_file(step_dir)
    os.truncate(p, p.stat().st_size // 2)


def _garble(step_dir: Path):
    p = _largest_file(step_dir)
    with open(p, "r+b") as f:
        f.seek(p.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def _garble_record(step_dir: Path):
    rec = json.loads((step_dir / COMMIT_FILE).read_text())
    rec["body"]["step"] = 1  # valid JSON, wrong content: caught by the record's own CRC
    (step_dir / COMMIT_FILE).write_text(json.dumps(rec))


def _record_names_outside(step_dir: Path):
    """A forged record (its CRC recomputed) that also lists a file outside the step: a restore
    would check, and read, whatever it names (``/dev/zero`` read for ever)."""
    from rlhp_jax.checkpoint import _record_crc

    outside = step_dir.parent.parent / "outside-empty"
    outside.write_bytes(b"")
    rec = json.loads((step_dir / COMMIT_FILE).read_text())
    rec["body"]["files"][str(outside)] = [0, 0]  # an empty file's size and CRC-32: every check passes
    rec["crc32"] = _record_crc(rec["body"])
    (step_dir / COMMIT_FILE).write_text(json.dumps(rec))


def _truncate_orbax_metadata(step_dir: Path):
    (step_dir / "_CHECKPOINT_METADATA").write_text('{"item_hand')


def _delete_meta(step_dir: Path):
    for p in (step_dir / "meta").iterdir():
        p.unlink()


def _link_elsewhere(step_dir: Path):
    """A data file replaced by a link to a file outside with the same bytes: sizes and CRCs pass, yet
    a restore would read whatever the link points at (in a run directory from someone else, a file
    of the user's)."""
    p = _largest_file(step_dir)
    outside = step_dir.parent.parent / f"outside-{p.name}"
    outside.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(outside)


def _step_linked_elsewhere(step_dir: Path):
    """The whole step moved elsewhere and a link left at its name (every file in it as the save
    wrote it): a restore would read a folder outside the run."""
    outside = step_dir.parent.parent / f"outside-step-{step_dir.name}"
    step_dir.rename(outside)
    step_dir.symlink_to(outside, target_is_directory=True)


def _add_a_file(step_dir: Path):
    p = _largest_file(step_dir)
    (p.parent / "extra").write_bytes(b"not written by the save")


@pytest.mark.parametrize("corrupt", [_truncate, _garble, _garble_record, _truncate_orbax_metadata, _delete_meta,
                                     _link_elsewhere, _step_linked_elsewhere, _add_a_file, _record_names_outside])
def test_corrupt_newest_falls_back_to_previous(tmp_path, corrupt):
    d = tmp_path / "ck"
    ckpt = Checkpointer(d, keep=3)
    for s in (1, 2, 3):
        ckpt.save(s, make_learner(s), {"step": s})
    corrupt(d / "3")
    with pytest.warns(UserWarning, match=r"checkpoint .*/3 is corrupt .*falling back to the older step 2"):
        state, meta = ckpt.restore(make_learner(0))
    assert meta == {"step": 2} and ckpt.restored_step == 2
    assert_same(state, make_learner(2))
    with pytest.raises(CheckpointError, match=r"/3 is corrupt"):
        ckpt.restore(make_learner(0), step=3)
    # the run goes on from step 2 and overwrites the corrupt step 3
    ckpt.save(3, make_learner(33), {"step": 33})
    assert ckpt.restore(make_learner(0))[1] == {"step": 33}


def test_one_flipped_bit_in_array_data_is_detected(tmp_path):
    # orbax/TensorStore read this flip back without complaint (1 of 1M values silently wrong);
    # only the CRC-32 of the commit record catches it.
    d = tmp_path / "ck"
    ckpt = Checkpointer(d)
    rng = np.random.default_rng(0)
    states = [{"x": rng.normal(size=(1_000_000,)).astype(np.float32)} for _ in range(2)]
    for s in (1, 2):
        ckpt.save(s, states[s - 1], {"step": s})
    p = _largest_file(d / "2")
    with open(p, "r+b") as f:
        f.seek(p.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.warns(UserWarning, match=r"/2 is corrupt \(file state/.* fails its CRC-32 check"):
        state, meta = ckpt.restore({"x": np.zeros(1_000_000, np.float32)})
    assert meta == {"step": 1}
    np.testing.assert_array_equal(state["x"], states[0]["x"])


def test_background_saves_round_trip_and_copy_numpy_leaves(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", keep=2, background=True)
    frames = np.arange(12, dtype=np.uint8)
    state = {"frames": frames, "w": jnp.arange(3.0)}
    ckpt.save(1, state, {"step": 1})
    frames[:] = 0  # the caller moves on and reuses its buffer: the checkpoint keeps what was saved
    ckpt.save(2, {"frames": frames + 1, "w": jnp.arange(3.0) * 2}, {"step": 2})
    got, meta = ckpt.restore(state, step=1)  # restore waits for the write in flight
    np.testing.assert_array_equal(got["frames"], np.arange(12, dtype=np.uint8))
    got, meta = ckpt.restore(state)
    assert meta == {"step": 2} and ckpt.all_steps() == [1, 2]
    np.testing.assert_array_equal(got["w"], [0.0, 2.0, 4.0])
    ckpt.close()


def test_a_failed_background_save_raises_at_the_next_call(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path / "ck", background=True)

    def fail(*args):
        raise CheckpointError("disk full")

    monkeypatch.setattr(ckpt, "_write", fail)
    ckpt.save(1, {"w": jnp.zeros(2)})  # returns: the write runs on the thread
    with pytest.raises(CheckpointError, match="disk full"):
        ckpt.save(2, {"w": jnp.zeros(2)})  # step 1's failure; step 2 is not started
    ckpt.wait()  # nothing in flight
    ckpt.save(3, {"w": jnp.zeros(2)})
    with pytest.raises(CheckpointError, match="disk full"):
        ckpt.close()


def test_every_checkpoint_corrupt_raises(tmp_path):
    d = tmp_path / "ck"
    ckpt = Checkpointer(d)
    for s in (1, 2):
        ckpt.save(s, make_learner(s), {"step": s})
        _truncate(d / str(s))
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match=r"every complete one is corrupt:\n  step 2: .*truncated.*\n  step 1:"):
        ckpt.restore(make_learner(0))


# ----------------------------------------------------------------------------- SIGKILL at any moment
# Shared by this process and the child that gets killed: a ~`mb` MB state whose every array holds `s`.
STATE_SRC = '''
import flax, jax, jax.numpy as jnp, numpy as np

@flax.struct.dataclass
class Big:
    frames: np.ndarray
    params: jax.Array
    count: jax.Array
    key: jax.Array
    typed_key: jax.Array

def make_state(s, mb):
    n = int(mb * 2**20)
    return Big(frames=np.full(n * 4 // 5, s % 256, np.uint8), params=jnp.full(n // 20, s, jnp.float32),
               count=jnp.int32(s), key=jax.random.PRNGKey(s), typed_key=jax.random.key(s))
'''

CHILD_SRC = STATE_SRC + '''
import os, signal, sys, threading, time, shutil
from rlhp_jax import checkpoint as ckpt

directory, mode, mb, kill_step = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
current = [None]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "during_orbax":   # as soon as orbax has started writing its temporary directory
    def watch():
        tmp = os.path.join(directory, str(kill_step) + ckpt.ORBAX_TMP_SUFFIX)
        while not os.path.exists(tmp):
            time.sleep(0.001)
        time.sleep(0.02)
        die()
    threading.Thread(target=watch, daemon=True).start()
    # On a loaded machine the watcher may be scheduled only after orbax has finished the step: hold
    # orbax's rename of that step back until the kill lands, so the step is never put in place.
    try:
        from orbax.checkpoint._src.path import atomicity
    except ImportError:  # a private module: without it the watcher alone decides (racy under load)
        atomicity = None
    if atomicity is not None:
        orig_finalize = atomicity.AtomicRenameTemporaryPath.finalize
        async def finalize(self, *a, **k):
            if os.path.basename(str(self.get())) == str(kill_step) + ckpt.ORBAX_TMP_SUFFIX:
                time.sleep(60)  # the watcher's SIGKILL arrives first
            return await orig_finalize(self, *a, **k)
        atomicity.AtomicRenameTemporaryPath.finalize = finalize
elif mode == "after_orbax":  # orbax renamed the step directory; no commit record yet
    orig_sync = ckpt._sync_and_checksum
    def sync(step_dir):
        if current[0] == kill_step:
            die()
        return orig_sync(step_dir)
    ckpt._sync_and_checksum = sync
elif mode == "during_commit":  # half of the commit record written to its temporary file
    orig_write = ckpt.write_atomic
    def write(path, text):
        if current[0] == kill_step and path.name == ckpt.COMMIT_FILE:
            with open(path.with_name(".half.tmp"), "w") as f:
                f.write(text[: len(text) // 2])
            die()
        return orig_write(path, text)
    ckpt.write_atomic = write
elif mode == "during_prune":  # an old step renamed to trash and half deleted
    orig_rmtree = shutil.rmtree
    def rmtree(path, *a, **k):
        if current[0] == kill_step and ckpt.TRASH_PREFIX in str(path):
            files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
            for f in files[: len(files) // 2]:
                os.unlink(f)
            die()
        return orig_rmtree(path, *a, **k)
    shutil.rmtree = rmtree

def say(*words):
    """One line in one write: print() writes each word apart when Python runs unbuffered
    (PYTHONUNBUFFERED), and a kill between two writes left a "saved" without its step."""
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())


c = ckpt.Checkpointer(directory, keep=2, background=sys.argv[5] == "1")
start = (c.latest_step() or 0) + 1
say("ready")
for s in range(start, start + 1000):
    current[0] = s
    state = make_state(s, mb)
    say("saving", s)
    c.save(s, state, {"step": s})
    say("saved", s)
'''

_ns: dict = {}
exec(STATE_SRC, _ns)
make_state = _ns["make_state"]


def check_consistent(state, meta, mb):
    s = meta["step"]
    n = int(mb * 2**20)
    assert state.frames.shape == (n * 4 // 5,) and state.frames.dtype == np.uint8
    assert np.all(state.frames == s % 256)
    assert state.params.dtype == jnp.float32 and bool(jnp.all(state.params == s))
    assert int(state.count) == s
    np.testing.assert_array_equal(state.key, jax.random.PRNGKey(s))
    np.testing.assert_array_equal(jax.random.key_data(state.typed_key), jax.random.key_data(jax.random.key(s)))
    return s


def start_child(directory: Path, mode: str, mb: float, kill_step: int = -1, background: bool = False) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD_SRC, str(directory), mode, str(mb), str(kill_step),
                             "1" if background else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"child did not start: {line!r}\n{proc.stderr.read()[-3000:]}")
    return proc


def leftovers(d: Path) -> list[str]:
    """What an interrupted save or deletion left: orbax tmp dirs, uncommitted steps, trash."""
    return [p.name for p in d.iterdir()
            if ORBAX_TMP_SUFFIX in p.name or p.name.startswith(TRASH_PREFIX)
            or (p.name.isdigit() and not (p / COMMIT_FILE).exists())]


@pytest.mark.parametrize("background", [False, True])
def test_sigkill_at_random_moments_leaves_last_complete_checkpoint(tmp_path, background):
    """A save that returned is never lost (with background saves: the one before the last that
    returned, whose write the next save waited for)."""
    mb = 50.0
    d = tmp_path / "ck"
    ckpt = Checkpointer(d, keep=2)
    ckpt.save(1, make_state(1, mb), {"step": 1})
    template = make_state(0, mb)
    rng = random.Random(1234)
    last, interrupted = 1, 0
    # four kills, and more (up to twelve) until one lands inside a save: a kill in the first moments
    # of a save, before orbax has made its directory, leaves no trace to tell it by, and on a loaded
    # machine those moments are long
    for attempt in range(12):
        if attempt >= 4 and interrupted:
            break
        proc = start_child(d, "random", mb, background=background)
        # from the first save on: a loaded machine may spend the child's first second or two building
        # its first state, and a kill there would exercise nothing
        while not proc.stdout.readline().startswith("saving"):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(rng.uniform(0.0, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        out = proc.stdout.read()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
        saved = [int(line.split()[1]) for line in out.splitlines() if line.startswith("saved")]
        interrupted += bool(leftovers(d))

        state, meta = ckpt.restore(template)
        s = check_consistent(state, meta, mb)
        assert s == ckpt.latest_step() >= max(saved + [last + background]) - background  # none lost
        # keep=2, and one more where the kill fell between a save's commit and its pruning of the oldest
        assert len(ckpt.all_steps()) <= 3
        # the run resumes: a further save works and cleans up what the kill left behind
        ckpt.save(s + 1, make_state(s + 1, mb), {"step": s + 1})
        assert leftovers(d) == [] and len(ckpt.all_steps()) <= 2
        last = check_consistent(*ckpt.restore(template), mb)
        assert last == s + 1
    assert interrupted >= 1, "no kill landed inside a save; the test exercised nothing"


@pytest.mark.parametrize("mode, restored", [
    ("during_orbax", 2),   # orbax's temporary directory is half written
    ("after_orbax", 2),    # step 3 renamed into place but not committed
    ("during_commit", 2),  # the commit record half written
    ("during_prune", 3),   # step 3 committed, step 1 half deleted
])
def test_sigkill_at_each_stage_of_a_save(tmp_path, mode, restored):
    mb = 2.0
    d = tmp_path / "ck"
    proc = start_child(d, mode, mb, kill_step=3)
    proc.wait(timeout=60)
    out = proc.stdout.read()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    assert "saved 2" in out and "saved 3" not in out
    assert leftovers(d), "the kill left nothing behind: the hook did not fire where intended"

    ckpt = Checkpointer(d, keep=2)
    state, meta = ckpt.restore(make_state(0, mb))
    assert check_consistent(state, meta, mb) == restored
    assert ckpt.latest_step() == restored
    ckpt.save(restored + 1, make_state(restored + 1, mb), {"step": restored + 1})
    assert leftovers(d) == [] and ckpt.all_steps() == [restored, restored + 1]
    assert check_consistent(*ckpt.restore(make_state(0, mb)), mb) == restored + 1
