"""Atari clips (layer 5: what a person sees): the frames a person is shown of a game.

Two pictures of a step:

``atari_native_clip_frames`` — what people labeling a run are shown
  The emulator's native ``[T, 210, 160, 3]`` colour frames, score area blanked, upscaled ×(2, 3)
  to 420×480.  Christiano's instructions to people (appendix B.2, ``human.instructions``) speak
  of colours — Pong's "orange paddle on the left" and "green paddle on the right", Breakout's
  "colored blocks", Qbert changing "the color of" blocks — that the agent's 84×84 grayscale does
  not show.  Each native pixel becomes a 2×3 block: wider than tall, as a television drew them
  (a 4:3 picture of 160×210 pixels has pixels 1.75 times as wide as tall), and a near-square
  picture like every other task's clip, which fills the page's square video boxes.
``atari_clip_frames`` — the agent's own view
  The newest frame of the agent's ``[T, 84, 84, 4]`` observation stack, nearest-neighbour
  upscaled: clips of a segment whose colour frames were not kept (``python -m rlhp_jax.render``
  without ``--native``).

Atari clips play at 15 fps (60 Hz emulator, frame skip 4) — real time (``Task.fps``).

The score is never shown
------------------------
``atari_native_clip_frames`` takes the game and blanks its ``atari_masks.MASKS`` rectangles in the
native frame (``mask_native``: the same table the agent's 84×84 frames are blanked from, there
mapped outward), so a person never sees a score the reward model never sees.  Masking happens
here, in the one function that turns colour frames into a person's pictures, not where frames are
kept: nothing else draws them.

Where colour frames come from: ``NativeFrames``
-----------------------------------------------
One envpool environment emits either the agent's 84×84 grayscale stack or native colour, not
both; asking it for colour and converting it to the agent's frames ourselves would change what
the agent sees (envpool max-pools the last two emulator frames in grayscale before an area
resize).  envpool's ``render()`` (``render_mode="rgb_array"``) instead returns the emulator's
current screen, ``[N, 210, 160, 3]``, without touching the observations.  So, only for runs
labeled by people, the run hands the environment wrapper a ``NativeFrames`` ring of the last K
steps of every environment (``EnvpoolVecEnv(..., native_frames=NativeFrames(N, K))``; the
wrapper, a lower layer, only calls its methods), and the wrapper calls ``render()`` after reset
and after every step of the compiled rollout (one ordered ``io_callback``) and keeps the frames
there.  Without a ring (the agent's own and the synthetic oracle's runs) nothing of this runs: no
render mode, no callback, not a byte.  Each step's ``StepOut.render`` carries
``("native_frame", "env")`` (``NativeFrames.FIELDS``): the id of the frame the agent acted on at
that step and the environment's index, so the rollout's render columns, gathered for the queried
segments exactly like MuJoCo's root positions, say which frames a queried clip needs;
``lookup`` fetches them (``human.teacher.HumanTeacher`` does, on the training thread, at once:
before the ring moves on).  Re-rendering a segment later is not possible: envpool cannot save
and restore an emulator mid-episode, and replaying from the episode's start is up to 27,000 steps.

The frame shown is the emulator's last of the four a step skips, where the agent's frame is the
maximum of the last two (which removes the flicker of sprites drawn on alternate frames): in a
game that flickers, a sprite the agent sees steadily may blink, or be missing, in a person's clip.
(Max-pooling colour would need the emulator's second-to-last frame, which ``render()`` does not
give.)

Cost, only on that path.  Memory: 100,800 B per environment step kept
(``ATARI_NATIVE_BYTES_PER_STEP``; the agent's newest frame is 7,056 B).  The ring needs one
iteration's rollout, from which the queried segments are chosen: K = rollout length + 1 (the
frame before the first step); Christiano's Atari runs (16 environments × 250 steps per iteration)
keep 16 × 251 × 100,800 B = 405 MB.  A queued pair holds its 2 × 25 frames, 5.0 MB, until its
clips are encoded (the pair's saved arrays leave them out).  Time, measured on Pong with 16
environments (XLA backend, a 2-core CPU machine): a batched step of the rollout takes about 1.0 ms
longer, 5.9 -> 6.9 ms (+17%; 63 µs per environment step): 0.3 ms the callback itself, 0.4 ms
``render()``, 0.2 ms the copy into the ring.  Palette indices (Atari has 128 colours) would keep a
third of the bytes but cost about 7 ms per 16 frames to convert, on every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlhp_jax import atari_masks
from rlhp_jax.render.video import upscale

ATARI_OBS_BYTES_PER_STEP = 84 * 84  # newest grayscale frame of the agent's stack
ATARI_NATIVE_BYTES_PER_STEP = 210 * 160 * 3  # native RGB frame
NATIVE_SHAPE = (atari_masks.NATIVE_HEIGHT, atari_masks.NATIVE_WIDTH, 3)
NATIVE_SCALE = (2, 3)  # 210×160 -> 420×480: pixels 1.5 times as wide as tall (see the module docstring)
FRAME_ID_MOD = 1 << 24  # frame ids travel in the rollout's float32 render columns: exact below 2^24


def atari_clip_frames(obs_stack: Any, scale: int = 4) -> np.ndarray:
    """The agent's observations ``[T, 84, 84, 4]`` (channel-last, newest frame last) ->
    the newest frame of each step, upscaled ×``scale`` with nearest neighbour:
    ``[T, 84·scale, 84·scale]`` grayscale uint8 (``encode_mp4`` takes it as is)."""
    obs = np.asarray(obs_stack)
    if obs.dtype != np.uint8:
        raise ValueError(f"Atari observations must be uint8, got dtype {obs.dtype}")
    if obs.ndim != 4:
        raise ValueError(f"Atari observations must be [T, H, W, stack] (channel-last), got shape "
                         f"{obs.shape}")
    if obs.shape[0] == 0:
        raise ValueError("empty clip: no time steps")
    return upscale(obs[..., -1], scale)


def atari_native_clip_frames(rgb: Any, game: str, scale: int | Sequence[int] = NATIVE_SCALE) -> np.ndarray:
    """What a person is shown of native-colour frames of ``game``: ``[T, 210, 160, 3]`` uint8 ->
    ``[T, 210·s_h, 160·s_w, 3]``, the game's score area (``atari_masks.MASKS``) black.

    ``scale``: an integer or ``(scale_h, scale_w)``; the default ×(2, 3) gives 420×480.
    """
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8:
        raise ValueError(f"native Atari frames must be uint8, got dtype {rgb.dtype}")
    if rgb.ndim != 4 or rgb.shape[-1] != 3:
        raise ValueError(f"native Atari frames must be [T, H, W, 3] RGB, got shape {rgb.shape}")
    if rgb.shape[0] == 0:
        raise ValueError("empty clip: no time steps")
    return upscale(atari_masks.mask_native(rgb, game), scale)


def native_scale(size: int) -> tuple[int, int]:
    """The upscaling of native frames for a clip ``size`` (``segment_frames``): ×(2, 3) up to
    384 pixels, ×(4, 6) up to 640, and so on."""
    k = max(1, round(size / 256))
    return NATIVE_SCALE[0] * k, NATIVE_SCALE[1] * k


class NativeFrames:
    """The emulator's native colour frames of the last ``capacity`` steps of ``num_envs``
    environments (a ring; see the module docstring).

    The environment wrapper calls ``after_reset`` and ``after_step`` with envpool's
    ``render()``, ``[N, 210, 160, 3]``; each batch gets the next id.  ``after_step`` returns the
    id of the frame before the step — the observation the agent acted on — and ``columns`` makes
    it the step's render columns.  ``lookup`` turns gathered render columns back into frames.
    Frames are kept as the emulator drew them, score included: ``atari_native_clip_frames`` blanks
    it when they are drawn for a person."""

    FIELDS = ("native_frame", "env")  # the render columns (``StepOut.render``) of a step

    def __init__(self, num_envs: int, capacity: int):
        if not (isinstance(num_envs, (int, np.integer)) and num_envs >= 1):
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if not (isinstance(capacity, (int, np.integer)) and 1 <= capacity < FRAME_ID_MOD):
            raise ValueError(f"native_frames (steps of colour frames kept) must be an integer in "
                             f"[1, {FRAME_ID_MOD}), got {capacity!r}")
        self.num_envs, self.capacity = int(num_envs), int(capacity)
        self.frames = np.zeros((self.capacity, self.num_envs, *NATIVE_SHAPE), np.uint8)  # pages taken when written
        self.ids = np.full(self.capacity, -1, np.int64)  # the id each slot holds
        self.latest = -1  # the id of the newest frame (-1: none yet)

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes

    def after_reset(self, frames: Any) -> int:
        """The frames of freshly reset environments; returns their id."""
        return self.record(frames)

    def after_step(self, frames: Any) -> np.int32:
        """The frames after a step; returns the id (modulo 2^24, for ``columns``) of the frames
        before it: those of the observation the step acted on."""
        return np.int32((self.record(frames) - 1) % FRAME_ID_MOD)

    def record(self, frames: Any) -> int:
        """Keep one step's frames ``[num_envs, 210, 160, 3]`` uint8 (copied); returns their id."""
        frames = np.asarray(frames)
        if frames.shape != (self.num_envs, *NATIVE_SHAPE) or frames.dtype != np.uint8:
            raise ValueError(f"expected native frames of shape {(self.num_envs, *NATIVE_SHAPE)} uint8, got "
                             f"{frames.shape} {frames.dtype}")
        self.latest += 1
        slot = self.latest % self.capacity
        self.frames[slot] = frames
        self.ids[slot] = self.latest
        return self.latest

    def columns(self, frame_id: Any, xp: Any = np) -> Any:
        """The ``[num_envs, 2]`` float32 render columns of a step whose observation is frame
        ``frame_id`` (a host int, or a traced int32 with ``xp=jax.numpy``)."""
        fid = xp.broadcast_to(xp.asarray(frame_id % FRAME_ID_MOD, xp.float32), (self.num_envs,))
        return xp.stack([fid, xp.arange(self.num_envs, dtype=xp.float32)], axis=-1)

    def lookup(self, render: Any) -> np.ndarray:
        """Render columns ``[..., 2]`` (``FIELDS``, gathered from a rollout like any per-step
        field) -> the frames ``[..., 210, 160, 3]`` uint8 (a copy).  ValueError if one of them has
        left the ring (it is older than ``capacity`` steps) or was never kept."""
        render = np.asarray(render)
        if render.ndim < 1 or render.shape[-1] != len(self.FIELDS):
            raise ValueError(f"render columns must be [..., {len(self.FIELDS)}] {self.FIELDS}, got shape "
                             f"{render.shape}")
        fid = render[..., 0].astype(np.int64)
        env = render[..., 1].astype(np.int64)
        if ((env < 0) | (env >= self.num_envs)).any():
            raise ValueError(f"environment index out of range [0, {self.num_envs})")
        age = (self.latest - fid) % FRAME_ID_MOD  # ids are kept modulo 2^24 in the columns
        full = self.latest - age
        slot = full % self.capacity
        if self.latest < 0 or (age >= self.capacity).any() or (full < 0).any() or (self.ids[slot] != full).any():
            oldest = int(age.max()) if self.latest >= 0 else 0
            raise ValueError(f"the colour frames of these steps are no longer kept: the oldest is {oldest} steps "
                             f"old and only the last {self.capacity} are (the environment's native_frames "
                             f"option: at least the rollout length + 1)")
        return self.frames[slot, env]
