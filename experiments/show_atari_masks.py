"""Picture the Atari score-area masks: one PNG per game, a real frame before and after masking.

    python -m experiments.show_atari_masks --out docs/atari_masks
    python -m experiments.show_atari_masks --games Pong Enduro --steps 300

Each ``<Game>.png`` shows, left to right: the native 210x160 RGB frame with the masked
rectangles outlined in magenta; the same frame masked (``atari_masks.mask_native``); and the
84x84 grayscale frame the policy and reward model see, masked (``atari_masks.mask_resized``),
from an 84x84 envpool run fed the same actions.  The native panels are drawn at 2x, the
84x84 one at 5x, so all three are 420 pixels tall.

The game is played for ``--steps`` steps with uniformly random actions (fixed seed); of the
last 30 frames the one with the most lit pixels inside the mask is shown, so that the score
is on screen (Q*bert, for one, draws its score only on some frames).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from rlhp_jax import atari_masks

COMMON_KW = dict(env_type="gymnasium", num_envs=1, frame_skip=4, noop_max=1,
                 repeat_action_probability=0.0, episodic_life=False, full_action_space=True)
OUTLINE = np.array([255, 0, 255], np.uint8)


def play(game: str, steps: int, seed: int):
    """``steps`` random actions in lockstep at native size and at 84x84; returns the chosen
    native RGB frame [210, 160, 3] and the matching 84x84 grayscale frame [84, 84]."""
    import envpool

    big = envpool.make(f"{game}-v5", seed=seed, img_height=atari_masks.NATIVE_HEIGHT,
                       img_width=atari_masks.NATIVE_WIDTH, gray_scale=False, stack_num=1, **COMMON_KW)
    small = envpool.make(f"{game}-v5", seed=seed, img_height=84, img_width=84, gray_scale=True,
                         stack_num=4, **COMMON_KW)
    rng = np.random.default_rng(seed)
    mask = atari_masks.boolean_mask(game)
    ob, _ = big.reset()
    ob_small, _ = small.reset()
    best, best_lit = (ob[0], ob_small[0, -1]), -1
    for step in range(steps):
        action = rng.integers(0, 18, 1)
        ob, _, term, trunc, _ = big.step(action)
        ob_small, *_ = small.step(action)
        if step >= steps - 30:
            lit = int(ob[0].any(0)[mask].sum())  # ob is channel-first [1, 3, 210, 160]
            if lit >= best_lit:
                best, best_lit = (ob[0], ob_small[0, -1]), lit
        if term[0] or trunc[0]:
            break
    big.close()
    small.close()
    return best[0].transpose(1, 2, 0), best[1]


def outline(frame: np.ndarray, rects) -> np.ndarray:
    """Draw each rectangle's border (its outermost pixels) on a copy of an RGB frame."""
    out = frame.copy()
    for r0, r1, c0, c1 in rects:
        out[r0, c0:c1] = out[r1 - 1, c0:c1] = OUTLINE
        out[r0:r1, c0] = out[r0:r1, c1 - 1] = OUTLINE
    return out


def compose(game: str, native: np.ndarray, small: np.ndarray) -> np.ndarray:
    """[420, 2 * 320 + 420 + gaps, 3] uint8: outlined native | masked native | masked 84x84."""
    def up(img, k):
        return img.repeat(k, 0).repeat(k, 1)

    before = up(outline(native, atari_masks.MASKS[game]), 2)
    after = up(atari_masks.mask_native(native, game), 2)
    gray = up(atari_masks.mask_resized(small, game), 5)
    gray = np.repeat(gray[:, :, None], 3, axis=2)
    gap = np.full((before.shape[0], 8, 3), 255, np.uint8)
    return np.concatenate([before, gap, after, gap, gray], axis=1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.show_atari_masks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/atari_masks", help="output directory")
    p.add_argument("--games", nargs="+", default=list(atari_masks.masked_games()),
                   help="games to draw (default: every game with a mask)")
    p.add_argument("--steps", type=int, default=200, help="random steps played before the frame is taken")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from matplotlib import image as mpimg

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for game in args.games:
        game = atari_masks.game_name(game)  # "Pong-v5" -> "Pong"; ValueError if unknown
        native, small = play(game, args.steps, args.seed)
        path = out / f"{game}.png"
        mpimg.imsave(path, compose(game, native, small))
        print(f"{path}  ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
