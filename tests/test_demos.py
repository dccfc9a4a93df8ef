"""Demonstration files (rlhp_jax.demos): the format round-trips, frames are stored once, and every
mismatch with the run's environment is refused with a clear message (Ibarz et al. 2018, H.7)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from experiments import minatar_demonstrator
from experiments.minatar_demonstrator import minatar_tracker as tracker
from rlhp_jax import demos as D
from rlhp_jax import demos_cli
from rlhp_jax import labels as labels_lib
from rlhp_jax.envs import make_env




@pytest.fixture(scope="module")
def minatar():
    return make_env("Breakout-MinAtar", 1)


@pytest.fixture(scope="module")
def minatar_demos(minatar, tmp_path_factory):
    seen = []

    def act(obs, key):
        seen.append(np.asarray(obs)[0].copy())
        return tracker(obs, key)

    rec = D.record_policy(minatar, act, jax.random.PRNGKey(0), episodes=2, max_steps=1200, source="tracker")
    path = rec.save(tmp_path_factory.mktemp("demos") / "breakout")
    return path, seen


@pytest.fixture(scope="module")
def pong():
    from rlhp_jax.envpool_envs import EnvpoolVecEnv

    return EnvpoolVecEnv("Pong", 1, seed=3)


@pytest.fixture(scope="module")
def pong_demos(pong, tmp_path_factory):
    seen = []

    def act(obs, key):
        seen.append(np.asarray(obs)[0].copy())
        return np.asarray(jax.random.randint(key, (1,), 0, pong.spec.num_actions))

    rec = D.record_policy(pong, act, jax.random.PRNGKey(1), episodes=1, max_steps=120, source="random")
    return rec.save(tmp_path_factory.mktemp("pong") / "pong.npz"), seen


def test_minatar_round_trip(minatar, minatar_demos):
    path, seen = minatar_demos
    assert path.suffix == ".npz"
    d = D.load_demos(path, minatar)
    # the horizon (1,000 steps) ends the first episode; the second is cut by max_steps
    assert d.num_episodes == 2 and d.num_steps == 1200
    assert list(d.episode_lengths) == [1000, 200]
    np.testing.assert_array_equal(d.obs(np.arange(d.num_steps)), np.stack(seen[:1200]))
    np.testing.assert_array_equal(d.actions, tracker(np.stack(seen[:1200]), None))
    assert d.rewards is not None and d.episode_returns()[0] > 0  # the tracker scores
    assert d.episode_end.sum() == 2 and d.episode_end[999] and d.episode_end[-1]


def test_the_demonstrator_script_records_the_tracker(minatar, tmp_path, capsys):
    """``python -m experiments.minatar_demonstrator`` (docs/results.md's recipe): the tracker's demos."""
    out = tmp_path / "tracker.npz"
    assert minatar_demonstrator.main(["--episodes", "1", "--max-steps", "50", "--seed", "0", "--out", str(out)]) == 0
    d = D.load_demos(out, minatar)
    assert d.num_steps == 50 and d.meta["source"] == "tracker"
    np.testing.assert_array_equal(d.actions, tracker(d.obs(np.arange(d.num_steps))))
    assert f"demonstrations written to {out}" in capsys.readouterr().out
    # an existing demo file is never replaced by accident: refused before recording, byte for byte kept
    before = out.read_bytes()
    assert minatar_demonstrator.main(["--episodes", "1", "--max-steps", "20", "--out", str(tmp_path / "tracker")]) == 2
    assert "tracker.npz already exists: choose another --out, or pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert minatar_demonstrator.main(["--episodes", "1", "--max-steps", "20", "--out", str(out), "--overwrite"]) == 0
    assert D.load_demos(out, minatar).num_steps == 20


def test_atari_frames_stored_once_and_observations_rebuilt(pong, pong_demos):
    path, seen = pong_demos
    d = D.load_demos(path, pong)
    assert d.meta["stack"] == 4 and tuple(d.meta["frame_shape"]) == (84, 84)
    assert d.num_steps == 120
    # each step adds one frame; the episode's first observation adds its whole stack
    assert d.frames.shape[0] == d.num_steps + 3
    np.testing.assert_array_equal(d.obs(np.arange(d.num_steps)), np.stack(seen[:120]))
    assert not d.frames[:, pong.score_mask].any()  # blanked as the agent sees them


def test_other_game_is_refused(minatar_demos):
    path, _ = minatar_demos
    with pytest.raises(D.DemoError, match="Breakout-MinAtar.*Asterix-MinAtar"):
        D.load_demos(path, make_env("Asterix-MinAtar", 1))


def _rewrite(path, out, **changes):
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    meta = json.loads(str(data["meta"]))
    meta.update(changes.pop("meta", {}))
    data["meta"] = np.asarray(json.dumps(meta))
    data.update(changes)
    return D.save_arrays(out, data)


def test_frame_format_action_set_and_mask_mismatches(pong, pong_demos, tmp_path):
    path, _ = pong_demos
    bad = _rewrite(path, tmp_path / "fmt.npz", meta=dict(obs_shape=[84, 84, 1], stack=1, frame_shape=[84, 84, 1]),
                   frames=np.zeros((123, 84, 84, 1), np.uint8))
    with pytest.raises(D.DemoError, match="recorded as .*this run's agent sees stacks of 4 84×84"):
        D.load_demos(bad, pong)
    bad = _rewrite(path, tmp_path / "actions.npz", meta=dict(num_actions=18))
    with pytest.raises(D.DemoError, match="18 actions and this environment has 6"):
        D.load_demos(bad, pong)
    bad = _rewrite(path, tmp_path / "mask.npz", meta=dict(mask_sha1="0" * 40))
    with pytest.raises(D.DemoError, match="another score-area mask"):
        D.load_demos(bad, pong)
    with np.load(path) as z:
        frames = z["frames"].copy()
    r, c = np.argwhere(pong.score_mask)[0]
    frames[5, r, c] = 200  # one unblanked score pixel
    bad = _rewrite(path, tmp_path / "unblanked.npz", frames=frames)
    with pytest.raises(D.DemoError, match="pixels inside the score area"):
        D.load_demos(bad, pong)


def test_empty_missing_and_foreign_files(minatar, tmp_path):
    fmt = D.frame_format(minatar)
    rec = D.DemoRecorder(fmt, source="nobody")
    with pytest.raises(D.DemoError, match="no steps were recorded"):
        rec.save(tmp_path / "none.npz")
    empty = D.save_arrays(tmp_path / "empty.npz", rec.arrays())
    with pytest.raises(D.DemoError, match="holds no demonstration steps"):
        D.load_demos(empty, minatar)
    with pytest.raises(D.DemoError, match="does not exist"):
        D.load_demos(tmp_path / "nope.npz", minatar)
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(D.DemoError, match="not a demo file"):
        D.load_demos(tmp_path / "text.npz", minatar)
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(D.DemoError, match="lacks meta"):
        D.load_demos(tmp_path / "other.npz", minatar)


def test_recorder_rejects_bad_steps(minatar):
    rec = D.DemoRecorder(D.frame_format(minatar), source="t")
    with pytest.raises(D.DemoError, match="observation shape"):
        rec.add(np.zeros((9, 9, 4), np.float32), 0)
    with pytest.raises(D.DemoError, match="action 7 outside"):
        rec.add(np.zeros((10, 10, 4), np.float32), 7)


def test_subset_and_segments(minatar, minatar_demos):
    d = D.load_demos(minatar_demos[0], minatar)
    small = d.subset(0.2)  # the first episode already holds 1000 of 1200 steps
    assert small.num_episodes == 1 and small.num_steps == 1000
    np.testing.assert_array_equal(small.obs(np.arange(10)), d.obs(np.arange(10)))
    with pytest.raises(D.DemoError, match="demo-fraction"):
        d.subset(0.0)
    clips = d.segments(np.random.default_rng(0), 64, 25)
    assert clips["obs"].shape == (64, 25, 10, 10, 4)
    # a clip never straddles the two episodes
    starts = d.segment_starts(25)
    assert not ((starts > 1000 - 25) & (starts < 1000)).any()
    with pytest.raises(D.DemoError, match="no demo episode is 2000 steps long"):
        d.segments(np.random.default_rng(0), 1, 2000)


def test_autolabels_pair_each_initial_clip_with_a_preferred_demo_clip(minatar, minatar_demos):
    d = D.load_demos(minatar_demos[0], minatar)
    k, t = 5, 25
    rng = np.random.default_rng(1)
    init = labels_lib.SegmentPairs(obs=rng.random((k, 2, t, 10, 10, 4)).astype(np.float32),
                                   action=rng.integers(0, 3, (k, 2, t)).astype(np.int32),
                                   true_reward=np.zeros((k, 2, t), np.float32))
    demo = d.segments(rng, 2 * k, t)
    pairs, mu = D.autolabels(init, demo)
    assert pairs.obs.shape == (2 * k, 2, t, 10, 10, 4) and mu.shape == (2 * k,)
    assert (mu == 1.0).all()  # σ¹ (the demo clip) preferred, every time
    np.testing.assert_array_equal(pairs.obs[:, 0], demo["obs"])
    np.testing.assert_array_equal(pairs.obs[:, 1], np.asarray(init.obs).reshape(2 * k, t, 10, 10, 4))
    with pytest.raises(ValueError, match="needs 10 demo clips"):
        D.autolabels(init, d.segments(rng, 3, t))


def test_recording_from_a_christiano_run_checkpoint(minatar, tmp_path, capsys):
    """A policy trained by the Christiano driver (PPO here) plays the demonstrations."""
    from experiments import classic

    run = tmp_path / "ppo"
    assert classic.main(["--env", "Breakout-MinAtar", "--steps", "2048", "--labels", "10", "--out", str(run),
                         "--no-progress"]) == 0
    out = tmp_path / "ppo_demos.npz"
    assert demos_cli.main(["record", "--run", str(run), "--episodes", "2", "--max-steps", "120", "--out", str(out)]) == 0
    d = D.load_demos(out, minatar)
    # two games of the barely trained policy (each ends when the ball is lost)
    assert d.num_episodes == 2 and d.num_steps == int(d.episode_lengths.sum()) and d.num_steps <= 120
    assert d.meta["source"] == f"policy:{run}"
    assert demos_cli.main(["record", "--run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.npz")]) == 2
    assert "no config.json" in capsys.readouterr().err
    # recording over a demo set is refused (it could be a person's), unless asked for
    before = out.read_bytes()
    assert demos_cli.main(["record", "--run", str(run), "--episodes", "1", "--out", str(out)]) == 2
    assert "ppo_demos.npz already exists" in capsys.readouterr().err and out.read_bytes() == before
    assert demos_cli.main(["record", "--run", str(run), "--episodes", "1", "--max-steps", "30", "--out", str(out),
                           "--overwrite"]) == 0
    assert D.load_demos(out, minatar).num_episodes == 1


def test_a_demo_file_with_nan_frames_or_a_bomb_is_refused(minatar, minatar_demos, tmp_path):
    """DQfD would pretrain on NaN frames; a member compressed a thousandfold more than numpy ever
    writes is refused before it is read (an unknown member is never even decompressed)."""
    import zipfile

    path, _ = minatar_demos
    with np.load(path) as z:
        frames = z["frames"].astype(np.float32)
    frames[3] = np.nan
    with pytest.raises(D.DemoError, match="NaN"):
        D.load_demos(_rewrite(path, tmp_path / "nan.npz", frames=frames), minatar)
    for name in ("frames.npy", "unknown.npy"):
        bomb = tmp_path / f"bomb-{name}.npz"
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(bomb, "w") as z:
            for info in src.infolist():
                if info.filename != name:
                    z.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
            z.writestr(name, src.read("frames.npy"), compress_type=zipfile.ZIP_BZIP2)
        if name == "unknown.npy":
            assert D.read_demos(bomb).num_steps > 0
        else:
            with pytest.raises(D.DemoError, match="method numpy does not write"):
                D.read_demos(bomb)
