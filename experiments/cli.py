"""The command line every experiment entry point shares: flags, config building, run and resume.

Each domain module (``experiments.classic``, ``experiments.atari``, ``experiments.mujoco``)
gives a :class:`Domain` — which tasks it runs, its default agent and the paper's settings as a
``RunConfig`` builder — and calls :func:`main`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Domain:
    prog: str  # "python -m experiments.atari"
    doc: str
    tasks: Callable[[], list[str]]  # the environment names this entry point accepts
    default_env: str
    default_agent: str
    # (args, env name) -> RunConfig keyword arguments with the domain's (paper) defaults;
    # args.labels / args.steps are None when the user did not give them
    settings: Callable[[argparse.Namespace, str], dict]
    out_root: str
    segments_ablation: bool = True  # Christiano ran "no segments" on the robotics tasks only
    # (args, env) -> IbarzConfig keyword arguments for --agent dqfd (None: the agent is not offered)
    ibarz_settings: Callable[[argparse.Namespace, str], dict] | None = None


def build_parser(domain: Domain) -> argparse.ArgumentParser:
    from rlhp_jax.agents import AGENTS
    from rlhp_jax.config import ABLATIONS
    from rlhp_jax.human.server import add_server_flags

    p = argparse.ArgumentParser(prog=domain.prog, description=domain.doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=domain.default_env, help=f"task (default {domain.default_env})")
    p.add_argument("--labels", type=int, default=None, help="synthetic-label budget (default per task)")
    p.add_argument("--steps", type=int, default=None, help="environment steps of RL (default per task)")
    p.add_argument("--seed", type=int, default=0)
    agents = AGENTS + (("dqfd",) if domain.ibarz_settings is not None else ())
    p.add_argument("--agent", choices=agents, default=domain.default_agent,
                   help=f"RL algorithm (default {domain.default_agent})"
                        + ("; dqfd runs Ibarz et al. 2018's protocol (flags below)" if "dqfd" in agents else ""))
    p.add_argument("--teacher", choices=["synthetic", "human"], default="synthetic",
                   help="who labels: the synthetic oracle (true reward, optionally noisy: flags below), or people "
                        "in a browser (human: a labeling page is served while the agent trains)")
    p.add_argument("--ablation", choices=sorted(ABLATIONS), default=None,
                   help="Christiano §3.3 ablation: " + "; ".join(f"{k}: {v}" for k, v in ABLATIONS.items()))
    p.add_argument("--baseline", action="store_true", help="train the same agent on the true reward instead")
    p.add_argument("--out", default=None, help=f"output directory (default {domain.out_root}/ENV-...-seedN)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a run from its newest checkpoint, with its saved configuration (a run stopped "
                        "before its first checkpoint starts again from it)")
    p.add_argument("--selection", choices=["disagreement", "random"], default=None,
                   help="query selection: ensemble disagreement (paper) or random")
    p.add_argument("--members", type=int, default=None, help="reward-model ensemble size (default 3)")
    p.add_argument("--segment-length", type=int, default=None, help="clip length in steps (default per task)")
    p.add_argument("--rate-constant", type=float, default=None, help="c of the label rate c/(T+c)")
    p.add_argument("--label-horizon", type=int, default=None,
                   help="step by which the whole label budget is due (default: the run's last step); a run "
                        "that ends before it asks only the labels due by then")
    p.add_argument("--initial-labels", type=float, default=None,
                   help="fraction of the budget asked about clips of the untrained policy")
    p.add_argument("--pretrain-epochs", type=float, default=None,
                   help="reward-model epochs over the initial labels before RL (A.2: 200)")
    p.add_argument("--pretrain-steps", type=int, default=None,
                   help="reward-model steps on the initial labels before RL (0: none; the MuJoCo preset fits one "
                        "iteration's share, what A.1's asynchronous predictor has done when the first batch is scored)")
    p.add_argument("--iteration-steps", type=int, default=None,
                   help="environment steps per driver iteration (agent updates between label rounds)")
    p.add_argument("--mistake-rate", type=float, default=0.0, help="oracle flips a label with this probability")
    p.add_argument("--beta", type=float, default=math.inf, help="Boltzmann-rational oracle temperature (inf: perfect)")
    p.add_argument("--myopic-gamma", type=float, default=1.0, help="oracle discount over a clip (1: none)")
    p.add_argument("--skip-below", type=float, default=-math.inf, help="oracle skips when both clip returns are below")
    p.add_argument("--tie-within", type=float, default=0.0, help="oracle ties when clip returns differ by at most this")
    p.add_argument("--agent-config", "--ppo", dest="agent_config", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override fields of the agent's preset, e.g. --agent-config lr=3e-4 ent_coef=0.01")
    p.add_argument("--checkpoint-every", type=int, default=None, help="iterations between checkpoints")
    h = p.add_argument_group("human labels (--teacher human)")
    add_server_flags(h)
    h.add_argument("--max-pending", type=int, default=None, help="pairs waiting for people at once (default 20)")
    h.add_argument("--no-wait", action="store_true",
                   help="start RL without waiting for answers to the first batch of pairs")
    if domain.ibarz_settings is not None:
        from rlhp_jax.ibarz import SETUPS

        g = p.add_argument_group("Ibarz et al. 2018 (--agent dqfd)")
        g.add_argument("--demos", default=None, metavar="PATH", help="demonstration file (rlhp_jax.demos format)")
        g.add_argument("--setup", choices=list(SETUPS), default=None,
                       help="; ".join(f"{k}: {v}" for k, v in SETUPS.items()) + " (default demos+prefs)")
        g.add_argument("--demo-fraction", type=float, default=None, help="use only this fraction of the demos")
        g.add_argument("--frozen-reward", metavar="RUN_DIR", default=None,
                       help="train on that finished run's reward model, held fixed (reward-hacking experiment)")
        g.add_argument("--bc-batches", type=int, default=None, help="first pretraining on the demos (A.4: 20,000)")
        g.add_argument("--rm-pretrain-batches", type=int, default=None,
                       help="reward-model batches on the initial labels (A.4: 50,000)")
        g.add_argument("--second-pretrain-batches", type=int, default=None,
                       help="second pretraining on the demos with r̂ (A.4: 60,000)")
        g.add_argument("--rm-batches", type=int, default=None, help="reward-model batches per iteration (A.4: 6,250)")
        g.add_argument("--replay-capacity", type=int, default=None, help="agent transitions kept (A.3: 1e6)")
        g.add_argument("--envs", type=int, default=None, help="actors stepping together (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


IBARZ_ONLY = ("demos", "setup", "demo_fraction", "frozen_reward", "bc_batches", "rm_pretrain_batches",
              "second_pretrain_batches", "rm_batches", "replay_capacity", "envs")


def ibarz_config_from_args(args: argparse.Namespace, domain: Domain):
    """The Ibarz protocol's config (``--agent dqfd``) from the command line."""
    from rlhp_jax.ibarz import IbarzConfig
    from rlhp_jax.replay import ReplayConfig
    from rlhp_jax.teachers import SyntheticTeacher

    tasks = domain.tasks()
    if args.env not in tasks:
        raise ValueError(f"Unknown environment {args.env!r} for {domain.prog}. Supported: {', '.join(tasks)}.")
    for flag, bad in (("--baseline", args.baseline), ("--ablation", args.ablation), ("--members", args.members),
                      ("--selection", args.selection)):
        if bad:
            raise ValueError(f"{flag} belongs to Christiano et al.'s setup; with --agent dqfd choose a --setup "
                             "(Ibarz uses a single reward model and uniformly chosen clips).")
    if args.label_horizon is not None:
        raise ValueError("--label-horizon applies to Christiano et al.'s schedule; Ibarz's protocol spends its "
                         "budget by the run's end (A.3's rate ∝ 5e6/(T + 5e6); --rate-constant changes c).")
    if args.teacher == "human":
        raise ValueError("--agent dqfd runs with the synthetic oracle only for now; label with people through "
                         "the Christiano setup (--agent a2c --teacher human).")
    d = dict(domain.ibarz_settings(args, args.env))
    if args.agent_config:
        from rlhp_jax.agents.dqfd import DQfDConfig

        d["agent_config"] = agent_config("dqfd", args.env, args.agent_config, d.get("agent_config", DQfDConfig()))
    setup = args.setup or "demos+prefs"
    given = dict(labels=args.labels, total_steps=args.steps, iteration_steps=args.iteration_steps,
                 segment_length=args.segment_length, rate_constant=args.rate_constant, demo_fraction=args.demo_fraction,
                 frozen_reward=args.frozen_reward, bc_batches=args.bc_batches,
                 rm_pretrain_batches=args.rm_pretrain_batches, second_pretrain_batches=args.second_pretrain_batches,
                 rm_batches_per_iteration=args.rm_batches, num_envs=args.envs)
    d.update({k: v for k, v in given.items() if v is not None})
    if args.replay_capacity is not None:
        d["replay"] = ReplayConfig(capacity=args.replay_capacity)
    tag = setup + ("-frozen" if args.frozen_reward else "") + (f"-{d['labels']}labels" if "labels" in d else "")
    out = args.out or _fresh_dir(f"{domain.out_root}/{args.env}-dqfd-{tag}-seed{args.seed}")
    teacher = SyntheticTeacher(mistake_rate=args.mistake_rate, beta=args.beta, gamma=args.myopic_gamma,
                               skip_below=args.skip_below, tie_within=args.tie_within)
    return IbarzConfig(env=args.env, setup=setup, demos=args.demos, seed=args.seed, out=out, teacher=teacher, **d)


def agent_config(agent: str, env: str, overrides: list[str], base=None):
    """The agent's preset for ``env`` (or ``base``) with FIELD=VALUE overrides: Python literals,
    except for text fields, which take VALUE as written.  The agent config checks the values
    itself (declared types, ranges: ``rlhp_jax.agents.common.check_config``), so a value of the
    wrong kind is a ValueError naming the field, raised before anything is built."""
    from rlhp_jax.agents import default_config

    cfg = base if base is not None else default_config(agent, env)
    fields = [f.name for f in dataclasses.fields(cfg)]
    changes = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--agent-config expects FIELD=VALUE with FIELD one of: {', '.join(fields)}; got {item!r}")
        if isinstance(getattr(cfg, name), str):
            changes[name] = value
            continue
        try:
            changes[name] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"--agent-config {name}: cannot parse {value!r} (a Python literal: 3e-4, (64, 64), "
                             "True, None)") from None
    try:
        return dataclasses.replace(cfg, **changes)
    except ValueError as e:
        raise ValueError(f"--agent-config: {e}") from None


def config_from_args(args: argparse.Namespace, domain: Domain):
    from rlhp_jax.config import RunConfig, with_ablation
    from rlhp_jax.ensemble import EnsembleConfig
    from rlhp_jax.teachers import SyntheticTeacher

    tasks = domain.tasks()
    if args.env not in tasks:
        raise ValueError(f"Unknown environment {args.env!r} for {domain.prog}. Supported: {', '.join(tasks)}.")
    if args.labels is not None and args.labels < 1 and not args.baseline:
        raise ValueError(f"--labels must be at least 1 (got {args.labels}); use --baseline to train on the true reward.")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    if args.teacher == "human" and args.baseline:
        raise ValueError("--baseline trains on the true reward: it asks no one, so it cannot use --teacher human.")
    if args.teacher == "human" and args.ablation == "target":
        raise ValueError("The target ablation regresses on true returns: a person gives preferences, not returns.")
    if args.baseline and args.ablation:
        raise ValueError("--baseline trains on the true reward: it cannot be combined with --ablation.")
    if args.pretrain_steps is not None and args.pretrain_epochs is not None:
        raise ValueError("--pretrain-steps and --pretrain-epochs both set how long the reward model pretrains: "
                         "give one.")
    d = domain.settings(args, args.env)
    labels = d.pop("labels")
    steps = d.pop("steps")
    ens_base = d.pop("ensemble", EnsembleConfig())
    ensemble = dataclasses.replace(ens_base, **({"num_members": args.members} if args.members is not None else {}))
    agent_cfg = agent_config(args.agent, args.env, args.agent_config, d.pop("agent_config", None))
    explicit = dict(segment_length=args.segment_length, rate_constant=args.rate_constant,
                    label_horizon=args.label_horizon,
                    initial_label_fraction=args.initial_labels, pretrain_epochs=args.pretrain_epochs,
                    pretrain_steps=args.pretrain_steps,
                    iteration_steps=args.iteration_steps, selection=args.selection,
                    checkpoint_every=args.checkpoint_every, max_pending_queries=args.max_pending)
    if args.teacher == "human":
        d.update(label_source="human", wait_for_initial_labels=not args.no_wait)
    d.update({k: v for k, v in explicit.items() if v is not None})
    if args.initial_labels is not None:
        d["initial_label_count"] = None
    if args.pretrain_steps is not None:  # in place of the preset's epochs (A.2)
        d["pretrain_epochs"] = None
    tag = "baseline" if args.baseline else f"{labels}labels" + (f"-{args.ablation}" if args.ablation else "") \
        + ("-human" if args.teacher == "human" else "")
    out = args.out or _fresh_dir(f"{domain.out_root}/{args.env}-{args.agent}-{tag}-seed{args.seed}")
    cfg = RunConfig(
        env=args.env, total_steps=steps, labels=max(labels, 1), seed=args.seed, agent=args.agent,
        agent_config=agent_cfg, reward_source="true" if args.baseline else "model", out=out,
        ensemble=ensemble,
        teacher=SyntheticTeacher(mistake_rate=args.mistake_rate, beta=args.beta, gamma=args.myopic_gamma,
                                 skip_below=args.skip_below, tie_within=args.tie_within),
        **d,
    )
    if args.ablation == "no_segments" and not domain.segments_ablation:
        raise ValueError("The no_segments ablation is defined for the robotics tasks only (Christiano §3.3): "
                         "the Atari reward model reads a stack of consecutive frames.")
    return with_ablation(cfg, args.ablation)


def _fresh_dir(path: str) -> str:
    """The default output directory, or ``path-2``, ``path-3``… if a run is already there (an
    explicit --out that holds a run is refused instead, so nothing is ever overwritten)."""
    candidate, n = path, 1
    while Path(candidate, "checkpoints").exists():
        n += 1
        candidate = f"{path}-{n}"
    return candidate


SERVER_FLAGS = ("host", "port", "token", "instructions", "lease")  # how the page is served, not part of the run


def _given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Flags whose value differs from the default (other than --resume / --no-progress)."""
    given = []
    for action in parser._actions:
        if action.dest in ("help", "resume", "no_progress") + SERVER_FLAGS:
            continue
        if getattr(args, action.dest, None) != action.default:
            given.append(action.option_strings[0])
    return given


def main(domain: Domain, argv=None) -> int:
    parser = build_parser(domain)
    args = parser.parse_args(argv)
    from rlhp_jax.checkpoint import CheckpointError
    from rlhp_jax.demos import DemoError
    from rlhp_jax.config import RunConfig
    from rlhp_jax.driver import PreferenceRun
    from rlhp_jax.runs import read_run_config

    try:
        if args.agent != "dqfd" and not args.resume:
            given = [f"--{k.replace('_', '-')}" for k in IBARZ_ONLY if getattr(args, k, None) is not None]
            if given:
                raise ValueError(f"{' '.join(given)} belong(s) to Ibarz et al.'s protocol: add --agent dqfd.")
        if args.resume:
            flags = _given_flags(parser, args)
            if flags:
                raise ValueError(f"--resume continues a run with its saved configuration; drop {' '.join(flags)}.")
            cfg = read_run_config(args.resume)
        elif args.agent == "dqfd":
            cfg = ibarz_config_from_args(args, domain)
        else:
            cfg = config_from_args(args, domain)
        if not isinstance(cfg, RunConfig):  # Ibarz et al.'s protocol
            from rlhp_jax.ibarz import IbarzRun

            summary = IbarzRun(cfg, progress=not args.no_progress, resume=bool(args.resume)).run()
            print(json.dumps(summary, indent=2))
            print(f"metrics, plots, TensorBoard events and checkpoints in {cfg.out}/")
            return 0

        from rlhp_jax.human.server import check_binding

        check_binding(args.host, args.token)
        run = PreferenceRun(cfg, progress=not args.no_progress, resume=bool(args.resume))
        server = None
        if cfg.label_source == "human" and cfg.reward_source == "model":  # the page, from a thread of this process
            from rlhp_jax.human.server import start_page
            from rlhp_jax.human.store import LabelStore

            server = start_page(LabelStore(cfg.out), cfg.env, args)
        try:
            summary = run.run()
        finally:
            if server is not None:
                server.stop()
    except (ValueError, CheckpointError, OSError, DemoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    print(f"metrics, plots, TensorBoard events and checkpoints in {cfg.out}/")
    return 0
