"""Atari clips (layer 5: what a person sees): the frames a person is shown of a game.

``atari_clip_frames`` shows the newest frame of the agent's ``[T, 84, 84, 4]`` observation
stack, upscaled with nearest neighbour (×4 → 336×336).  ``atari_native_clip_frames`` shows
native ``[T, 210, 160, 3]`` colour frames (×2 → 420×320) if the environment wrapper keeps
them for displayed segments (100,800 B per step instead of 7,056 B).  Atari clips play at
15 fps (60 Hz emulator, frame skip 4) — real time (``Task.fps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlhp_jax.render.video import upscale

ATARI_OBS_BYTES_PER_STEP = 84 * 84  # newest grayscale frame of the agent's stack
ATARI_NATIVE_BYTES_PER_STEP = 210 * 160 * 3  # native RGB frame


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


def atari_native_clip_frames(rgb: Any, scale: int | Sequence[int] = 2) -> np.ndarray:
    """Native-colour Atari frames ``[T, 210, 160, 3]`` uint8 -> ``[T, 210·s, 160·s, 3]``.

    For segments a person is shown, the wrapper may keep the emulator's RGB frames (100,800 B
    per step, vs 7,056 B for the newest 84×84 grayscale frame).  ``scale`` may be
    ``(scale_h, scale_w)``, e.g. ``(2, 4)`` for the 4:3 aspect of a television screen.
    """
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8:
        raise ValueError(f"native Atari frames must be uint8, got dtype {rgb.dtype}")
    if rgb.ndim != 4 or rgb.shape[-1] != 3:
        raise ValueError(f"native Atari frames must be [T, H, W, 3] RGB, got shape {rgb.shape}")
    if rgb.shape[0] == 0:
        raise ValueError("empty clip: no time steps")
    return upscale(rgb, scale)
