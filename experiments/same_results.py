"""Do two versions of the code compute the same thing?  Fixed-seed runs and a digest of their numbers.

    python -m experiments.same_results --out /tmp/before            # runs, prints one digest per run
    python -m experiments.same_results --out /tmp/after --check /tmp/before/digests.json

Runs short fixed-seed jobs through the entry points a user runs (CartPole with PPO from 50
synthetic labels; HalfCheetah with TRPO from 40 labels; each with its RL-on-the-true-reward
baseline) and digests every number of their ``metrics.jsonl`` except the wall-clock ones
(``time_*``, ``wall_s``, ``steps_per_s``).  Losses, returns, correlations and entropies are
compared to the last bit: a refactor that claims "no behaviour change" must leave every digest
unchanged (BUILD_NOTES records the digests before and after), or differ only in how a logged
column is rounded (a few float32 ulps, named in the output).  ``--check`` exits 1 on any other
difference and names the first row and column where it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from rlhp_jax.metrics import read_jsonl
from rlhp_jax.refusal import refuse

RUNS = {
    "CartPole-ppo-50labels": ["experiments.classic", "--env", "CartPole-v1", "--labels", "50", "--steps", "16384"],
    "CartPole-ppo-baseline": ["experiments.classic", "--env", "CartPole-v1", "--baseline", "--steps", "16384"],
    "HalfCheetah-trpo-40labels": ["experiments.mujoco", "--env", "HalfCheetah", "--labels", "40", "--steps", "24576"],
    "HalfCheetah-trpo-baseline": ["experiments.mujoco", "--env", "HalfCheetah", "--baseline", "--steps", "24576"],
}
WALL_CLOCK = ("wall_s", "steps_per_s")
ROUNDING = 4 * 2.0 ** -24  # a few float32 ulps, relative


def numbers(row: dict) -> dict:
    """A metrics row without its wall-clock columns."""
    return {k: v for k, v in row.items() if k not in WALL_CLOCK and not k.startswith("time_")}


def read_rows(run_dir: Path) -> list[dict]:
    """A run's metrics rows without wall-clock columns (a row cut short by a killed run is skipped)."""
    return [numbers(row) for row in read_jsonl(run_dir / "metrics.jsonl")]


def digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def compare(a: list[dict], b: list[dict]) -> tuple[str | None, dict[str, float]]:
    """(the first real difference or None, {column: largest relative difference} of the columns
    that differ only by float32 rounding: at most ROUNDING relative, e.g. a return computed as
    float32 mean × horizon rather than float64)."""
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)}", {}
    rounding: dict[str, float] = {}
    for i, (ra, rb) in enumerate(zip(a, b)):
        for k in sorted(set(ra) | set(rb)):
            x, y = ra.get(k), rb.get(k)
            if x == y:
                continue
            if isinstance(x, float) and isinstance(y, float) and not isinstance(x, bool):
                rel = abs(x - y) / max(abs(x), abs(y))
                if rel <= ROUNDING:
                    rounding[k] = max(rounding.get(k, 0.0), rel)
                    continue
            return f"row {i} (iteration {ra.get('iteration')}), {k}: {x!r} vs {y!r}", rounding
    return None, rounding


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.same_results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the runs and digests.json")
    p.add_argument("--check", default=None, help="digests.json of an earlier version to compare with")
    p.add_argument("--only", nargs="*", default=None, choices=sorted(RUNS), help="a subset of the runs")
    args = p.parse_args(argv)
    if args.check is not None and not Path(args.check).is_file():
        return refuse(f"--check {args.check}: no such file (the digests.json an earlier --out holds)")
    out = Path(args.out)
    names = [name for name in RUNS if not args.only or name in args.only]
    if held := [name for name in names if (out / name).exists()]:
        return refuse(f"{out} already holds the runs {', '.join(held)} of an earlier check: choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        run_dir = out / name
        proc = subprocess.run([sys.executable, "-m", *RUNS[name], "--seed", "0", "--out", str(run_dir), "--no-progress"],
                              stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            return refuse(f"the run {name} failed (exit {proc.returncode}; what it said is above)")
        rows = read_rows(run_dir)
        results[name] = dict(digest=digest(rows), rows=rows)
        print(f"{name:28s} {results[name]['digest']}  ({len(rows)} rows; last true_return "
              f"{rows[-1].get('true_return')!r})", flush=True)
    (out / "digests.json").write_text(json.dumps(results, indent=1))
    if args.check is None:
        return 0
    before = json.loads(Path(args.check).read_text())
    bad = 0
    for name, r in results.items():
        if name not in before:
            continue
        if before[name]["digest"] == r["digest"]:
            print(f"{name:28s} identical")
            continue
        diff, rounding = compare(before[name]["rows"], r["rows"])
        bad += diff is not None
        note = ", ".join(f"{k} (≤ {v:.1e})" for k, v in sorted(rounding.items()))
        print(f"{name:28s} " + (f"DIFFERENT: {diff}" if diff else f"the same up to float32 rounding of {note}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
