"""Importing labeled sets: safe, validated and all-or-nothing.

* Clip paths of an imported file stay inside the file's folder (no absolute or ``..`` path, no
  symlink out of it) and name regular MP4 files; nothing else is copied into a store and served.
* A pair the trainer cannot learn from (no segments, unreadable or mis-shaped arrays) is refused
  when importing into a training run, and skipped, with one warning, by a trainer that finds it in
  its store anyway: no data in a store can make ``--teacher human`` exit, and exit again on restart.
* Every line is checked (file, line, field, what is wanted) before anything is written, and then
  the whole file is written in one transaction: a bad file changes no file and no row.
* An export is self-contained (clips outside its folder are copied beside it) and imports back.
* Property: any corruption of a valid file either imports fully or is refused with one line that
  leaves the store exactly as it was.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhp_jax.human import exchange
from rlhp_jax.human.__main__ import main
from rlhp_jax.human.store import LabelStore
from rlhp_jax.human.teacher import HumanTeacher, save_npz

MP4 = b"\x00\x00\x00\x18ftypmp42"  # how an H.264 MP4 (render.video.encode_mp4) starts: an ISO-BMFF ftyp box
T, OBS = 5, 4  # the segments of these tests: [2, 5] steps of 4-dim observations
SHAPES = dict(obs=(2, T, OBS), action=(2, T), true_reward=(2, T))


def segment_arrays(seed: int = 0, length: int = T, obs_dim: int = OBS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(obs=rng.normal(size=(2, length, obs_dim)).astype(np.float32), action=np.zeros((2, length), np.int32),
                true_reward=rng.normal(size=(2, length)).astype(np.float32))


def npz_b64(**arrays) -> str:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def good_lines(folder: Path, n: int = 2) -> list[dict]:
    """``n`` valid labeled pairs whose clips lie in ``folder/clips``."""
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        for side in ("left", "right"):
            (folder / "clips" / f"{i}-{side}.mp4").write_bytes(MP4 + bytes([i]) * 32)
        lines.append(dict(id=f"q{i}", env="CartPole-v1", created=1000.0 + i, wanted=1, withdrawn=None,
                          left_clip=f"clips/{i}-left.mp4", right_clip=f"clips/{i}-right.mp4",
                          info={"env": "CartPole-v1", "env_steps": 0, "true_returns": [1.0, 0.5]},
                          segments=npz_b64(**segment_arrays(i)),
                          labels=[dict(labeler="ann", choice="left", created=1001.0 + i, offered=1000.5,
                                       response_s=0.5)]))
    return lines


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def snapshot(root: Path, db: Path | None = None):
    """Every row of every table (when there is a database) and every file under ``root`` with its size."""
    rows = None
    if db is not None and db.exists():
        conn = sqlite3.connect(db)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        rows = {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}
        conn.close()
    files = sorted((p.relative_to(root).as_posix(), p.stat().st_size if p.is_file() else None)
                   for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm")))
    return rows, files


def store_snapshot(store: LabelStore):
    return snapshot(store.root, store.path)


def refused(store, path, *needles):
    """Import ``path``; assert a one-line ValueError naming the file and ``needles`` that changed nothing."""
    before = store_snapshot(store)
    with pytest.raises(ValueError) as e:
        exchange.import_jsonl(store, path)
    msg = str(e.value)
    assert "\n" not in msg and Path(path).name in msg, msg
    for needle in needles:
        assert needle in msg, msg
    assert store_snapshot(store) == before
    return msg


# ------------------------------------------------------------------ 1. clip paths
@pytest.mark.parametrize("case", ["absolute", "dotdot", "symlink_out", "directory", "fifo", "not_video", "missing"])
def test_clip_paths_must_name_mp4_files_inside_the_files_folder(tmp_path, case):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    outside = tmp_path / "secret.mp4"  # looks like video: only where it lies makes it wrong
    outside.write_bytes(MP4 + b"secret")
    clip = {"absolute": str(outside), "dotdot": "../secret.mp4", "symlink_out": "clips/link.mp4",
            "directory": "clips", "fifo": "clips/fifo.mp4", "not_video": "clips/notes.mp4",
            "missing": "clips/none.mp4"}[case]
    os.symlink(outside, folder / "clips" / "link.mp4")
    os.mkfifo(folder / "clips" / "fifo.mp4")
    (folder / "clips" / "notes.mp4").write_text("root:x:0:0:root:/root:/bin/bash\n")
    lines[1]["right_clip"] = clip
    store = LabelStore(tmp_path / "store")
    msg = refused(store, write_lines(folder / "set.jsonl", lines), "line 2", "right_clip")
    assert "secret" not in "".join(p.name for p in store.root.rglob("*"))
    if case == "missing":
        assert "not found" in msg


def test_a_symlink_inside_the_folder_to_a_clip_inside_it_is_fine(tmp_path):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    os.symlink(folder / "clips" / "1-left.mp4", folder / "clips" / "alias.mp4")
    lines[1]["left_clip"] = "clips/alias.mp4"
    store = LabelStore(tmp_path / "store")
    assert exchange.import_jsonl(store, write_lines(folder / "set.jsonl", lines))["pairs"] == 2
    assert store.resolve(store.query("q1")["left_clip"]).read_bytes() == MP4 + bytes([1]) * 32


def test_label_queue_refuses_a_path_out_of_its_folder_before_creating_its_store(tmp_path, capsys, monkeypatch):
    def serve_forever(*_):
        raise AssertionError("the page was started for a bad queue")

    monkeypatch.setattr("rlhp_jax.human.__main__.serve_forever", serve_forever)
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[0]["left_clip"] = "/etc/passwd"
    queue = write_lines(folder / "queue.jsonl", lines)
    before = snapshot(folder)
    assert main(["label", "--queue", str(queue), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "line 1" in err and "left_clip" in err
    assert snapshot(folder) == before and not (folder / "queue.sqlite").exists()


# ------------------------------------------------------------------ 2. pairs the trainer cannot learn from
def make_run(root: Path, env: str = "CartPole-v1") -> LabelStore:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"env": env, "label_source": "human"}))
    return LabelStore(root)


def test_a_training_run_refuses_pairs_without_segments_a_display_store_keeps_them(tmp_path):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[1]["segments"] = None
    path = write_lines(folder / "set.jsonl", lines)
    run = make_run(tmp_path / "run")
    refused(run, path, "line 2", "segments")
    plain = LabelStore(tmp_path / "plain")  # no config.json: a display-only store (label --queue, agreement)
    assert exchange.import_jsonl(plain, path)["pairs"] == 2


def test_a_training_run_refuses_pairs_of_another_task(tmp_path):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[1]["env"] = lines[1]["info"]["env"] = "Pendulum-v1"
    refused(make_run(tmp_path / "run"), write_lines(folder / "set.jsonl", lines), "line 2", "env")


@pytest.mark.parametrize("text", ["{damaged", "[]"])
def test_a_training_run_whose_config_cannot_be_read_is_named_and_nothing_is_imported(tmp_path, text):
    path = write_lines(tmp_path / "set" / "set.jsonl", good_lines(tmp_path / "set"))
    store = make_run(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text(text)
    before = store_snapshot(store)
    with pytest.raises(exchange.LabeledSetError, match="config.json: not a run's configuration"):
        exchange.import_jsonl(store, path)
    assert store_snapshot(store) == before


def bad_pairs_store(root: Path) -> tuple[LabelStore, list[str]]:
    """A store with one answer to each of: two good pairs, and every kind of pair a trainer cannot use."""
    store = LabelStore(root)
    (root / "clips").mkdir()
    clip = root / "clips" / "c.mp4"
    clip.write_bytes(MP4)
    good = segment_arrays(0)
    kinds = {
        "good0": good,
        "no_segments": None,
        "corrupt": b"PK\x03\x04 not really a zip",
        "longer": segment_arrays(1, length=T + 1),
        "other_obs": segment_arrays(2, obs_dim=OBS - 1),
        "no_reward": {k: v for k, v in good.items() if k != "true_reward"},
        "nan": dict(good, obs=np.full((2, T, OBS), np.nan, np.float32)),
        "one_segment": {k: v[:1] for k, v in good.items()},
        "good1": segment_arrays(3),
    }
    for qid, arrays in kinds.items():
        seg = None
        if isinstance(arrays, bytes):
            seg = root / f"{qid}.npz"
            seg.write_bytes(arrays)
        elif arrays is not None:
            seg = root / f"{qid}.npz"
            save_npz(seg, **arrays)
        store.add_query(clip, clip, seg, {"env": "CartPole-v1"}, wanted=0, query_id=qid)
        store.add_label(qid, "ann", "left")
    store.add_label("no_segments", "bob", "right")  # a second answer to a bad pair: still one warning
    return store, list(kinds)


@pytest.mark.parametrize("shapes", [SHAPES, None])
def test_the_trainer_skips_answers_it_cannot_train_on_with_one_warning_per_pair(tmp_path, shapes):
    store, kinds = bad_pairs_store(tmp_path)
    teacher = HumanTeacher(tmp_path, "CartPole-v1", store=store, pair_shapes=shapes)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            labels, pairs, mu, cursor = teacher.answers_since(0)
        assert [lab.query_id for lab in labels] == ["good0", "good1"]
        assert {k: v.shape for k, v in pairs.items()} == {k: (2, *s) for k, s in SHAPES.items()}
        assert mu.tolist() == [1.0, 1.0]
        assert cursor == store.labels_since(0)[-1].id  # past the skipped answers: they are never read again
        skipped = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert len(skipped) == len(kinds) - 2
        assert all(any(k in m for m in skipped) for k in kinds if not k.startswith("good"))
        assert teacher.answers_since(cursor)[0] == []
    finally:
        teacher.close()


def test_a_human_taught_run_goes_on_past_a_pair_without_segments(tmp_path):
    """The issue's crash loop: a labeled display-only pair in a ``--teacher human`` run's store."""
    from rlhp_jax.config import RunConfig
    from rlhp_jax.driver import PreferenceRun

    out = tmp_path / "run"
    store = LabelStore(out)
    (out / "clips").mkdir()
    clip = out / "clips" / "c.mp4"
    clip.write_bytes(MP4)
    store.add_query(clip, clip, None, {"env": "CartPole-v1"}, query_id="display-only")
    store.add_label("display-only", "ann", "left")
    seg_len = 25  # CartPole's default segment length
    for i in range(4):  # every answer the run is due is already there: no pair is rendered
        save_npz(out / f"s{i}.npz", **segment_arrays(i, length=seg_len))
        store.add_query(clip, clip, out / f"s{i}.npz", {"env": "CartPole-v1"}, query_id=f"good{i}")
        store.add_label(f"good{i}", "ann", "left" if i % 2 else "right")
    cfg = RunConfig(env="CartPole-v1", total_steps=1024, labels=4, label_source="human", out=str(out),
                    pretrain_steps=5, fit_steps=5, eval_every=100, eval_episodes=1, checkpoint_every=0,
                    correlation_segments=8)
    with pytest.warns(UserWarning, match="display-only"):
        summary = PreferenceRun(cfg, progress=False, log=lambda *_: None).run()
    assert summary["labels"] == 4


# ------------------------------------------------------------------ 3. validated, all or nothing
def _set(path, value):
    """A change to a line: ``path`` like ``labels.0.labeler`` (``value`` DELETE removes the key)."""
    def change(d):
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        if value is DELETE:
            del d[last]
        else:
            d[int(last) if isinstance(d, list) else last] = value
    return change


class _Delete:
    def __repr__(self):
        return "DELETE"


DELETE = _Delete()  # a change that removes the key
npz_without_obs = npz_b64(**{k: v for k, v in segment_arrays().items() if k != "obs"})
npz_three_segments = npz_b64(**{k: np.concatenate([v, v[:1]]) for k, v in segment_arrays().items()})
BAD_FIELDS = [
    ("labels.0.labeler", DELETE, "labels[0].labeler"),
    ("labels.0.labeler", "<script>", "labels[0].labeler"),
    ("labels", "abc", "labels"),
    ("labels", [1, 2], "labels[0]"),
    ("labels.0.choice", "maybe", "labels[0].choice"),
    ("labels.0.created", "yesterday", "labels[0].created"),
    ("labels.0.response_s", float("nan"), "labels[0].response_s"),
    ("labels.0.offered", 10 ** 400, "labels[0].offered"),
    ("wanted", "abc", "wanted"),
    ("wanted", -1, "wanted"),
    ("wanted", 10 ** 30, "wanted"),
    ("info", "xyz", "info"),
    ("info.env_steps", "abc", "info.env_steps"),
    ("info.true_returns", [1, "x"], "info.true_returns"),
    ("created", "yesterday", "created"),
    ("created", float("inf"), "created"),
    ("withdrawn", "soon", "withdrawn"),
    ("env", 5, "env"),
    ("id", "../x", "id"),
    ("id", "q0", "id"),  # line 1's id again
    ("id", DELETE, "id"),
    ("left_clip", 5, "left_clip"),
    ("segments", "not base64!", "segments"),
    ("segments", "", "segments"),
    ("segments", base64.b64encode(b"not a zip").decode(), "segments"),
    ("segments", npz_without_obs, "segments"),
    ("segments", npz_three_segments, "segments"),
]


@pytest.mark.parametrize("key, value, field", BAD_FIELDS, ids=[f"{k}={str(v)[:12]}" for k, v, _ in BAD_FIELDS])
def test_a_bad_field_is_named_and_nothing_is_written(tmp_path, key, value, field):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    _set(key, value)(lines[1])
    store = LabelStore(tmp_path / "store")
    refused(store, write_lines(folder / "set.jsonl", lines), "line 2", field)
    assert store.counts()["queries"] == 0  # line 1 was valid, and is not written either


@pytest.mark.parametrize("text", [b"\xff\xfe{}", b"[1, 2]", b"42", b'{"id": "q9", "left_clip"', b'"a string"'])
def test_a_line_that_is_not_a_json_object_is_named(tmp_path, text):
    folder = tmp_path / "set"
    path = write_lines(folder / "set.jsonl", good_lines(folder))
    path.write_bytes(path.read_bytes() + text + b"\n")
    refused(LabelStore(tmp_path / "store"), path, "line 3")


def test_a_failing_write_leaves_no_row_and_no_copied_file(tmp_path, monkeypatch):
    folder = tmp_path / "set"
    lines = good_lines(folder, n=3)
    path = write_lines(folder / "set.jsonl", lines)
    store = LabelStore(tmp_path / "store")
    before = store_snapshot(store)
    calls = []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args, **kwargs)

    real = store.add_label
    monkeypatch.setattr(store, "add_label", flaky)
    with pytest.raises(ValueError, match="nothing imported"):
        exchange.import_jsonl(store, path)
    assert store_snapshot(store) == before
    monkeypatch.undo()
    assert exchange.import_jsonl(store, path) == dict(pairs=3, labels=3, skipped_pairs=0, skipped_labels=0)


def test_a_store_transaction_commits_all_or_nothing(tmp_path):
    store = LabelStore(tmp_path)
    clip = tmp_path / "c.mp4"
    clip.write_bytes(MP4)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_query(clip, clip, query_id="a")
            store.add_label("a", "ann", "left")
            raise RuntimeError("boom")
    assert store.counts()["queries"] == 0 and store.labels_since(0) == []
    with store.transaction():
        store.add_query(clip, clip, query_id="a")
        with pytest.raises(Exception):
            store.add_label("missing", "ann", "left")  # an inner failure undoes only itself
        store.add_label("a", "ann", "left")
    assert store.counts()["queries"] == 1 and len(store.labels_since(0)) == 1


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "rlhp_jax.human", *map(str, argv)], capture_output=True,
                          text=True, timeout=120)


def test_the_import_command_refuses_a_bad_file_with_one_line_and_changes_nothing(tmp_path):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[1]["labels"][0]["labeler"] = "<script>"
    bad = write_lines(folder / "bad.jsonl", lines)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    before = snapshot(tmp_path)
    p = run_cli("import", "--run", run, "--file", bad)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "bad.jsonl" in p.stderr and "line 2" in p.stderr and "labeler" in p.stderr
    assert snapshot(tmp_path) == before  # not even labels.sqlite was created

    lines[1]["labels"][0]["labeler"] = "bob"
    p = run_cli("import", "--run", run, "--file", write_lines(folder / "good.jsonl", lines))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == dict(pairs=2, labels=2, skipped_pairs=0, skipped_labels=0)


# ------------------------------------------------------------------ exports
def source_store(root: Path, n: int = 2) -> LabelStore:
    store = LabelStore(root)
    (root / "clips").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        clips = []
        for side in ("left", "right"):
            clips.append(root / "clips" / f"{i}-{side}.mp4")
            clips[-1].write_bytes(MP4 + bytes([i, len(side)]) * 16)
        save_npz(root / f"s{i}.npz", **segment_arrays(i))
        store.add_query(*clips, root / f"s{i}.npz", {"env": "CartPole-v1", "true_returns": [1.0, 0.0]},
                        query_id=f"q{i}")
        store.add_label(f"q{i}", "ann", "left", response_s=1.0)
    return store


def test_an_export_outside_the_run_is_self_contained_and_imports_back(tmp_path):
    src = source_store(tmp_path / "run")
    out = tmp_path / "elsewhere" / "set.jsonl"
    assert exchange.export_jsonl(src, out) == 2
    clips = [d[k] for d in exchange.read_jsonl(out) for k in ("left_clip", "right_clip")]
    assert all(c.startswith("set_clips/") for c in clips), clips  # copied beside the file, no ../run/clips
    shutil.move(tmp_path / "elsewhere", tmp_path / "moved")  # travels as one folder
    dst = LabelStore(tmp_path / "dst")
    assert exchange.import_jsonl(dst, tmp_path / "moved" / "set.jsonl")["pairs"] == 2
    for q in ("q0", "q1"):
        for side in ("left", "right"):
            assert dst.resolve(dst.query(q)[f"{side}_clip"]).read_bytes() == \
                src.resolve(src.query(q)[f"{side}_clip"]).read_bytes()


def test_an_export_that_loses_its_name_leaves_no_clips_behind(tmp_path, monkeypatch):
    """A file that appears at the export's name while it writes (another export's) is kept, and
    the clips this export had copied beside it went with it: ``set_clips/`` was left behind."""
    src = source_store(tmp_path / "run")
    out = tmp_path / "elsewhere" / "set.jsonl"
    lines = exchange.pair_lines

    def then_someone_writes(*a, **k):
        yield from lines(*a, **k)
        out.write_text("someone else's labels\n")

    monkeypatch.setattr(exchange, "pair_lines", then_someone_writes)
    with pytest.raises(FileExistsError):
        exchange.export_jsonl(src, out, overwrite=False)
    assert sorted(p.name for p in out.parent.iterdir()) == ["set.jsonl"]
    assert out.read_text() == "someone else's labels\n"


def test_an_export_never_writes_over_another_exports_clips(tmp_path):
    """Two stores exported to one name in one folder: the second replaced the first's clip copies
    (same pair ids, other videos) and so changed what the first set's lines show.  Without
    ``overwrite`` a different copy is refused and kept; the same bytes (the same pair again) are fine."""
    first, second = source_store(tmp_path / "a"), source_store(tmp_path / "b")
    (tmp_path / "b" / "clips" / "1-right.mp4").write_bytes(MP4 + b"another video")
    out = tmp_path / "out" / "set.jsonl"
    exchange.export_jsonl(first, out, overwrite=False)
    copies = {p.name: p.read_bytes() for p in (tmp_path / "out" / "set_clips").iterdir()}
    out.unlink()  # moved away, say: its clips stay
    with pytest.raises(FileExistsError, match="q1-right.mp4 already holds another clip"):
        exchange.export_jsonl(second, out, overwrite=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "set_clips").iterdir()} == copies
    assert not out.exists()
    assert exchange.export_jsonl(first, out, overwrite=False) == 2  # the same pairs again
    assert exchange.export_jsonl(second, out, overwrite=True) == 2
    assert (tmp_path / "out" / "set_clips" / "q1-right.mp4").read_bytes() == MP4 + b"another video"


def test_an_export_inside_the_run_points_at_its_clips(tmp_path):
    src = source_store(tmp_path / "run")
    out = tmp_path / "run" / "set.jsonl"
    exchange.export_jsonl(src, out)
    clips = [d[k] for d in exchange.read_jsonl(out) for k in ("left_clip", "right_clip")]
    assert all(c.startswith("clips/") for c in clips) and not (tmp_path / "run" / "set_clips").exists()
    assert exchange.import_jsonl(src, out) == dict(pairs=0, labels=0, skipped_pairs=2, skipped_labels=2)
    assert exchange.import_jsonl(LabelStore(tmp_path / "dst"), out)["pairs"] == 2


# ------------------------------------------------------------------ property: corrupt files change nothing
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
FIELDS = ["id", "env", "created", "wanted", "withdrawn", "left_clip", "right_clip", "info", "segments", "labels",
          "labels.0", "labels.0.labeler", "labels.0.choice", "labels.0.created", "labels.0.offered",
          "labels.0.response_s", "info.env_steps", "info.true_returns"]
CORRUPTIONS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 2), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("field"), st.integers(0, 2), st.sampled_from(FIELDS), JSON_VALUES | st.just(DELETE)),
    st.tuples(st.just("clip"), st.integers(0, 2), st.sampled_from(["left_clip", "right_clip"]),
              st.sampled_from(["absolute", "dotdot", "symlink_out", "not_video", "directory"])),
    st.tuples(st.just("npz"), st.integers(0, 2), st.floats(0, 1), st.integers(1, 255)),
)


def corrupt_lines(folder: Path, lines: list[dict], outside: Path, change) -> None:
    """A structured change: a field replaced (or removed), a clip path made unsafe, or a byte
    of the segments archive flipped."""
    kind, i, key, value = change
    if kind == "npz":  # one byte of the segments archive flipped (base64 still valid)
        data = bytearray(base64.b64decode(lines[i]["segments"]))
        data[min(int(key * len(data)), len(data) - 1)] ^= value
        lines[i]["segments"] = base64.b64encode(bytes(data)).decode("ascii")
    elif kind == "field":
        try:
            _set(key, value)(lines[i])
        except (KeyError, IndexError, TypeError, ValueError):
            pass  # that field is not there (any more): nothing to change
    elif value == "absolute":
        lines[i][key] = str(outside)
    elif value == "dotdot":
        lines[i][key] = "../" + outside.name
    elif value == "symlink_out":
        link = folder / f"link{i}-{key}.mp4"
        if not link.is_symlink():
            os.symlink(outside, link)
        lines[i][key] = f"link{i}-{key}.mp4"
    elif value == "not_video":
        (folder / f"text{i}.mp4").write_text("just text")
        lines[i][key] = f"text{i}.mp4"
    else:
        lines[i][key] = "set_clips"  # a directory


def corrupt_bytes(data: bytearray, change) -> None:
    """A byte-level change: one line cut short, or one byte flipped."""
    if change[0] == "truncate":
        _, i, at = change
        starts = [0] + [j + 1 for j, b in enumerate(data) if b == ord("\n")]
        lo, hi = starts[i], starts[i + 1] - 1
        del data[lo + int(at * (hi - lo)):hi]
    else:
        _, at, mask = change
        data[min(int(at * len(data)), len(data) - 1)] ^= mask


@given(changes=st.lists(CORRUPTIONS, min_size=1, max_size=3))
def test_a_corrupted_file_imports_fully_or_changes_nothing(changes):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = source_store(tmp / "run", n=3)
        src.add_label("q0", "bob", "right")
        path = tmp / "set" / "set.jsonl"
        exchange.export_jsonl(src, path)
        outside = tmp / "outside.mp4"
        outside.write_bytes(MP4 + b"private")
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for change in changes:
            if change[0] in ("field", "clip", "npz"):
                corrupt_lines(path.parent, lines, outside, change)
        data = bytearray("".join(json.dumps(d) + "\n" for d in lines).encode())
        for change in changes:
            if change[0] in ("truncate", "flip"):
                corrupt_bytes(data, change)
        path.write_bytes(bytes(data))

        store = source_store(tmp / "store", n=1)  # an existing store with a pair of its own
        store.add_label("q0", "cy", "tie")
        before = store_snapshot(store)
        try:
            added = exchange.import_jsonl(store, path)
        except ValueError as e:
            msg = str(e)
            assert "\n" not in msg and "set.jsonl" in msg and "line" in msg, msg
            assert store_snapshot(store) == before
            return
        ids = [json.loads(x)["id"] for x in path.read_text().splitlines() if x.strip()]
        assert added["pairs"] + added["skipped_pairs"] == len(ids)
        for q in ids:
            for side in ("left", "right"):
                assert store.resolve(store.query(q)[f"{side}_clip"]).read_bytes().startswith(MP4)
        teacher = HumanTeacher(store.root, "CartPole-v1", store=store, pair_shapes=SHAPES)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                teacher.answers_since(0)  # whatever was imported, the trainer can read it
        finally:
            teacher.close()
            store.close()
            src.close()


# ------------------------------------------------------------------ files someone else made
def bomb_npz(method, mb: int = 300) -> bytes:
    """A pair's ``.npz`` plus a ``render`` member of ``mb`` MB of zeros compressed with ``method``
    (300 MB deflated: ~300 kB; as bzip2 a few hundred bytes), written in chunks (this test's own
    memory stays low); ``method`` None: the pair alone."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in segment_arrays().items():
            with z.open(f"{k}.npy", "w") as f:
                np.lib.format.write_array(f, v)
        if method is not None:
            z.compression = method
            with z.open("render.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                         "shape": (mb << 18,)})
                chunk = bytes(1 << 20)
                for _ in range(mb):
                    f.write(chunk)
    return buf.getvalue()


@pytest.mark.parametrize("method", ["bzip2", "lzma", "deflate"])
def test_a_compression_bomb_in_a_pair_is_refused_before_it_expands(tmp_path, method):
    """A labeled set from someone else can carry segments of a kilobyte that expand to gigabytes:
    ``import``, ``label --queue`` and ``fit`` would be killed for memory (or kill something else)."""
    import tracemalloc
    import zipfile

    # refused by its method whatever its size (bzip2 expands 1000x more than deflate), by its size if deflated
    data = bomb_npz({"bzip2": zipfile.ZIP_BZIP2, "lzma": zipfile.ZIP_LZMA, "deflate": zipfile.ZIP_DEFLATED}[method],
                    300 if method == "deflate" else 1)
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[1]["segments"] = base64.b64encode(data).decode("ascii")
    path = write_lines(folder / "set.jsonl", lines)
    tracemalloc.start()
    try:
        msg = refused(LabelStore(tmp_path / "store"), path, "line 2", "segments")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ("method numpy does not write" if method != "deflate" else "MiB") in msg
    assert peak < 50 << 20, peak  # bytes: nothing expanded (the deflated bomb holds 300 MB)
    from rlhp_jax.human.teacher import read_segments

    assert set(read_segments(io.BytesIO(bomb_npz(None)))) == set(SHAPES)  # the same writer, no bomb: fine


@pytest.mark.parametrize("case", ["heic", "beside", "not_mp4_name"])
def test_a_clip_must_be_a_video_in_the_set_s_clips_folder(tmp_path, case):
    """A set saved into a Downloads folder must not have the page serve, or the next export send
    back, the photos and videos beside it: a HEIC or AVIF photo starts with an ftyp box too."""
    folder = tmp_path / "Downloads"
    lines = good_lines(folder)
    (folder / "IMG_0001.HEIC").write_bytes(b"\x00\x00\x00\x18ftypheic" + b"photo")
    (folder / "clips" / "IMG_0002.HEIC").write_bytes(b"\x00\x00\x00\x18ftypmif1" + b"photo")
    (folder / "family.mp4").write_bytes(MP4 + b"holiday")
    (folder / "clips" / "x.mov").write_bytes(MP4 + b"movie")
    lines[0]["left_clip"] = {"heic": "clips/IMG_0002.HEIC", "beside": "family.mp4", "not_mp4_name": "clips/x.mov"}[case]
    store = LabelStore(tmp_path / "store")
    refused(store, write_lines(folder / "set.jsonl", lines), "line 1", "left_clip")
    assert not any(b"photo" in p.read_bytes() or b"holiday" in p.read_bytes()
                   for p in store.root.rglob("*") if p.is_file())


def test_an_id_the_store_holds_for_another_pair_is_refused(tmp_path):
    """Answers given about other clips are never attached to the store's pair of the same id; the
    same pair again (a re-import) is skipped as before."""
    folder = tmp_path / "set"
    lines = good_lines(folder)
    store = LabelStore(tmp_path / "store")
    path = write_lines(folder / "set.jsonl", lines)
    assert exchange.import_jsonl(store, path)["pairs"] == 2
    assert exchange.import_jsonl(store, path) == dict(pairs=0, labels=0, skipped_pairs=2, skipped_labels=2)
    other = tmp_path / "other"
    lines = good_lines(other)
    lines[1]["segments"] = npz_b64(**segment_arrays(7))
    lines[1]["labels"] = [dict(labeler="alice", choice="right")]
    refused(store, write_lines(other / "set.jsonl", lines), "line 2", "other clips or segments")
    assert [lab.labeler for lab in store.labels_for("q1")] == ["ann"]


def test_a_pair_for_a_training_run_names_its_task(tmp_path):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[1]["env"] = lines[1]["info"]["env"] = None
    refused(make_run(tmp_path / "run"), write_lines(folder / "set.jsonl", lines), "line 2", "env", "CartPole-v1")


@pytest.mark.parametrize("qid", ["..", ".", "é1", "-x"])
def test_a_pair_id_names_a_url_path_segment(tmp_path, qid):
    folder = tmp_path / "set"
    lines = good_lines(folder)
    lines[0]["id"] = qid
    refused(LabelStore(tmp_path / "store"), write_lines(folder / "set.jsonl", lines), "line 1", "id")
