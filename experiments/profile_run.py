"""Where a run's time goes: run one entry point and print its time per component.

    python -m experiments.profile_run experiments.classic --env Pendulum-v1 --labels 1000 --steps 100000
    python -m experiments.profile_run experiments.mujoco --env Hopper --labels 700 --steps 49152
    python -m experiments.profile_run --json prof.json experiments.atari --env Pong --labels 500 --steps 8000
    python -m experiments.profile_run --imports experiments.classic --env CartPole-v1

Runs ``python -m MODULE ARGS --out TMP --no-progress`` (``--out`` given in ARGS is kept, and the
run is then left on disk; with ``--resume RUN_DIR`` the resumed run is profiled, from the rows this
process adds), times the whole process, and reads the ``time_*`` columns every
iteration row of ``metrics.jsonl`` carries (host driver: ``agent`` = acting and the agent's
update, ``labels`` = choosing and answering queries, ``fit`` = the reward model's steps,
``diagnostics`` = validation, correlation and fall statistics, ``metrics`` = the row's numbers
fetched from the device, ``eval`` = evaluation episodes; Ibarz's protocol has its own).  It prints:

* ``start-up``: process wall time before the training loop's clock starts (imports, building
  the environment, the persistent compilation cache's loads or first compiles, random-policy
  statistics);
* ``finish``: process wall time after the last metrics row was written (the last checkpoint's
  commit, the summary, the learning-curve plot, the interpreter's exit), read from the metrics
  file's modification time;
* each component's total, its share of the process, and its median per iteration after the
  first (the first iteration compiles what the cache did not have: it is shown on its own);
* ``other``: loop time no component accounts for (the initial labels and pretraining, checkpoint
  saves, writing metrics, TensorBoard);
* the run's compiled programs (read from JAX's ``JAX_LOG_COMPILES`` lines, which the run writes
  to its stderr and this script keeps off the screen): how many were traced, lowered, compiled
  and loaded from the persistent cache, the seconds of each stage, and the programs that cost
  most.  Every program is traced at every start, cached or not, and those not built with
  ``compile_cache.jit`` are lowered again too; a run with many programs pays for them even warm;
* with ``--imports``, the slow top-level imports (``python -X importtime``): what start-up spends
  on libraries, such as one a dependency imports only to probe for it (tensorboardX imported
  PyTorch for a type annotation: BUILD_NOTES, "What a warm start imports").  Imports on other
  threads are listed too, and an import's seconds include the time other threads held the GIL.

So the next bottleneck is on one screen.  Record findings in BUILD_NOTES.md with the device.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rlhp_jax.metrics import read_jsonl
from rlhp_jax.refusal import refuse

# JAX's compile log (JAX_LOG_COMPILES=1), one pattern per stage: (program, seconds)
STAGES = {
    "traced": re.compile(r"Finished tracing (?:\+ transforming )?(\S+) for \S+ in ([0-9.e+-]+) sec"),
    "lowered": re.compile(r"Finished jaxpr to MLIR module conversion jit\((\S+?)\) in ([0-9.e+-]+) sec"),
    "compiled": re.compile(r"Finished XLA compilation of jit\((\S+?)\) in ([0-9.e+-]+) sec"),
}
CACHE_HIT = re.compile(r"Persistent compilation cache hit for 'jit_(\S+?)'")
# ``python -X importtime``: self and cumulative microseconds, then the module indented by its depth
IMPORT_TIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)\s*$")
IMPORT_MIN_S = 0.05  # --imports lists the top-level imports that took at least this
COMPILE_LOG = re.compile(r"^(WARNING|INFO|DEBUG):jax\._src\.|^Compiling |^Finished |^Persistent compilation cache")


def breakdown(rows: list[dict], process_s: float, wall_before: float = 0.0, finish_s: float = 0.0) -> dict:
    """Totals per ``time_*`` component from metrics rows; see the module docstring.  ``wall_before``:
    the loop's clock when this process took over (a resumed run's rows carry the time of every
    process before it in ``wall_s``); ``finish_s``: the process's time after its last row."""
    if not rows:
        raise ValueError("the run wrote no metrics rows")
    loop_s = float(rows[-1]["wall_s"]) - wall_before
    names = sorted({k for r in rows for k in r if k.startswith("time_") and k.endswith("_s")})
    comps = {}
    for k in names:
        vals = [float(r[k]) for r in rows if r.get(k) is not None]
        later = [float(r[k]) for r in rows[1:] if r.get(k) is not None]
        comps[k[len("time_"):-2]] = dict(total_s=sum(vals), first_s=float(rows[0].get(k) or 0.0),
                                         median_ms=1e3 * statistics.median(later) if later else None)
    accounted = sum(c["total_s"] for c in comps.values())
    return dict(process_s=process_s, startup_s=max(process_s - loop_s - finish_s, 0.0), loop_s=loop_s,
                finish_s=finish_s, iterations=len(rows), components=comps, other_s=max(loop_s - accounted, 0.0))


def rows_added(before: list[dict], after: list[dict]) -> tuple[list[dict], float]:
    """The rows of ``after`` that ``before`` (the same metrics file before a resumed run) did not
    hold, and the loop's clock where they start: the ``wall_s`` of the row before the first of them
    (0 when none).  A resume may rewrite rows past its checkpoint: those count as added."""
    seen = {(r.get("iteration"), r.get("wall_s")) for r in before}
    first = next((i for i, r in enumerate(after) if (r.get("iteration"), r.get("wall_s")) not in seen), len(after))
    return after[first:], float(after[first - 1]["wall_s"]) if first > 0 else 0.0


def programs(log_lines) -> dict:
    """What JAX's compile log says of a run's programs: per stage (traced, lowered, compiled) the
    count and seconds, ``from_cache`` (compilations the persistent cache answered: their
    "compiled" seconds are the load), and ``costliest``: the five programs of most lowering +
    compiling seconds, summed over their instances."""
    out = {stage: dict(count=0, seconds=0.0) for stage in STAGES}
    per_program: dict[str, float] = defaultdict(float)
    hits = 0
    for line in log_lines:
        for stage, pattern in STAGES.items():
            m = pattern.search(line)
            if m:
                out[stage]["count"] += 1
                out[stage]["seconds"] += float(m.group(2))
                if stage != "traced":
                    per_program[m.group(1)] += float(m.group(2))
        hits += bool(CACHE_HIT.search(line))
    out["from_cache"] = hits
    out["costliest"] = sorted(per_program.items(), key=lambda kv: -kv[1])[:5]
    return out


def imports(lines, min_s: float = IMPORT_MIN_S) -> list[tuple[str, float]]:
    """The top-level imports of ``python -X importtime`` lines that took at least ``min_s``
    seconds with everything they imported, slowest first: (module, seconds).  Top level means
    imported by the run's own code or a library's import at call time, on any thread (orbax on the
    checkpoint thread, SciPy's LAPACK modules on the reading-ahead one)."""
    out = []
    for line in lines:
        m = IMPORT_TIME.match(line)
        if m and len(m.group(3)) == 1 and int(m.group(2)) >= min_s * 1e6:
            out.append((m.group(4), int(m.group(2)) / 1e6))
    return sorted(out, key=lambda kv: -kv[1])


def programs_text(p: dict) -> str:
    t, l, c = p["traced"], p["lowered"], p["compiled"]
    top = ", ".join(f"{name} {sec:.2f} s" for name, sec in p["costliest"])
    return (f"programs: {t['count']} traced ({t['seconds']:.2f} s), {l['count']} lowered ({l['seconds']:.2f} s), "
            f"{c['count']} compiled or loaded ({c['seconds']:.2f} s; {p['from_cache']} from the persistent cache)"
            + (f"\nmost lowering + compiling: {top}" if top else ""))


def table(b: dict) -> str:
    p = b["process_s"]
    pct = lambda s: f"{100 * s / p:.0f} %" if p > 0 else "—"
    lines = [f"process {p:.1f} s, {b['iterations']} iterations", "",
             "| component | total s | share | first iteration s | median per later iteration |",
             "|---|---|---|---|---|",
             f"| start-up | {b['startup_s']:.2f} | {pct(b['startup_s'])} | | |"]
    for name, c in sorted(b["components"].items(), key=lambda kv: -kv[1]["total_s"]):
        med = "—" if c["median_ms"] is None else f"{c['median_ms']:.1f} ms"
        lines.append(f"| {name} | {c['total_s']:.2f} | {pct(c['total_s'])} | {c['first_s']:.2f} | {med} |")
    lines.append(f"| other (initial labels, pretraining, checkpoints, writing) | {b['other_s']:.2f} | {pct(b['other_s'])} | | |")
    lines.append(f"| finish (last checkpoint, summary, plots, exit) | {b['finish_s']:.2f} | {pct(b['finish_s'])} | | |")
    if b.get("programs"):
        lines += ["", programs_text(b["programs"])]
    if b.get("imports") is not None:
        top = ", ".join(f"{name} {sec:.2f} s" for name, sec in b["imports"]) or "none"
        lines.append(f"imports of {IMPORT_MIN_S} s or more (top level, any thread, with what they import): {top}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE", default=None, help="also write the breakdown as JSON")
    p.add_argument("--imports", action="store_true",
                   help="run it under python -X importtime and list its slow top-level imports (the "
                        "start-up's; the measurement adds a little to every import)")
    p.add_argument("module", help="the entry point, e.g. experiments.classic")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if not a.module.startswith("experiments."):
        p.error(f"expected an entry point such as experiments.classic, got {a.module!r}")
    args = list(a.args)
    tmp = None
    if "--resume" in args[:-1]:
        out = Path(args[args.index("--resume") + 1])
    else:
        if "--out" not in args[:-1]:
            tmp = tempfile.TemporaryDirectory(prefix="rlhp_profile_")
            args += ["--out", tmp.name]
        out = Path(args[args.index("--out") + 1])
    metrics = out / "metrics.jsonl"
    before = read_jsonl(metrics) if metrics.is_file() else []
    if "--no-progress" not in args:
        args.append("--no-progress")
    t0 = time.perf_counter()
    log: list[str] = []
    import_log: list[str] = []
    proc = subprocess.Popen([sys.executable, *(["-X", "importtime"] if a.imports else []), "-m", a.module, *args],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, JAX_LOG_COMPILES="1"))
    for line in proc.stderr:  # the compile log is read, everything else the run says goes on to the screen
        if COMPILE_LOG.search(line):
            log.append(line)
        elif line.startswith("import time:"):
            import_log.append(line)
        else:
            sys.stderr.write(line)
    proc.wait()
    process_s, ended = time.perf_counter() - t0, time.time()
    if proc.returncode != 0:
        return refuse(f"the run failed (exit {proc.returncode}); nothing to profile")
    rows, wall_before = rows_added(before, read_jsonl(metrics))
    if not rows:
        return refuse(f"the run added no iterations to {metrics} (already finished?); nothing to profile")
    # the last row's write is the loop's end: what the process did after it is its finish
    b = breakdown(rows, process_s, wall_before, finish_s=min(max(ended - metrics.stat().st_mtime, 0.0), process_s))
    b["programs"] = programs(log)
    if a.imports:
        b["imports"] = imports(import_log)
    b["command"] = [a.module, *a.args]
    print(table(b))
    if a.json:
        Path(a.json).write_text(json.dumps(b, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
