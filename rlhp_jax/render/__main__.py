"""``python -m rlhp_jax.render``: write an MP4 clip of a random policy in any task (layer 7: a CLI).

``python -m rlhp_jax.render --env Hopper --steps 60 --out clip.mp4`` runs a random policy
through the project's environment wrapper (``envs.make_env``: the papers' settings, masked
Atari frames) and writes a clip of the state after each step, drawn by the ``render`` modules
(MuJoCo ``render.mujoco``, Atari ``render.atari``, gymnax's classic-control and MinAtar tasks
``render.classic``) and encoded by ``render.video``.  ``--env`` takes every task
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
from rlhp_jax.render.atari import atari_clip_frames, atari_native_clip_frames
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
    parser = _Parser(prog="python -m rlhp_jax.render",
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
