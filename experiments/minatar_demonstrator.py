"""A scripted Breakout-MinAtar demonstrator, and demonstrations of it for Ibarz et al.'s protocol.

    python -m experiments.minatar_demonstrator --out demos.npz     # 5 episodes, seed 7 (docs/results.md)
    python -m experiments.minatar_demonstrator --episodes 2 --max-steps 1200 --seed 0 --out demos/breakout.npz

:func:`minatar_tracker` moves the paddle toward the ball's column; it scores, so its demonstrations
are worth imitating, and it is deterministic, so tests can check that a cloned policy copies it.
Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse

import numpy as np

from rlhp_jax.refusal import refuse

ENV = "Breakout-MinAtar"


def minatar_tracker(obs, key=None):
    """A deterministic Breakout-MinAtar demonstrator: move the paddle (channel 0, row 9) toward
    the ball's column (channel 1); actions 0 stay, 1 left, 2 right."""
    obs = np.asarray(obs)
    paddle = obs[:, 9, :, 0].argmax(-1)
    ball = obs[:, :, :, 1].sum(1).argmax(-1)
    return np.where(ball < paddle, 1, np.where(ball > paddle, 2, 0)).astype(np.int32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.minatar_demonstrator",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=5000, help="stop after this many steps in all")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True, help="demo file to write (.npz); an existing one is refused")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    import jax

    from rlhp_jax.demos import DemoError, new_demo_path, record_policy
    from rlhp_jax.demos_cli import save_recording
    from rlhp_jax.envs import make_env

    try:
        out = new_demo_path(args.out, args.overwrite)
        rec = record_policy(make_env(ENV, 1), minatar_tracker, jax.random.PRNGKey(args.seed), episodes=args.episodes,
                            max_steps=args.max_steps, source="tracker")
        save_recording(rec, out, args.overwrite)
        return 0
    except (DemoError, ValueError, OSError) as e:
        return refuse(e)


if __name__ == "__main__":
    raise SystemExit(main())
