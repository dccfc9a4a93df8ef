"""``python -m rlhp_jax.render``: write an MP4 clip of a random policy in any task (layer 7: a CLI).

``python -m rlhp_jax.render --env Hopper --steps 60 --out clip.mp4`` runs a random policy
through the project's environment wrapper (``envs.make_env``: the papers' settings, masked
Atari frames) and writes a clip of the state after each step, drawn by the ``render`` modules
(MuJoCo ``render.mujoco``, Atari ``render.atari``, gymnax's classic-control and MinAtar tasks
``render.classic``) and encoded by ``render.video``; an existing ``--out`` is refused unless
``--overwrite``.  ``--env`` takes every task
``envs.make_env`` takes, in every spelling ``tasks.resolve`` accepts.  It prints how long
rendering and encoding took.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from rlhp_jax import tasks
from rlhp_jax.refusal import check_new_file, refuse
from rlhp_jax.render.atari import NATIVE_SCALE, NativeFrames, atari_clip_frames, atari_native_clip_frames
from rlhp_jax.render.classic import MIN_CLIP_SIZE, classic_clip_frames
from rlhp_jax.render.mujoco import MujocoRenderer, reconstruct_state
from rlhp_jax.render.video import encode_mp4, probe_mp4


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


def random_rollout(env_name: str, steps: int, seed: int, **options):
    """``steps`` steps of a uniformly random policy through the project's environment wrapper
    (``envs.make_env``: the papers' settings, Atari score masks; ``options``: the wrapper's).
    Returns ``(env, next_obs, render)``: the observation *after* each step and the render data
    of each step, so frame t shows the result of action t (what a segment's clip shows)."""
    import jax

    from rlhp_jax.envs import make_env
    from rlhp_jax.rollout import collect_rollout, uniform_random_policy

    if tasks.resolve(env_name).backend != "gymnax":  # envpool seeds its emulators when built; gymnax by the keys
        options = dict(options, seed=seed)
    env = make_env(env_name, 1, **options)
    spec = env.spec

    policy = uniform_random_policy(spec)

    state, obs = env.reset(jax.random.key(seed))
    _, last, ro = collect_rollout(env, policy, None, state, obs, jax.random.key(seed), steps)
    next_obs = np.concatenate([np.asarray(ro.obs[1:, 0]), np.asarray(last)], axis=0)
    return env, next_obs, np.asarray(ro.render[:, 0])


def _run_atari_native(game: str, steps: int, seed: int) -> np.ndarray:
    """The native ``[T, 210, 160, 3]`` colour frames after each step of a random policy, kept by
    the wrapper as in a run labeled by people (``atari.NativeFrames``; the score is blanked when
    they are drawn)."""
    ring = NativeFrames(1, steps + 1)
    _, _, render = random_rollout(game, steps, seed, native_frames=ring)
    after = np.asarray(render, np.float64)
    after[:, 0] += 1  # render[t] names the frame step t acted on; the clip shows the one after it
    return ring.lookup(after)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(allow_abbrev=False, prog="python -m rlhp_jax.render",
                     description="Write an MP4 clip of a random policy in any task envs.make_env "
                                 "runs (MuJoCo, Atari, gymnax classic control and MinAtar).")
    parser.add_argument("--env", required=True,
                        help="MuJoCo task (Hopper, ...), Atari game (Pong, Pong-v5, ...) or gymnax "
                             "task (CartPole-v1, Breakout-MinAtar, ...)")
    parser.add_argument("--steps", type=int, default=60,
                        help="frames in the clip: the state after each of `steps` random actions")
    parser.add_argument("--out", required=True, help="output .mp4 path (an existing file is refused)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=float, default=None,
                        help="default: real time (MuJoCo 1/(timestep·frame_skip), Atari 15, "
                             "gymnax 1/dt: CartPole 50, MinAtar 10, ...)")
    parser.add_argument("--size", type=int, default=256,
                        help="MuJoCo and gymnax frame width and height (gymnax: even, >= 32)")
    parser.add_argument("--scale", type=int, default=None,
                        help="Atari upscaling (default 4 for 84×84; for --native ×(2, 3), the clips "
                             "people are shown, or ×scale both ways)")
    parser.add_argument("--native", action="store_true",
                        help="Atari: native-colour frames, as people labeling a run see them")
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
        check_new_file(args.out, args.overwrite)  # a clip someone kept is not replaced by a typo
        resolved = tasks.find(args.env)
        if resolved is None:
            raise _UsageError(_unknown_env_message(args.env))
        kind, name = resolved.backend, resolved.name
        task = name if kind == "mujoco" else None
        game = name if kind == "atari" else None
        if kind == "gymnax":
            if args.native or args.scale is not None:
                raise _UsageError(f"--native and --scale apply to Atari games only; {name}'s "
                                  f"frames are --size pixels square (default 256)")
            if args.size < MIN_CLIP_SIZE or args.size % 2:
                raise _UsageError(f"--size for {name} must be an even number >= {MIN_CLIP_SIZE}, "
                                  f"got {args.size}")
    except (_UsageError, ValueError) as exc:
        return refuse(exc)

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
        t_setup = 0.0
        _, obs, _ = random_rollout(name, args.steps, args.seed)
        t0 = time.perf_counter()
        frames = classic_clip_frames(name, obs[::args.every], size=args.size)
        t_render = time.perf_counter() - t0
        fps = args.fps if args.fps is not None else resolved.fps / args.every
    else:
        t_setup = 0.0
        if args.native:
            frames_in = _run_atari_native(game, args.steps, args.seed)
            t0 = time.perf_counter()
            frames = atari_native_clip_frames(frames_in, game, args.scale or NATIVE_SCALE)
        else:
            _, frames_in, _ = random_rollout(game, args.steps, args.seed)
            t0 = time.perf_counter()
            frames = atari_clip_frames(frames_in, args.scale or 4)
        t_render = time.perf_counter() - t0
        fps = args.fps if args.fps is not None else resolved.fps
    t0 = time.perf_counter()
    try:  # a clip that appeared at --out while this one was made is kept (the check above was seconds ago)
        encode_mp4(frames, args.out, fps, replace=args.overwrite)
    except FileExistsError:
        return refuse(f"{args.out} appeared while the clip was made (another command's?): it is kept; choose another --out")
    t_encode = time.perf_counter() - t0
    info_out = probe_mp4(args.out)
    print(f"{args.out}: {name}, {info_out['frames']} frames, {info_out['duration_s']:.2f} s at "
          f"{fps:g} fps, {info_out['width']}x{info_out['height']} {info_out['codec']}; "
          f"render {t_render:.2f} s (+{t_setup:.2f} s renderer setup), encode {t_encode:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
