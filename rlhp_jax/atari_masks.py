"""Score-area masks for Atari frames: one table, native ALE coordinates.

Atari games draw their score on the screen, so a reward model that sees it could read the
reward off the frame instead of learning it from what happens in the game.  Both papers blank
it out:

* Christiano et al. (2017), appendix A.2: "we replace the score area with a constant black
  background on all seven games.  On BeamRider we additionally blank out the enemy ship
  count, and on Enduro we blank out the speedometer."
* Ibarz et al. (2018), appendix A.1: "We replace the score with a constant black background
  to prevent inferring the reward from the score."

The table covers Christiano's seven games (BeamRider, Breakout, Enduro, Pong, Qbert, Seaquest,
SpaceInvaders) and Ibarz's nine (the same less SpaceInvaders, plus Hero, MontezumaRevenge and
PrivateEye).  Beyond the two extras A.2 names, only the score area is masked (counting
BeamRider's sector number, printed under its score, as part of it): lives, timers,
oxygen/power bars and inventories stay visible.

``MASKS`` lists, per game, the rectangles to blank.  Keys are the games' names in
``tasks.TASKS`` (``"Pong"`` for ``"Pong-v5"``); every function here also accepts the task id
itself, and nothing looser (``game_name``: a mask is never applied to a game it was not drawn for).

Coordinates
-----------
Rectangles are ``(row0, row1, col0, col1)``, half-open (``frame[row0:row1, col0:col1]``), in
NATIVE ALE screen coordinates: 210 rows x 160 columns, row 0 at the top, i.e. exactly the
frame envpool returns with ``img_height=210, img_width=160``.  They were placed by looking at
real envpool frames and at the pixels that change when the score changes, with about two
pixels of margin; where a score grows by more digits as it gets larger, the rectangle leaves
room for six digits, 8 pixels apart (the pitch seen on Hero, PrivateEye and Seaquest; assumed
for MontezumaRevenge, where simple play never leaves the initial "0").

For resized observations (envpool's default 84x84, resized from the native frame with
``cv2.INTER_AREA``) every rectangle is mapped by scaling and rounding OUTWARD: the start is
floored and the end is ceiled.  An output pixel of an area-resize is a weighted mean of the
native pixels its footprint overlaps; the outward mapping blanks exactly the output pixels
whose footprint overlaps a rectangle, so no blend of a score pixel survives.  (Blanking the
native frame before resizing would instead leave the border pixels a blend of black and the
surroundings; blanking after resizing is what you can do on envpool's output.)

Masked pixels are set to 0, black in RGB and in grayscale.  Masking is applied with
``np.where`` / ``jnp.where`` against a precomputed boolean mask, so it also works on jax
arrays inside ``jax.jit``.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Rect = tuple[int, int, int, int]  # (row0, row1, col0, col1), half-open, native coordinates

NATIVE_HEIGHT = 210
NATIVE_WIDTH = 160

MASKS: dict[str, tuple[Rect, ...]] = {
    "BeamRider": (
        # Score: six fixed digits, drawn in rows 10-17, cols 61-106.
        (8, 20, 58, 110),
        # "SECTOR nn" line under the score (rows 21-28, cols 60-105).  Not named by the papers;
        # we count it as part of the score area: it is the same HUD block, and the sector
        # number advances every 15 enemies destroyed, so it is a coarse running count of reward.
        (20, 31, 58, 110),
        # Enemy-ship count (A.2: "we additionally blank out the enemy ship count"): enemies left
        # in the sector, green digits in rows 32-39, cols 20-30.  The torpedo stock at the
        # right of the same row (cols 128-147) is left visible.
        (30, 42, 17, 34),
    ),
    "Breakout": (
        # Score: three fixed digits, rows 5-14, cols 36-79.  The lives count (cols 100-111)
        # and the player number (cols 136-139) on the same line are left visible.  The grey
        # top wall starts at row 17.
        (3, 17, 34, 82),
    ),
    "Enduro": (
        # The whole red instrument panel below the road (rows 161-190, cols 48-111).  Top line:
        # the odometer, whose last digit rolls at a rate set by the car's speed; this is the
        # "speedometer" A.2 blanks (Enduro has no other speed display).  Bottom line: the day
        # number and the count of cars still to pass today.  The reward is +1 per car passed
        # and -1 per car that passes you, and that counter moves with it (200 -> 199 on the
        # first car passed): it is Enduro's score display and is blanked.  The day number is
        # blanked with it, as it sits inside the same panel.
        (159, 193, 46, 114),
    ),
    "Hero": (
        # Score: right-aligned at col 102, rows 179-186, growing leftward 8 px per digit;
        # room for six digits.  At the start of a level the same line shows "LEVEL: n"
        # (cols 59-102), also covered.  Power bar, lives and dynamite stock above are left.
        (177, 189, 53, 105),
    ),
    "MontezumaRevenge": (
        # Score: right-aligned at col 101, rows 6-13 (a single "0" at the start), room for
        # six digits to the left (8-px pitch assumed: no higher score was seen).  The row of
        # hats (lives) starts at row 15 and is left visible, as is the inventory.
        (4, 15, 52, 104),
    ),
    "Pong": (
        # Both players' scores: everything above the white top wall (which starts at row
        # 24).  The digits occupy rows 1-20; two-digit scores reach cols 20-47 (left,
        # computer) and 100-127 (right, agent).  Nothing else is drawn in this strip.
        (0, 24, 0, 160),
    ),
    "PrivateEye": (
        # Score: right-aligned at col 104, rows 8-15 (starts at 1000), room for six digits.
        # The countdown clock below it (rows 19-26) is not a score and is left visible.
        (6, 18, 55, 107),
    ),
    "Qbert": (
        # Score: five digits with leading zeros, rows 6-12, cols 34-70 (shown only on some
        # frames).  Widened by one digit on each side in case a sixth digit appears; the
        # strip is empty black sky above the pyramid.  The lives icons below (rows 16-27)
        # are left visible.
        (4, 15, 26, 80),
    ),
    "Seaquest": (
        # Score: right-aligned at col 104, rows 9-16, growing leftward 8 px per digit; room
        # for six digits.  The reserve submarines below it (rows 22-29) are left visible.
        (7, 19, 55, 107),
    ),
    "SpaceInvaders": (
        # Player 1's score (the one that counts): four fixed digits, rows 10-19, cols 4-63.
        (8, 22, 2, 66),
        # Player 2's score, same rows, cols 84-143.  It stays 0000 in a one-player game but
        # it is half of the score area, and the score line alternates with the mothership,
        # which flies through these rows; where the two overlap the mothership is blanked
        # too (unavoidable: it is drawn on the same pixels as the digits).
        (8, 22, 82, 146),
    ),
}


def masked_games() -> tuple[str, ...]:
    """The games with a mask, i.e. the keys of ``MASKS``."""
    return tuple(MASKS)


_TASK_SUFFIX = re.compile(r"-v\d+$")


def game_name(game: str) -> str:
    """``"Pong"`` or the envpool task id ``"Pong-v5"`` -> ``"Pong"``; ValueError otherwise."""
    if isinstance(game, str):
        name = _TASK_SUFFIX.sub("", game)
        if name in MASKS:
            return name
    raise ValueError(
        f"no score-area mask for Atari game {game!r}; supported games: {', '.join(MASKS)} "
        "(or their envpool task ids, e.g. 'Pong-v5')"
    )


def scale_rect(rect: Rect, height: int, width: int) -> Rect:
    """Map a native rectangle onto a ``height`` x ``width`` resize of the native frame,
    rounding outward (floor the start, ceil the end) so that every output pixel whose
    area-resize footprint overlaps the rectangle is included."""
    r0, r1, c0, c1 = rect
    return (
        (r0 * height) // NATIVE_HEIGHT,
        -((-r1 * height) // NATIVE_HEIGHT),
        (c0 * width) // NATIVE_WIDTH,
        -((-c1 * width) // NATIVE_WIDTH),
    )


def resized_rects(game: str, height: int = 84, width: int = 84) -> tuple[Rect, ...]:
    """``MASKS[game]`` mapped outward onto a ``height`` x ``width`` frame."""
    _check_size(height, width)
    return tuple(scale_rect(r, height, width) for r in MASKS[game_name(game)])


@functools.lru_cache(maxsize=None)
def _mask(game: str, height: int, width: int) -> np.ndarray:
    mask = np.zeros((height, width), bool)
    for r0, r1, c0, c1 in resized_rects(game, height, width):
        mask[r0:r1, c0:c1] = True
    mask.setflags(write=False)  # cached and shared: keep it immutable
    return mask


def boolean_mask(game: str, height: int = NATIVE_HEIGHT, width: int = NATIVE_WIDTH) -> np.ndarray:
    """The ``[height, width]`` boolean mask (True = blanked) of ``game``, computed once per
    (game, size) and cached; read-only.  The default size is the native frame."""
    _check_size(height, width)
    return _mask(game_name(game), int(height), int(width))


def _check_size(height, width):
    if not (isinstance(height, (int, np.integer)) and isinstance(width, (int, np.integer))
            and height > 0 and width > 0):
        raise ValueError(f"frame size must be positive integers, got height={height!r}, width={width!r}")


def _apply(frames, mask: np.ndarray):
    """Zero ``frames`` where ``mask`` (broadcastable to frames) is True; keeps the dtype, and the
    array kind: jax in -> jax out (works on tracers inside jit), anything else -> numpy."""
    if isinstance(frames, jax.Array):
        return jnp.where(mask, jnp.zeros((), frames.dtype), frames)
    return np.where(mask, np.zeros((), frames.dtype), frames)


def _as_array(frames):
    return frames if isinstance(frames, jax.Array) else np.asarray(frames)


def mask_native(frames, game: str):
    """Blank the score area of native ALE frames.

    ``frames`` is a numpy or jax array of shape ``[..., 210, 160]`` (grayscale, or envpool's
    channel-first ``[..., C, 210, 160]``: the channel axis is then one of the leading axes) or
    ``[..., 210, 160, C]`` (channel-last, e.g. RGB).  Returns an array of the same shape, dtype
    and kind with the pixels inside ``MASKS[game]`` set to 0 and all others unchanged.
    """
    mask = boolean_mask(game)
    frames = _as_array(frames)
    shape = tuple(frames.shape)
    if shape[-2:] == (NATIVE_HEIGHT, NATIVE_WIDTH):
        return _apply(frames, mask)
    if len(shape) >= 3 and shape[-3:-1] == (NATIVE_HEIGHT, NATIVE_WIDTH):
        return _apply(frames, mask[:, :, None])
    raise ValueError(
        f"native frames must have shape [..., {NATIVE_HEIGHT}, {NATIVE_WIDTH}] or "
        f"[..., {NATIVE_HEIGHT}, {NATIVE_WIDTH}, C]; got {shape}"
    )


Layout = Literal["chw", "hwc"]


def mask_resized(frames, game: str, height: int = 84, width: int = 84, layout: Layout = "chw"):
    """Blank the score area of frames resized from the native 210x160 to ``height`` x ``width``.

    ``layout`` says where the image axes are:

    * ``"chw"`` (default): the LAST two axes are (height, width); any leading axes are
      batch / time / channel axes.  This covers a single grayscale frame ``[84, 84]``,
      envpool's channel-first frame stack ``[N, 4, 84, 84]`` and ``[N, 3, 84, 84]`` RGB.
    * ``"hwc"``: channel-last, the axes ``-3, -2`` are (height, width), e.g. ``[N, 84, 84, 4]``.

    (A square frame makes the layout ambiguous from the shape alone, hence the argument.)
    Returns an array of the same shape, dtype and kind (numpy or jax; usable inside
    ``jax.jit``) with the outward-mapped rectangles set to 0 and all other pixels unchanged.
    """
    if layout not in ("chw", "hwc"):
        raise ValueError(f"layout must be 'chw' (image axes last) or 'hwc' (channel-last); got {layout!r}")
    mask = boolean_mask(game, height, width)
    frames = _as_array(frames)
    shape = tuple(frames.shape)
    if layout == "chw":
        if shape[-2:] == (height, width):
            return _apply(frames, mask)
        hint = " (channel-last? pass layout='hwc')" if shape[-3:-1] == (height, width) else ""
        raise ValueError(
            f"expected frames of shape [..., {height}, {width}] for layout='chw'; got {shape}{hint}")
    if len(shape) >= 3 and shape[-3:-1] == (height, width):
        return _apply(frames, mask[:, :, None])
    hint = " (image axes last? pass layout='chw')" if shape[-2:] == (height, width) else ""
    raise ValueError(
        f"expected frames of shape [..., {height}, {width}, C] for layout='hwc'; got {shape}{hint}")
