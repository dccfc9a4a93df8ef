"""Clips a person can watch: short H.264 MP4s of trajectory segments (Atari and MuJoCo).

Only segments that are actually shown to a person are rendered, never anything on the
training hot path, so this module is plain numpy + Python (no jit).

Video
  ``encode_mp4`` writes ``[T, H, W, 3]`` RGB or ``[T, H, W]`` grayscale uint8 frames as H.264
  (``libx264``, ``yuv420p``, ``+faststart``) through the ffmpeg bundled with ``imageio-ffmpeg``
  (the format DESIGN.md records as playing in Chromium).  ``yuv420p`` needs even sizes: odd sizes are padded by repeating
  the last row/column.  ``probe_mp4`` reads a file back (frames, duration, size, codec).

Atari
  ``atari_clip_frames`` shows the newest frame of the agent's ``[T, 84, 84, 4]`` observation
  stack, upscaled with nearest neighbour (×4 → 336×336).  ``atari_native_clip_frames`` shows
  native ``[T, 210, 160, 3]`` colour frames (×2 → 420×320) if the environment wrapper keeps
  them for displayed segments (100,800 B per step instead of 7,056 B).  Atari clips play at
  15 fps (60 Hz emulator, frame skip 4) — real time.

MuJoCo
  ``MujocoRenderer`` rebuilds each step's ``qpos`` from the observation (plus the root
  position from ``info``, which gym-v4 observations exclude) and renders it offscreen with the
  task's own XML from envpool's assets.  What the environment wrapper must keep per step, and
  how the state is rebuilt, is in the task's ``tasks.MujocoModel`` / ``reconstruct_state``.
  Clips play at the task's real-time rate ``1 / (timestep · frame_skip)`` (``Task.fps``).  The
  frames match envpool's own ``render()`` (tests/test_clips.py), except that envpool's
  HalfCheetah frames lag one physics substep behind its observations; ours show the observed
  state.  envpool reports
  ``x_position = 0`` at a reset (see ``backfill_reset_positions``).

CLI
  ``python -m rlhp_jax.clips --env Hopper --steps 60 --out clip.mp4`` runs a random policy
  through the project's environment wrapper (``envs.make_env``: the papers' settings, masked
  Atari frames) and writes a clip of the state after each step.  ``--env`` takes every task
  ``envs.make_env`` takes (MuJoCo, Atari, and gymnax's classic-control and MinAtar tasks, drawn
  by ``classic_clips``), in every spelling ``tasks.resolve`` accepts.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlhp_jax import tasks

# --------------------------------------------------------------------------------- video


@contextlib.contextmanager
def _exec_only_fork():
    """Silence Python's 'os.fork() with threads' warning for subprocesses that exec ffmpeg at
    once (the child runs no Python code, so JAX's threads cannot deadlock it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield

ATARI_OBS_BYTES_PER_STEP = 84 * 84  # newest grayscale frame of the agent's stack
ATARI_NATIVE_BYTES_PER_STEP = 210 * 160 * 3  # native RGB frame


def _as_frames(frames: Any) -> np.ndarray:
    """Validate a clip; returns ``[T, H, W, 3]`` (RGB) or ``[T, H, W]`` (grayscale) uint8."""
    if not isinstance(frames, np.ndarray):
        frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got dtype {frames.dtype}")
    if frames.ndim == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    if not (frames.ndim == 3 or (frames.ndim == 4 and frames.shape[-1] == 3)):
        raise ValueError(
            f"frames must be [T, H, W, 3] (RGB) or [T, H, W] (grayscale), got shape {frames.shape}")
    if frames.shape[0] == 0:
        raise ValueError("empty clip: frames has no time steps (T == 0)")
    if frames.shape[1] == 0 or frames.shape[2] == 0:
        raise ValueError(f"frames have zero height or width: shape {frames.shape}")
    return frames


def _scale_pair(scale: int | Sequence[int]) -> tuple[int, int]:
    pair = (scale, scale) if np.ndim(scale) == 0 else tuple(scale)
    if len(pair) != 2 or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in pair):
        raise ValueError(f"scale must be a positive integer or a pair of them, got {scale!r}")
    return int(pair[0]), int(pair[1])


def upscale(frames: np.ndarray, scale: int | Sequence[int]) -> np.ndarray:
    """Nearest-neighbour integer upscaling of ``[T, H, W(, C)]`` along H and W.

    ``scale`` is one integer or ``(scale_h, scale_w)``.
    """
    sh, sw = _scale_pair(scale)
    if sh > 1:
        frames = np.repeat(frames, sh, axis=1)
    if sw > 1:
        frames = np.repeat(frames, sw, axis=2)
    return frames


def _pad_even(frames: np.ndarray) -> np.ndarray:
    """Repeat the last row / column so H and W are even (yuv420p subsamples chroma 2×2)."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    widths = [(0, 0), (0, pad_h), (0, pad_w)] + [(0, 0)] * (frames.ndim - 3)
    return np.pad(frames, widths, mode="edge")


def encode_mp4(frames: Any, path: str | os.PathLike, fps: float,
               scale: int | Sequence[int] = 1, crf: int = 18) -> str:
    """Write a clip as a browser-playable H.264 MP4; returns the path.

    frames: ``[T, H, W, 3]`` RGB or ``[T, H, W]`` grayscale, uint8.  ``scale`` (an integer or
    ``(scale_h, scale_w)``) upscales with nearest neighbour first; odd sizes are then padded to
    even.  ``crf`` is x264's constant rate factor (lower = better; 18 keeps upscaled pixel
    edges sharp).  The file appears atomically: ffmpeg writes a temporary file in the same
    directory, which is then renamed onto ``path``.
    """
    import imageio_ffmpeg

    frames = _as_frames(frames)
    fps = float(fps)
    if not np.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number, got {fps}")
    frames = _pad_even(upscale(frames, scale))
    if frames.ndim == 3:  # grayscale -> RGB; x264 encodes yuv420p either way
        frames = np.repeat(frames[..., None], 3, axis=-1)
    frames = np.ascontiguousarray(frames)
    t, h, w, _ = frames.shape

    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"output directory does not exist: {directory}")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp.mp4",
                               dir=directory)
    os.close(fd)
    try:
        writer = imageio_ffmpeg.write_frames(
            tmp, (w, h), pix_fmt_in="rgb24", pix_fmt_out="yuv420p", fps=fps, quality=None,
            codec="libx264", macro_block_size=2, ffmpeg_log_level="error",
            output_params=["-crf", str(int(crf)), "-movflags", "+faststart"])
        with _exec_only_fork():
            writer.send(None)  # start ffmpeg
        for frame in frames:
            writer.send(frame)
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _mp4_top_level_boxes(path: str) -> list[str]:
    """Types of the top-level boxes of an MP4 file, in order ('ftyp', 'moov', 'mdat', ...)."""
    boxes = []
    size_total = os.path.getsize(path)
    with open(path, "rb") as f:
        pos = 0
        while pos + 8 <= size_total and len(boxes) < 64:
            f.seek(pos)
            header = f.read(16)
            size = int.from_bytes(header[:4], "big")
            boxes.append(header[4:8].decode("latin-1"))
            if size == 1:  # 64-bit size
                size = int.from_bytes(header[8:16], "big")
            elif size == 0:  # box runs to end of file
                break
            if size < 8:
                break
            pos += size
    return boxes


def probe_mp4(path: str | os.PathLike) -> dict[str, Any]:
    """What a video file holds, read back with the bundled ffmpeg.

    Returns ``frames`` (decoded count), ``duration_s`` (container duration, 10 ms resolution),
    ``width``, ``height``, ``codec`` (e.g. 'h264'), ``pix_fmt`` (e.g. 'yuv420p'), ``fps``
    (the stream's frame rate), and ``faststart`` (the index, ``moov``, precedes the media data,
    so a browser can start playing before the whole file has arrived).
    """
    import imageio_ffmpeg

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    with _exec_only_fork():
        out = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", path],
                             capture_output=True, text=True, errors="replace").stderr
    stream = re.search(r"Stream #\S+.*?: Video: (\w+)[^,]*, (\w+)[^,]*?(?:\([^)]*\))?, (\d+)x(\d+)",
                       out)
    if stream is None:
        raise ValueError(f"no video stream in {path}: {out.strip()[-300:]}")
    duration = re.search(r"Duration: (\d+):(\d+):(\d+(?:\.\d+)?)", out)
    fps = re.search(r", (\d+(?:\.\d+)?(?:k)?) fps", out)
    frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    boxes = _mp4_top_level_boxes(path)
    return dict(
        frames=int(frames),
        duration_s=(int(duration[1]) * 3600 + int(duration[2]) * 60 + float(duration[3])
                    if duration else float("nan")),
        width=int(stream[3]),
        height=int(stream[4]),
        codec=stream[1],
        pix_fmt=stream[2],
        fps=(float(fps[1].rstrip("k")) * (1000 if fps[1].endswith("k") else 1)
             if fps else float("nan")),
        faststart=("moov" in boxes and "mdat" in boxes
                   and boxes.index("moov") < boxes.index("mdat")),
    )


# --------------------------------------------------------------------------------- Atari


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


# -------------------------------------------------------------------------------- MuJoCo


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


# ------------------------------------------------------------------------------ segments


def segment_frames(env: str, obs: Any, render: Any = None, render_fields: Sequence[str] = (),
                   size: int = 256) -> tuple[np.ndarray, float]:
    """``(frames, fps)`` of one trajectory segment as a person is shown it, for any task the
    project runs: ``obs`` ``[T, *obs_shape]`` and ``render`` ``[T, R]`` as the rollout keeps
    them (``render_fields`` names the R columns; MuJoCo's root position).  Frame t shows the
    observation the agent acted on at step t; MuJoCo's root position is the one reported after
    that step (one step ahead: a constant shift of about one step's travel).

    Clips play in real time, but never shorter than ``MIN_CLIP_S``: shorter segments (CartPole's
    25 steps are 0.5 s) play in slow motion, since Christiano's labelers judged clips of 1-2 s."""
    obs = np.asarray(obs)
    frames, fps = _segment_frames(env, obs, render, render_fields, size)
    return frames, min(fps, len(frames) / MIN_CLIP_S)


MIN_CLIP_S = 1.0


def _segment_frames(env, obs, render, render_fields, size):
    task = tasks.resolve(env)
    if task.backend == "mujoco":
        render = np.zeros((obs.shape[0], 0)) if render is None else np.asarray(render)
        info = {f: render[:, i] for i, f in enumerate(render_fields)}
        qpos, qvel = reconstruct_state(task.name, obs, info)
        return get_mujoco_renderer(task.name, size, size).render_qpos(qpos, qvel), task.fps
    if task.backend == "atari":  # the agent's masked 84x84 frames
        return atari_clip_frames(obs.astype(np.uint8), scale=max(1, round(size / 84))), task.fps
    from rlhp_jax.classic_clips import classic_clip_frames

    return classic_clip_frames(task.name, obs, size=size), task.fps


# ----------------------------------------------------------------------------------- CLI


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # return exit code 2 from main() instead of exiting
        raise _UsageError(message)


def _unknown_env_message(env: str) -> str:
    mujoco = [name for name, task in tasks.TASKS.items() if task.backend == "mujoco"]  # the table's order
    return (f"unknown env {env!r}; supported: MuJoCo {', '.join(mujoco)}; "
            f"Atari {', '.join(tasks.names('atari'))}; classic control and MinAtar (gymnax) "
            f"{', '.join(tasks.names('gymnax'))}")


def random_rollout(env_name: str, steps: int, seed: int):
    """``steps`` steps of a uniformly random policy through the project's environment wrapper
    (``envs.make_env``: the papers' settings, Atari score masks).  Returns ``(env, next_obs,
    render)``: the observation *after* each step and its render data, so frame t shows the
    result of action t (what a segment's clip shows)."""
    import jax

    from rlhp_jax.envs import make_env
    from rlhp_jax.rollout import collect_rollout, uniform_random_policy

    env = make_env(env_name, 1, seed=seed)
    spec = env.spec

    policy = uniform_random_policy(spec)

    state, obs = env.reset(jax.random.key(seed))
    _, last, ro = collect_rollout(env, policy, None, state, obs, jax.random.key(seed), steps)
    next_obs = np.concatenate([np.asarray(ro.obs[1:, 0]), np.asarray(last)], axis=0)
    return env, next_obs, np.asarray(ro.render[:, 0])


def _run_atari_native(game: str, steps: int, seed: int, rng: np.random.Generator):
    """Native ``[T, 210, 160, 3]`` colour frames of a random policy, score area blanked.  A
    separate envpool instance with the same Atari options as the wrapper but native frames
    (one envpool env cannot emit both the 84×84 stack and native colour)."""
    import envpool

    from rlhp_jax import atari_masks
    from rlhp_jax.envpool_envs import EnvpoolVecEnv

    kwargs = dict(EnvpoolVecEnv(game, 1, seed=seed).envpool_kwargs, img_height=210, img_width=160,
                  gray_scale=False, stack_num=1)
    env = envpool.make(tasks.TASKS[game].envpool_id, **kwargs)
    env.reset()
    frames = []
    for _ in range(steps):
        obs, *_ = env.step(rng.integers(0, env.action_space.n, size=(1,)).astype(np.int32))
        frames.append(obs[0])
    env.close()
    return atari_masks.mask_native(np.transpose(np.stack(frames), (0, 2, 3, 1)), game)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m rlhp_jax.clips",
                     description="Write an MP4 clip of a random policy in any task envs.make_env "
                                 "runs (MuJoCo, Atari, gymnax classic control and MinAtar).")
    parser.add_argument("--env", required=True,
                        help="MuJoCo task (Hopper, ...), Atari game (Pong, Pong-v5, ...) or gymnax "
                             "task (CartPole-v1, Breakout-MinAtar, ...)")
    parser.add_argument("--steps", type=int, default=60,
                        help="frames in the clip: the state after each of `steps` random actions")
    parser.add_argument("--out", required=True, help="output .mp4 path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=float, default=None,
                        help="default: real time (MuJoCo 1/(timestep·frame_skip), Atari 15, "
                             "gymnax 1/dt: CartPole 50, MinAtar 10, ...)")
    parser.add_argument("--size", type=int, default=256,
                        help="MuJoCo and gymnax frame width and height (gymnax: even, >= 32)")
    parser.add_argument("--scale", type=int, default=None,
                        help="Atari upscaling (default 4 for 84×84, 2 for --native)")
    parser.add_argument("--native", action="store_true", help="Atari: native-colour frames")
    parser.add_argument("--every", type=int, default=1,
                        help="MuJoCo and gymnax: render every k-th step at fps/k (still real time)")
    try:
        args = parser.parse_args(argv)
        if args.steps < 1:
            raise _UsageError(f"--steps must be at least 1, got {args.steps}")
        if args.fps is not None and not args.fps > 0:
            raise _UsageError(f"--fps must be positive, got {args.fps}")
        if args.every < 1 or args.size < 1 or (args.scale is not None and args.scale < 1):
            raise _UsageError("--every, --size and --scale must be positive")
        if not args.out.lower().endswith(".mp4"):
            raise _UsageError(f"--out must end in .mp4, got {args.out!r}")
        resolved = tasks.find(args.env)
        if resolved is None:
            raise _UsageError(_unknown_env_message(args.env))
        kind, name = resolved.backend, resolved.name
        task = name if kind == "mujoco" else None
        game = name if kind == "atari" else None
        if kind == "gymnax":
            from rlhp_jax.classic_clips import MIN_CLIP_SIZE

            if args.native or args.scale is not None:
                raise _UsageError(f"--native and --scale apply to Atari games only; {name}'s "
                                  f"frames are --size pixels square (default 256)")
            if args.size < MIN_CLIP_SIZE or args.size % 2:
                raise _UsageError(f"--size for {name} must be an even number >= {MIN_CLIP_SIZE}, "
                                  f"got {args.size}")
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    rng = np.random.default_rng(args.seed)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    if task is not None:
        env, obs, render = random_rollout(task, args.steps, args.seed)
        info = {f: render[:, i] for i, f in enumerate(env.render_fields)}
        t0 = time.perf_counter()
        renderer = MujocoRenderer(task, args.size, args.size)
        t_setup = time.perf_counter() - t0
        qpos, qvel = reconstruct_state(task, obs, info)
        t0 = time.perf_counter()
        frames = renderer.render_qpos(qpos[::args.every], qvel[::args.every])
        t_render = time.perf_counter() - t0
        fps = args.fps if args.fps is not None else resolved.fps / args.every
        renderer.close()
    elif kind == "gymnax":
        from rlhp_jax.classic_clips import classic_clip_frames

        t_setup = 0.0
        _, obs, _ = random_rollout(name, args.steps, args.seed)
        t0 = time.perf_counter()
        frames = classic_clip_frames(name, obs[::args.every], size=args.size)
        t_render = time.perf_counter() - t0
        fps = args.fps if args.fps is not None else resolved.fps / args.every
    else:
        t_setup = 0.0
        if args.native:
            frames_in = _run_atari_native(game, args.steps, args.seed, rng)
            t0 = time.perf_counter()
            frames = atari_native_clip_frames(frames_in, args.scale or 2)
        else:
            _, frames_in, _ = random_rollout(game, args.steps, args.seed)
            t0 = time.perf_counter()
            frames = atari_clip_frames(frames_in, args.scale or 4)
        t_render = time.perf_counter() - t0
        fps = args.fps if args.fps is not None else resolved.fps
    t0 = time.perf_counter()
    encode_mp4(frames, args.out, fps)
    t_encode = time.perf_counter() - t0
    info_out = probe_mp4(args.out)
    print(f"{args.out}: {name}, {info_out['frames']} frames, {info_out['duration_s']:.2f} s at "
          f"{fps:g} fps, {info_out['width']}x{info_out['height']} {info_out['codec']}; "
          f"render {t_render:.2f} s (+{t_setup:.2f} s renderer setup), encode {t_encode:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
