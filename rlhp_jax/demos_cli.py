"""Demonstration files: record a trained policy's demonstrations, or describe a demo file.

    python -m rlhp_jax.demos_cli record --run RUN_DIR --episodes 3 --out demos/pong.npz
    python -m rlhp_jax.demos_cli info demos/pong.npz

Errors are one line on stderr and exit status 2.  (Layer 7: a command line.  The file format is
:mod:`rlhp_jax.demos`; the trained policy comes from :mod:`rlhp_jax.trained`.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax

from rlhp_jax.demos import DemoError, describe, new_demo_path, read_demos, record_policy
from rlhp_jax.refusal import refuse


def save_recording(rec, out, overwrite: bool = False) -> None:
    """Write a ``DemoRecorder``'s demonstrations to ``out`` and print what the file holds: never over
    a file written there since ``out`` was checked, unless ``overwrite`` (``demos.save_arrays``)."""
    path = rec.save(out, overwrite=overwrite)
    print(json.dumps(describe(read_demos(path)), indent=2, ensure_ascii=False))
    print(f"demonstrations written to {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m rlhp_jax.demos_cli", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", allow_abbrev=False, help="record demonstrations of a trained policy (a run directory)")
    r.add_argument("--run", required=True, help="run directory (experiments.atari / experiments.classic)")
    r.add_argument("--env", default=None, help="task (default: the run's)")
    r.add_argument("--episodes", type=int, default=3)
    r.add_argument("--max-steps", type=int, default=100_000, help="stop after this many steps in all")
    r.add_argument("--epsilon", type=float, default=0.01, help="random actions with this probability")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True, help="demo file to write (.npz); an existing one is refused")
    r.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    i = sub.add_parser("info", allow_abbrev=False, help="describe a demo file")
    i.add_argument("file")
    args = p.parse_args(argv)
    try:
        if args.cmd == "info":
            print(json.dumps(describe(read_demos(args.file)), indent=2, ensure_ascii=False))
            return 0
        from rlhp_jax.runs import read_run_config  # the drivers: only to record (info stays light)
        from rlhp_jax.trained import load_policy, run_env

        out = new_demo_path(args.out, args.overwrite)  # before anything is recorded
        run = Path(args.run)
        env = run_env(read_run_config(run), args.env)
        act = load_policy(run, env, args.epsilon)
        from tqdm import tqdm

        bar = tqdm(total=args.episodes, desc="episodes", unit="ep")

        def progress(episodes, steps):
            bar.n = episodes
            bar.set_postfix(steps=steps)
            bar.refresh()

        rec = record_policy(env, act, jax.random.PRNGKey(args.seed), episodes=args.episodes, max_steps=args.max_steps,
                            source=f"policy:{run}", progress=progress)
        bar.close()
        save_recording(rec, out, args.overwrite)
        return 0
    except (DemoError, ValueError, OSError) as e:
        return refuse(e)


if __name__ == "__main__":
    raise SystemExit(main())
