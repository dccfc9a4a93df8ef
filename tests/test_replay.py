"""DQfD's prioritized replay (replay.py): hand-computed values and invariants on small buffers.

Every buffer here holds 6×6 uint8 frames stacked by 4 (an Atari-like observation in miniature),
so frame sharing, the frame ring, demo slots and the n-step fields are exercised exactly as on
84×84×4, in milliseconds.  All randomness is seeded.
"""

from __future__ import annotations

import io

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from rlhp_jax.demos import DemoRecorder, FrameFormat, read_demos
from rlhp_jax.replay import (
    PrioritizedReplay,
    ReplayConfig,
    SumTree,
    importance_weights,
    priorities_from_td,
    replay_memory_bytes,
)

FRAME = (6, 6)
STACK = 4
OBS_SHAPE = (*FRAME, STACK)
N_STEP = 3
EPISODES = (5, 3, 4)  # demo episode lengths: 12 demo transitions, episode ends at steps 4, 7, 11
NUM_DEMO = sum(EPISODES)


# ---------------------------------------------------------------------------- helpers
class Stream:
    """Stacked observations where each one continues the previous (``obs_t[..., :-1] ==
    obs_{t-1}[..., 1:]``) unless ``fresh=True`` asks for a new stack (a discontinuity)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.obs = None

    def next(self, fresh: bool = False) -> np.ndarray:
        if self.obs is None or fresh:
            self.obs = self.rng.integers(0, 256, OBS_SHAPE, dtype=np.uint8)
        else:
            frame = self.rng.integers(0, 256, FRAME, dtype=np.uint8)
            self.obs = np.concatenate([self.obs[..., 1:], frame[..., None]], axis=-1)
        return self.obs.copy()


def feed(buf: PrioritizedReplay, steps: int, seed: int = 0, fresh_at=(), invalid_at=(), record=None):
    """Add ``steps`` steps to a one-lane buffer; returns (or extends) the record of what went in."""
    if record is None:
        record = dict(stream=Stream(seed), obs=[], action=[], reward=[], valid=[], rng=np.random.default_rng(seed + 1))
    rng = record["rng"]
    for _ in range(steps):
        t = len(record["obs"])
        o = record["stream"].next(fresh=t in fresh_at)
        a = int(rng.integers(0, 3))
        r = float(t) + 0.5
        v = t not in invalid_at
        buf.add(o[None], np.array([a]), np.array([v]), np.array([r], np.float32))
        record["obs"].append(o)
        record["action"].append(a)
        record["reward"].append(r)
        record["valid"].append(v)
    return record


def slot_of(buf: PrioritizedReplay, step, lane: int = 0):
    return buf.num_demo + lane * buf.lane_cap + np.asarray(step) % buf.lane_cap


def drawable_steps(buf: PrioritizedReplay, lane: int = 0) -> np.ndarray:
    """Absolute steps of ``lane`` whose slot has priority > 0 (FIFO: a slot holds its newest step)."""
    lo = buf.num_demo + lane * buf.lane_cap
    pos = np.flatnonzero(buf.tree.leaves()[lo:lo + buf.lane_cap] > 0)
    last = int(buf.steps[lane]) - 1
    return np.sort(last - (last - pos) % buf.lane_cap)


def make_buffer(capacity=20, demos=None, lanes=1, **cfg) -> PrioritizedReplay:
    return PrioritizedReplay(ReplayConfig(capacity=capacity, n_step=N_STEP, **cfg), OBS_SHAPE, STACK, np.uint8,
                             demos=demos, lanes=lanes)


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory):
    """Three demo episodes (5, 3, 4 steps) of continuing stacks, saved and read back."""
    fmt = FrameFormat(env="X", obs_shape=OBS_SHAPE, frame_shape=FRAME, stack=STACK, obs_dtype="uint8",
                      num_actions=3, mask_sha1="none")
    rec = DemoRecorder(fmt, source="test")
    rng = np.random.default_rng(123)
    obs, actions, rewards = [], [], []
    for ep, length in enumerate(EPISODES):
        stream = Stream(1000 + ep)
        for _ in range(length):
            o, a, r = stream.next(), int(rng.integers(0, 3)), float(rng.normal())
            rec.add(o, a, r)
            obs.append(o)
            actions.append(a)
            rewards.append(r)
        rec.end_episode()
    demos = read_demos(rec.save(tmp_path_factory.mktemp("demos") / "demos.npz"))
    assert demos.num_steps == NUM_DEMO
    return demos, np.stack(obs), np.asarray(actions, np.int32), np.asarray(rewards, np.float32)


# ---------------------------------------------------------------------------- the formulas
def test_importance_weights_hand_values():
    # (N·P)^-β with N = 10, β = 0.4: (1, 2, 4)^-0.4, divided by the largest (the first)
    w = importance_weights(np.array([0.1, 0.2, 0.4]), 10, 0.4)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, [1.0, 0.7578582833, 0.5743491775], rtol=1e-6)
    # β = 1: the rarest draw gets weight 1, twice as likely -> half the weight
    np.testing.assert_allclose(importance_weights(np.array([0.5, 0.25, 0.25]), 4, 1.0), [0.5, 1.0, 1.0], rtol=1e-6)
    # β = 0: no correction
    np.testing.assert_allclose(importance_weights(np.array([0.7, 0.1]), 5, 0.0), [1.0, 1.0])


def test_priorities_from_td_hand_values():
    pr = priorities_from_td(np.array([-0.5, 0.2, 0.0, -2.0]), np.array([True, False, True, False]), 1e-3, 3.0)
    np.testing.assert_allclose(pr, [3.5, 0.201, 3.0, 2.001], rtol=1e-12)


# ---------------------------------------------------------------------------- the sum tree
def _assert_consistent(tree: SumTree):
    t = tree.tree
    for node in range(1, tree.size):
        assert t[node] == t[2 * node] + t[2 * node + 1], node
    assert tree.total == pytest.approx(float(tree.leaves().sum()), abs=1e-9)
    assert not t[tree.size + tree.capacity:].any()  # padding leaves stay empty


def test_sumtree_hand_example():
    tree = SumTree(5)  # 8 leaves, 3 of them padding
    assert tree.size == 8
    tree.set(np.arange(5), [1.0, 2.0, 3.0, 4.0, 5.0])
    assert tree.total == 15.0
    _assert_consistent(tree)
    # cumulative ranges: [0,1) [1,3) [3,6) [6,10) [10,15)
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.999, 1.0, 2.5, 3.0, 9.99, 10.0, 14.99])),
                                  [0, 0, 1, 1, 2, 3, 4, 4])
    tree.set([1], 0.0)  # an empty leaf is never found
    assert tree.total == 13.0
    np.testing.assert_array_equal(tree.find(np.array([0.5, 1.0, 1.5, 3.99])), [0, 2, 2, 2])
    # duplicates in one call: the later value wins, as with sequential updates
    tree.set([3, 3, 0], [10.0, 0.5, 2.0])
    np.testing.assert_array_equal(tree.leaves(), [2.0, 0.0, 3.0, 0.5, 5.0])
    assert tree.total == 10.5
    _assert_consistent(tree)
    # rebuild from leaves
    tree.rebuild(np.array([0.0, 4.0, 0.0, 0.0, 1.0]))
    assert tree.total == 5.0
    _assert_consistent(tree)
    np.testing.assert_array_equal(tree.find(np.array([0.0, 3.9, 4.0, 4.5])), [1, 1, 4, 4])
    np.testing.assert_array_equal(tree.leaves([4, 1]), [1.0, 4.0])


def test_sumtree_single_leaf():
    tree = SumTree(1)
    tree.set([0], 3.0)
    assert tree.total == 3.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 2.9])), [0, 0])
    tree.rebuild(np.array([2.0]))
    assert tree.total == 2.0


@given(st.integers(1, 40),
       st.lists(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 9)), min_size=1, max_size=10),
                min_size=1, max_size=6))
def test_sumtree_matches_sequential_reference(capacity, batches):
    """Batched ``set`` (with duplicates) == sequential assignment; ``find`` == searchsorted on the
    cumulative sums (integer priorities: every sum is exact)."""
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for batch in batches:
        idx = np.array([i % capacity for i, _ in batch])
        val = np.array([v for _, v in batch], np.float64)
        tree.set(idx, val)
        for i, v in zip(idx, val):
            ref[i] = v
    np.testing.assert_array_equal(tree.leaves(), ref)
    assert tree.total == ref.sum()
    _assert_consistent(tree)
    if ref.sum() > 0:
        cum = np.cumsum(ref)
        before = cum - ref
        live = ref > 0
        u = np.concatenate([before[live], before[live] + ref[live] / 2, cum[live] - 0.25])
        np.testing.assert_array_equal(tree.find(u), np.searchsorted(cum, u, side="right"))
    rebuilt = SumTree(capacity)
    rebuilt.rebuild(ref)
    np.testing.assert_array_equal(rebuilt.tree, tree.tree)


# ---------------------------------------------------------------------------- configuration errors
def test_bad_configurations_raise():
    with pytest.raises(ValueError):
        ReplayConfig(capacity=0)
    with pytest.raises(ValueError):
        ReplayConfig(n_step=0)
    with pytest.raises(ValueError, match="too small"):
        make_buffer(capacity=9, lanes=2)  # needs lanes * (n + 2) = 10
    buf = make_buffer()
    with pytest.raises(ValueError):
        buf.sample(np.random.default_rng(0), 4)  # nothing drawable yet
    feed(buf, 3)
    with pytest.raises(ValueError):
        buf.sample(np.random.default_rng(0), 4)  # 3 steps: none has its 3 successors
    feed(buf, 1, record=None, seed=5)
    assert buf.sample(np.random.default_rng(0), 4)["index"].shape == (4,)
    with pytest.raises(ValueError, match="no demonstrations"):
        buf.sample(np.random.default_rng(0), 4, demo_only=True)


# ---------------------------------------------------------------------------- frames stored once
def test_frames_stored_once_and_reconstructed():
    buf = make_buffer(capacity=30)
    steps, cut = 25, 10
    rec = feed(buf, steps, seed=1, fresh_at={cut})
    obs = np.stack(rec["obs"])
    # one frame per continuing step, the whole stack at the first step and at the discontinuity
    assert buf.frames_written[0] == STACK + (steps - 1) + (STACK - 1) == 31
    expected = [obs[0][..., i] for i in range(STACK)]
    for t in range(1, steps):
        expected += [obs[t][..., i] for i in range(STACK)] if t == cut else [obs[t][..., -1]]
    np.testing.assert_array_equal(buf.frames[0, :31], np.stack(expected))
    assert not buf.frames[0, 31:].any()
    newest = np.array([3 + t + (3 if t >= cut else 0) for t in range(steps)])
    np.testing.assert_array_equal(buf.newest[0, :steps], newest)

    # transitions: observations, actions and true rewards at offsets t … t+n
    ready = np.arange(steps - N_STEP)
    np.testing.assert_array_equal(drawable_steps(buf), ready)
    tr = buf.transitions(slot_of(buf, ready))
    offs = ready[:, None] + np.arange(N_STEP + 1)
    assert tr["obs"].shape == (ready.size, N_STEP + 1, *OBS_SHAPE) and tr["obs"].dtype == np.uint8
    np.testing.assert_array_equal(tr["obs"], obs[offs])
    np.testing.assert_array_equal(tr["action"], np.asarray(rec["action"])[offs])
    np.testing.assert_array_equal(tr["true_reward"], np.asarray(rec["reward"], np.float32)[offs[:, :N_STEP]])
    np.testing.assert_array_equal(tr["cont"], np.ones((ready.size, N_STEP)))  # agent: one endless episode
    assert not tr["is_demo"].any()

    # clips for labels: every window of 5 written steps, reconstructed exactly
    starts = buf.recent_segment_starts(np.array([0]), 5)[0]
    np.testing.assert_array_equal(starts, np.arange(steps - 5 + 1))
    seg = buf.segments(np.zeros(starts.size, np.int64), starts, 5)
    win = starts[:, None] + np.arange(5)
    np.testing.assert_array_equal(seg["obs"], obs[win])
    np.testing.assert_array_equal(seg["action"], np.asarray(rec["action"])[win])
    np.testing.assert_array_equal(seg["true_reward"], np.asarray(rec["reward"], np.float32)[win])
    assert buf.recent_segment_starts(np.array([steps - 4]), 5)[0].size == 0

    # single observations for the metrics: each one is the step it claims to be
    few = buf.recent_steps(np.random.default_rng(0), np.array([20]), 100)
    assert few["obs"].shape == (5, *OBS_SHAPE)
    for o, a, r in zip(few["obs"], few["action"], few["true_reward"]):
        t = int(r - 0.5)  # feed() writes reward t + 0.5
        assert t >= 20
        np.testing.assert_array_equal(o, obs[t])
        assert a == rec["action"][t]


@pytest.mark.parametrize("fresh_every", [0, 5, 1])
def test_ring_wraps_and_reconstructs(fresh_every):
    """After the step ring wraps several times, every drawable transition still decodes to its own
    observations: also when fresh stacks (4 frames each) overrun the frame ring."""
    buf = make_buffer(capacity=20)
    steps = 150
    fresh = set(range(0, steps, fresh_every)) if fresh_every else set()
    rec = feed(buf, steps, seed=2, fresh_at=fresh)
    obs = np.stack(rec["obs"])
    ready = drawable_steps(buf)
    if fresh_every == 1:
        # 4 frames a step, a ring of 20 + 8·4 = 52 frames: only the last 13 steps keep their frames,
        # and the last 3 of those wait for successors
        np.testing.assert_array_equal(ready, np.arange(steps - 13, steps - N_STEP))
    else:
        np.testing.assert_array_equal(ready, np.arange(steps - 20, steps - N_STEP))
    offs = ready[:, None] + np.arange(N_STEP + 1)
    np.testing.assert_array_equal(buf.transitions(slot_of(buf, ready))["obs"], obs[offs])
    starts = buf.recent_segment_starts(np.array([0]), 4)[0]
    assert starts.size and starts.min() == ready.min()
    seg = buf.segments(np.zeros(starts.size, np.int64), starts, 4)
    np.testing.assert_array_equal(seg["obs"], obs[starts[:, None] + np.arange(4)])
    batch = buf.sample(np.random.default_rng(0), 64)
    step0 = buf.steps[0] - 1 - (buf.steps[0] - 1 - (batch["index"] - buf.num_demo)) % buf.lane_cap
    np.testing.assert_array_equal(batch["obs"][:, 0], obs[step0])


def test_two_lanes_are_separate_fifo_rings():
    buf = make_buffer(capacity=40, lanes=2)
    assert buf.lane_cap == 20
    streams, obs = [Stream(10), Stream(11)], [[], []]
    rng = np.random.default_rng(3)
    actions = []
    for t in range(57):
        o = np.stack([s.next(fresh=(lane == 1 and t % 7 == 0)) for lane, s in enumerate(streams)])
        a = rng.integers(0, 3, 2)
        buf.add(o, a, np.ones(2, bool), np.zeros(2, np.float32))
        for lane in range(2):
            obs[lane].append(o[lane])
        actions.append(a)
    obs, actions = np.stack(obs, 1), np.stack(actions)  # [T, lanes, ...]
    for lane in range(2):
        ready = drawable_steps(buf, lane)
        np.testing.assert_array_equal(ready, np.arange(57 - 20, 57 - N_STEP))
        tr = buf.transitions(slot_of(buf, ready, lane))
        offs = ready[:, None] + np.arange(N_STEP + 1)
        np.testing.assert_array_equal(tr["obs"], obs[offs, lane])
        np.testing.assert_array_equal(tr["action"], actions[offs, lane])
    assert len(buf) == 40 and buf.agent_transitions == 40


# ---------------------------------------------------------------------------- demonstrations
def test_demo_transitions_are_never_evicted(demo_set):
    demos, demo_obs, demo_act, _ = demo_set
    buf = make_buffer(capacity=20, demos=demos)
    # demos enter with (max priority + ε_d)^α = (1 + 3)^0.5
    np.testing.assert_allclose(buf.tree.leaves()[:NUM_DEMO], 2.0)
    rec = feed(buf, 100, seed=4)  # the agent ring wraps 5 times
    assert len(buf) == NUM_DEMO + 20
    leaves = buf.tree.leaves()
    np.testing.assert_allclose(leaves[:NUM_DEMO], 2.0)
    np.testing.assert_array_equal(drawable_steps(buf), np.arange(80, 97))
    rng = np.random.default_rng(0)
    drawn = []
    for _ in range(100):
        b = buf.sample(rng, 32)
        d = b["is_demo"]
        np.testing.assert_array_equal(d, b["index"] < NUM_DEMO)
        np.testing.assert_array_equal(b["obs"][d, 0], demo_obs[b["index"][d]])
        np.testing.assert_array_equal(b["action"][d, 0], demo_act[b["index"][d]])
        agent_steps = 99 - (99 - (b["index"][~d] - NUM_DEMO)) % 20
        np.testing.assert_array_equal(b["obs"][~d, 0], np.stack(rec["obs"])[agent_steps])
        drawn.append(b["index"])
    drawn = np.concatenate(drawn)
    assert set(range(NUM_DEMO)) <= set(drawn.tolist())
    tr = buf.transitions(np.arange(NUM_DEMO))
    np.testing.assert_array_equal(tr["obs"][:, 0], demo_obs)
    np.testing.assert_array_equal(tr["action"][:, 0], demo_act)
    assert tr["is_demo"].all()
    # demo-only batches draw demos only
    b = buf.sample(rng, 64, demo_only=True)
    assert (b["index"] < NUM_DEMO).all() and b["is_demo"].all()


# demo step i -> its observation index at offsets 0..3 and cont (episodes end at 4, 7, 11)
DEMO_OFFSETS = np.array([[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 4], [3, 4, 4, 4], [4, 4, 4, 4],
                         [5, 6, 7, 7], [6, 7, 7, 7], [7, 7, 7, 7],
                         [8, 9, 10, 11], [9, 10, 11, 11], [10, 11, 11, 11], [11, 11, 11, 11]])
DEMO_CONT = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0],
                      [1, 1, 0], [1, 0, 0], [0, 0, 0],
                      [1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)


def test_demo_n_step_fields_stop_at_episode_end(demo_set):
    demos, demo_obs, demo_act, demo_rew = demo_set
    buf = make_buffer(capacity=20, demos=demos)
    tr = buf.transitions(np.arange(NUM_DEMO))
    np.testing.assert_array_equal(tr["cont"], DEMO_CONT)
    np.testing.assert_array_equal(tr["obs"], demo_obs[DEMO_OFFSETS])  # clamped inside the episode
    np.testing.assert_array_equal(tr["action"], demo_act[DEMO_OFFSETS])
    # true reward k counts while steps 0..k are in the episode (the first always), 0 after its end
    alive = np.concatenate([np.ones((NUM_DEMO, 1)), np.cumprod(DEMO_CONT, 1)[:, :-1]], 1)
    np.testing.assert_allclose(tr["true_reward"], demo_rew[DEMO_OFFSETS[:, :N_STEP]] * alive)
    assert tr["true_reward"][4, 0] == demo_rew[4] and tr["true_reward"][4, 1] == 0.0
    # shuffled and repeated indices give the same rows
    perm = np.array([11, 3, 3, 0, 7])
    tr2 = buf.transitions(perm)
    np.testing.assert_array_equal(tr2["cont"], DEMO_CONT[perm])
    np.testing.assert_array_equal(tr2["obs"], demo_obs[DEMO_OFFSETS[perm]])


def test_stack_first_layout_is_a_transpose(demo_set):
    """``stack_last=False`` (the learner moves the stack axis on the device) holds the same data
    as [B, n+1, stack, H, W], for demo and agent slots alike."""
    demos, demo_obs, _, _ = demo_set
    buf = make_buffer(capacity=20, demos=demos)
    feed(buf, 50, seed=17, fresh_at={44})
    idx = np.concatenate([np.arange(NUM_DEMO), slot_of(buf, np.arange(30, 47))])
    last, first = buf.transitions(idx), buf.transitions(idx, stack_last=False)
    assert first["obs"].shape == (idx.size, N_STEP + 1, STACK, *FRAME)
    np.testing.assert_array_equal(first["obs"], np.moveaxis(last["obs"], -1, 2))
    for k in ("action", "cont", "is_demo", "true_reward"):
        np.testing.assert_array_equal(first[k], last[k])
    a = buf.sample(np.random.default_rng(18), 32)
    b = buf.sample(np.random.default_rng(18), 32, stack_last=False)
    np.testing.assert_array_equal(a["index"], b["index"])
    np.testing.assert_array_equal(a["weight"], b["weight"])
    np.testing.assert_array_equal(np.moveaxis(b["obs"], 2, -1), a["obs"])


# ---------------------------------------------------------------------------- FIFO, readiness, validity
def test_fifo_eviction_and_readiness(demo_set):
    demos = demo_set[0]
    buf = make_buffer(capacity=20, demos=demos)
    rec = None
    for s in range(45):
        rec = feed(buf, 1, seed=6, record=rec)
        oldest = max(0, s - 19)
        assert buf.evicted[0] == oldest
        assert buf.agent_transitions == min(s + 1, 20)
        # drawable: held steps whose n successors are written
        np.testing.assert_array_equal(drawable_steps(buf), np.arange(oldest, s - N_STEP + 1))
        # the newest n steps have priority exactly 0, the ready ones the max priority^α = 1
        leaves = buf.tree.leaves()
        for t in range(max(oldest, s - N_STEP + 1), s + 1):
            assert leaves[slot_of(buf, t)] == 0.0
        for t in range(oldest, s - N_STEP + 1):
            assert leaves[slot_of(buf, t)] == 1.0
    # each slot holds its newest step: slot of step 44 = slot of step 24, and shows step 44's obs
    obs = np.stack(rec["obs"])
    held = np.arange(25, 42)
    np.testing.assert_array_equal(buf.transitions(slot_of(buf, held))["obs"][:, 0], obs[held])


def test_invalid_steps_are_never_first(demo_set):
    demos = demo_set[0]
    buf = make_buffer(capacity=20, demos=demos)
    rng = np.random.default_rng(8)
    invalid = set(np.flatnonzero(rng.random(60) < 0.3).tolist())
    rec = feed(buf, 60, seed=7, invalid_at=invalid)
    valid = np.asarray(rec["valid"])
    ready = drawable_steps(buf)
    np.testing.assert_array_equal(ready, [t for t in range(40, 57) if valid[t]])
    for t in range(40, 60):
        if not valid[t]:
            assert buf.tree.leaves()[slot_of(buf, t)] == 0.0
    firsts = []
    for _ in range(200):
        b = buf.sample(rng, 32)
        agent = b["index"][b["index"] >= NUM_DEMO]
        firsts.append(59 - (59 - (agent - NUM_DEMO)) % 20)
    firsts = np.concatenate(firsts)
    assert valid[firsts].all()
    assert set(firsts.tolist()) == set(ready.tolist())
    # clips for labels: windows without an invalid step, brute force
    starts = buf.recent_segment_starts(np.array([0]), 4)[0]
    expect = [t for t in range(40, 57) if valid[t:t + 4].all()]
    np.testing.assert_array_equal(starts, expect)


# ---------------------------------------------------------------------------- priorities
def test_update_priorities(demo_set):
    demos = demo_set[0]
    cfg = ReplayConfig(capacity=20, n_step=N_STEP)
    buf = make_buffer(capacity=20, demos=demos)
    rec = feed(buf, 30, seed=9)  # holds steps 10..29, 10..26 drawable
    before = buf.tree.leaves().copy()
    idx = np.array([0, 5, slot_of(buf, 12), slot_of(buf, 15)])
    buf.update_priorities(idx, np.array([0.5, -2.0, 0.25, -1.5], np.float32))
    pr = np.array([0.5 + 3.0, 2.0 + 3.0, 0.25 + 1e-3, 1.5 + 1e-3])
    leaves = buf.tree.leaves()
    np.testing.assert_allclose(leaves[idx], pr ** cfg.alpha, rtol=1e-6)
    others = np.setdiff1d(np.arange(leaves.size), idx)
    np.testing.assert_array_equal(leaves[others], before[others])
    assert buf.max_priority == pytest.approx(5.0)
    assert buf.tree.total == pytest.approx(leaves.sum())
    # a slot with priority 0 (step 28: not ready) is left alone
    buf.update_priorities(np.array([slot_of(buf, 28)]), np.array([0.1]))
    assert buf.tree.leaves()[slot_of(buf, 28)] == 0.0
    # the max priority only grows
    buf.update_priorities(np.array([slot_of(buf, 13)]), np.array([0.0]))
    assert buf.max_priority == pytest.approx(5.0)
    # a step that becomes ready enters with the max priority
    feed(buf, 1, record=rec)  # step 30 written: step 27 is ready
    assert buf.tree.leaves()[slot_of(buf, 27)] == pytest.approx(5.0 ** 0.5)
    assert buf.tree.leaves()[slot_of(buf, 10)] == 0.0  # step 10 left the ring


class FakeLearner:
    """A ``td_error`` for tests: |δ| of a transition = its first observation's newest pixel [0, 0]
    / 64 (distinct per transition, never the max priority), and a log of the batches it saw."""

    def __init__(self, stack_last: bool = True):
        self.batches, self.stack_last = [], stack_last

    def __call__(self, batch):
        self.batches.append(batch)
        obs0 = batch["obs"][:, 0]
        newest = obs0[..., -1] if self.stack_last else obs0[:, -1]
        return newest[:, 0, 0].astype(np.float32) / 64.0

    @staticmethod
    def priority(obs0, is_demo=False):
        return (obs0[0, 0, -1] / 64.0 + (3.0 if is_demo else 1e-3)) ** 0.5


def test_new_transitions_get_their_td_error_priority_before_they_can_be_drawn(demo_set):
    """Ibarz A.3: priorities are "computed from their TD error at the moment they are added to
    and sampled from the buffer" — not the largest priority seen so far."""
    demos, demo_obs = demo_set[0], demo_set[1]
    learner = FakeLearner()
    buf = PrioritizedReplay(ReplayConfig(capacity=20, n_step=N_STEP), OBS_SHAPE, STACK, np.uint8, demos=demos,
                            td_error=learner, td_batch=8)
    assert buf.tree.total == 0 and buf.unscored[:NUM_DEMO].all()  # demos wait for the first draw
    buf.score_unscored()  # (a draw would do it)
    np.testing.assert_allclose(buf.tree.leaves()[:NUM_DEMO], [FakeLearner.priority(o, True) for o in demo_obs])
    rec = None
    for s in range(45):
        rec = feed(buf, 1, seed=21, record=rec)
        oldest = max(0, s - 19)
        complete = np.arange(oldest, s - N_STEP + 1)
        waiting = buf.unscored[slot_of(buf, complete)]
        # the complete steps are scored or waiting, never both, never drawable while waiting ...
        assert waiting.sum() == np.count_nonzero(buf.unscored) < 8  # scored as soon as 8 wait
        np.testing.assert_array_equal(drawable_steps(buf), complete[~waiting])
        # ... and each scored one has its own TD error's priority
        for t in complete[~waiting]:
            assert buf.tree.leaves()[slot_of(buf, t)] == pytest.approx(FakeLearner.priority(rec["obs"][t]))
        assert not buf.unscored[slot_of(buf, np.arange(max(oldest, s - N_STEP + 1), s + 1))].any()
    # a draw scores the waiting ones first
    assert np.count_nonzero(buf.unscored) > 0
    b = buf.sample(np.random.default_rng(0), 32)
    assert not buf.unscored.any()
    np.testing.assert_array_equal(drawable_steps(buf), np.arange(25, 42))
    obs = np.stack(rec["obs"])
    np.testing.assert_allclose(buf.tree.leaves()[slot_of(buf, np.arange(25, 42))],
                               [FakeLearner.priority(o) for o in obs[25:42]])
    assert set(b) >= {"index", "weight"}
    # every batch the learner scored had td_batch rows, weight 1, and no oracle reward
    for batch in learner.batches:
        assert set(batch) == {"obs", "action", "cont", "is_demo", "weight"}
        assert batch["obs"].shape == (8, N_STEP + 1, *OBS_SHAPE)
        np.testing.assert_array_equal(batch["weight"], 1.0)
    # after a learning step the priority follows the drawn TD error, as before
    buf.update_priorities(slot_of(buf, np.array([30])), np.array([2.0]))
    assert buf.tree.leaves()[slot_of(buf, 30)] == pytest.approx((2.0 + 1e-3) ** 0.5)


def test_waiting_transitions_that_leave_the_ring_are_not_scored_and_survive_checkpoints():
    learner = FakeLearner(stack_last=False)
    buf = PrioritizedReplay(ReplayConfig(capacity=20, n_step=N_STEP), OBS_SHAPE, STACK, np.uint8,
                            td_error=learner, td_batch=64, td_stack_last=False)
    rec = feed(buf, 45, seed=22, invalid_at={33})
    # steps 0..41 became complete; only the held ones (25..41) wait, and not the invalid step 33
    held = [t for t in range(25, 42) if t != 33]
    np.testing.assert_array_equal(np.sort(np.flatnonzero(buf.unscored)),
                                  np.sort(slot_of(buf, np.array(held))))
    assert buf.tree.total == 0 and learner.batches == []
    # a checkpoint keeps them waiting
    b = PrioritizedReplay(ReplayConfig(capacity=20, n_step=N_STEP), OBS_SHAPE, STACK, np.uint8,
                          td_error=learner, td_batch=64, td_stack_last=False)
    b.load_state_dict(_roundtrip(buf.state_dict()))
    np.testing.assert_array_equal(b.unscored, buf.unscored)
    assert b.score_unscored() == len(held)
    (batch,) = learner.batches
    assert batch["obs"].shape == (64, N_STEP + 1, STACK, *FRAME)  # the layout asked for
    obs = np.stack(rec["obs"])
    np.testing.assert_allclose(b.tree.leaves()[slot_of(b, np.array(held))],
                               [FakeLearner.priority(o) for o in obs[held]])
    # without a td_error, a checkpoint's waiting transitions get the largest priority seen
    c = make_buffer(capacity=20)
    c.load_state_dict(_roundtrip(buf.state_dict()))
    c.sample(np.random.default_rng(1), 4)
    np.testing.assert_allclose(c.tree.leaves()[slot_of(c, np.array(held))], 1.0)
    with pytest.raises(ValueError, match="td_batch"):
        PrioritizedReplay(ReplayConfig(capacity=20), OBS_SHAPE, STACK, np.uint8, td_error=learner, td_batch=0)


def test_sampling_is_proportional(demo_set):
    demos = demo_set[0]
    buf = make_buffer(capacity=20, demos=demos)
    feed(buf, 40, seed=11)
    live = np.flatnonzero(buf.tree.leaves() > 0)
    rng = np.random.default_rng(12)
    buf.update_priorities(live, rng.uniform(0.0, 5.0, live.size))
    leaves = buf.tree.leaves().copy()
    expected = leaves / leaves.sum()
    draws, batch = 1500, 32
    counts = np.zeros(leaves.size)
    for i in range(draws):
        b = buf.sample(rng, batch)
        counts += np.bincount(b["index"], minlength=leaves.size)
        if i == 0:  # importance weights: (N·P)^-β over the batch's largest, N = transitions held
            probs = leaves[b["index"]] / leaves.sum()
            w = (len(buf) * probs) ** -0.4
            np.testing.assert_allclose(b["weight"], w / w.max(), rtol=1e-5)
    freq = counts / counts.sum()
    assert (np.abs(freq - expected) <= 0.1 * expected + 2e-3).all(), np.c_[freq, expected]
    assert counts[leaves == 0].sum() == 0
    # demo-only: proportional among the demos, N = number of demos
    counts = np.zeros(NUM_DEMO)
    for i in range(500):
        b = buf.sample(rng, batch, demo_only=True)
        counts += np.bincount(b["index"], minlength=NUM_DEMO)
        if i == 0:
            probs = leaves[b["index"]] / leaves[:NUM_DEMO].sum()
            w = (NUM_DEMO * probs) ** -0.4
            np.testing.assert_allclose(b["weight"], w / w.max(), rtol=1e-5)
    np.testing.assert_allclose(counts / counts.sum(), leaves[:NUM_DEMO] / leaves[:NUM_DEMO].sum(), atol=0.01)


# ---------------------------------------------------------------------------- checkpoints, discontinuities
def _roundtrip(state: dict) -> dict:
    """What a checkpoint does to the state: serialized and read back (no shared memory)."""
    f = io.BytesIO()
    np.savez(f, **state)
    f.seek(0)
    with np.load(f) as z:
        return {k: z[k] for k in z.files}


def test_state_dict_roundtrip_gives_identical_samples(demo_set):
    demos = demo_set[0]
    a = make_buffer(capacity=20, demos=demos)
    rec = feed(a, 47, seed=13, fresh_at={30}, invalid_at={35, 40})
    live = np.flatnonzero(a.tree.leaves() > 0)
    a.update_priorities(live, np.random.default_rng(14).uniform(0, 2, live.size))
    b = make_buffer(capacity=20, demos=demos)
    b.load_state_dict(_roundtrip(a.state_dict()))
    np.testing.assert_array_equal(b.tree.tree, a.tree.tree)
    assert b.max_priority == a.max_priority
    for buf_a, buf_b in ((a, b), (a, b)):
        ra, rb = np.random.default_rng(15), np.random.default_rng(15)
        for _ in range(3):
            sa, sb = buf_a.sample(ra, 32), buf_b.sample(rb, 32)
            assert sa.keys() == sb.keys()
            for k in sa:
                np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
        # both continue identically: the restored previous observation shares frames
        fw = int(b.frames_written[0])
        feed(a, 1, record=rec)
        o, act = rec["obs"][-1], rec["action"][-1]
        b.add(o[None], np.array([act]), np.array([True]), np.array([rec["reward"][-1]], np.float32))
        assert b.frames_written[0] == fw + 1
        np.testing.assert_array_equal(b.tree.tree, a.tree.tree)


def test_mark_discontinuity():
    buf = make_buffer(capacity=30)
    buf.mark_discontinuity()  # on an empty buffer: nothing to mark
    rec = feed(buf, 10, seed=16)
    fw = int(buf.frames_written[0])
    buf.mark_discontinuity()
    assert not buf.valid[0, 9]
    # the next observation continues the last one, yet stores its whole stack
    feed(buf, 1, record=rec)
    assert buf.frames_written[0] == fw + STACK
    feed(buf, 14, record=rec)
    assert buf.frames_written[0] == fw + STACK + 14
    ready = drawable_steps(buf)
    np.testing.assert_array_equal(ready, [t for t in range(25 - N_STEP) if t != 9])
    obs = np.stack(rec["obs"])
    offs = ready[:, None] + np.arange(N_STEP + 1)
    np.testing.assert_array_equal(buf.transitions(slot_of(buf, ready))["obs"], obs[offs])
    # clips for labels do not cross the marked step
    starts = buf.recent_segment_starts(np.array([0]), 3)[0]
    np.testing.assert_array_equal(starts, [t for t in range(25 - 3 + 1) if not t <= 9 <= t + 2])


# ---------------------------------------------------------------------------- memory
def test_frames_are_stored_once_in_memory():
    capacity = 1000
    buf = make_buffer(capacity=capacity)
    frame_bytes = int(np.prod(FRAME))
    assert buf.frames.nbytes == (capacity + 8 * STACK) * frame_bytes  # about C frames ...
    assert buf.frames.nbytes < 1.05 * capacity * frame_bytes  # ... not 4·C
    # replay_memory_bytes counts exactly what a demo-free buffer allocates
    buf = make_buffer(capacity=37)
    allocated = sum(x.nbytes for x in (buf.frames, buf.newest, buf.oldest, buf.action, buf.valid,
                                       buf.true_reward, buf.unscored, buf.tree.tree))
    assert replay_memory_bytes(37, OBS_SHAPE, STACK) == allocated
    # the paper's 1e6 transitions of 84×84×4 uint8: ~7.1 GB (not 28 GB)
    full = replay_memory_bytes(1_000_000, (84, 84, 4), 4)
    assert 7.0e9 < full < 8.0e9
