"""The label store: leases, idempotent answers, durability under SIGKILL, JSONL in and out."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rlhp_jax.human import exchange
from rlhp_jax.human.store import MU, BadLease, LabelStore, QueryWithdrawn, StoreError, UnknownQuery
from rlhp_jax.human.teacher import save_npz


MP4 = b"\x00\x00\x00\x18ftypmp42"


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def make_store(tmp_path, n=3, wanted=1, clock=None, segments=False):
    store = LabelStore(tmp_path, clock=clock or Clock())
    (tmp_path / "clips").mkdir(exist_ok=True)
    ids = []
    for i in range(n):
        left, right = tmp_path / "clips" / f"{i}-l.mp4", tmp_path / "clips" / f"{i}-r.mp4"
        left.write_bytes(MP4 + b"L%d" % i)  # imports take only files that start like an MP4
        right.write_bytes(MP4 + b"R%d" % i)
        seg = None
        if segments:
            seg = tmp_path / f"seg{i}.npz"
            rng = np.random.default_rng(i)
            save_npz(seg, obs=rng.normal(size=(2, 5, 4)).astype(np.float32), action=np.zeros((2, 5), np.int32),
                     true_reward=rng.normal(size=(2, 5)).astype(np.float32), render=np.zeros((2, 5, 0), np.float32))
        ids.append(store.add_query(left, right, seg, info={"env": "CartPole-v1", "true_returns": [1.0 + i, 0.5]},
                                   wanted=wanted, query_id=f"q{i}"))
    return store, ids


def test_a_pair_is_leased_to_one_labeler_at_a_time_and_reoffered_when_the_lease_lapses(tmp_path):
    clock = Clock()
    store, ids = make_store(tmp_path, n=2, clock=clock)
    a = store.lease("ann", lease_s=60)
    b = store.lease("bob", lease_s=60)
    assert a.query_id == ids[0] and b.query_id == ids[1]  # bob is not given ann's pair
    assert store.lease("cy", lease_s=60) is None  # both pairs are out
    assert store.lease("ann", lease_s=60).token == a.token  # a reload gives ann the same pair
    clock.t += 61
    c = store.lease("cy", lease_s=60)
    assert c.query_id == ids[0] and c.token != a.token  # ann's lapsed: offered again


def test_answers_are_idempotent_and_a_late_answer_counts_only_if_no_one_answered(tmp_path):
    clock = Clock()
    store, ids = make_store(tmp_path, n=2, clock=clock)
    a = store.lease("ann", lease_s=10)
    clock.t += 3
    first = store.submit(a.query_id, a.token, "left")
    assert first.recorded and first.label.choice == "left" and first.label.response_s == pytest.approx(3.0)
    again = store.submit(a.query_id, a.token, "right")  # a double click, or a retried request
    assert not again.recorded and again.label.choice == "left"
    assert [lab.choice for lab in store.labels_since(0)] == ["left"]

    b = store.lease("bob", lease_s=10)  # ids[1]
    clock.t += 11  # bob's lease lapses
    c = store.lease("cy", lease_s=10)
    assert c.query_id == b.query_id
    late = store.submit(b.query_id, b.token, "tie")  # bob answers late, before cy: kept
    assert late.recorded
    after = store.submit(c.query_id, c.token, "right")  # cy is now too late
    assert not after.recorded and after.label is None
    assert [(lab.labeler, lab.choice) for lab in store.labels_since(1)] == [("bob", "tie")]


def test_bad_submissions_raise_and_write_nothing(tmp_path):
    store, ids = make_store(tmp_path, n=2)
    a = store.lease("ann")
    with pytest.raises(UnknownQuery):
        store.submit("nope", a.token, "left")
    with pytest.raises(BadLease):
        store.submit(ids[1], a.token, "left")  # a lease of another pair
    with pytest.raises(BadLease):
        store.submit(ids[0], "forged", "left")
    with pytest.raises(StoreError):
        store.submit(ids[0], a.token, "up")
    store.withdraw([ids[0]])
    with pytest.raises(QueryWithdrawn):
        store.submit(ids[0], a.token, "left")
    assert store.labels_since(0) == []
    assert store.lease("bob").query_id == ids[1]  # withdrawn pairs are not offered


def test_every_labeler_answers_each_pair_when_wanted_is_zero(tmp_path):
    store, ids = make_store(tmp_path, n=2, wanted=0)
    for name in ("ann", "bob"):
        for _ in ids:
            o = store.lease(name)
            assert store.submit(o.query_id, o.token, "left").recorded
        assert store.lease(name) is None
    assert len(store.labels_since(0)) == 4
    assert store.counts("ann")["queued_for_me"] == 0 and store.counts()["open"] == 2  # still open for newcomers


def test_paths_cannot_leave_the_root(tmp_path):
    store = LabelStore(tmp_path / "run")
    outside = tmp_path / "secret.mp4"
    outside.write_bytes(b"x")
    with pytest.raises(StoreError):
        store.add_query(outside, outside)
    with pytest.raises(StoreError):
        store.add_query("../secret.mp4", "a.mp4")
    with pytest.raises(UnknownQuery):
        store.resolve("../secret.mp4")
    link = tmp_path / "run" / "link.mp4"
    link.symlink_to(outside)
    with pytest.raises(StoreError):  # a symlink pointing out is outside too
        store.add_query(link, link)


def test_bad_labeler_names_are_refused(tmp_path):
    store, _ = make_store(tmp_path, n=1)
    for name in ("", "x" * 65, "<script>", "a/b"):
        with pytest.raises(StoreError):
            store.lease(name)


_WRITER = textwrap.dedent("""
    import os, sys, time
    from rlhp_jax.human.store import LabelStore
    store = LabelStore(sys.argv[1])
    name = sys.argv[2]
    while not os.path.exists(os.path.join(sys.argv[1], "go")):  # start together
        time.sleep(0.005)
    while True:
        offer = store.lease(name, lease_s=600)
        if offer is None:
            print("done", flush=True)
            break
        r = store.submit(offer.query_id, offer.token, "left")
        print("ack", offer.query_id, int(r.recorded), flush=True)
        time.sleep(0.002)  # people pause between answers (SQLite's lock is not fair to a writer that never does)
""")


def _writers(tmp_path, n):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), f"w{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    time.sleep(1.0)  # let them import and open the store
    (tmp_path / "go").touch()
    return procs


def test_many_processes_labeling_at_once_lose_and_duplicate_nothing(tmp_path):
    store, ids = make_store(tmp_path, n=200)
    procs = _writers(tmp_path, 4)
    acks = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        acks += [line.split() for line in out.splitlines() if line.startswith("ack")]
    recorded = [a[1] for a in acks if a[2] == "1"]
    labels = store.labels_since(0)
    assert sorted(recorded) == sorted(ids)  # every pair acknowledged exactly once
    assert sorted(lab.query_id for lab in labels) == sorted(ids)  # and stored exactly once
    assert len({lab.labeler for lab in labels}) > 1  # they really ran side by side


def test_sigkill_loses_no_acknowledged_label_and_the_queue_resumes(tmp_path):
    store, ids = make_store(tmp_path, n=400)
    (p,) = _writers(tmp_path, 1)
    acked = []
    deadline = time.monotonic() + 60
    while len(acked) < 20 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith("ack"):
            acked.append(line.split()[1])
    os.kill(p.pid, signal.SIGKILL)  # mid-stream: probably inside a transaction
    p.wait()
    assert len(acked) == 20
    fresh = LabelStore(tmp_path)
    assert fresh._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {lab.query_id for lab in fresh.labels_since(0)}
    assert set(acked) <= stored
    assert len(fresh.labels_since(0)) == len(stored)
    # the killed labeler's lease is long (600 s) but the queue goes on for everyone else
    offer = fresh.lease("after")
    assert offer is not None and offer.query_id not in stored
    assert len(fresh.open_queries()) == 400 - len(stored)


def test_jsonl_round_trip_keeps_pairs_answers_and_segments(tmp_path):
    src, ids = make_store(tmp_path / "a", n=3, segments=True)
    for name, choice in (("ann", "left"), ("bob", "cant_tell")):
        src.add_label(ids[0], name, choice, response_s=1.5)
    src.add_label(ids[1], "ann", "tie")
    src.withdraw([ids[2]])
    out = tmp_path / "elsewhere" / "labels.jsonl"
    assert exchange.export_jsonl(src, out) == 3

    dst = LabelStore(tmp_path / "b")
    added = exchange.import_jsonl(dst, out)
    assert added == dict(pairs=3, labels=3, skipped_pairs=0, skipped_labels=0)
    assert exchange.import_jsonl(dst, out)["skipped_labels"] == 3  # idempotent
    got = [(lab.query_id, lab.labeler, lab.choice, lab.response_s) for lab in dst.labels_since(0)]
    assert got == [(ids[0], "ann", "left", 1.5), (ids[0], "bob", "cant_tell", 1.5), (ids[1], "ann", "tie", None)]
    assert dst.query(ids[2])["withdrawn"] is not None and dst.open_queries() == []
    assert dst.resolve(dst.query(ids[0])["left_clip"]).read_bytes() == MP4 + b"L0"  # clip copied inside the new root

    arrays, mu, env = exchange.load_labeled(out)
    assert env == "CartPole-v1" and mu.tolist() == [1.0, 0.5]  # can't tell is not trained on
    with np.load(src.resolve(src.query(ids[0])["segments"])) as z:
        np.testing.assert_array_equal(arrays["obs"][0], z["obs"])
    with pytest.raises(ValueError, match="no answers"):
        exchange.load_labeled(out, labeler="bob")


def test_importing_a_bad_file_names_the_line(tmp_path):
    store = LabelStore(tmp_path / "s")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "q1", "left_clip": "a.mp4", "right_clip": "b.mp4"}) + "\n{oops\n")
    with pytest.raises(ValueError, match="line 2"):
        exchange.import_jsonl(store, bad)
    bad.write_text(json.dumps({"id": "q1", "left_clip": "missing.mp4", "right_clip": "b.mp4"}) + "\n")
    with pytest.raises(ValueError, match="not found"):
        exchange.import_jsonl(store, bad)
    bad.write_text(json.dumps({"id": "../q", "left_clip": "a.mp4", "right_clip": "b.mp4"}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        exchange.import_jsonl(store, bad)
    assert store.counts()["queries"] == 0


def test_agreement_stats(tmp_path):
    store, ids = make_store(tmp_path, n=3, wanted=0)  # true returns: left better on every pair
    for q in ids:
        store.add_label(q, "ann", "left", response_s=2.0)
    store.add_label(ids[0], "bob", "left")
    store.add_label(ids[1], "bob", "right")
    out = tmp_path / "x.jsonl"
    exchange.export_jsonl(store, out)
    stats = exchange.agreement_stats(exchange.read_jsonl(out))
    assert stats["labelers"]["ann"]["oracle_agreement"] == 1.0
    assert stats["labelers"]["bob"]["oracle_agreement"] == 0.5
    assert stats["labelers"]["ann"]["median_response_s"] == 2.0
    assert stats["between_labelers"]["ann vs bob"] == dict(shared=2, agreement=0.5)


def test_mu_follows_christiano():
    assert MU == {"left": 1.0, "right": 0.0, "tie": 0.5, "cant_tell": None}


def test_the_teacher_withdraws_pairs_of_a_long_gone_policy(tmp_path):
    from rlhp_jax.human.teacher import HumanTeacher

    store, ids = make_store(tmp_path, n=2)
    store._conn().execute("UPDATE queries SET info = json_set(info, '$.env_steps', 5000) WHERE id = ?", (ids[1],))
    teacher = HumanTeacher(tmp_path, "CartPole-v1", store=store)
    try:
        assert teacher.withdraw_older_than(1000) == 1  # made at step 0: withdrawn
        assert store.open_queries() == [ids[1]] and teacher.pending() == 1
    finally:
        teacher.close()
