"""The task registry (``rlhp_jax.tasks``): one resolver for every spelling, and a table that is
plain data yet complete for every module that asks it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rlhp_jax import tasks
from rlhp_jax.tasks import TASKS, find, names, resolve


def _kind(name):
    task = find(name)
    return None if task is None else (task.backend, task.name)


def test_every_task_resolves_to_itself_and_names_list_them_by_backend():
    assert names() == names("gymnax") + names("atari") + names("mujoco")
    assert sorted(names()) == sorted(TASKS)
    for backend in tasks.BACKENDS:
        assert names(backend) == sorted(n for n, t in TASKS.items() if t.backend == backend)
        for name in names(backend):
            assert _kind(name) == (backend, name)
    with pytest.raises(ValueError, match="backend"):
        names("ale")


def test_every_spelling_accepted_before_the_registry_resolves_as_it_did():
    """The spellings make_env, the clips CLI, the play page and the labeling page took (moved here
    from tests/test_clips.py's CLI test when the four resolvers became this one)."""
    assert _kind("pendulum") == ("mujoco", "InvertedPendulum")
    assert _kind("double pendulum") == ("mujoco", "InvertedDoublePendulum")
    assert _kind("double_pendulum") == ("mujoco", "InvertedDoublePendulum")
    assert _kind("Pendulum-v1") == ("gymnax", "Pendulum-v1")
    assert _kind("Breakout") == ("atari", "Breakout")
    assert _kind("SPACEINVADERS-MINATAR") == ("gymnax", "SpaceInvaders-MinAtar")
    for name in ("Pong", "Pong-v5", "PongNoFrameskip-v4", "pong", "pong-v5"):
        assert _kind(name) == ("atari", "Pong"), name
    for name in ("Hopper", "Hopper-v4", "hopper", "hopper-v4"):
        assert _kind(name) == ("mujoco", "Hopper"), name
    assert _kind("cartpole-v1") == ("gymnax", "CartPole-v1")
    assert _kind("breakout-minatar") == ("gymnax", "Breakout-MinAtar")
    for name in ("Humanoid", "CartPole", "MinAtar", "Breakout-MinAtar-v1", "", None, 3):
        assert find(name) is None, name
    with pytest.raises(ValueError, match=r"Unknown environment 'Hoper'\. Supported environments: "
                                         r"Acrobot-v1, .*CartPole-v1.*Pong.*Hopper"):
        resolve("Hoper")


def test_the_registry_imports_no_environment_library():
    code = ("import sys, rlhp_jax.tasks; heavy = {'envpool', 'mujoco', 'gymnax', 'jax'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_each_backend_has_what_its_modules_read():
    from rlhp_jax import atari_masks
    from rlhp_jax.render import classic

    assert set(atari_masks.masked_games()) == set(names("atari"))  # a game without a mask cannot run
    for name in names("atari"):
        task = TASKS[name]
        assert task.play_actions[0] == "NOOP", name
        assert list(task.play_actions) == [a for a in tasks.ALE_ACTIONS if a in task.play_actions], name
        assert task.envpool_id == f"{name}-v5" and task.reward_std == 0.05 and task.on_terminate == "reset"
    for name in names("gymnax"):  # every gymnax task can be drawn (a MinAtar palette or a drawing)
        task = TASKS[name]
        frames = classic.classic_clip_frames(name, np.zeros((1, *task.obs_shape), np.float32), size=32)
        assert frames.shape == (1, 32, 32, 3), name
        assert task.mujoco is None and not task.envpool_id
    for name in names("mujoco"):
        task = TASKS[name]
        assert task.on_terminate == "continue" and task.envpool_id == f"{name}-v4" and task.mujoco is not None
        assert task.fps == pytest.approx(1 / task.mujoco.control_timestep)
    with pytest.raises(ValueError, match="MujocoModel"):
        tasks.Task(name="X", backend="mujoco", horizon=1, segment_length=1, fps=1.0, terminal_penalty=0.0,
                   reward_std=1.0, on_terminate="continue")


@pytest.mark.parametrize("name", [n for n in names("gymnax") if TASKS[n].minatar_channels])
def test_play_page_shows_minatar_in_the_labeling_clips_colours(name):
    """One palette: the play page's cells are the labeling clips' cells (board colour included)."""
    from rlhp_jax import render
    from rlhp_jax.render import classic

    rng = np.random.default_rng(0)
    obs = rng.random(TASKS[name].obs_shape) < 0.3
    image = render.play_frame(obs, 1, name)
    assert image.shape == (10, 10, 3) and image.dtype == np.uint8
    big = classic.classic_clip_frames(name, obs[None], size=100)[0]
    np.testing.assert_array_equal(image, big[5::10, 5::10])  # the centre of each 10-pixel cell
