"""What a person sees (layer 5): the pictures of any task the project runs, for clips and the play page.

Two questions, one answer each, for every backend the task registry (``tasks.TASKS``) knows:

* ``segment_frames(env, obs, render, render_fields, rgb=...)`` — the frames of one trajectory
  segment as a labeler is shown it, and the rate they play at; ``video.encode_mp4`` turns them
  into the MP4 the labeling page plays (``human.teacher.write_clips``).  An Atari segment is
  shown in the emulator's native colour when its frames were kept (``rgb``, from
  ``atari.NativeFrames``), else as the agent's 84×84 grayscale.
* ``play_frame(obs, stack, env)`` — the picture the play page draws of the game's current
  observation (``human.play.PlaySession``).

The drawing itself lives in one module per kind of task, each its only home:

``render.video``
  H.264 MP4 encoding and probing (``encode_mp4``, ``probe_mp4``), nearest-neighbour ``upscale``.
``render.atari``
  Atari frames: native colour with the score blanked, kept during a run labeled by people
  (``NativeFrames``), or the agent's masked 84×84 stack.
``render.mujoco``
  MuJoCo state rebuilt from observations (``reconstruct_state``) and rendered offscreen
  (``MujocoRenderer``, ``get_mujoco_renderer``, ``gl_backend``).
``render.classic``
  gymnax classic control drawn with numpy, MinAtar cells in the registry's palette
  (``classic_clip_frames``, ``minatar_cells``).
``python -m rlhp_jax.render`` (``render/__main__``)
  A clip of a random policy in any task, for looking at and timing the above.

Only what a person is shown is rendered, never anything on the training hot path: plain numpy
and Python (no jit); MuJoCo, envpool and ffmpeg are imported only when used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlhp_jax import tasks
from rlhp_jax.render.atari import atari_clip_frames, atari_native_clip_frames, native_scale
from rlhp_jax.render.classic import classic_clip_frames, minatar_cells
from rlhp_jax.render.mujoco import get_mujoco_renderer, reconstruct_state

__all__ = ["MIN_CLIP_S", "play_frame", "segment_frames"]

MIN_CLIP_S = 1.0


def segment_frames(env: str, obs: Any, render: Any = None, render_fields: Sequence[str] = (),
                   size: int = 256, rgb: Any = None) -> tuple[np.ndarray, float]:
    """``(frames, fps)`` of one trajectory segment as a person is shown it, for any task the
    project runs: ``obs`` ``[T, *obs_shape]`` and ``render`` ``[T, R]`` as the rollout keeps
    them (``render_fields`` names the R columns; MuJoCo's root position).  Frame t shows the
    observation the agent acted on at step t; MuJoCo's root position is the one reported after
    that step (one step ahead: a constant shift of about one step's travel).

    ``rgb`` (Atari only): the segment's native colour frames ``[T, 210, 160, 3]``
    (``atari.NativeFrames.lookup``), shown with the score blanked at ×(2, 3) per 256 of ``size``
    (420×480); without them an Atari clip is the agent's 84×84 grayscale, ≈``size`` square.

    Clips play in real time, but never shorter than ``MIN_CLIP_S``: shorter segments (CartPole's
    25 steps are 0.5 s) play in slow motion, since Christiano's labelers judged clips of 1-2 s."""
    obs = np.asarray(obs)
    frames, fps = _segment_frames(env, obs, render, render_fields, size, rgb)
    return frames, min(fps, len(frames) / MIN_CLIP_S)


def _segment_frames(env, obs, render, render_fields, size, rgb):
    task = tasks.resolve(env)
    if rgb is not None:
        if task.backend != "atari":
            raise ValueError(f"native colour frames are for Atari games; {task.name} is a {task.backend} task")
        if len(rgb) != len(obs):
            raise ValueError(f"{len(rgb)} colour frames for a segment of {len(obs)} steps")
        return atari_native_clip_frames(rgb, task.name, native_scale(size)), task.fps
    if task.backend == "mujoco":
        render = np.zeros((obs.shape[0], 0)) if render is None else np.asarray(render)
        info = {f: render[:, i] for i, f in enumerate(render_fields)}
        qpos, qvel = reconstruct_state(task.name, obs, info)
        return get_mujoco_renderer(task.name, size, size).render_qpos(qpos, qvel), task.fps
    if task.backend == "atari":  # the agent's masked 84x84 frames
        return atari_clip_frames(obs.astype(np.uint8), scale=max(1, round(size / 84))), task.fps
    return classic_clip_frames(task.name, obs, size=size), task.fps


def play_frame(obs: np.ndarray, stack: int, env_name: str) -> np.ndarray:
    """What the play page draws of one observation: Atari the newest frame of the stack ([H, W]
    uint8, already blanked by the wrapper), MinAtar its cells in the colours of the labeling clips
    (``classic.minatar_cells``: [H, W, 3] uint8).  ``stack`` is the demo file's frame stack
    (``demos.frame_format``)."""
    obs = np.asarray(obs)
    if stack > 1:
        return np.ascontiguousarray(obs[..., -1], np.uint8)
    if obs.dtype == np.uint8 and obs.ndim == 2:
        return obs
    return minatar_cells(env_name, obs)
