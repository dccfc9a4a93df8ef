"""Classic-control and MinAtar clips (layer 5: what a person sees): frames drawn from observations.

gymnax has no renderer the project can use, so the frames are drawn here from the
observations alone, with plain numpy (no jax, no new dependencies).  The frames go to
``render.video.encode_mp4`` like the Atari and MuJoCo ones, played at the task's ``fps``
(real time; ``tasks.TASKS``)::

    frames = classic_clip_frames("CartPole-v1", obs)            # [T, 256, 256, 3] uint8
    encode_mp4(frames, "clip.mp4", tasks.TASKS["CartPole-v1"].fps)

What is drawn (the observation layouts are gymnax 1.0.1's ``get_obs``; conventions as gym's
own renderers, y up):

CartPole-v1  ``[x, x_dot, theta, theta_dot]``
  The track (x in ±2.4 m plus margins across the width), red marks at the ±2.4 m limits, a
  grey mark at 0, the cart and the pole drawn to scale (1 m pole).  ``theta > 0`` leans the
  pole to the right (pushing the cart right swings it left: gymnax's dynamics).
Pendulum-v1  ``[cos θ, sin θ, θdot]``
  A rod of 1 m from the centre with a bob, the bob's circle in grey and a green mark at the
  top: ``θ = 0`` is upright (the goal), ``θ > 0`` swings counter-clockwise (to the left).
Acrobot-v1  ``[cos θ1, sin θ1, cos θ2, sin θ2, θ1dot, θ2dot]``
  Two 1 m links from a fixed pivot in the centre (``θ1 = θ2 = 0`` hangs straight down, the
  angles count counter-clockwise), and the green goal line 1 m above the pivot: the task ends
  when the tip rises above it (``-cos θ1 - cos(θ1 + θ2) > 1``).
MountainCarContinuous-v0  ``[position, velocity]``
  The hill ``y = 0.45 sin(3x) + 0.55`` for x in [-1.2, 0.6], the red goal flag at x = 0.45,
  and the car on the curve, tilted with the slope.
MinAtar (Asterix, Breakout, Freeway, Seaquest, SpaceInvaders)  ``[10, 10, C]``
  One channel per object type (the task's ``minatar_channels`` name them and give each its
  colour: the registry's palette, the only one; the play page draws the same cells,
  ``minatar_cells``), row 0 at the top.  Cells are scaled up with nearest neighbour onto a dark
  board with 1-pixel gaps between cells; where channels overlap, the later channel is drawn over
  the earlier (as MinAtar's own display does).

Speed: a primitive (capsule, disc, convex polygon) is rasterised with a distance / half-plane
mask over its bounding box only, and the static parts (track, hill, flag, goal line) are drawn
once per size, so 60 frames of 256×256 take a few tens of milliseconds.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rlhp_jax import tasks

__all__ = ["MIN_CLIP_SIZE", "classic_clip_frames", "minatar_cells"]

RGB = tasks.RGB

MIN_CLIP_SIZE = 32

# ------------------------------------------------------------------------------ drawing
# Pixel coordinates are floats (x = column, y = row, y down); pixel (r, c) covers
# [c, c+1) x [r, r+1) and is sampled at its centre (c + 0.5, r + 0.5).


def _window(img: np.ndarray, x0: float, x1: float, y0: float, y1: float):
    """The part of ``img`` a primitive with bounding box [x0, x1] x [y0, y1] can touch:
    (view, xs [1, w], ys [h, 1]) with the pixel-centre coordinates, or None if off-image."""
    h, w = img.shape[:2]
    c0, c1 = max(int(np.floor(x0)), 0), min(int(np.ceil(x1)) + 1, w)
    r0, r1 = max(int(np.floor(y0)), 0), min(int(np.ceil(y1)) + 1, h)
    if c0 >= c1 or r0 >= r1:
        return None
    xs = (np.arange(c0, c1, dtype=np.float32) + 0.5)[None, :]
    ys = (np.arange(r0, r1, dtype=np.float32) + 0.5)[:, None]
    return img[r0:r1, c0:c1], xs, ys


def _capsule(img: np.ndarray, a, b, radius: float, color: RGB) -> None:
    """A thick line: every pixel within ``radius`` of the segment a-b (round ends)."""
    (ax, ay), (bx, by) = a, b
    win = _window(img, min(ax, bx) - radius, max(ax, bx) + radius,
                  min(ay, by) - radius, max(ay, by) + radius)
    if win is None:
        return
    view, xs, ys = win
    dx, dy = bx - ax, by - ay
    den = dx * dx + dy * dy
    px, py = xs - ax, ys - ay
    t = np.clip((px * dx + py * dy) / den, 0.0, 1.0) if den > 0 else np.zeros((1, 1), np.float32)
    ex, ey = px - t * dx, py - t * dy
    view[ex * ex + ey * ey <= radius * radius] = color


def _disc(img: np.ndarray, c, radius: float, color: RGB) -> None:
    _capsule(img, c, c, radius, color)


def _ring(img: np.ndarray, c, radius: float, half_width: float, color: RGB) -> None:
    cx, cy = c
    r_out = radius + half_width
    win = _window(img, cx - r_out, cx + r_out, cy - r_out, cy + r_out)
    if win is None:
        return
    view, xs, ys = win
    d = np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2)
    view[np.abs(d - radius) <= half_width] = color


def _polygon(img: np.ndarray, points, color: RGB) -> None:
    """A filled convex polygon (vertices in either winding order)."""
    pts = np.asarray(points, np.float64)
    win = _window(img, pts[:, 0].min(), pts[:, 0].max(), pts[:, 1].min(), pts[:, 1].max())
    if win is None:
        return
    view, xs, ys = win
    pos = np.ones(view.shape[:2], bool)
    neg = np.ones(view.shape[:2], bool)
    for (x0, y0), (x1, y1) in zip(pts, np.roll(pts, -1, axis=0)):
        cross = (x1 - x0) * (ys - y0) - (y1 - y0) * (xs - x0)
        pos &= cross >= 0
        neg &= cross <= 0
    view[pos | neg] = color


def _rect(img: np.ndarray, x0: float, y0: float, x1: float, y1: float, color: RGB) -> None:
    _polygon(img, [(x0, y0), (x1, y0), (x1, y1), (x0, y1)], color)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# ------------------------------------------------------------------------------ CartPole

_CP_X_LIMIT = 2.4  # gymnax x_threshold
_CP_MARGIN = 0.35  # metres shown beyond each limit
_CP_CART_W, _CP_CART_H = 0.5, 0.3  # metres
_CP_POLE_LEN, _CP_POLE_W = 1.0, 0.1  # 2 * length (gymnax length = half the pole)
_CP_TRACK = (30, 30, 30)
_CP_LIMIT = (220, 30, 30)
_CP_CENTER = (170, 170, 170)
_CP_CART = (40, 40, 70)
_CP_POLE = (210, 120, 40)
_CP_AXLE = (110, 120, 230)


def _cp_geometry(size: int):
    scale = size / (2 * (_CP_X_LIMIT + _CP_MARGIN))  # px per metre
    track_y = 0.62 * size
    return scale, track_y


def _cp_px(x: float, size: int) -> float:
    scale, _ = _cp_geometry(size)
    return size / 2 + x * scale


@functools.lru_cache(maxsize=8)
def _cartpole_background(size: int) -> np.ndarray:
    img = np.full((size, size, 3), 255, np.uint8)
    scale, ty = _cp_geometry(size)
    lw = max(1.0, size / 256)
    _capsule(img, (0, ty), (size, ty), lw, _CP_TRACK)
    tick = 0.05 * size
    for x in (-_CP_X_LIMIT, _CP_X_LIMIT):
        px = _cp_px(x, size)
        _capsule(img, (px, ty - tick), (px, ty + tick), 1.5 * lw, _CP_LIMIT)
    _capsule(img, (size / 2, ty + lw + 1), (size / 2, ty + tick), lw, _CP_CENTER)
    return _frozen(img)


def _draw_cartpole(img: np.ndarray, o: np.ndarray, size: int) -> None:
    x, theta = float(o[0]), float(o[2])
    scale, ty = _cp_geometry(size)
    cx = _cp_px(x, size)
    w, h = _CP_CART_W * scale, _CP_CART_H * scale
    _rect(img, cx - w / 2, ty - h, cx + w / 2, ty, _CP_CART)
    pivot = (cx, ty - 0.75 * h)
    length = _CP_POLE_LEN * scale
    tip = (cx + length * np.sin(theta), pivot[1] - length * np.cos(theta))  # theta > 0: right
    _capsule(img, pivot, tip, max(1.0, _CP_POLE_W * scale / 2), _CP_POLE)
    _disc(img, pivot, max(1.5, 0.06 * scale), _CP_AXLE)


# ------------------------------------------------------------------------------ Pendulum

_PD_VIEW = 1.3  # metres from the centre to the frame's edge
_PD_PATH = (215, 215, 215)
_PD_GOAL = (40, 170, 60)
_PD_ROD = (204, 77, 77)
_PD_BOB = (150, 30, 30)
_PD_PIVOT = (40, 40, 40)


@functools.lru_cache(maxsize=8)
def _pendulum_background(size: int) -> np.ndarray:
    img = np.full((size, size, 3), 255, np.uint8)
    c = size / 2
    scale = size / (2 * _PD_VIEW)
    lw = max(1.0, size / 256)
    _ring(img, (c, c), scale, lw, _PD_PATH)
    _capsule(img, (c, c - 1.1 * scale), (c, c - 1.22 * scale), 1.5 * lw, _PD_GOAL)
    return _frozen(img)


def _draw_pendulum(img: np.ndarray, o: np.ndarray, size: int) -> None:
    cos_t, sin_t = float(o[0]), float(o[1])
    norm = np.hypot(cos_t, sin_t) or 1.0
    cos_t, sin_t = cos_t / norm, sin_t / norm
    c = size / 2
    scale = size / (2 * _PD_VIEW)
    end = (c - scale * sin_t, c - scale * cos_t)  # theta = 0: up; theta > 0: counter-clockwise
    _capsule(img, (c, c), end, max(1.0, 0.05 * scale), _PD_ROD)
    _disc(img, end, 0.12 * scale, _PD_BOB)
    _disc(img, (c, c), max(1.5, 0.05 * scale), _PD_PIVOT)


# ------------------------------------------------------------------------------ Acrobot

_AC_VIEW = 2.2  # metres from the pivot to the frame's edge (gym's bound)
_AC_GOAL = (40, 170, 60)
_AC_LINK = (0, 150, 170)
_AC_JOINT = (230, 180, 0)
_AC_PIVOT = (40, 40, 40)


@functools.lru_cache(maxsize=8)
def _acrobot_background(size: int) -> np.ndarray:
    img = np.full((size, size, 3), 255, np.uint8)
    c = size / 2
    scale = size / (2 * _AC_VIEW)
    lw = max(1.0, size / 256)
    _capsule(img, (0.1 * scale, c - scale), (size - 0.1 * scale, c - scale), lw, _AC_GOAL)
    return _frozen(img)


def _draw_acrobot(img: np.ndarray, o: np.ndarray, size: int) -> None:
    c1, s1, c2, s2 = (float(v) for v in o[:4])
    n1, n2 = np.hypot(c1, s1) or 1.0, np.hypot(c2, s2) or 1.0
    c1, s1, c2, s2 = c1 / n1, s1 / n1, c2 / n2, s2 / n2
    c12, s12 = c1 * c2 - s1 * s2, s1 * c2 + c1 * s2  # cos, sin of theta1 + theta2
    c = size / 2
    scale = size / (2 * _AC_VIEW)
    # world (y up): p1 = (sin t1, -cos t1), p2 = p1 + (sin(t1+t2), -cos(t1+t2)); image rows go down
    p0 = (c, c)
    p1 = (c + scale * s1, c + scale * c1)
    p2 = (p1[0] + scale * s12, p1[1] + scale * c12)
    r = max(1.0, 0.1 * scale)
    _capsule(img, p0, p1, r, _AC_LINK)
    _capsule(img, p1, p2, r, _AC_LINK)
    _disc(img, p1, 0.8 * r, _AC_JOINT)
    _disc(img, p0, 0.8 * r, _AC_PIVOT)


# ------------------------------------------------------------------------------ MountainCar

_MC_MIN_X, _MC_MAX_X, _MC_GOAL_X = -1.2, 0.6, 0.45
_MC_MARGIN = 0.05
_MC_Y_MID = 0.6  # world height at the frame's vertical centre
_MC_CAR_W, _MC_CAR_H, _MC_WHEEL = 0.18, 0.08, 0.025
_MC_SKY = (250, 250, 255)
_MC_GROUND = (205, 225, 175)
_MC_HILL = (70, 90, 50)
_MC_FLAG = (220, 30, 30)
_MC_POLE = (60, 60, 60)
_MC_CAR = (40, 40, 70)
_MC_WHEEL_C = (140, 140, 140)


def _mc_height(x):
    return np.sin(3 * x) * 0.45 + 0.55


def _mc_transform(size: int):
    scale = size / (_MC_MAX_X - _MC_MIN_X + 2 * _MC_MARGIN)

    def to_px(x, y):
        return ((x - _MC_MIN_X + _MC_MARGIN) * scale, size / 2 - (y - _MC_Y_MID) * scale)

    return scale, to_px


@functools.lru_cache(maxsize=8)
def _mountaincar_background(size: int) -> np.ndarray:
    img = np.empty((size, size, 3), np.uint8)
    img[:] = _MC_SKY
    scale, to_px = _mc_transform(size)
    cols = np.arange(size) + 0.5
    xw = np.clip(cols / scale + _MC_MIN_X - _MC_MARGIN, _MC_MIN_X, _MC_MAX_X)
    _, rows = to_px(xw, _mc_height(xw))
    img[(np.arange(size)[:, None] + 0.5) > rows[None, :]] = _MC_GROUND
    lw = max(1.0, size / 200)
    xs = np.linspace(_MC_MIN_X, _MC_MAX_X, 120)
    pts = [to_px(x, _mc_height(x)) for x in xs]
    for a, b in zip(pts[:-1], pts[1:]):
        _capsule(img, a, b, lw, _MC_HILL)
    gy = _mc_height(_MC_GOAL_X)
    base, top = to_px(_MC_GOAL_X, gy), to_px(_MC_GOAL_X, gy + 0.16)
    _capsule(img, base, top, lw, _MC_POLE)
    _polygon(img, [top, to_px(_MC_GOAL_X, gy + 0.11), to_px(_MC_GOAL_X + 0.09, gy + 0.135)],
             _MC_FLAG)
    return _frozen(img)


def _draw_mountaincar(img: np.ndarray, o: np.ndarray, size: int) -> None:
    x = float(o[0])
    _, to_px = _mc_transform(size)
    y = _mc_height(x)
    alpha = np.arctan(1.35 * np.cos(3 * x))  # slope of the hill
    t = np.array([np.cos(alpha), np.sin(alpha)])  # along the slope (world, y up)
    n = np.array([-np.sin(alpha), np.cos(alpha)])  # normal, pointing out of the hill
    ground = np.array([x, y])
    body_lo = ground + n * 2 * _MC_WHEEL * 0.8
    corners = [body_lo + sx * t * _MC_CAR_W / 2 + sy * n * _MC_CAR_H
               for sx, sy in ((-1, 0), (1, 0), (1, 1), (-1, 1))]
    _polygon(img, [to_px(*p) for p in corners], _MC_CAR)
    scale, _ = _mc_transform(size)
    for sx in (-0.3, 0.3):
        wc = ground + n * _MC_WHEEL + t * sx * _MC_CAR_W
        _disc(img, to_px(*wc), _MC_WHEEL * scale, _MC_WHEEL_C)


# ------------------------------------------------------------------------------ MinAtar

_MA_GAP = (14, 14, 20)
_MA_BOARD = (30, 30, 42)


@functools.lru_cache(maxsize=16)
def _minatar_maps(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(cell index of each pixel row/column [size], gap mask [size, size])."""
    idx = (np.arange(size) * 10) // size
    edge = np.zeros(size, bool)
    edge[1:] = idx[1:] != idx[:-1]  # first pixel of every cell but the first
    gap = edge[:, None] | edge[None, :]
    return _frozen(idx), _frozen(gap)


def minatar_cells(env_name: str, obs: Any) -> np.ndarray:
    """A MinAtar game's observations ``[T, 10, 10, C]`` -> one colour per cell ``[T, 10, 10, 3]``
    uint8: the dark board, each channel in its colour, later channels over earlier ones."""
    obs = np.asarray(obs)
    cells = np.empty((*obs.shape[:-1], 3), np.uint8)
    cells[:] = _MA_BOARD
    for c, (_, color) in enumerate(tasks.TASKS[env_name].minatar_channels):
        cells[obs[..., c] > 0.5] = color
    return cells


def _minatar_frames(env_name: str, obs: np.ndarray, size: int) -> np.ndarray:
    cells = minatar_cells(env_name, obs)
    idx, gap = _minatar_maps(size)
    frames = cells.take(idx, axis=1).take(idx, axis=2)  # nearest neighbour; C-contiguous
    frames[:, gap] = _MA_GAP
    return frames


# ------------------------------------------------------------------------------ API

_CLASSIC = {
    "CartPole-v1": (_cartpole_background, _draw_cartpole),
    "Pendulum-v1": (_pendulum_background, _draw_pendulum),
    "Acrobot-v1": (_acrobot_background, _draw_acrobot),
    "MountainCarContinuous-v0": (_mountaincar_background, _draw_mountaincar),
}


def classic_clip_frames(env_name: str, obs: Any, size: int = 256) -> np.ndarray:
    """Frames of a gymnax task's clip: observations ``[T, *obs_shape]`` -> ``[T, size, size, 3]``
    RGB uint8, for ``render.video.encode_mp4`` at the task's ``fps``.

    ``env_name`` is a gymnax task's name (``tasks.TASKS``); ``obs`` are the observations the
    environment wrapper returns (the task's ``obs_shape``; the module docstring says what each
    task's frames show).  ``size`` must be even (H.264's yuv420p) and at least 32.  Raises
    ``ValueError`` for an unknown task, a bad size, or observations of the wrong shape, type or
    with non-finite values.
    """
    task = tasks.TASKS.get(env_name)
    if task is None or task.backend != "gymnax":
        raise ValueError(f"no classic clip renderer for {env_name!r}; supported: "
                         f"{', '.join(tasks.names('gymnax'))}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < MIN_CLIP_SIZE \
            or size % 2:
        raise ValueError(f"size must be an even integer >= {MIN_CLIP_SIZE}, got {size!r}")
    size = int(size)
    expected = task.obs_shape
    obs = np.asarray(obs)
    if obs.ndim != 1 + len(expected) or obs.shape[1:] != expected:
        hint = " (a single observation? pass obs[None])" if obs.shape == expected else ""
        raise ValueError(f"{env_name}: observations must be [T, {', '.join(map(str, expected))}], "
                         f"got shape {obs.shape}{hint}")
    if obs.shape[0] == 0:
        raise ValueError(f"{env_name}: empty clip: no time steps (T == 0)")
    if obs.dtype.kind not in "biuf":
        raise ValueError(f"{env_name}: observations must be numbers or booleans, got dtype "
                         f"{obs.dtype}")
    obs = obs.astype(np.float64)
    if not np.isfinite(obs).all():
        raise ValueError(f"{env_name}: observations contain non-finite values (NaN or inf)")

    if task.minatar_channels:
        return _minatar_frames(env_name, obs, size)
    background, draw = _CLASSIC[env_name]
    frames = np.empty((obs.shape[0], size, size, 3), np.uint8)
    frames[:] = background(size)
    for frame, o in zip(frames, obs):
        draw(frame, o, size)
    return frames
