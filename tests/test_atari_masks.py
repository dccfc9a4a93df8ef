"""The Atari score-area masks (rlhp_jax.atari_masks), checked on real envpool frames.

For every game in the table we play a short, deterministic episode (fixed seed, and a fixed
random or scripted action sequence) twice in lockstep: once at native size (210x160 RGB) and
once as the policy sees it (84x84 grayscale, a stack of 4).  On those frames we check

* that masking zeroes exactly the masked pixels and leaves every other pixel unchanged;
* that the mask covers the score: around the first few reward events, every pixel of the
  game's HUD band (the screen strip holding the score, see ``BAND``) that changes between
  the frame before the reward and each of the next few frames lies inside the mask, at native
  size and at 84x84.  The score is sometimes redrawn a step or two after the reward arrives,
  hence "the next few frames".  At least one such change must be seen per game, so the check
  is never vacuous;
* that every drawn pixel of the score strip (any colour but the strip's background) is
  masked, on the frames right after those rewards.  Montezuma's Revenge yields no reward in
  a few hundred steps of simple play, so there only this weaker check is made, on its
  initial "0";
* that right-aligned scores, which grow leftward, have room for six digits in the mask.

All rollouts are made once per module (about 900 steps, times two emulators).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhp_jax import atari_masks as am

envpool = pytest.importorskip("envpool")

GAMES = am.masked_games()
H, W = am.NATIVE_HEIGHT, am.NATIVE_WIDTH
SMALL = 84

COMMON_KW = dict(env_type="gymnasium", num_envs=1, frame_skip=4, noop_max=1,
                 repeat_action_probability=0.0, episodic_life=False, full_action_space=True, seed=0)
NATIVE_KW = dict(img_height=H, img_width=W, gray_scale=False, stack_num=1)
SMALL_KW = dict(img_height=SMALL, img_width=SMALL, gray_scale=True, stack_num=4)

# The HUD strip holding the score, native (row0, row1, col0, col1): it is wider than the mask
# (so a too-small mask shows) but holds no play field, only HUD items that change with the
# score.  Columns 0-7 are skipped where the ALE draws its black HMOVE bar.
BAND = {
    "BeamRider": (0, 43, 8, 124),  # above the first beam, left of the torpedo stock
    "Breakout": (0, 17, 0, 160),  # above the top wall (includes the unmasked lives count)
    "Enduro": (156, 195, 8, 160),  # between the road and the Activision logo
    "Hero": (177, 189, 8, 160),  # the score line, under the dynamite stock
    "MontezumaRevenge": (0, 15, 0, 160),  # above the hats
    "Pong": (0, 34, 0, 160),  # down to the bottom of the top wall
    "PrivateEye": (0, 18, 8, 160),  # the sky above the clock
    "Qbert": (0, 15, 0, 160),  # above the lives icons
    "Seaquest": (0, 21, 8, 160),  # the sky above the reserve submarines
    "SpaceInvaders": (0, 30, 0, 160),  # above the invaders
}
# Where BAND holds more than the score on a plain background (unmasked HUD items, a black
# border), the strip that holds only that, for the check that every drawn score pixel is masked.
SCORE_STRIP = {
    "Breakout": (0, 17, 0, 90),  # left of the lives count
    "Pong": (0, 24, 0, 160),  # above the top wall
    "PrivateEye": (5, 18, 8, 160),  # the sky only (rows 0-4 are a black border)
    "Seaquest": (7, 21, 8, 160),  # the sky only (rows 0-6 are a black border)
}
# Reward events whose neighbourhood is checked (the rollout stops after them), and step limits.
EVENTS = 2
# Hero's 2nd reward is far, BeamRider's 2nd comes with a screen flash; Qbert often hides its score
OTHER_EVENTS = {"BeamRider": 1, "Hero": 1, "Qbert": 3}
MAX_STEPS = 450
STEPS = {"MontezumaRevenge": 25}  # no reward within reach; the initial score is checked
LAG = 3  # frames after the reward step compared with the frame before it
FLASH = 0.5  # a pair where more of the band changed than this is a full-screen flash: skipped


# ------------------------------------------------------------------------------ policies
# full_action_space: 0 NOOP, 1 FIRE, 3 RIGHT, 4 LEFT, 5 DOWN, 11 RIGHTFIRE, 12 LEFTFIRE,
# 16 DOWNRIGHTFIRE, 17 DOWNLEFTFIRE


def breakout_policy(step, frame, rng):
    """Fire, then keep the paddle (rows 189-192) under the ball."""
    if step % 40 == 0:
        return 1
    paddle = frame[189:193, 8:152].any(-1).any(0)
    ball = frame[100:188, 8:152].any(-1).any(0)
    if not ball.any() or not paddle.any():
        return 1
    bx, px = np.flatnonzero(ball).mean(), np.flatnonzero(paddle).mean()
    return 3 if bx > px + 2 else 4 if bx < px - 2 else 0


def enduro_policy(step, frame, rng):
    return 1  # accelerate: passes cars within a few dozen steps


def seaquest_policy(step, frame, rng):
    """Dive, then fire at the nearest shark, moving down (never up: surfacing costs a life)."""
    if step < 45:
        return 5
    reg = frame[60:155, 8:160].astype(int)
    sub = (reg[..., 0] > 150) & (reg[..., 1] > 150) & (reg[..., 2] < 120)
    shark = (reg[..., 1] > 150) & (reg[..., 0] < 150) & (reg[..., 2] < 150)
    if not sub.any() or not shark.any():
        return 12 if (step // 20) % 2 else 11
    sr, sc = (a.mean() for a in np.nonzero(sub))
    ys, xs = np.nonzero(shark)
    k = np.argmin(abs(ys - sr))
    left = xs[k] < sc
    if ys[k] > sr + 3:
        return 17 if left else 16
    return 12 if left else 11


def hero_policy(step, frame, rng):
    """Walk right to the first wall, drop a stick of dynamite, walk back left, wait."""
    return 3 if step < 60 else 5 if step == 60 else 4 if step < 75 else 0


def random_policy(step, frame, rng):
    return int(rng.integers(18))


def constant(action):
    return lambda step, frame, rng: action


# Policies that score within ~150 steps; the other games get uniformly random actions.
POLICY = {"Breakout": breakout_policy, "Enduro": enduro_policy, "Seaquest": seaquest_policy,
          "Hero": hero_policy, "PrivateEye": constant(3), "Qbert": constant(3),
          "SpaceInvaders": constant(11)}


# ------------------------------------------------------------------------------ rollouts
@dataclasses.dataclass
class Rollout:
    native: np.ndarray  # [T, 3, 210, 160] uint8, envpool's channel-first RGB
    small: np.ndarray  # [T, 4, 84, 84] uint8 grayscale stacks
    reward: np.ndarray  # [T]; reward[t] arrived with frame t

    @property
    def events(self):
        return np.flatnonzero(self.reward)[:max(EVENTS, *OTHER_EVENTS.values())]


def play(game: str) -> Rollout:
    big = envpool.make(f"{game}-v5", **COMMON_KW, **NATIVE_KW)
    small = envpool.make(f"{game}-v5", **COMMON_KW, **SMALL_KW)
    policy = POLICY.get(game, random_policy)
    rng = np.random.default_rng(0)
    ob, _ = big.reset()
    os_, _ = small.reset()
    natives, smalls, rewards, small_rewards = [ob[0]], [os_[0]], [0.0], [0.0]
    wanted = OTHER_EVENTS.get(game, EVENTS)
    for step in range(STEPS.get(game, MAX_STEPS)):
        action = np.array([policy(step, natives[-1].transpose(1, 2, 0), rng)])
        ob, r, term, trunc, _ = big.step(action)
        os_, rs, *_ = small.step(action)
        natives.append(ob[0])
        smalls.append(os_[0])
        rewards.append(float(r[0]))
        small_rewards.append(float(rs[0]))
        events = np.flatnonzero(rewards)
        if term[0] or trunc[0] or (len(events) >= wanted and step >= events[wanted - 1] + LAG):
            break
    big.close()
    small.close()
    # Both emulators saw the same actions; the ALE is deterministic, so they must agree.
    assert rewards == small_rewards, f"{game}: the native and 84x84 runs diverged"
    return Rollout(np.stack(natives), np.stack(smalls), np.array(rewards))


@pytest.fixture(scope="module")
def rollout():
    """``rollout(game)``: that game's episode, played once per module.  All games are played
    up front on two threads (envpool steps without the GIL): most tests here need all of them."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        played = dict(zip(GAMES, pool.map(play, GAMES)))
    return played.__getitem__


def scaled_band_inward(band, height, width):
    """The band on a resized frame, rounded inward (so it holds no resized play field)."""
    r0, r1, c0, c1 = band
    return (-((-r0 * height) // H), (r1 * height) // H, -((-c0 * width) // W), (c1 * width) // W)


def score_changes(frames, band, events):
    """For each reward event t and k in 0..LAG: the boolean [h, w] map of band pixels that
    differ between frames[t - 1] and frames[t + k] (full-frame size, False outside the band),
    skipping full-band flashes.  ``frames`` is [T, ..., h, w] (leading per-frame axes compared
    together)."""
    r0, r1, c0, c1 = band
    out = []
    for t in events:
        for k in range(LAG + 1):
            if t + k >= len(frames):
                break
            before, after = frames[t - 1], frames[t + k]
            changed = (before != after).reshape(-1, *before.shape[-2:]).any(0)
            in_band = np.zeros_like(changed)
            in_band[r0:r1, c0:c1] = changed[r0:r1, c0:c1]
            if in_band.sum() > FLASH * (r1 - r0) * (c1 - c0):
                continue
            out.append((int(t), k, in_band))
    return out


# ------------------------------------------------------------------------------ tests
def test_table():
    assert set(GAMES) == {"BeamRider", "Breakout", "Enduro", "Pong", "Qbert", "Seaquest",
                          "SpaceInvaders", "Hero", "MontezumaRevenge", "PrivateEye"}
    for game, rects in am.MASKS.items():
        assert rects, game
        for r0, r1, c0, c1 in rects:
            assert 0 <= r0 < r1 <= H and 0 <= c0 < c1 <= W, (game, (r0, r1, c0, c1))
            # a score area, not a play field: no rectangle covers more than a fifth of the screen
            assert (r1 - r0) * (c1 - c0) < 0.2 * H * W, (game, (r0, r1, c0, c1))


@pytest.mark.parametrize("game", GAMES)
def test_masking_zeroes_exactly_the_mask_on_real_frames(rollout, game):
    ro = rollout(game)
    t = len(ro.reward) - 1  # late in the episode: the score is drawn
    native_chw = ro.native[t - 1:t + 1].copy()  # [2, 3, 210, 160]
    native_hwc = native_chw.transpose(0, 2, 3, 1)  # [2, 210, 160, 3]
    small_chw = ro.small[t - 1:t + 1]  # [2, 4, 84, 84]
    small_hwc = small_chw.transpose(0, 2, 3, 1)  # [2, 84, 84, 4]
    mask = am.boolean_mask(game)
    mask_small = am.boolean_mask(game, SMALL, SMALL)
    cases = [
        (am.mask_native(native_hwc, game), native_hwc, mask[:, :, None]),
        (am.mask_native(native_chw, game), native_chw, mask),
        (am.mask_native(native_hwc[0, ..., 0], game), native_hwc[0, ..., 0], mask),
        (am.mask_resized(small_chw, game), small_chw, mask_small),
        (am.mask_resized(small_chw[0, -1], game), small_chw[0, -1], mask_small),
        (am.mask_resized(small_hwc, game, layout="hwc"), small_hwc, mask_small[:, :, None]),
    ]
    for out, frames, m in cases:
        assert isinstance(out, np.ndarray) and out.shape == frames.shape and out.dtype == frames.dtype
        m = np.broadcast_to(m, frames.shape)
        assert (out[m] == 0).all()
        np.testing.assert_array_equal(out[~m], frames[~m])
    # the two layouts agree
    np.testing.assert_array_equal(cases[0][0], cases[1][0].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(cases[5][0], cases[3][0].transpose(0, 2, 3, 1))
    # the inputs are left alone, and the mask hid something (the frames are not black there)
    np.testing.assert_array_equal(native_chw, ro.native[t - 1:t + 1])
    assert native_chw.any(axis=(0, 1))[mask].any()


@pytest.mark.parametrize("game", [g for g in GAMES if g != "MontezumaRevenge"])
def test_mask_covers_score_changes(rollout, game):
    ro = rollout(game)
    assert len(ro.events) > 0, f"{game}: no reward in {len(ro.reward) - 1} steps"
    checks = {
        "native": (ro.native, BAND[game], am.boolean_mask(game)),
        "84x84": (ro.small[:, -1], scaled_band_inward(BAND[game], SMALL, SMALL),
                  am.boolean_mask(game, SMALL, SMALL)),
    }
    for size, (frames, band, mask) in checks.items():
        pairs = score_changes(frames, band, ro.events)
        seen = 0
        for t, k, changed in pairs:
            leaked = changed & ~mask
            assert not leaked.any(), (
                f"{game} {size}: reward at step {t}; band pixels changed by step {t + k} outside "
                f"the mask at (row, col) {np.argwhere(leaked)[:5].tolist()}")
            seen += int(changed.any())
        assert seen, f"{game} {size}: the score never visibly changed around rewards {ro.events}"


def foreground(frame, band):
    """[h, w] map of the band pixels of ``frame`` ([C, h, w] or [h, w]) whose colour is not the
    band's most common one (the background), False outside the band."""
    r0, r1, c0, c1 = band
    frame = frame.reshape(-1, *frame.shape[-2:])
    pixels = frame[:, r0:r1, c0:c1].reshape(frame.shape[0], -1).T
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    out = np.zeros(frame.shape[-2:], bool)
    out[r0:r1, c0:c1] = (frame[:, r0:r1, c0:c1] != colours[counts.argmax()][:, None, None]).any(0)
    return out


def score_frames(ro, game):
    """Frames on which the score has just been (re)drawn: those right after a reward whose
    band changed; for Montezuma's Revenge (no reward), a frame after the game has started."""
    if game == "MontezumaRevenge":
        return [20]
    pairs = score_changes(ro.native, BAND[game], ro.events)
    return sorted({t + k for t, k, changed in pairs if changed.any()})


@pytest.mark.parametrize("game", GAMES)
def test_mask_covers_the_drawn_score(rollout, game):
    """Every non-background pixel of the score strip is masked (this checks the digits that
    did not change too, and the parts of the score area that do not change in a short game,
    such as SpaceInvaders' player-2 score and BeamRider's sector number)."""
    ro = rollout(game)
    frames = score_frames(ro, game)
    assert frames
    band = SCORE_STRIP.get(game, BAND[game])
    for size, images, b, mask in [
        ("native", ro.native, band, am.boolean_mask(game)),
        ("84x84", ro.small[:, -1], scaled_band_inward(band, SMALL, SMALL), am.boolean_mask(game, SMALL, SMALL)),
    ]:
        for t in frames:
            drawn = foreground(images[t], b)
            assert drawn.any(), f"{game} {size}: no score drawn at step {t}"
            leaked = drawn & ~mask
            assert not leaked.any(), (
                f"{game} {size} step {t}: score pixels outside the mask at (row, col) "
                f"{np.argwhere(leaked)[:5].tolist()}")


@pytest.mark.parametrize("game", ["Hero", "MontezumaRevenge", "PrivateEye", "Seaquest"])
def test_room_for_six_digits(rollout, game):
    """Right-aligned scores grow leftward, a digit every 8 pixels; the short games here show
    only 1-4 digits, so check that the mask leaves room for six to the left of the last one."""
    ro = rollout(game)
    mask = am.boolean_mask(game)
    for t in score_frames(ro, game):
        rows, cols = np.nonzero(foreground(ro.native[t], SCORE_STRIP.get(game, BAND[game])))
        right = cols.max() + 1
        assert mask[rows.min():rows.max() + 1, right - 6 * 8:right].all(), (game, t)


@pytest.mark.parametrize("height,width", [(84, 84), (105, 80), (64, 48), (H, W)])
def test_resized_mask_is_exactly_the_area_footprint(height, width):
    """A resized pixel is masked iff its INTER_AREA footprint on the native frame overlaps a
    masked native pixel: outward rounding blanks everything the score can bleed into, and
    nothing else."""
    i, j = np.arange(height), np.arange(width)
    row_from, row_to = i * H // height, -(-(i + 1) * H // height)  # footprint rows [from, to)
    col_from, col_to = j * W // width, -(-(j + 1) * W // width)
    for game in GAMES:
        native = am.boolean_mask(game).astype(np.int64)
        integral = np.pad(native.cumsum(0).cumsum(1), ((1, 0), (1, 0)))  # summed-area table
        count = (integral[row_to][:, col_to] - integral[row_from][:, col_to]
                 - integral[row_to][:, col_from] + integral[row_from][:, col_from])
        np.testing.assert_array_equal(am.boolean_mask(game, height, width), count > 0, err_msg=game)
        if (height, width) == (H, W):
            assert am.resized_rects(game, H, W) == am.MASKS[game]


def test_jax_arrays_and_jit(rollout):
    ro = rollout("Pong")
    small = ro.small[-2:]
    native = ro.native[-2:]
    f = jax.jit(lambda s, n: (am.mask_resized(s, "Pong"), am.mask_native(n, "Pong-v5")))
    out_s, out_n = f(jnp.asarray(small), jnp.asarray(native))
    assert isinstance(out_s, jax.Array) and out_s.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(out_s), am.mask_resized(small, "Pong"))
    np.testing.assert_array_equal(np.asarray(out_n), am.mask_native(native, "Pong"))


def test_cached_mask_is_read_only():
    m = am.boolean_mask("Pong", 84, 84)
    assert m is am.boolean_mask("Pong", 84, 84)
    with pytest.raises(ValueError):
        m[0, 0] = False


def test_unknown_game():
    frames = np.zeros((H, W), np.uint8)
    for bad in ("Asterix", "pong", "Pong-v", "", None):
        with pytest.raises(ValueError, match="supported games: BeamRider, Breakout") as err:
            am.mask_native(frames, bad)
        assert all(g in str(err.value) for g in GAMES)
    with pytest.raises(ValueError, match="supported games"):
        am.mask_resized(np.zeros((84, 84), np.uint8), "Asterix")
    assert am.mask_native(frames, "Pong-v5").shape == (H, W)  # envpool task ids are accepted


def test_wrong_shapes():
    for shape in [(84, 84), (160, 210), (210,), (3, 160, 210), (210, 161, 3)]:
        with pytest.raises(ValueError, match="native frames must have shape"):
            am.mask_native(np.zeros(shape, np.uint8), "Pong")
    with pytest.raises(ValueError, match=r"layout='hwc'"):
        am.mask_resized(np.zeros((2, 84, 84, 4), np.uint8), "Pong")  # channel-last, default layout
    with pytest.raises(ValueError, match=r"layout='chw'"):
        am.mask_resized(np.zeros((2, 4, 84, 84), np.uint8), "Pong", layout="hwc")
    with pytest.raises(ValueError, match=r"\[\.\.\., 84, 84\]"):
        am.mask_resized(np.zeros((210, 160), np.uint8), "Pong")
    with pytest.raises(ValueError, match="layout must be"):
        am.mask_resized(np.zeros((84, 84), np.uint8), "Pong", layout="nhwc")
    with pytest.raises(ValueError, match="positive integers"):
        am.mask_resized(np.zeros((84, 84), np.uint8), "Pong", height=0)
