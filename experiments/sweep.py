"""Many seeds (and settings) of the whole preference-learning loop at once, compiled (gymnax tasks).

    python -m experiments.sweep --env Breakout-MinAtar --seeds 32
    python -m experiments.sweep --env CartPole-v1 --seeds 8 --sweep-labels 50 100 200
    python -m experiments.sweep --env CartPole-v1 --seeds 8 --mistake-rates 0 0.1 0.3 --members 1 3
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.sweep --seeds 16   # 8 CPU devices
    python -m experiments.sweep --compare runs/sweep/a runs/sweep/b --out runs/sweep/ab   # finished sweeps, one figure
    python -m experiments.sweep --seeds 4 --env-devices 2 --member-devices 3   # on 6+ devices: lanes split too

Every run is the host driver's algorithm (``python -m experiments.classic`` with the same flags:
any of its options, e.g. ``--ablation random_queries``, ``--segment-length 10`` or ``--teacher.beta 2``,
passes through),
compiled into one program that runs every seed × setting as a lane (``rlhp_jax.compiled``) and
splits the lanes over every device it sees (``rlhp_jax.distributed``; several hosts with
``--coordinator``); ``--env-devices``/``--member-devices`` also spread each lane's environments
and ensemble members over groups of devices.  The grid flags take one value per point; ``--members`` (ensemble
sizes: a grid over ``--ensemble.num-members``) changes shapes, so each value is its own program.

Writes to ``--out``: ``metrics.jsonl`` and ``metrics.csv`` (one row per lane per iteration — the
per-seed curves — with the lane's seed and settings), ``curves.png`` (mean ± std over seeds per
setting, every seed behind it), ``summary.json`` (final and best evaluation return per setting,
mean ± std over seeds, and the timings), and ``config.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from rlhp_jax.refusal import refuse

PROG = "python -m experiments.sweep"

GRID_FLAGS = {  # flag -> Hyper field
    "sweep_labels": "labels",
    "mistake_rates": "mistake_rate",
    "error_rates": "error_rate",
    "rm_lrs": "rm_learning_rate",
    "agent_lrs": "agent_learning_rate",
}


# the sweep flags that change where and how its lanes run, not what they compute: a killed sweep continues
# under other values of these
HOW_IT_RUNS = ("out", "no_progress", "devices", "env_devices", "member_devices", "coordinator", "num_processes",
               "process_id", "pass_at", "compare")


def parse(argv):
    # allow_abbrev=False: "--env" (passed through to experiments.classic) must not be read as "--env-devices"
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=8, help="seeds per setting (default 8)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--sweep-labels", type=int, nargs="+", help="label budgets (the largest sets the program's shapes)")
    p.add_argument("--mistake-rates", type=float, nargs="+", help="synthetic teacher's mistake rates")
    p.add_argument("--error-rates", type=float, nargs="+", help="ε of the preference model's error model (A: 0.1)")
    p.add_argument("--rm-lrs", type=float, nargs="+", help="reward-model learning rates")
    p.add_argument("--agent-lrs", type=float, nargs="+", help="agent learning rates")
    p.add_argument("--members", type=int, nargs="+", help="ensemble sizes (one program each)")
    p.add_argument("--devices", type=int, default=None, help="devices to split lanes over (default: all)")
    p.add_argument("--env-devices", type=int, default=1,
                   help="split each lane's environments over this many devices (default 1)")
    p.add_argument("--member-devices", type=int, default=1,
                   help="split each lane's ensemble members over this many devices (default 1; vmaps the members)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for a run over several hosts")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--pass-at", type=float, metavar="RETURN",
                   help="also count the seeds whose final evaluation return is at least this (e.g. 475 on "
                        "CartPole-v1: issue 17's bar), and those whose best evaluation reached it (the rest never "
                        "got there; the difference reached it and lost it), per setting, in summary.json and the "
                        "printout")
    p.add_argument("--out", default=None, help="output directory (default runs/sweep/<env>)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: the lanes run as one program instead of blocks of iterations called "
                        "from the host (both are kept by the persistent compilation cache); the blocks are saved "
                        "as they end, so a killed sweep continues, and the one program keeps nothing until it ends")
    p.add_argument("--compare", nargs="+", metavar="DIR",
                   help="draw finished sweeps (their metrics.jsonl) on one figure, compare.png in --out, and stop")
    args, rest = p.parse_known_args(argv)
    return p, args, rest


def base_config(rest: list[str], labels_needed: int | None):
    """The RunConfig ``python -m experiments.classic`` would build from the same flags (a bad one is
    refused under this command's name)."""
    from experiments.classic import DOMAIN as CLASSIC
    from experiments.cli import build_parser, config_from_args, start_compile_cache

    domain = dataclasses.replace(CLASSIC, prog=PROG)
    cargs = build_parser(domain).parse_args(rest)
    ignored = {"--seed": "a sweep's seeds are --seeds N from --first-seed S",
               "--resume": "a killed sweep continues with the same command"}
    for flag, instead in ignored.items():
        if any(arg == flag or arg.startswith(flag + "=") for arg in rest):
            raise ValueError(f"{flag} is a flag of python -m experiments.classic that a sweep does not use: {instead}.")
    start_compile_cache(cargs)  # before the program compiles (--no-compile-cache: off)
    if cargs.teacher == "human":
        raise ValueError("A sweep labels with the synthetic oracle; people label through python -m experiments.classic.")
    if cargs.agent == "dqfd":
        raise ValueError("The compiled loop runs Christiano's loop (ppo, a2c, trpo); DQfD runs through "
                         "python -m experiments.classic --agent dqfd.")
    if labels_needed is not None:
        cargs.labels = labels_needed if cargs.labels is None else max(cargs.labels, labels_needed)
    return config_from_args(cargs, domain)


class Progress:
    """A tqdm bar over iterations, fed between the program's blocks of iterations (every lane at once)."""

    def __init__(self, total_steps: int, steps_per_iter: int, desc: str, enabled: bool):
        self.bar, self.enabled = None, enabled
        self.total_steps, self.steps_per_iter, self.desc = total_steps, steps_per_iter, desc

    def start(self):
        """After compiling, so the rate and the ETA are the run's."""
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total_steps, unit="step", unit_scale=True, dynamic_ncols=True, desc=self.desc)

    def __call__(self, it, metrics):
        if self.bar is None:
            return
        self.bar.update(self.steps_per_iter)
        post = {"labels": int(np.max(metrics["labels"]))}
        ev = np.asarray(metrics["eval_return"], np.float64)
        if np.isfinite(ev).any():
            post["eval"] = f"{np.nanmean(ev):.1f}±{np.nanstd(ev):.1f}"
        else:
            post["true"] = f"{np.mean(metrics['true_return']):.1f}"
        self.bar.set_postfix(post)

    def write(self, line: str) -> None:
        """A line above the bar (or printed, without one)."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run(argv=None) -> dict:
    with contextlib.ExitStack() as held:  # the sweep's --out, held while it runs (runs.claimed)
        return _run(argv, held)


def _run(argv, held: contextlib.ExitStack) -> dict:
    parser, args, rest = parse(argv)
    if args.compare:
        return compare(args.compare, Path(args.out or "runs/sweep/compare"))
    if args.coordinator or args.num_processes:
        from rlhp_jax.distributed import initialize

        initialize(args.coordinator, args.num_processes, args.process_id)
    import jax

    from rlhp_jax.compiled import CompiledRun
    from rlhp_jax.distributed import gather, lane_mesh
    from rlhp_jax.config import config_to_json
    from rlhp_jax.metrics import MetricsWriter, plot_sweep
    from rlhp_jax.files import own_folder, write_atomic

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    grid = {field: getattr(args, flag) for flag, field in GRID_FLAGS.items() if getattr(args, flag)}
    base = base_config(rest, max(grid["labels"]) if "labels" in grid else None)
    out = Path(args.out or f"runs/sweep/{base.env}")
    main_process = jax.process_index() == 0
    if main_process:
        from rlhp_jax.config_fields import SWEEP_KEY, config_object, is_sweep_config
        from rlhp_jax.runs import claimed, results_held, write_summary

        held.enter_context(claimed(out))
        if (out / "summary.json").exists():
            raise ValueError(f"{out} already holds a finished run or sweep; choose another --out.")
        not_a_sweep = (out / "config.json").exists() and not is_sweep_config(config_object(out))
        if ((out / "checkpoints").exists() and not is_sweep_config(config_object(out))) or not_a_sweep:
            # a killed sweep continues in its directory; a run's (killed or not) is never written over
            raise ValueError(f"{out} holds a training run (its config.json or checkpoints), not a sweep: choose "
                             "another --out.")
        if not is_sweep_config(config_object(out)) and (taken := results_held(out)):  # nor anyone else's files
            raise ValueError(f"{out} already holds {' and '.join(taken)}, not of a sweep: choose another --out.")
        fields = json.loads(json.dumps({**config_to_json(base), SWEEP_KEY: vars(args)}))
        if is_sweep_config(killed := config_object(out)):  # killed: it continues (compiled._Blocks)
            from experiments.grid import differences

            def same(c: dict) -> dict:  # what decides the results
                flags = c[SWEEP_KEY] if isinstance(c[SWEEP_KEY], dict) else {"flags": c[SWEEP_KEY]}
                return {**{k: v for k, v in c.items() if k != "out"},
                        SWEEP_KEY: {k: v for k, v in flags.items() if k not in HOW_IT_RUNS}}

            was, now = same(killed), same(fields)
            changed = [line for key in dict.fromkeys([*now, *was])
                       for line in differences(key, was.get(key), now.get(key))]
            if changed:
                raise ValueError(f"{out} holds a killed sweep of other settings ({'; '.join(changed)}): choose another "
                                 "--out, or run that sweep's own command again.")
            print(f"{out} holds this sweep, killed before it ended: it continues from its last checkpoint (with "
                  "--no-progress, or over several devices, it keeps none: it runs again)", flush=True)
        write_atomic(out / "config.json", json.dumps(fields, indent=2))
    if args.member_devices > 1:  # members split over devices must be one vmapped computation
        base = dataclasses.replace(base, ensemble=dataclasses.replace(base.ensemble, member_axis="vmap"))
    mesh = (lane_mesh(args.devices, envs=args.env_devices, members=args.member_devices)
            if (args.devices or len(jax.devices()) > 1 or args.env_devices > 1 or args.member_devices > 1) else None)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    writer = MetricsWriter(out / "metrics.jsonl") if main_process else None
    groups, summary_rows, timings = {}, [], []
    for members in args.members or [base.ensemble.num_members]:
        cfg = dataclasses.replace(base, ensemble=dataclasses.replace(base.ensemble, num_members=members))
        program = CompiledRun(cfg)
        keys, hypers, lanes = program.lanes(seeds, **grid)
        progress = Progress(program.num_iters * program.steps_per_iter, program.steps_per_iter,
                            f"{cfg.env} {len(lanes)} lanes" + (f", {members} members" if args.members else ""),
                            enabled=main_process and not args.no_progress)
        # with a bar, the program runs in blocks of iterations and the bar moves between them (no host
        # callback inside: JAX would not keep such a program in the persistent cache).  Several
        # processes run one program each, with no bar: every process must run the same programs.
        program.progress = progress if progress.enabled and jax.process_count() == 1 else None
        t0 = time.perf_counter()
        compiled, keys, hypers = program.compile_lanes(keys, hypers, mesh)
        t1 = time.perf_counter()
        progress.start()
        if program.progress is not None and mesh is None:  # in blocks on one device: saved after each
            from rlhp_jax.checkpoint import Checkpointer

            saves = Checkpointer(own_folder(own_folder(out / "checkpoints") / f"members{members}"), keep=1)
            _, metrics = compiled(keys, hypers, checkpoint=saves, log=progress.write)
        else:
            _, metrics = compiled(keys, hypers)
        metrics = gather(metrics)
        t2 = time.perf_counter()
        progress.close()
        steps = program.num_iters * program.steps_per_iter
        timings.append(dict(members=members, lanes=len(lanes), compile_s=t1 - t0, run_s=t2 - t1,
                            lane_steps_per_s=len(lanes) * steps / (t2 - t1), devices=mesh.size if mesh else 1))
        for i, lane in enumerate(lanes):
            if args.members:
                lane["members"] = members
            for j in range(program.num_iters):
                row = dict(lane, **{k: _value(v[i, j]) for k, v in metrics.items()})
                if writer:
                    writer.write(row)
        settings = sorted({tuple((k, v) for k, v in lane.items() if k != "seed") for lane in lanes})
        for setting in settings:
            idx = [i for i, lane in enumerate(lanes) if all(lane.get(k) == v for k, v in setting)]
            name = _setting_name(dict(setting), cfg.reward_source, cfg.labels)
            groups[name] = {k: np.asarray(v)[idx] for k, v in metrics.items()}
            final, best = _final_and_best(groups[name]["eval_return"])
            summary_rows.append(dict(setting=dict(setting), seeds=len(idx), final_eval_mean=_mean(final),
                                     final_eval_std=_std(final), best_eval_mean=_mean(best), best_eval_std=_std(best),
                                     final_true_return_mean=_mean(groups[name]["true_return"][:, -1]),
                                     final_reward_correlation_mean=_mean(groups[name]["reward_correlation"][:, -1])))
            if args.pass_at is not None:
                summary_rows[-1].update(pass_at=args.pass_at, seeds_passing=int(np.sum(final >= args.pass_at)),
                                        seeds_reaching=int(np.sum(best >= args.pass_at)))
        env_steps = np.asarray(metrics["env_steps"][0])
    summary = dict(env=base.env, agent=base.agent, seeds=list(seeds), env_steps=int(env_steps[-1]),
                   settings=summary_rows, timings=timings, backend=jax.default_backend(),
                   devices=len(jax.devices()), processes=jax.process_count())
    if main_process:
        writer.close()
        plot_sweep(groups, env_steps, out / "curves.png",
                   title=f"{base.env} — {base.agent.upper()} {_source(base)}, {args.seeds} seeds per setting")
        write_summary(out, summary)
        if (out / "checkpoints").is_dir():  # the lanes' states between blocks: the finished sweep's rows hold it all
            shutil.rmtree(out / "checkpoints")
        for r in summary_rows:
            name = ", ".join(f"{k} {v}" for k, v in r["setting"].items()) or "config"
            seeds = f"{r['seeds']} seed" + "s" * (r["seeds"] != 1)
            print(f"{name}: final eval {_pm(r['final_eval_mean'], r['final_eval_std'])} "
                  f"(best {_pm(r['best_eval_mean'], r['best_eval_std'])}) over {seeds}"
                  + (f"; final >= {r['pass_at']:g} on {r['seeds_passing']} of {r['seeds']} (reached at some "
                     f"evaluation by {r['seeds_reaching']})" if "pass_at" in r else ""))
        for t in timings:
            print(f"{t['lanes']} lanes on {t['devices']} device(s): compile {t['compile_s']:.1f} s, "
                  f"run {t['run_s']:.1f} s, {t['lane_steps_per_s']:,.0f} lane·steps/s")
        print(f"wrote {out}/metrics.jsonl, curves.png, summary.json")
    return summary


def _source(cfg) -> str:
    return "from preferences" if cfg.reward_source == "model" else "on the true reward"


def _setting_name(setting: dict, reward_source: str, labels) -> str:
    """A setting's name on plots: its swept values, or the run's label budget / "true reward"."""
    return ", ".join(f"{k} {v}" for k, v in setting.items()) or (
        f"{labels} labels" if reward_source == "model" else "true reward")


def compare(dirs: list[str], out: Path) -> dict:
    """Finished sweeps on one figure: every setting of every sweep as a band (mean ± std over its
    seeds), read back from their ``metrics.jsonl`` and ``summary.json``.  Writes ``compare.png``.
    A directory whose files are not what a sweep writes is a ValueError naming it."""
    from rlhp_jax.config_fields import config_object
    from rlhp_jax.metrics import SWEEP_PANELS, plot_sweep, read_jsonl

    groups, steps, envs = {}, None, set()
    for d in map(Path, dirs):
        if not (d / "summary.json").exists() or not (d / "metrics.jsonl").exists():
            raise ValueError(f"{d} holds no finished sweep (summary.json and metrics.jsonl); run the sweep first.")
        config = config_object(d) or {}  # it only names the settings
        try:
            summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
            envs.add(summary["env"])
            rows = read_jsonl(d / "metrics.jsonl")
            for entry in summary["settings"]:
                setting = entry["setting"]
                mine = [r for r in rows if all(r.get(k) == v for k, v in setting.items())]
                if not mine:
                    raise ValueError(f"{d}: its metrics.jsonl holds no row of the setting {setting} that its "
                                     "summary.json names (not the files of one finished sweep)")
                seeds = sorted({r["seed"] for r in mine})
                iters = sorted({r["iteration"] for r in mine})
                table = {(r["seed"], r["iteration"]): r for r in mine}
                grid = lambda key: np.array([[np.nan if table[(s, i)].get(key) is None else table[(s, i)][key]
                                              for i in iters] for s in seeds], np.float64)
                these = np.asarray([table[(seeds[0], i)]["env_steps"] for i in iters])
                if steps is not None and not np.array_equal(these, steps):
                    raise ValueError(f"{d} ran a different number of steps per iteration or in all than {dirs[0]}; "
                                     "only sweeps of the same length can share a figure.")
                steps = these
                label = _setting_name(setting, config.get("reward_source", "model"), config.get("labels"))
                groups[f"{d.name}: {label}"] = {key: grid(key) for key, _ in SWEEP_PANELS}
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError, IndexError,
                AttributeError, OverflowError) as e:  # a damaged or hand-made file (a number of 400 digits)
            raise ValueError(f"{d} holds no sweep this version can draw: its summary.json or metrics.jsonl is not "
                             f"what a sweep writes ({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None
    if len(envs) > 1:
        raise ValueError(f"the sweeps are of different tasks ({', '.join(sorted(envs))}); compare one task at a time.")
    from rlhp_jax.refusal import check_out_directory

    check_out_directory(out)
    out.mkdir(parents=True, exist_ok=True)
    path = plot_sweep(groups, steps, out / "compare.png", title=f"{envs.pop()}: {len(groups)} settings")
    print(f"wrote {path}")
    return dict(figure=str(path), settings=list(groups))


def _pm(mean, std) -> str:
    return "n/a" if mean is None else f"{mean:.1f} ± {std:.1f}"


def _value(x):
    x = np.asarray(x).item()
    return None if isinstance(x, float) and not np.isfinite(x) else x


def _final_and_best(evals: np.ndarray):
    """Per seed: the last finite evaluation and the best one."""
    final = np.array([row[np.isfinite(row)][-1] if np.isfinite(row).any() else np.nan for row in evals])
    best = np.array([np.nanmax(row) if np.isfinite(row).any() else np.nan for row in evals])
    return final, best


def _mean(x):
    x = np.asarray(x, np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else None


def _std(x):
    x = np.asarray(x, np.float64)
    return float(np.nanstd(x)) if np.isfinite(x).any() else None


def main(argv=None) -> int:
    try:
        run(argv)
    except ValueError as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
