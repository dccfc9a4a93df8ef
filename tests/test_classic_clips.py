"""Clips of the gymnax tasks (``rlhp_jax.render.classic``): frames drawn from observations.

The drawing conventions are checked against gymnax itself where it defines them (observation
layouts, time steps, CartPole's direction of lean, Acrobot's goal) and against gym's renderers
otherwise (Pendulum and Acrobot angles count counter-clockwise, θ = 0 up / down).
"""

from __future__ import annotations

import numpy as np
import pytest

from rlhp_jax.render import classic as cc
from rlhp_jax.render import video
from rlhp_jax.render.__main__ import random_rollout
from rlhp_jax.tasks import TASKS, names

FPS = {name: TASKS[name].fps for name in names("gymnax")}
OBS_SHAPES = {name: TASKS[name].obs_shape for name in names("gymnax")}
MINATAR_CHANNELS = {name: TASKS[name].minatar_channels for name in names("gymnax") if TASKS[name].minatar_channels}

CLASSIC = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCarContinuous-v0"]
MINATAR = ["Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar",
           "SpaceInvaders-MinAtar"]


def _mask(frame, color):
    return np.all(frame == np.asarray(color, np.uint8), axis=-1)


def _centroid(frame, color):
    """(row, column) centre of the pixels of exactly ``color``; fails if there are none."""
    rows, cols = np.nonzero(_mask(frame, color))
    assert rows.size > 0, f"no pixels of colour {color}"
    return rows.mean(), cols.mean()


def _sample_obs(env_name, t=3, seed=0):
    rng = np.random.default_rng(seed)
    if env_name in MINATAR_CHANNELS:
        return (rng.random((t,) + OBS_SHAPES[env_name]) < 0.15).astype(np.float32)
    if env_name == "CartPole-v1":
        return rng.uniform([-2.4, -1, -0.2, -1], [2.4, 1, 0.2, 1], (t, 4)).astype(np.float32)
    if env_name == "MountainCarContinuous-v0":
        return rng.uniform([-1.2, -0.07], [0.6, 0.07], (t, 2)).astype(np.float32)
    angles = rng.uniform(-np.pi, np.pi, (t, 2))
    if env_name == "Pendulum-v1":
        return np.stack([np.cos(angles[:, 0]), np.sin(angles[:, 0]), angles[:, 1]], 1).astype(np.float32)
    return np.concatenate([np.stack([np.cos(angles[:, 0]), np.sin(angles[:, 0]),
                                     np.cos(angles[:, 1]), np.sin(angles[:, 1])], 1),
                           rng.normal(size=(t, 2))], 1).astype(np.float32)


# ------------------------------------------------------------------- tables vs gymnax


def test_tables_cover_exactly_the_gymnax_tasks_and_match_their_observations():
    import gymnax

    tasks = set(names("gymnax"))
    assert set(FPS) == tasks
    assert set(OBS_SHAPES) == tasks
    assert set(MINATAR_CHANNELS) == set(MINATAR)
    for name in tasks:
        env, params = gymnax.make(name)
        assert tuple(env.observation_space(params).shape) == OBS_SHAPES[name], name


def test_fps_is_real_time():
    import gymnax

    _, cartpole = gymnax.make("CartPole-v1")
    _, pendulum = gymnax.make("Pendulum-v1")
    _, acrobot = gymnax.make("Acrobot-v1")
    assert FPS["CartPole-v1"] == pytest.approx(1 / cartpole.tau) == 50
    assert FPS["Pendulum-v1"] == pytest.approx(1 / pendulum.dt) == 20
    assert FPS["Acrobot-v1"] == pytest.approx(1 / acrobot.dt) == 5
    assert FPS["MountainCarContinuous-v0"] == 30
    assert all(FPS[name] == 10 for name in MINATAR)


# ------------------------------------------------------------------- every task


@pytest.mark.parametrize("env_name", CLASSIC + MINATAR)
@pytest.mark.parametrize("size", [256, 64])
def test_frames_shape_dtype_and_content(env_name, size):
    obs = _sample_obs(env_name, t=5)
    frames = cc.classic_clip_frames(env_name, obs, size=size)
    assert frames.shape == (5, size, size, 3) and frames.dtype == np.uint8
    assert frames.flags.writeable and frames.flags.c_contiguous
    # something besides the background is drawn, and different observations draw differently
    assert len(np.unique(frames[0].reshape(-1, 3), axis=0)) >= 3
    assert not np.array_equal(frames[0], frames[1])
    # bool observations (MinAtar's native type) and a list give the same frames
    if env_name in MINATAR_CHANNELS:
        np.testing.assert_array_equal(cc.classic_clip_frames(env_name, obs > 0.5, size), frames)
    np.testing.assert_array_equal(cc.classic_clip_frames(env_name, obs.tolist(), size), frames)


def test_cached_backgrounds_are_not_modified_by_drawing():
    a = cc.classic_clip_frames("CartPole-v1", np.zeros((1, 4)))
    cc.classic_clip_frames("CartPole-v1", np.array([[1.0, 0, 0.1, 0]] * 4))
    np.testing.assert_array_equal(cc.classic_clip_frames("CartPole-v1", np.zeros((1, 4))), a)


# ------------------------------------------------------------------- CartPole


def test_cartpole_cart_follows_x_within_the_drawn_limits():
    obs = np.array([[-2.4, 0, 0, 0], [0.0, 0, 0, 0], [1.0, 0, 0, 0], [2.4, 0, 0, 0]])
    frames = cc.classic_clip_frames("CartPole-v1", obs)
    assert not np.array_equal(frames[1], frames[2])
    cols = [_centroid(f, cc._CP_CART)[1] for f in frames]
    assert cols[0] < cols[1] < cols[2] < cols[3]
    assert cols[1] == pytest.approx(128, abs=1)
    # the red limit marks sit at x = ±2.4: the cart's centre there
    limit_cols = np.nonzero(_mask(frames[1], cc._CP_LIMIT).any(axis=0))[0]
    assert limit_cols.min() == pytest.approx(cols[0], abs=4)
    assert limit_cols.max() == pytest.approx(cols[3], abs=4)
    assert 0 < limit_cols.min() and limit_cols.max() < 255  # inside the frame, with margins
    # the whole cart is visible at the limits
    for f in (frames[0], frames[3]):
        c = np.nonzero(_mask(f, cc._CP_CART).any(axis=0))[0]
        assert c.min() > 0 and c.max() < 255


def _pole_side(frame):
    """Column of the pole's pixels relative to the cart's centre (> 0: right)."""
    return _centroid(frame, cc._CP_POLE)[1] - _centroid(frame, cc._CP_CART)[1]


def test_cartpole_pole_leans_right_for_positive_theta():
    obs = np.array([[0.5, 0, 0.15, 0], [0.5, 0, -0.15, 0], [0.5, 0, 0.0, 0]])
    frames = cc.classic_clip_frames("CartPole-v1", obs)
    assert _pole_side(frames[0]) > 3
    assert _pole_side(frames[1]) < -3
    assert abs(_pole_side(frames[2])) < 0.5
    # the pole rises above the cart, about 1 m (the pole's length) at the drawing's scale
    scale = 256 / (2 * (2.4 + cc._CP_MARGIN))
    rows = np.nonzero(_mask(frames[2], cc._CP_POLE).any(axis=1))[0]
    assert rows.max() - rows.min() == pytest.approx(scale, abs=4)
    assert rows.max() < _centroid(frames[2], cc._CP_CART)[0]


def test_cartpole_lean_convention_matches_gymnax_dynamics():
    """Pushing the cart right from rest swings the pole to the left (it lags behind): in
    gymnax that makes theta negative, and the drawing must show the pole left of the cart."""
    import gymnax
    import jax
    import jax.numpy as jnp
    from gymnax.environments.classic_control.cartpole import EnvState

    env, params = gymnax.make("CartPole-v1")
    state = EnvState(x=jnp.float32(0), x_dot=jnp.float32(0), theta=jnp.float32(0),
                     theta_dot=jnp.float32(0), time=0)
    key = jax.random.key(0)
    for _ in range(6):
        obs, state, *_ = env.step_env(key, state, 1, params)  # action 1 = push right
    obs = np.asarray(obs)[None]
    assert obs[0, 0] > 0 and obs[0, 2] < -0.01
    assert _pole_side(cc.classic_clip_frames("CartPole-v1", obs)[0]) < -1


# ------------------------------------------------------------------- Pendulum, Acrobot


def _pendulum(theta):
    return np.array([[np.cos(theta), np.sin(theta), 0.0]])


def test_pendulum_upright_is_up_and_hanging_is_down():
    up = cc.classic_clip_frames("Pendulum-v1", _pendulum(0.0))[0]
    down = cc.classic_clip_frames("Pendulum-v1", _pendulum(np.pi))[0]
    ccw = cc.classic_clip_frames("Pendulum-v1", _pendulum(np.pi / 2))[0]
    (r_up, c_up), (r_down, c_down) = _centroid(up, cc._PD_BOB), _centroid(down, cc._PD_BOB)
    assert r_up < 128 - 60 and abs(c_up - 128) < 1
    assert r_down > 128 + 60 and abs(c_down - 128) < 1
    r_ccw, c_ccw = _centroid(ccw, cc._PD_BOB)  # gym's convention: counter-clockwise
    assert c_ccw < 128 - 60 and abs(r_ccw - 128) < 1


def _acrobot(t1, t2):
    return np.array([[np.cos(t1), np.sin(t1), np.cos(t2), np.sin(t2), 0.0, 0.0]])


def test_acrobot_hangs_down_and_reaches_the_goal_line_only_when_done():
    size = 256
    goal_row = size / 2 - size / (2 * cc._AC_VIEW)  # 1 m above the pivot
    goal_rows = np.nonzero(_mask(cc.classic_clip_frames("Acrobot-v1", _acrobot(0, 0))[0],
                                 cc._AC_GOAL).any(axis=1))[0]
    assert abs(goal_rows.mean() - goal_row) < 1.5
    for t1, t2 in [(0.0, 0.0), (np.pi / 2, 0.0), (np.pi, 0.0), (np.pi - 0.3, 0.6), (2.0, 0.5)]:
        frame = cc.classic_clip_frames("Acrobot-v1", _acrobot(t1, t2))[0]
        rows, cols = np.nonzero(_mask(frame, cc._AC_LINK))
        done = -np.cos(t1) - np.cos(t1 + t2) > 1.0  # gymnax's terminal condition
        reaches = rows.min() < goal_row - 6  # the tip's round cap clears the line
        assert reaches == done, (t1, t2)
        if (t1, t2) == (0.0, 0.0):  # straight down from the pivot
            assert rows.min() >= size / 2 - 8 and abs(cols.mean() - size / 2) < 1
        if (t1, t2) == (np.pi / 2, 0.0):  # gym: x = sin(theta1): to the right
            assert cols.min() >= size / 2 - 8 and abs(rows.mean() - size / 2) < 1


# ------------------------------------------------------------------- MountainCar


def test_mountaincar_car_rides_the_hill():
    xs = np.array([-1.0, -0.5236, 0.0, 0.45])
    frames = cc.classic_clip_frames("MountainCarContinuous-v0", np.stack([xs, 0 * xs], 1))
    centres = [_centroid(f, cc._MC_CAR) for f in frames]
    cols = [c for _, c in centres]
    rows = [r for r, _ in centres]
    assert cols == sorted(cols)
    assert rows[1] == max(rows)  # the valley (x = -pi/6) is lowest
    assert rows[3] < rows[2] < rows[1]
    flag_col = _centroid(frames[3], cc._MC_FLAG)[1]
    assert abs(cols[3] - flag_col) < 15  # at the goal the car is at the flag


# ------------------------------------------------------------------- MinAtar


@pytest.mark.parametrize("env_name", MINATAR)
def test_minatar_channel_colours_land_in_their_cells(env_name):
    channels = MINATAR_CHANNELS[env_name]
    colors = [tuple(color) for _, color in channels]
    assert len(set(colors) | {cc._MA_BOARD, cc._MA_GAP}) == len(colors) + 2  # all distinct
    size, n = 200, len(channels)
    obs = np.zeros((n, 10, 10, n), np.float32)
    cells = [(c * 3 % 10, (c * 7 + 2) % 10) for c in range(n)]
    for c, (r, q) in enumerate(cells):
        obs[c, r, q, c] = 1.0
    frames = cc.classic_clip_frames(env_name, obs, size=size)
    for c, (r, q) in enumerate(cells):
        frame = frames[c]
        rows, cols = np.nonzero(_mask(frame, colors[c]))
        assert rows.size > 0, channels[c][0]
        assert (rows // 20 == r).all() and (cols // 20 == q).all(), channels[c][0]
        assert rows.size >= 19 * 19  # the whole cell but its 1-pixel gap
        assert frame[r * 20 + 10, q * 20 + 10].tolist() == list(colors[c])
        # nothing else is drawn
        others = ~_mask(frame, colors[c]) & ~_mask(frame, cc._MA_BOARD) & ~_mask(frame, cc._MA_GAP)
        assert not others.any()


@pytest.mark.parametrize("env_name", ["Breakout-MinAtar", "Seaquest-MinAtar"])
def test_minatar_later_channels_are_drawn_over_earlier(env_name):
    n = len(MINATAR_CHANNELS[env_name])
    obs = np.zeros((1, 10, 10, n), np.float32)
    obs[0, 4, 6, [0, n - 1]] = 1.0
    frame = cc.classic_clip_frames(env_name, obs, size=100)[0]
    assert frame[45, 65].tolist() == list(MINATAR_CHANNELS[env_name][-1][1])


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("env_name, obs, match", [
    ("Hopper-v4", np.zeros((2, 11)), "no classic clip renderer"),
    ("cartpole", np.zeros((2, 4)), "no classic clip renderer"),
    ("CartPole-v1", np.zeros((2, 3)), r"\[T, 4\]"),
    ("CartPole-v1", np.zeros(4), r"obs\[None\]"),
    ("CartPole-v1", np.zeros((2, 4, 1)), r"\[T, 4\]"),
    ("Pendulum-v1", np.zeros((2, 4)), r"\[T, 3\]"),
    ("Acrobot-v1", np.zeros((2, 4)), r"\[T, 6\]"),
    ("MountainCarContinuous-v0", np.zeros((2, 3)), r"\[T, 2\]"),
    ("Breakout-MinAtar", np.zeros((2, 10, 10, 7)), r"\[T, 10, 10, 4\]"),
    ("Seaquest-MinAtar", np.zeros((2, 10, 10)), r"\[T, 10, 10, 10\]"),
    ("CartPole-v1", np.zeros((0, 4)), "empty"),
    ("CartPole-v1", np.array([[0, 0, np.nan, 0]]), "non-finite"),
    ("CartPole-v1", np.array([["a", "b", "c", "d"]]), "dtype"),
])
def test_bad_input_raises(env_name, obs, match):
    with pytest.raises(ValueError, match=match):
        cc.classic_clip_frames(env_name, obs)


@pytest.mark.parametrize("size", [255, 0, 16, 64.0, True])
def test_bad_size_raises(size):
    with pytest.raises(ValueError, match="size"):
        cc.classic_clip_frames("CartPole-v1", np.zeros((1, 4)), size=size)


# ------------------------------------------------------------------- a real clip


def test_cartpole_clip_of_a_real_rollout_encodes_as_h264(tmp_path):
    """30 random steps through the project's environment wrapper (``envs.make_env`` +
    ``rollout.collect_rollout``, via ``render.__main__.random_rollout``) -> frames -> MP4."""
    env, next_obs, _ = random_rollout("CartPole-v1", 30, seed=0)
    assert next_obs.shape == (30, *env.spec.obs_shape)
    frames = cc.classic_clip_frames("CartPole-v1", next_obs)
    assert frames.shape == (30, 256, 256, 3)
    assert len({f.tobytes() for f in frames}) > 20  # the system moves
    path = video.encode_mp4(frames, tmp_path / "cartpole.mp4", FPS["CartPole-v1"])
    info = video.probe_mp4(path)
    assert info["frames"] == 30
    assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert (info["width"], info["height"]) == (256, 256)
    assert info["fps"] == pytest.approx(50)
    assert info["duration_s"] == pytest.approx(30 / 50, abs=0.03)
