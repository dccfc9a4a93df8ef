"""The benchmark suite: one command that measures the pipeline's speed on this machine.

    python -m experiments.benchmark                      # every section, full sizes
    python -m experiments.benchmark --quick              # tiny sizes: a smoke test (< 1 min on 2 CPU cores)
    python -m experiments.benchmark --sections env agent reward
    python -m experiments.benchmark --sections env --tasks CartPole-v1 --envs 8 512 4096
    python -m experiments.benchmark --sections reward --models cnn --repeats 1

It prints a Markdown table on stdout (a progress line per measurement on stderr) and writes
``benchmark-<platform>-<date>.json`` and ``.md`` under ``--out`` (default ``benchmarks/``),
stamped with the device (``device_kind``, platform, device count, CPU model, cores), the
versions of python, jax, jaxlib, flax, optax, envpool, gymnax and numpy, the command and the date.

Every figure is a rate of a call *after* the first one (the first compiles), blocked on with
``jax.block_until_ready``, best of ``--repeats`` (each row records its ``repeats`` where it
differs).  Higher is better except where the unit says otherwise.  The sections, and how to read them:

``env``     Environment steps/s through the project's wrapper (``rlhp_jax.envs.make_env``: the
            papers' modifications included), random actions, ``steps`` batched steps in one
            jitted ``lax.scan`` (``experiments.bench_envs.wrapper``).  One env step = one step of
            one environment, so the figure is ``steps × envs / s``.  envpool Atari (Pong: frame
            skip 4, so one step = 4 emulator frames) and MuJoCo (HalfCheetah) step on host
            threads through envpool's XLA custom call: on a 2-core CPU they saturate at a few
            envs.  gymnax (CartPole-v1, Breakout-MinAtar) is pure JAX and vmapped: it should grow
            with the env count until the device is full — that curve is what an accelerator buys.
``agent``   Env steps consumed per second by one jitted ``agent.update`` on a fixed rollout
            (``num_envs × num_steps`` steps of the agent's preset, collected once with the
            initial policy; the true reward stands in for r̂).  It is the learner's cost per env
            step, without acting: PPO (epochs × minibatches of Adam steps), A2C (one RMSProp step
            on the Nature CNN, 80 steps per update), TRPO (conjugate gradient + line search +
            value fit, 8,192 steps per update).  Compare it with the ``env`` rate of the same
            task: whichever is lower bounds the training loop.
``reward``  Reward-model training: clip pairs/s (``experiments.bench_ensemble.bench``: the
            ensemble's ``fitter()`` as the driver runs it, one Adam step per member on its own
            batch plus the adaptive-L2 validation losses, on a full buffer of 64 random labeled
            pairs).  A.1 MLP on HalfCheetah-sized input (50-step clips, 64 pairs per member, 300
            steps in one scan) and A.2 CNN on 84×84×4 frames (25-step clips, 16 pairs per member;
            50 steps, or on CPU 2 steps timed once: a step takes seconds there); 1 and 3 members,
            the members ``vmap``ped (one batched program) or sequential (``map`` for the MLP,
            ``unroll`` for the CNN: what ``member_axis="auto"`` picks on CPU, see
            ``rlhp_jax.ensemble.resolve_member_axis``; ``--quick`` times the vmapped layout
            only).  Pairs/s counts every member's pairs, so a perfect vmap triples it from 1 to
            3 members.  The row ``3 members / 1 member`` is the ratio of *time per step* with the
            members vmapped: 1.0 means the extra members are free, 3.0 means no better than one
            after another.  For the CNN it is far above 3× on CPU (9×) and on an H200 (80×): a
            vmapped convolution becomes a grouped convolution, which XLA runs slowly on both, so
            ``auto`` unrolls the CNN's members everywhere (BUILD_NOTES, "on a GPU").
``draws``   Index draws/s of ``rlhp_jax.core.sample_indices`` (inverse CDF: what clip starts and
            the reward model's batches use) against ``jax.random.categorical`` on the same
            weights (what they used before: n × K Gumbel variates): 640 and 2,560 draws among
            4,160 steps (a Pendulum iteration's candidates for 32 and 128 queries) and 2,048
            among 49,152 (a larger pool), every 50th start unusable (an episode boundary).
            ``--quick``: the first case only.
``clips``   Frames/s drawn for a labeling page's clip of a gymnax task (``rlhp_jax.render.classic``:
            60 frames of 256×256 from a random policy's observations, numpy on the host), per
            classic-control and MinAtar task; ``ms_per_clip`` is what a person waits per clip before
            its encoding.  ``--quick``: CartPole only.
``loop``    End-to-end seeds·env steps/s of the compiled training loop for several seed counts,
            from ``experiments.benchmark_loop.rows(args)`` (``args``: this command's parsed
            arguments: ``quick``, ``repeats``, ``tasks``, ...).  Skipped with a note when that
            module does not exist.

Peak memory: every row carries ``peak_rss_mib`` (the process's peak resident set size,
``resource.getrusage``) and, where the backend reports it (GPUs), ``peak_device_mib``
(``memory_stats()["peak_bytes_in_use"]`` of the first device), both read when the row's
measurement finished.  Both are high-water marks of the whole process, so they only grow along
the run: a row's figure bounds what it needed, and a jump from the previous row is what the
measurement added.  The stamp holds the same figures at the end of each section.

A measurement that fails (envpool not installed, out of memory, ...) becomes a row with
``value: null`` and its ``error``; the suite carries on.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import resource
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from experiments import bench_envs
from experiments.bench_envs import best_time
from experiments.bench_ensemble import bench as bench_reward_fit
from rlhp_jax.agents import default_config, make_agent
from rlhp_jax.core import sample_indices
from rlhp_jax.ensemble import resolve_member_axis
from rlhp_jax.envs import make_env
from rlhp_jax.rollout import collect_rollout
from rlhp_jax.tasks import resolve as resolve_task

# ------------------------------------------------------------------------------------ sizes
# env: task -> (env counts, env counts with --quick); batched steps per timing (full, quick)
ENV_TASKS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "CartPole-v1": ((8, 64, 512), (8, 64)),
    "Breakout-MinAtar": ((8, 64, 512), (8,)),
    "Pong": ((8, 16), (8,)),
    "HalfCheetah": ((8, 16), (8,)),
}
ENV_STEPS = (1000, 100)

# agent: (agent, task) with the agent's preset for the task; --quick shortens the rollout
AGENT_CASES: tuple[tuple[str, str], ...] = (
    ("ppo", "CartPole-v1"), ("ppo", "Breakout-MinAtar"), ("a2c", "Pong"), ("trpo", "HalfCheetah"),
)
QUICK_NUM_STEPS = {"ppo": 32, "a2c": 5, "trpo": 64}

# reward: models, timed fit steps (full, quick), members, and the tiny problem of --quick.  A CNN
# step takes 2-20 s on a 2-core CPU, so there it gets 2 steps timed once; an accelerator gets 50
# steps, best of --repeats.
REWARD_MODELS = ("mlp", "cnn")
REWARD_STEPS = {"mlp": (300, 10), "cnn": (50, 1)}
REWARD_STEPS_CPU = {"mlp": (300, 10), "cnn": (2, 1)}
REWARD_MEMBERS = (1, 3)
QUICK_REWARD = {"mlp": dict(batch=16, segment_length=10, capacity=16),
                "cnn": dict(batch=2, segment_length=5, capacity=4)}

# draws: (draws, weights): clip starts for 32 and 128 queries' candidates in a Pendulum iteration, and a
# larger pool
DRAW_CASES = ((640, 4_160), (2_560, 4_160), (2_048, 49_152))

# clips: the gymnax tasks whose clips are drawn from observations, and a clip's frames
CLIP_TASKS = ("CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCarContinuous-v0", "Breakout-MinAtar",
              "SpaceInvaders-MinAtar")
CLIP_FRAMES = 60

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "envpool", "gymnax", "numpy")
_STANDARD = ("section", "name", "value", "unit")
_NOT_SETTINGS = set(_STANDARD) | {"error", "seconds", "peak_rss_mib", "peak_device_mib"}
# settings the row names of these sections already say (left out of the Markdown, kept in the JSON)
_IN_NAME = {"env": {"task", "num_envs"}, "agent": {"agent", "task"}, "reward": {"model", "members", "member_axis"},
            "clips": {"task"}}


class SectionSkipped(Exception):
    """Raised by a section that cannot run here for a reason that is no failure (a note)."""


# ------------------------------------------------------------------------------------ machine
def peak_memory() -> dict[str, float]:
    """Peak RSS of this process, and the first device's peak memory where the backend reports it."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"peak_rss_mib": rss / (2**20 if sys.platform == "darwin" else 2**10)}
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # backends without memory statistics (CPU) return None or raise
        stats = None
    if stats and "peak_bytes_in_use" in stats:
        out["peak_device_mib"] = stats["peak_bytes_in_use"] / 2**20
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_stamp(command: str, args: argparse.Namespace) -> dict[str, Any]:
    dev = jax.devices()[0]
    return dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=command,
        device_kind=dev.device_kind,
        platform=dev.platform,
        device_count=jax.device_count(),
        cpu_model=_cpu_model(),
        cpu_cores=os.cpu_count(),
        versions={"python": platform.python_version(), **{lib: _version(lib) for lib in LIBRARIES}},
        quick=args.quick,
        repeats=args.repeats,
        sections={},
    )


# ------------------------------------------------------------------------------------ rows
def measure(section: str, name: str, fn: Callable[[], dict]) -> dict:
    """Run one measurement: ``fn()`` returns ``value``, ``unit`` and its settings.  The row gets
    the peak memory so far and is reported on stderr; an exception becomes an error row."""
    t0 = time.perf_counter()
    try:
        row = {"section": section, "name": name, **fn()}
    except Exception as e:  # noqa: BLE001 - one failed measurement must not end the suite
        row = {"section": section, "name": name, "value": None, "unit": "", "error": f"{type(e).__name__}: {e}"}
    row.update(peak_memory())
    took = time.perf_counter() - t0
    if row.get("error"):
        print(f"[benchmark] {section:6s} {name}: FAILED ({row['error'].splitlines()[0][:200]})", file=sys.stderr,
              flush=True)
    else:
        print(f"[benchmark] {section:6s} {name}: {_fmt(row['value'])} {row['unit']} ({took:.1f} s)", file=sys.stderr,
              flush=True)
    return row


def _selected(task: str, tasks: list[str] | None) -> bool:
    return tasks is None or task.lower() in {t.lower() for t in tasks}


class _KeyedReset:
    """A view of an env whose ``reset()`` needs no key (``bench_envs.wrapper`` calls it bare,
    as envpool allows; gymnax needs one)."""

    def __init__(self, env, key):
        self._env, self._key = env, key

    def reset(self, key=None):
        return self._env.reset(self._key if key is None else key)

    def __getattr__(self, name):
        return getattr(self._env, name)


# ------------------------------------------------------------------------------------ env
def _env_rate(task: str, num_envs: int, steps: int, repeats: int) -> dict:
    env = make_env(task, num_envs)
    seconds = bench_envs.wrapper(_KeyedReset(env, jax.random.PRNGKey(0)), steps, repeats=max(1, repeats))
    library = "gymnax" if resolve_task(task).backend == "gymnax" else "envpool"
    return dict(value=steps * num_envs / seconds, unit="env steps/s", task=task, library=library,
                num_envs=num_envs, steps=steps, seconds=seconds)


def env_rows(args: argparse.Namespace) -> list[dict]:
    steps = ENV_STEPS[args.quick]
    rows = []
    for task, (counts, quick_counts) in ENV_TASKS.items():
        if not _selected(task, args.tasks):
            continue
        for n in args.envs or (quick_counts if args.quick else counts):
            rows.append(measure("env", f"{task}, {n} envs", lambda: _env_rate(task, n, steps, args.repeats)))
    return rows


# ------------------------------------------------------------------------------------ agent
def _agent_rate(agent_name: str, task: str, quick: bool, repeats: int) -> dict:
    config = default_config(agent_name, task)
    if quick:
        config = dataclasses.replace(config, num_steps=min(config.num_steps, QUICK_NUM_STEPS[agent_name]))
    env = make_env(task, config.num_envs)
    agent = make_agent(agent_name, env.spec, config)
    k_init, k_reset, k_roll, k_update = jax.random.split(jax.random.PRNGKey(0), 4)
    state = agent.init(k_init)
    env_state, obs = env.reset(k_reset)
    _, _, rollout = collect_rollout(env, agent.policy, state.params, env_state, obs, k_roll, config.num_steps)
    update = jax.jit(agent.update)
    seconds = best_time(update, state, rollout, rollout.true_reward, k_update, repeats=max(1, repeats))
    batch = config.num_envs * config.num_steps
    return dict(value=batch / seconds, unit="env steps/s", agent=agent_name, task=task, network=agent.pi.network,
                num_envs=config.num_envs, num_steps=config.num_steps, seconds=seconds)


def agent_rows(args: argparse.Namespace) -> list[dict]:
    return [measure("agent", f"{agent.upper()} {task}", lambda: _agent_rate(agent, task, args.quick, args.repeats))
            for agent, task in AGENT_CASES if _selected(task, args.tasks)]


# ------------------------------------------------------------------------------------ reward
def _reward_rate(kind: str, members: int, axis: str, quick: bool, repeats: int) -> dict:
    on_cpu = jax.default_backend() == "cpu"
    steps = (REWARD_STEPS_CPU if on_cpu else REWARD_STEPS)[kind][quick]
    repeats = 1 if (on_cpu and kind == "cnn") else max(1, repeats)
    r = bench_reward_fit(kind, members, axis, steps, repeats=repeats, **(QUICK_REWARD[kind] if quick else {}))
    return dict(value=r["pairs_per_s"], unit="clip pairs/s", model=kind, members=members, member_axis=axis,
                steps_per_s=r["steps_per_s"], batch_pairs=r["batch_pairs"], segment_length=r["segment_length"],
                capacity=r["capacity"], steps=steps, repeats=repeats, fit_loop=r["fit_loop"], seconds=r["seconds"])


def _members_ratio(kind: str, rows: list[dict]) -> dict:
    """Time per step with 3 members over 1 member, both vmapped."""
    rate = {r["members"]: r["steps_per_s"] for r in rows
            if r.get("model") == kind and r.get("member_axis") == "vmap" and r["value"] is not None}
    if 1 not in rate or 3 not in rate:
        raise RuntimeError(f"needs the vmapped 1- and 3-member {kind.upper()} rows, which failed")
    return dict(value=rate[1] / rate[3], unit="× time per step", model=kind, member_axis="vmap")


def reward_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for kind in args.models:
        # the members batched (vmap) against the sequential layout auto picks on CPU
        axes = ("vmap", resolve_member_axis("auto", backend="cpu", model_kind=kind))
        for m in REWARD_MEMBERS:
            for axis in axes[:1] if args.quick else axes:  # --quick: vmapped only (what the ratio needs)
                label = f"{kind.upper()}, {m} member{'s' if m > 1 else ''}, {axis}"
                rows.append(measure("reward", label, lambda: _reward_rate(kind, m, axis, args.quick, args.repeats)))
        rows.append(measure("reward", f"{kind.upper()} vmap: 3 members / 1 member", lambda: _members_ratio(kind, rows)))
    return rows


# ------------------------------------------------------------------------------------ draws
def _draw_rate(method: str, n: int, k: int, repeats: int) -> dict:
    counts = jnp.arange(k) % 50 != 49  # every 50th start unusable
    if method == "inverse CDF":
        fn = jax.jit(lambda key: sample_indices(key, counts, n))
    else:
        logits = jnp.where(counts, 0.0, -jnp.inf)
        fn = jax.jit(lambda key: jax.random.categorical(key, logits, shape=(n,)))
    seconds = best_time(fn, jax.random.PRNGKey(0), repeats=max(1, repeats))
    return dict(value=n / seconds, unit="draws/s", method=method, draws=n, weights=k, seconds=seconds)


def draw_rows(args: argparse.Namespace) -> list[dict]:
    return [measure("draws", f"{method}, {n:,} among {k:,}", lambda: _draw_rate(method, n, k, args.repeats))
            for n, k in (DRAW_CASES[:1] if args.quick else DRAW_CASES) for method in ("inverse CDF", "categorical")]


# ------------------------------------------------------------------------------------ clips
def _clip_rate(task: str, repeats: int, size: int = 256) -> dict:
    from rlhp_jax.render.__main__ import random_rollout
    from rlhp_jax.render.classic import classic_clip_frames

    _, obs, _ = random_rollout(task, CLIP_FRAMES, seed=0)
    seconds = best_time(lambda o: classic_clip_frames(task, o, size), obs, repeats=max(1, repeats))
    return dict(value=CLIP_FRAMES / seconds, unit="frames/s", task=task, frames=CLIP_FRAMES, size=size,
                ms_per_clip=1000 * seconds, seconds=seconds)


def clip_rows(args: argparse.Namespace) -> list[dict]:
    chosen = [t for t in (CLIP_TASKS[:1] if args.quick else CLIP_TASKS) if _selected(t, args.tasks)]
    return [measure("clips", f"{t}, {CLIP_FRAMES} frames", lambda t=t: _clip_rate(t, args.repeats)) for t in chosen]


# ------------------------------------------------------------------------------------ loop
def loop_rows(args: argparse.Namespace) -> list[dict]:
    try:
        benchmark_loop = importlib.import_module("experiments.benchmark_loop")
    except ImportError as e:
        if getattr(e, "name", None) == "experiments.benchmark_loop":
            raise SectionSkipped("experiments/benchmark_loop.py does not exist in this checkout") from None
        raise SectionSkipped(f"experiments.benchmark_loop failed to import ({type(e).__name__}: {e})") from None
    rows = []
    for row in benchmark_loop.rows(args):
        row = {"section": "loop", **row}
        row.update(peak_memory())
        print(f"[benchmark] loop   {row.get('name')}: {_fmt(row.get('value'))} {row.get('unit', '')}",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


SECTIONS: dict[str, Callable[[argparse.Namespace], list[dict]]] = {
    "env": env_rows, "agent": agent_rows, "reward": reward_rows, "draws": draw_rows, "clips": clip_rows,
    "loop": loop_rows,
}


# ------------------------------------------------------------------------------------ output
def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict]) -> str:
    lines = ["| section | name | value | unit | settings | peak memory (MiB) |",
             "| --- | --- | ---: | --- | --- | ---: |"]
    for r in rows:
        hidden = _NOT_SETTINGS | _IN_NAME.get(r.get("section"), set())
        settings = ", ".join(f"{k}={_fmt(v)}" for k, v in r.items() if k not in hidden)
        if r.get("error"):
            value, settings = "**failed**", f"{r['error'].splitlines()[0][:200]}"
        else:
            value = _fmt(r.get("value"))
        mem = (f"{r['peak_device_mib']:,.0f} device" if "peak_device_mib" in r
               else f"{r['peak_rss_mib']:,.0f} RSS" if "peak_rss_mib" in r else "–")
        lines.append("| " + " | ".join(_cell(c) for c in (r.get("section"), r.get("name"), value, r.get("unit", ""),
                                                            settings, mem)) + " |")
    return "\n".join(lines)


def markdown_report(stamp: dict, rows: list[dict]) -> str:
    v = stamp["versions"]
    head = [
        f"# Benchmark: {stamp['device_kind']} ({stamp['platform']}), {stamp['date']}",
        "",
        f"- command: `{stamp['command']}`" + (" (quick sizes)" if stamp["quick"] else ""),
        f"- device: {stamp['device_count']} × {stamp['device_kind']} ({stamp['platform']}); "
        f"CPU: {stamp['cpu_model']}, {stamp['cpu_cores']} cores",
        "- versions: " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v),
        f"- every figure: a call after the compiling one, best of {stamp['repeats']}"
        + (" (the CNN reward on CPU: one call)" if stamp["platform"] == "cpu" else ""),
    ]
    for name, s in stamp["sections"].items():
        if s["status"] != "ok":
            head.append(f"- section `{name}` {s['status']}: {s.get('note', '')}")
    return "\n".join(head) + "\n\n" + markdown_table(rows) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS), help="default: all")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test; the figures mean little)")
    p.add_argument("--out", default="benchmarks", help="directory for the JSON and Markdown files")
    p.add_argument("--repeats", type=int, default=3, help="timings per figure after the compiling call (best of)")
    p.add_argument("--tasks", nargs="+", default=None,
                   help=f"only these tasks in env/agent (of {', '.join(ENV_TASKS)})")
    p.add_argument("--models", nargs="+", default=list(REWARD_MODELS), choices=REWARD_MODELS,
                   help="reward models in the reward section")
    p.add_argument("--envs", nargs="+", type=int, default=None, help="env counts for the env section (every task)")
    args = p.parse_args(argv)
    from rlhp_jax.refusal import check_out_directory

    try:  # now, not after minutes of measuring
        check_out_directory(args.out)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    command = "python -m experiments.benchmark " + " ".join(sys.argv[1:] if argv is None else argv)
    stamp = machine_stamp(command.strip(), args)
    rows: list[dict] = []
    for section in args.sections:
        t0 = time.perf_counter()
        info: dict[str, Any] = {"status": "ok"}
        try:
            new = SECTIONS[section](args)
        except SectionSkipped as e:
            new, info = [], {"status": "skipped", "note": str(e)}
            print(f"[benchmark] {section}: skipped: {e}", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - a broken section is recorded, the others still run
            new = [{"section": section, "name": section, "value": None, "unit": "",
                    "error": f"{type(e).__name__}: {e}", **peak_memory()}]
            info = {"status": "failed", "note": new[0]["error"]}
            print(f"[benchmark] {section}: FAILED: {new[0]['error']}", file=sys.stderr, flush=True)
        failed = sum(1 for r in new if r.get("error"))
        if failed and info["status"] == "ok":
            info = {"status": "ok", "note": f"{failed} measurement(s) failed"}
        stamp["sections"][section] = {**info, "rows": len(new), "seconds": time.perf_counter() - t0, **peak_memory()}
        rows.extend(new)

    report = markdown_report(stamp, rows)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"benchmark-{stamp['platform']}-{stamp['date'][:10]}")
    with open(base + ".json", "w") as f:
        json.dump({"stamp": stamp, "rows": rows}, f, indent=1, allow_nan=True)
    with open(base + ".md", "w") as f:
        f.write(report)
    print(report)
    print(f"[benchmark] wrote {base}.json and {base}.md", file=sys.stderr, flush=True)
    return {"stamp": stamp, "rows": rows, "json": base + ".json", "markdown": base + ".md"}


if __name__ == "__main__":
    main()
