"""People labeling an Atari run see the game in native colour with the score blanked
(``render.atari``: ``NativeFrames``, ``atari_native_clip_frames``), while the agent and the
synthetic oracle see exactly what they saw before and pay nothing for it.

One real envpool Pong run of 2 environments × 60 steps (module-scoped), checked against a raw
envpool twin fed the same actions.
"""

from __future__ import annotations

import os

import envpool
import jax
import numpy as np
import pytest

from rlhp_jax import atari_masks
from rlhp_jax.envpool_envs import EnvpoolVecEnv
from rlhp_jax.human.teacher import HumanTeacher, read_segments
from rlhp_jax.render import segment_frames
from rlhp_jax.render.atari import NATIVE_SCALE, NativeFrames, atari_native_clip_frames
from rlhp_jax.rollout import collect_rollout, uniform_random_policy

N, T, SEG = 2, 60, 25
ROM = os.path.join(envpool.make_spec("Pong-v5").config.base_path, "atari", "roms", "pong.bin")
pytestmark = pytest.mark.skipif(not os.path.exists(ROM), reason="no Atari ROMs in this environment")


def run(native: bool, backend: str = "xla", steps: int = T, seed: int = 4):
    """A random policy's rollout: (env, ring or None, rollout as numpy [T, N, ...])."""
    ring = NativeFrames(N, steps + 1) if native else None
    env = EnvpoolVecEnv("Pong", N, seed=seed, backend=backend, native_frames=ring)
    state, obs = env.reset(jax.random.key(0))
    _, _, ro = collect_rollout(env, uniform_random_policy(env.spec), None, state, obs, jax.random.key(1), steps)
    return env, ring, jax.tree.map(np.asarray, ro)


def twin_frames(env, actions) -> np.ndarray:
    """What a raw envpool twin (same options and seed) shows after reset and after each of
    ``actions`` [T, N]: [T + 1, N, 210, 160, 3]."""
    twin = envpool.make(env.envpool_id, render_mode="rgb_array", **env.envpool_kwargs)
    ids = np.arange(N)
    twin.reset(ids)
    out = [twin.render(ids)]
    for a in actions:
        twin.step(np.asarray(a, np.int32), ids)
        out.append(twin.render(ids))
    twin.close()
    return np.stack(out)


@pytest.fixture(scope="module")
def pong():
    return run(native=True)


def pair_of(ro, starts=((0, 5), (1, 30))):
    """One pair [1, 2, SEG, ...] of segments (env, t0) from the rollout, as a run queues it."""
    take = lambda x: np.stack([x[t0:t0 + SEG, e] for e, t0 in starts])[None]
    return dict(obs=take(ro.obs), action=take(ro.action), true_reward=take(ro.true_reward), render=take(ro.render))


def test_people_see_atari_segments_in_native_colour_with_the_score_blank(pong, tmp_path):
    env, ring, ro = pong
    pair = pair_of(ro)
    teacher = HumanTeacher(tmp_path, "Pong", render_fields=env.render_fields, native_frames=ring)
    (qid,) = teacher.queue(pair, [dict(env_steps=0)])
    teacher.wait_idle()
    teacher.close()
    # the frames a person is shown, before encoding: colour, 420×480, the score rows black
    rgb = ring.lookup(pair["render"][0])  # [2, SEG, 210, 160, 3]
    top = atari_masks.MASKS["Pong"][0][1] * NATIVE_SCALE[0]  # Pong's mask: rows 0-24, all columns
    for side in (0, 1):
        frames, fps = segment_frames("Pong", pair["obs"][0, side], pair["render"][0, side], env.render_fields,
                                     rgb=rgb[side])
        assert frames.shape == (SEG, 420, 480, 3) and frames.dtype == np.uint8 and fps == 15.0
        assert (frames[:, :top] == 0).all()  # the score area, blank ...
        assert (rgb[side][:, :24] != 0).any()  # ... where the emulator drew something
        field = frames[:, top + 40:].astype(int)
        assert np.abs(field[..., 0] - field[..., 2]).mean() > 50  # colour: Pong's orange-brown field
    # the MP4s people watch: colour at that size, the score rows black
    for side in ("left", "right"):
        shown = _decode(tmp_path / "clips" / f"{qid}-{side}.mp4")
        assert shown.shape == (SEG, 420, 480, 3)
        assert shown[:, :top - 8].max() <= 24  # black, up to H.264's rounding near the edge
        field = shown[:, top + 40:].astype(int)
        assert np.abs(field[..., 0] - field[..., 2]).mean() > 50
    # the colour frames are shown, never saved with the pair's arrays (5 MB a pair)
    saved = read_segments(tmp_path / "segments" / f"{qid}.npz")
    assert "rgb" not in saved and set(saved) == {"obs", "action", "true_reward", "render"}


@pytest.mark.parametrize("backend", ["xla", "callback"])
def test_each_step_shows_the_emulator_frame_the_agent_acted_on(pong, backend):
    env, ring, ro = pong if backend == "xla" else run(native=True, backend="callback", steps=20)
    steps = ro.action.shape[0]
    twin = twin_frames(env, ro.action)  # twin[t]: the screen when the agent chose action t (obs[t]'s)
    np.testing.assert_array_equal(ring.lookup(ro.render), twin[:steps])
    np.testing.assert_array_equal(ro.render[..., 1], np.broadcast_to(np.arange(N), (steps, N)))
    assert ring.latest == steps  # the reset frame, then one per step


def test_the_agent_and_the_oracle_see_the_same_with_or_without_colour_frames(pong):
    env, ring, ro = pong
    plain_env, plain_ring, plain = run(native=False)
    assert plain_ring is None and plain_env.native_frames is None and plain_env.render_fields == ()
    assert plain.render.shape == (T, N, 0)  # no columns, no callback: nothing extra on that path
    assert "render_mode" not in plain_env.envpool_kwargs and plain_env.pool._render_config()[0] is None
    for field in ("obs", "action", "true_reward", "terminated", "boundary", "raw_reward", "valid"):
        np.testing.assert_array_equal(getattr(ro, field), getattr(plain, field), err_msg=field)
    assert ring.nbytes == (T + 1) * N * 100_800


def test_frames_older_than_the_ring_or_never_kept_are_refused():
    ring = NativeFrames(2, 3)
    frame = lambda v: np.full((2, 210, 160, 3), v, np.uint8)
    with pytest.raises(ValueError, match="no longer kept"):
        ring.lookup(np.array([[0.0, 0.0]]))  # nothing recorded yet
    ring.after_reset(frame(1))
    assert [ring.after_step(frame(v)) for v in (2, 3, 4)] == [0, 1, 2]  # the frame each step acted on
    np.testing.assert_array_equal(ring.lookup(ring.columns(2))[..., 0, 0, 0], [3, 3])
    np.testing.assert_array_equal(ring.lookup(np.array([[1.0, 1.0], [3.0, 0.0]]))[:, 0, 0, 0], [2, 4])
    with pytest.raises(ValueError, match="no longer kept"):
        ring.lookup(np.array([[0.0, 0.0]]))  # 4 frames recorded, 3 kept: the reset frame is gone
    with pytest.raises(ValueError, match="environment index"):
        ring.lookup(np.array([[3.0, 2.0]]))
    with pytest.raises(ValueError, match="render columns"):
        ring.lookup(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="native frames of shape"):
        ring.after_step(np.zeros((2, 84, 84, 3), np.uint8))
    with pytest.raises(ValueError, match="native_frames"):
        NativeFrames(2, 0)
    with pytest.raises(ValueError, match="holds 2 environments, not 3"):
        EnvpoolVecEnv("Pong", 3, native_frames=ring)
    with pytest.raises(ValueError, match="Unknown MuJoCo options"):
        EnvpoolVecEnv("Hopper", 2, native_frames=ring)
    with pytest.raises(ValueError, match="for Atari games"):
        segment_frames("CartPole-v1", np.zeros((3, 4), np.float32), rgb=np.zeros((3, 210, 160, 3), np.uint8))


def test_native_clip_frames_blank_every_games_score_area():
    rgb = np.random.default_rng(3).integers(1, 256, (2, 210, 160, 3), dtype=np.uint8)
    for game, rects in atari_masks.MASKS.items():
        out = atari_native_clip_frames(rgb, game)
        assert out.shape == (2, 420, 480, 3)
        blank = np.repeat(np.repeat(atari_masks.boolean_mask(game), 2, 0), 3, 1)
        assert (out[:, blank] == 0).all() and (out[:, ~blank] != 0).all(), game
    with pytest.raises(ValueError, match="no score-area mask"):
        atari_native_clip_frames(rgb, "Pitfall")


def _decode(path):
    """All frames of a video as [T, H, W, 3] uint8 (bundled ffmpeg)."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path))
    w, h = next(gen)["size"]
    return np.stack([np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen])
