"""Benchmark: rendering and encoding one clip a person is shown.

    python -m experiments.bench_clips                 # Atari 25 steps; Hopper, HalfCheetah 1.5 s
    python -m experiments.bench_clips --size 128 --repeats 3

Clips: a 25-step Atari clip (84×84 newest frames → ×4 = 336×336, 15 fps) and 1.5 s of
simulated time for Hopper (188 steps at 125 fps), Hopper rendered every 4th step (47 frames at
31.25 fps, still real time) and HalfCheetah (30 steps at 20 fps), MuJoCo at ``--size``² (256²
by default).  The MuJoCo states come from a random policy in envpool; the Atari frames are
random noise (worst case for the encoder).  Render time excludes creating the renderer (one
OpenGL context per task, reused across clips; reported separately, with the first frame, as
``setup``).  Prints one line per clip and a JSON list at the end; record the figures in
BUILD_NOTES.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

from rlhp_jax import tasks
from rlhp_jax.render.atari import atari_clip_frames
from rlhp_jax.render.mujoco import MujocoRenderer, reconstruct_state
from rlhp_jax.render.video import encode_mp4


def _mujoco_states(task: str, steps: int, seed: int = 0):
    import envpool

    env_id = tasks.resolve(task).envpool_id
    kwargs = {}
    if "terminate_when_unhealthy" in envpool.make_spec(env_id).config._fields:
        kwargs["terminate_when_unhealthy"] = False
    env = envpool.make(env_id, env_type="gymnasium", num_envs=1, seed=seed, **kwargs)
    rng = np.random.default_rng(seed)
    obs, info = env.reset()
    rec_obs, rec_x = [obs[0]], [info["x_position"][0]]
    for _ in range(steps - 1):
        obs, _, _, _, info = env.step(rng.uniform(-1, 1, (1,) + env.action_space.shape))
        rec_obs.append(obs[0])
        rec_x.append(info["x_position"][0])
    return np.stack(rec_obs), {"x_position": np.asarray(rec_x)}


def bench_atari(tmpdir: str, repeats: int) -> dict:
    obs = np.random.default_rng(0).integers(0, 256, (25, 84, 84, 4), dtype=np.uint8)
    render, encode = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        frames = atari_clip_frames(obs, scale=4)
        t1 = time.perf_counter()
        encode_mp4(frames, os.path.join(tmpdir, f"atari{i}.mp4"), tasks.TASKS["Pong"].fps)
        t2 = time.perf_counter()
        render.append(t1 - t0)
        encode.append(t2 - t1)
    size = os.path.getsize(os.path.join(tmpdir, "atari0.mp4"))
    return dict(clip="Atari 25 steps 336x336", frames=25, fps=tasks.TASKS["Pong"].fps, setup_s=0.0,
                render_s=min(render), encode_s=min(encode), bytes=size)


def bench_mujoco(task: str, size: int, every: int, tmpdir: str, repeats: int) -> dict:
    t0 = time.perf_counter()
    renderer = MujocoRenderer(task, size, size)
    steps = math.ceil(1.5 * renderer.fps)
    obs, info = _mujoco_states(task, steps)
    qpos, qvel = reconstruct_state(task, obs, info)
    qpos, qvel = qpos[::every], qvel[::every]
    renderer.render_qpos(qpos[:1], qvel[:1])  # first frame compiles shaders, uploads textures
    setup = time.perf_counter() - t0
    render, encode = [], []
    fps = renderer.fps / every
    for i in range(repeats):
        t0 = time.perf_counter()
        frames = renderer.render_qpos(qpos, qvel)
        t1 = time.perf_counter()
        path = os.path.join(tmpdir, f"{task}{every}_{i}.mp4")
        encode_mp4(frames, path, fps)
        t2 = time.perf_counter()
        render.append(t1 - t0)
        encode.append(t2 - t1)
    renderer.close()
    label = f"{task} 1.5 s {size}x{size}" + (f" every {every}th step" if every > 1 else "")
    return dict(clip=label, frames=len(qpos), fps=fps, setup_s=setup, render_s=min(render),
                encode_s=min(encode), bytes=os.path.getsize(path))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MuJoCo frame width and height")
    parser.add_argument("--repeats", type=int, default=1, help="clips per setting (min taken)")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmpdir:
        cases = [lambda: bench_atari(tmpdir, args.repeats)]
        for task, every in (("Hopper", 1), ("Hopper", 4), ("HalfCheetah", 1)):
            cases.append(lambda t=task, e=every: bench_mujoco(t, args.size, e, tmpdir,
                                                              args.repeats))
        for case in cases:
            r = case()
            results.append(r)
            print(f"{r['clip']:<40} {r['frames']:4d} frames @ {r['fps']:6.2f} fps: render "
                  f"{r['render_s']:6.2f} s ({1000 * r['render_s'] / r['frames']:5.1f} ms/frame), "
                  f"encode {r['encode_s']:5.2f} s, setup {r['setup_s']:4.2f} s, "
                  f"{r['bytes'] / 1024:.0f} KiB", flush=True)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
