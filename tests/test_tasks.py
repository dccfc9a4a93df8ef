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


# the gymnax state each declared mirror acts on: the same reflection, on the simulator's variables
_MIRRORED_STATE = {
    "CartPole-v1": lambda s: s.replace(x=-s.x, x_dot=-s.x_dot, theta=-s.theta, theta_dot=-s.theta_dot),
    "Pendulum-v1": lambda s: s.replace(theta=-s.theta, theta_dot=-s.theta_dot, last_u=-s.last_u),
    "Acrobot-v1": lambda s: s.replace(joint_angle1=-s.joint_angle1, joint_angle2=-s.joint_angle2,
                                      velocity_1=-s.velocity_1, velocity_2=-s.velocity_2),
}


def _mirror_obs(m: tasks.Mirror, obs):
    return np.asarray(obs)[..., list(m.obs_permutation)] * np.asarray(m.obs_sign)


# MuJoCo: the reflection's signs on qpos and qvel (the observation is qpos[2:], qvel: "root_excluded")
_MIRRORED_QPOS_QVEL = {
    "Swimmer": ((1.0, -1.0, -1.0, -1.0, -1.0), (1.0, -1.0, -1.0, -1.0, -1.0)),  # slider x, slider y, 3 hinges
}


def test_the_mirrored_tasks_are_the_tasks_checked_below():
    assert sorted(n for n, t in TASKS.items() if t.mirror is not None) == sorted(
        [*_MIRRORED_STATE, *_MIRRORED_QPOS_QVEL])


@pytest.mark.parametrize("name", sorted(_MIRRORED_QPOS_QVEL))
def test_a_declared_mujoco_mirror_commutes_with_the_simulation_and_keeps_the_forward_motion(name):
    """The same check on the task's MuJoCo model (envpool's asset): from random states, the
    mirrored state under the mirrored torques steps to the mirror image, and the root moves
    forward (the true reward) by the same distance."""
    import mujoco

    from rlhp_jax.render.mujoco import mujoco_asset

    task = TASKS[name]
    assert task.mujoco.layout == "root_excluded"
    sign = np.asarray(task.mirror.obs_sign)
    qpos_sign, qvel_sign = (np.asarray(v) for v in _MIRRORED_QPOS_QVEL[name])
    xml, frame_skip = mujoco_asset(name)
    model = mujoco.MjModel.from_xml_path(xml)
    data, image = mujoco.MjData(model), mujoco.MjData(model)
    obs = lambda d: np.concatenate([d.qpos[2:], d.qvel])
    rng = np.random.default_rng(0)
    for _ in range(5):
        data.qpos[:] = rng.normal(size=model.nq) * 0.5
        data.qvel[:] = rng.normal(size=model.nv)
        for _ in range(20):
            image.qpos[:], image.qvel[:] = data.qpos * qpos_sign, data.qvel * qvel_sign
            np.testing.assert_allclose(obs(image), sign * obs(data), atol=1e-12)
            action = rng.uniform(-1, 1, model.nu)
            data.ctrl[:], image.ctrl[:] = action, np.asarray(task.mirror.action_sign) * action
            x, x_image = data.qpos[0], image.qpos[0]
            for _ in range(frame_skip):
                mujoco.mj_step(model, data)
                mujoco.mj_step(model, image)
            np.testing.assert_allclose(obs(image), sign * obs(data), atol=1e-9)
            assert abs((image.qpos[0] - x_image) - (data.qpos[0] - x)) < 1e-9


@pytest.mark.parametrize("name", sorted(_MIRRORED_STATE))
def test_a_declared_mirror_commutes_with_the_dynamics_and_keeps_the_reward(name):
    """From states a random policy reaches: stepping the mirrored state with the mirrored action
    gives the mirror image of the next observation, the same reward and the same end."""
    import gymnax
    import jax

    mirror = TASKS[name].mirror
    env, params = gymnax.make(name)
    step = jax.jit(env.step_env)
    _, state = env.reset_env(jax.random.PRNGKey(0), params)
    rng = np.random.default_rng(0)
    checked = 0
    for t in range(60):
        key = jax.random.PRNGKey(t)
        if mirror.action_index is not None:
            a = int(rng.integers(len(mirror.action_index)))
            a_m = mirror.action_index[a]
        else:
            a = rng.uniform(-2, 2, size=len(mirror.action_sign)).astype(np.float32)
            a_m = a * np.asarray(mirror.action_sign, np.float32)
            a, a_m = a[0], a_m[0]  # gymnax's Pendulum takes a scalar torque
        mirrored = _MIRRORED_STATE[name](state)
        np.testing.assert_allclose(env.get_obs(mirrored), _mirror_obs(mirror, env.get_obs(state)), atol=1e-6)
        obs, next_state, reward, done, _ = step(key, state, a, params)
        obs_m, _, reward_m, done_m, _ = step(key, mirrored, a_m, params)
        np.testing.assert_allclose(obs_m, _mirror_obs(mirror, obs), atol=1e-4, err_msg=f"{name} step {t}")
        np.testing.assert_allclose(reward_m, reward, atol=1e-5)
        assert bool(done_m) == bool(done)
        checked += 1
        state = env.reset_env(key, params)[1] if bool(done) else next_state
    assert checked == 60


def test_a_mirror_must_be_a_reflection():
    with pytest.raises(ValueError, match="undo itself"):
        tasks.Mirror(obs_sign=(1.0, -1.0), obs_index=(1, 0), action_sign=(1.0,))
    with pytest.raises(ValueError, match="permutation"):
        tasks.Mirror(obs_sign=(1.0, 1.0), obs_index=(0, 0), action_sign=(1.0,))
    with pytest.raises(ValueError, match="-1 or 1"):
        tasks.Mirror(obs_sign=(0.5,), action_sign=(1.0,))
    with pytest.raises(ValueError, match="not both"):
        tasks.Mirror(obs_sign=(1.0,))
    with pytest.raises(ValueError, match="action_index"):
        tasks.Mirror(obs_sign=(1.0,), action_index=(1, 2, 0))
    tasks.Mirror(obs_sign=(-1.0, -1.0, 1.0), obs_index=(1, 0, 2), action_index=(1, 0, 2))  # a swap is fine
