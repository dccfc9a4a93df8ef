"""MuJoCo clips (layer 5: what a person sees): rebuild each step's state and render it offscreen.

``MujocoRenderer`` rebuilds each step's ``qpos`` from the observation (plus the root position
from ``info``, which gym-v4 observations exclude; ``reconstruct_state``) and renders it
offscreen with the task's own XML from envpool's assets (``mujoco_asset``).  What the
environment wrapper must keep per step, and how the state is rebuilt, is in the task's
``tasks.MujocoModel``.  Clips play at the task's real-time rate ``1 / (timestep · frame_skip)``
(``Task.fps``).  The frames match envpool's own ``render()`` (tests/test_clips.py), except that
envpool's HalfCheetah frames lag one physics substep behind its observations; ours show the
observed state.  envpool reports ``x_position = 0`` at a reset (see
``backfill_reset_positions``).  ``gl_backend`` picks the offscreen OpenGL platform (EGL or
OSMesa); ``get_mujoco_renderer`` keeps one renderer per task and size.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlhp_jax import tasks

def _mujoco_task(task: str) -> tasks.Task:
    """The MuJoCo task ``task`` spells (``tasks.resolve``); its ``mujoco`` field says how a clip
    rebuilds its state."""
    found = tasks.find(task)
    if found is None or found.backend != "mujoco":
        raise ValueError(f"unknown MuJoCo task {task!r}; supported: {', '.join(tasks.names('mujoco'))}")
    return found


def mujoco_asset(task: str) -> tuple[str, int]:
    """(XML path, frame_skip) of the model envpool simulates for a task.

    envpool 1.2 loads ``<base_path>/mujoco/assets_gym/<name>_envpool.xml`` — the gym XML
    converted to local coordinates (MuJoCo >= 3 rejects the original ``hopper.xml`` and
    ``walker2d.xml``, which use ``coordinate="global"``, and Swimmer's ``collision=`` option).
    """
    import envpool

    config = envpool.make_spec(_mujoco_task(task).envpool_id).config
    directory = os.path.join(config.base_path, "mujoco", "assets_gym")
    stem, ext = os.path.splitext(config.xml_file)
    path = os.path.join(directory, stem + "_envpool" + ext)
    if not os.path.isfile(path):
        path = os.path.join(directory, config.xml_file)
    return path, int(config.frame_skip)


def reconstruct_state(task: str, obs: Any, info: Mapping[str, Any] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Rebuild ``(qpos [T, nq], qvel [T, nv])`` from per-step observations and root positions.

    obs: ``[T, obs_dim]`` (float32 is fine); info: per-step arrays ``[T]`` for the task's
    ``root_info`` fields (``x_position``, and ``y_position`` for Swimmer and Ant).

    * Hopper, Walker2d, HalfCheetah: ``qpos = [x_position, obs[:nq-1]]``,
      ``qvel = obs[nq-1:nq-1+nv]`` (Hopper/Walker velocities are clipped to ±10 in the
      observation; rendering uses ``qpos`` only).
    * Swimmer, Ant: ``qpos = [x_position, y_position, obs[:nq-2]]``,
      ``qvel = obs[nq-2:nq-2+nv]`` (Ant's free-joint quaternion is normalised by MuJoCo).
    * Reacher: ``qpos = [atan2(sin q0, cos q0), atan2(sin q1, cos q1), target_x, target_y]``
      from ``obs[0:6]``; ``qvel = [obs[6], obs[7], 0, 0]`` (the target does not move).
    * InvertedPendulum: ``qpos = obs[:2]``, ``qvel = obs[2:4]``.
    * InvertedDoublePendulum: ``qpos = [obs[0], atan2(obs[1], obs[3]), atan2(obs[2], obs[4])]``,
      ``qvel = obs[5:8]`` (clipped to ±10).  atan2 gives the angle modulo 2π — the same pose.

    If an observation already includes the root position (``exclude_current_positions_
    from_observation=False``: ``len(root_info)`` more values), it is used and ``info`` is not
    needed.  Ant may carry its 84 contact-force values at the end (ignored).
    """
    entry = _mujoco_task(task)
    spec, env_id = entry.mujoco, entry.envpool_id
    obs = np.asarray(obs, dtype=np.float64)
    if obs.ndim == 1:
        obs = obs[None]
    if obs.ndim != 2 or obs.shape[0] == 0:
        raise ValueError(f"{env_id}: obs must be [T, obs_dim] with T > 0, got {obs.shape}")
    t, dim = obs.shape
    nq, nv = spec.nq, spec.nv
    if spec.layout == "root_excluded":
        k = len(spec.root_info)
        dims = {spec.obs_dim, spec.obs_dim + spec.extra_obs}
        if dim in {d + k for d in dims}:  # root position included in the observation
            return obs[:, :nq].copy(), obs[:, nq:nq + nv].copy()
        if dim not in dims:
            raise ValueError(f"{env_id}: expected obs_dim in {sorted(dims)} (or "
                             f"{sorted(d + k for d in dims)} with the root position), got {dim}")
        missing = [key for key in spec.root_info if info is None or key not in info]
        if missing:
            raise ValueError(f"{env_id}: the observation excludes the root position; "
                             f"info must hold per-step {missing}")
        root = [np.asarray(info[key], dtype=np.float64).reshape(-1) for key in spec.root_info]
        for key, r in zip(spec.root_info, root):
            if r.shape[0] != t:
                raise ValueError(f"{env_id}: info[{key!r}] has {r.shape[0]} steps, obs {t}")
        qpos = np.concatenate([np.stack(root, axis=1), obs[:, :nq - k]], axis=1)
        qvel = obs[:, nq - k:nq - k + nv]
        return qpos, qvel.copy()
    if dim < spec.obs_dim:
        raise ValueError(f"{env_id}: expected obs_dim {spec.obs_dim}, got {dim}")
    if spec.layout == "full":
        return obs[:, :nq].copy(), obs[:, nq:nq + nv].copy()
    if spec.layout == "reacher":
        angles = np.arctan2(obs[:, 2:4], obs[:, 0:2])
        qpos = np.concatenate([angles, obs[:, 4:6]], axis=1)
        qvel = np.concatenate([obs[:, 6:8], np.zeros((t, 2))], axis=1)
        return qpos, qvel
    if spec.layout == "double_pendulum":
        angles = np.arctan2(obs[:, 1:3], obs[:, 3:5])
        return np.concatenate([obs[:, :1], angles], axis=1), obs[:, 5:8].copy()
    raise AssertionError(spec.layout)


def backfill_reset_positions(position: Any, velocity: Any, first: Any, dt: float) -> np.ndarray:
    """Correct the root position of episodes' first steps.

    envpool reports ``x_position = 0`` (and ``y_position = 0``) in the info of a reset,
    although the reset noise has moved the root (≤ 5 mm for Hopper/Walker2d, ≤ 0.1 m for
    HalfCheetah, Swimmer and Ant).  The next step's info recovers it:
    ``x[t] = x_position[t+1] - x_velocity[t+1] · dt`` with ``dt = timestep · frame_skip``.
    ``first[t]`` marks steps that begin an episode; where the next step is not in the clip
    (or begins another episode), the value is left as it is.
    """
    pos = np.array(position, dtype=np.float64).reshape(-1)
    vel = np.asarray(velocity, dtype=np.float64).reshape(-1)
    first = np.asarray(first, dtype=bool).reshape(-1)
    idx = np.nonzero(first[:-1] & ~first[1:])[0]
    pos[idx] = pos[idx + 1] - vel[idx + 1] * dt
    return pos


_GL_BACKEND: str | None = None


def _loadable(*names: str) -> bool:
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


def gl_backend() -> str:
    """The offscreen OpenGL platform for MuJoCo rendering: 'egl' or 'osmesa'.

    ``MUJOCO_GL=egl|osmesa`` chooses; otherwise EGL if ``libEGL.so.1`` loads, else OSMesa.
    Debian 12 packages: EGL needs ``libegl1`` (pulls in Mesa's ``libegl-mesa0``),
    ``libopengl0`` (PyOpenGL's GL entry points; ``libgl1`` also works) and, without a GPU,
    ``libgl1-mesa-dri`` (the llvmpipe software rasteriser); OSMesa needs ``libosmesa6``.
    Both give identical pixels here; EGL/llvmpipe is ~2× faster than OSMesa.

    mujoco reads ``MUJOCO_GL`` once, at ``import mujoco``, for ``mujoco.Renderer``; this module
    makes its GL contexts itself (so it works whatever that import saw), and sets
    ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` (unless already set) for everyone else.
    """
    global _GL_BACKEND
    if _GL_BACKEND is None:
        wanted = os.environ.get("MUJOCO_GL", "").strip().lower()
        if wanted in ("egl", "osmesa"):
            backend = wanted
        elif _loadable("libEGL.so.1"):
            backend = "egl"
        elif _loadable("libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so"):
            backend = "osmesa"
        else:
            raise RuntimeError(
                "no offscreen OpenGL for MuJoCo rendering: install EGL (Debian: libegl1 "
                "libopengl0 libgl1-mesa-dri) or OSMesa (Debian: libosmesa6)")
        os.environ.setdefault("MUJOCO_GL", backend)
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
        _GL_BACKEND = backend
    return _GL_BACKEND


def _gl_context(width: int, height: int):
    backend = gl_backend()
    try:
        if backend == "egl":
            from mujoco.egl import GLContext
        else:
            from mujoco.osmesa import GLContext
        return GLContext(width, height)
    except Exception as exc:  # noqa: BLE001 - re-raised with advice
        other = "osmesa (Debian libosmesa6)" if backend == "egl" else "egl (Debian libegl1)"
        raise RuntimeError(
            f"cannot create an offscreen OpenGL context with MUJOCO_GL={backend}: {exc}. "
            f"Try MUJOCO_GL={other.split()[0]} ({other}) in a fresh process.") from exc


class MujocoRenderer:
    """Renders MuJoCo clips of one envpool gym-v4 task from per-step observations.

    ``camera``: None for the task's default — the XML's ``track`` camera (a ``trackcom``
    camera following the torso; envpool renders with the same one) for Hopper, Walker2d,
    HalfCheetah, Swimmer and Ant; a fixed free camera that shows the whole arena (Reacher,
    top-down) or the whole rail (the two pendulums, whose cart runs on a bounded ±1 m rail),
    so a person sees where the cart is.  Or a camera name / id (-1 = MuJoCo's default free
    camera, what envpool's ``render()`` uses for tasks without a camera), or a dict of
    free-camera settings (``lookat``, ``distance``, ``elevation``, ``azimuth``).

    ``shadow_size`` caps the shadow map's resolution (the XMLs ask for 4096²): with software
    OpenGL (Mesa llvmpipe) shadow mapping dominates the cost, and 1024² renders 256² frames
    2–3× faster with a mean pixel difference of 0.01/255.  None keeps the XML's.

    One OpenGL context per renderer (creating one costs ~0.5 s, the first frame ~0.3–1 s
    more); keep renderers around (``get_mujoco_renderer``).  Thread-safe through a lock.
    """

    def __init__(self, task: str, width: int = 256, height: int = 256,
                 camera: str | int | Mapping[str, Any] | None = None,
                 shadow_size: int | None = 1024):
        entry = _mujoco_task(task)
        self.spec, self.task, self.env_id = entry.mujoco, entry.name, entry.envpool_id
        if int(width) < 1 or int(height) < 1:
            raise ValueError(f"width and height must be positive, got {width}×{height}")
        self.width, self.height = int(width), int(height)
        gl_backend()
        import mujoco

        self._mj = mujoco
        self.xml_path, self.frame_skip = mujoco_asset(self.task)
        self.model = mujoco.MjModel.from_xml_path(self.xml_path)
        if (self.model.nq, self.model.nv) != (self.spec.nq, self.spec.nv):
            raise RuntimeError(f"{self.xml_path}: nq, nv = {self.model.nq}, {self.model.nv}, "
                               f"expected {self.spec.nq}, {self.spec.nv}")
        self.data = mujoco.MjData(self.model)
        self.dt = float(self.model.opt.timestep) * self.frame_skip
        self.fps = 1.0 / self.dt
        self.camera = self._make_camera(self.spec.camera if camera is None else camera)

        vis = self.model.vis.global_
        vis.offwidth, vis.offheight = max(vis.offwidth, self.width), max(vis.offheight,
                                                                         self.height)
        if shadow_size is not None:  # the XMLs ask for 4096²; 1024² looks the same at 256²
            quality = self.model.vis.quality
            quality.shadowsize = min(int(quality.shadowsize), int(shadow_size))
        self._lock = threading.Lock()
        self._gl = _gl_context(self.width, self.height)
        # current only while in use (then released), so any one thread at a time may render
        with self._gl.as_current():
            self._con = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        self._scene = mujoco.MjvScene(self.model, maxgeom=1000)
        self._option = mujoco.MjvOption()
        self._perturb = mujoco.MjvPerturb()
        self._rect = mujoco.MjrRect(0, 0, self.width, self.height)
        self._pixels = np.empty((self.height, self.width, 3), np.uint8)
        _LIVE_RENDERERS.add(self)

    def _make_camera(self, camera):
        mujoco = self._mj
        cam = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(self.model, cam)
        if isinstance(camera, Mapping):
            if "lookat" in camera:
                cam.lookat[:] = camera["lookat"]
            for key in ("distance", "elevation", "azimuth"):
                if key in camera:
                    setattr(cam, key, float(camera[key]))
            return cam
        if isinstance(camera, str):
            cam_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if cam_id < 0:
                raise ValueError(f"{self.env_id} has no camera named {camera!r}")
            camera = cam_id
        camera = int(camera)
        if camera == -1:
            return cam
        if not 0 <= camera < self.model.ncam:
            raise ValueError(f"{self.env_id}: camera id {camera} out of range "
                             f"(-1..{self.model.ncam - 1})")
        cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        cam.fixedcamid = camera
        return cam

    def render_qpos(self, qpos: Any, qvel: Any | None = None) -> np.ndarray:
        """``qpos [T, nq]`` (and optionally ``qvel [T, nv]``) -> frames ``[T, H, W, 3]`` uint8."""
        qpos = np.asarray(qpos, dtype=np.float64)
        if qpos.ndim != 2 or qpos.shape[1] != self.model.nq or qpos.shape[0] == 0:
            raise ValueError(f"qpos must be [T, {self.model.nq}] with T > 0, got {qpos.shape}")
        if qvel is not None:
            qvel = np.asarray(qvel, dtype=np.float64)
            if qvel.shape != (qpos.shape[0], self.model.nv):
                raise ValueError(f"qvel must be [{qpos.shape[0]}, {self.model.nv}], "
                                 f"got {qvel.shape}")
        if not np.all(np.isfinite(qpos)):
            raise ValueError("qpos has non-finite values")
        out = np.empty((qpos.shape[0], self.height, self.width, 3), np.uint8)
        with self._lock:
            if self._con is None:
                raise RuntimeError("renderer is closed")
            with self._gl.as_current():
                self._render_into(out, qpos, qvel)
        return out

    def _render_into(self, out: np.ndarray, qpos: np.ndarray, qvel: np.ndarray | None) -> None:
        mujoco = self._mj
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        for t in range(qpos.shape[0]):
            self.data.qpos[:] = qpos[t]
            self.data.qvel[:] = 0.0 if qvel is None else qvel[t]
            mujoco.mj_forward(self.model, self.data)
            mujoco.mjv_updateScene(self.model, self.data, self._option, self._perturb,
                                   self.camera, mujoco.mjtCatBit.mjCAT_ALL, self._scene)
            mujoco.mjr_render(self._rect, self._scene, self._con)
            mujoco.mjr_readPixels(self._pixels, None, self._rect, self._con)
            out[t] = self._pixels[::-1]  # OpenGL's rows run bottom-up

    def render(self, obs: Any, info: Mapping[str, Any] | None = None) -> np.ndarray:
        """Per-step observations ``[T, obs_dim]`` (+ root positions in ``info``) -> frames."""
        qpos, qvel = reconstruct_state(self.task, obs, info)
        return self.render_qpos(qpos, qvel)

    def close(self) -> None:
        with self._lock:
            if getattr(self, "_con", None) is not None:
                with self._gl.as_current():
                    self._con.free()
                self._con = None
                self._gl.free()

    def __del__(self) -> None:
        # Free the MjrContext with this renderer's own GL context current: freed by the
        # garbage collector while another context is current, it would delete that
        # context's textures and framebuffers (same object ids), corrupting its frames.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> MujocoRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIVE_RENDERERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_renderers() -> None:
    """Free GL resources while the interpreter still works (OSMesa complains otherwise)."""
    for renderer in list(_LIVE_RENDERERS):
        try:
            renderer.close()
        except Exception:  # noqa: BLE001
            pass


_RENDERERS: dict[tuple, MujocoRenderer] = {}
_RENDERERS_LOCK = threading.Lock()


def get_mujoco_renderer(task: str, width: int = 256, height: int = 256) -> MujocoRenderer:
    """A cached ``MujocoRenderer`` (task default camera) per (task, width, height)."""
    found = tasks.find(task)
    key = (found.name if found else task, int(width), int(height))
    with _RENDERERS_LOCK:
        if key not in _RENDERERS:
            _RENDERERS[key] = MujocoRenderer(task, width, height)
        return _RENDERERS[key]
