"""The command line every experiment entry point shares: flags generated from the config fields,
configs built by the papers' presets (:mod:`rlhp_jax.presets`), run and resume.

Each domain module (``experiments.classic``, ``experiments.atari``, ``experiments.mujoco``) gives a
:class:`Domain` — a backend of the task registry, whose tasks it runs — and calls :func:`main`.
A command line builds the config that ``RunConfig.paper(TASK, ...)`` (``--agent dqfd``:
``presets.ibarz(IbarzConfig, TASK, ...)``) builds from the same settings.

**Flag names.**  Every setting of the config has one flag, named after the field it sets: the
field's path, each ``_`` written ``-``, a nested config's fields after a dot (the convention of
dataclass CLIs such as tyro) — ``--segment-length`` sets ``segment_length``,
``--ensemble.num-members`` sets ``ensemble.num_members``, ``--teacher.mistake-rate`` the synthetic
teacher's ``mistake_rate``, ``--replay.capacity`` the Ibarz replay's.  A True/False field has two:
``--wait-for-initial-labels`` / ``--no-wait-for-initial-labels``, nested
``--ensemble.adaptive-l2`` / ``--ensemble.no-adaptive-l2``.  An optional field takes ``none``; a
tuple field a Python literal; a value that starts with ``-`` and is no number takes ``=``
(``--teacher.skip-below=-inf``).  A field both protocols have (``segment_length``,
``rate_constant``, ``iteration_steps``, ``keep_checkpoints``, ``env_options``, ``teacher.*``) has one
flag, which sets it in whichever config is built.  One flag is not named after its field:
IbarzConfig's ``initial_labels`` is a count, set by ``--initial-label-count`` like RunConfig's
``initial_label_count``; there is no ``--initial-labels`` (it used to be a fraction: now
``--initial-label-fraction``).  A flag's help is its field's comment in the source
(``config_fields.field_docs``), with the value the entry point's default task has.  A flag left
out leaves the preset's value; abbreviations are not accepted.

**Flags that are no field**: ``--env`` (the task), ``--labels``, ``--steps`` (``total_steps``),
``--seed``, ``--agent``, ``--agent-config FIELD=VALUE`` (the agent's config, whose fields depend on
the agent), ``--teacher synthetic|human`` (``label_source``), ``--baseline`` (RL on the true reward),
``--ablation``, ``--out``, ``--resume``, ``--no-progress``, ``--no-compile-cache`` (JAX's persistent
compilation cache, :mod:`rlhp_jax.compile_cache`, is on by default), and the labeling page's ``--host``,
``--port``, ``--token``, ``--instructions``, ``--lease``.

**People label either protocol** (``--teacher human``): the same labeling page is served from a
thread of the training process, for Christiano's runs and for Ibarz's (``--agent dqfd``; its
``--wait-for-labels`` / ``--no-wait-for-labels`` says whether each iteration waits for its batch;
Christiano's human flags, whose pacing differs, are refused there with what to use instead).

Flags renamed when they became field names (:data:`RENAMED`; the old spellings are refused with
the new name): ``--members`` → ``--ensemble.num-members``, ``--initial-labels`` (a fraction) →
``--initial-label-fraction``, ``--max-pending`` → ``--max-pending-queries``, ``--no-wait`` →
``--no-wait-for-initial-labels``, ``--mistake-rate``/``--beta``/``--myopic-gamma``/``--skip-below``/
``--tie-within`` → ``--teacher.mistake-rate``/``.beta``/``.gamma``/``.skip-below``/``.tie-within``,
``--rm-batches`` → ``--rm-batches-per-iteration``, ``--replay-capacity`` → ``--replay.capacity``,
``--envs`` → ``--num-envs``, ``--ppo`` → ``--agent-config``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gc
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, NoReturn

from rlhp_jax.refusal import refuse

# fields set by the flags that are no field, or by none
NOT_FLAGS = ("env", "total_steps", "labels", "seed", "agent", "agent_config", "reward_source", "label_source",
             "ablation", "out", "protocol")
IBARZ_AS = {"initial_labels": "initial_label_count"}  # IbarzConfig field -> the flag (dest) that sets it
HUMAN_FIELDS = ("max_pending_queries", "wait_for_initial_labels", "query_max_age_steps",  # help group
                "wait_for_labels")
EXTRA_HELP = {  # for fields whose comment says too little on its own
    "eval_episodes": "episodes per evaluation",
    "keep_checkpoints": "newest checkpoints kept",
    "rm_batches_per_iteration": "reward-model batches per iteration",
    "env_options": "environment options",
    "setup": "which of the setups above",
}
RENAMED = {
    "--members": "--ensemble.num-members",
    "--initial-labels": "--initial-label-fraction (a fraction of the budget; a number of labels is "
                        "--initial-label-count)",
    "--max-pending": "--max-pending-queries",
    "--no-wait": "--no-wait-for-initial-labels",
    "--mistake-rate": "--teacher.mistake-rate",
    "--beta": "--teacher.beta",
    "--myopic-gamma": "--teacher.gamma",
    "--skip-below": "--teacher.skip-below",
    "--tie-within": "--teacher.tie-within",
    "--rm-batches": "--rm-batches-per-iteration",
    "--replay-capacity": "--replay.capacity",
    "--envs": "--num-envs",
    "--ppo": "--agent-config",
}
SERVER_FLAGS = ("host", "port", "token", "instructions", "lease")  # how the page is served, not part of the run


@dataclasses.dataclass(frozen=True)
class Domain:
    prog: str  # "python -m experiments.atari"
    doc: str
    backend: str  # rlhp_jax.tasks.BACKENDS: the tasks it runs; its presets are rlhp_jax.presets'
    default_env: str

    def tasks(self) -> list[str]:
        from rlhp_jax import tasks

        return tasks.names(self.backend)

    @property
    def default_agent(self) -> str:
        from rlhp_jax import presets

        return presets.AGENTS[self.backend]

    @property
    def offers_dqfd(self) -> bool:
        """Whether Ibarz et al.'s protocol runs here (``--agent dqfd``: discrete actions)."""
        from rlhp_jax import presets

        return self.backend in presets.IBARZ


# ------------------------------------------------------------------ flags from fields
@dataclasses.dataclass(frozen=True)
class FieldFlag:
    """One generated flag: the field path it sets in a RunConfig and/or an IbarzConfig."""

    dest: str  # its attribute on the parsed arguments: the field path
    christiano: str | None  # RunConfig field path (None: Ibarz only)
    ibarz: str | None  # IbarzConfig field path (None: Christiano only)
    hint: Any  # declared type

    @property
    def name(self) -> str:
        return flag_name(self.dest)

    @property
    def negative(self) -> str:
        """A bool field's second flag: ``--no-x``, nested ``--a.no-x``."""
        return flag_name(self.dest, False)


def flag_name(dest: str, value: Any = None) -> str:
    """The flag that sets ``dest`` (to ``value``: False gives a bool field's ``--no-`` form)."""
    head, _, last = dest.rpartition(".")
    last = ("no-" if value is False else "") + last
    return "--" + (f"{head}.{last}" if head else last).replace("_", "-")


def field_flags(domain: Domain) -> list[FieldFlag]:
    """Every flag generated from the configs this entry point builds: RunConfig's fields, and
    IbarzConfig's where ``--agent dqfd`` is offered (module docstring: the naming rule)."""
    from rlhp_jax.config import RunConfig
    from rlhp_jax.config_fields import field_paths

    flags = {path: FieldFlag(path, path, None, hint) for path, hint in field_paths(RunConfig, skip=NOT_FLAGS)}
    if domain.offers_dqfd:
        for path, hint in field_paths(_ibarz_classes()[0], skip=NOT_FLAGS):
            dest = IBARZ_AS.get(path, path)
            flags[dest] = (dataclasses.replace(flags[dest], ibarz=path) if dest in flags
                           else FieldFlag(dest, None, path, hint))
    return list(flags.values())


def _ibarz_classes():
    """``IbarzConfig`` and ``SETUPS`` (in ``rlhp_jax.config``; ``rlhp_jax.ibarz`` before they moved)."""
    try:
        from rlhp_jax.config import SETUPS, IbarzConfig
    except ImportError:
        from rlhp_jax.config import SETUPS, IbarzConfig
    return IbarzConfig, SETUPS


class _Toggle(argparse.Action):
    """A bool field's two flags: the first sets True, the ``no-`` one False."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string == self.option_strings[0])


class _Renamed(argparse.Action):
    """An old flag's spelling: refused, naming the new one."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs="*", **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.new}")


def _text_type(hint, flag: str):
    from rlhp_jax.config_fields import from_text

    def parse(text: str):
        try:
            return from_text(hint, text, flag)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = flag
    return parse


def _show(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _value_at(config, path: str):
    for part in path.split("."):
        config = getattr(config, part)
    return config


def _help(doc: str, shown: str) -> str:
    text = f"{doc} (default {shown})" if doc else f"default {shown}"
    return text.replace("%", "%%")


def build_parser(domain: Domain) -> argparse.ArgumentParser:
    from rlhp_jax import presets
    from rlhp_jax.agents import AGENTS
    from rlhp_jax.config import ABLATIONS, RunConfig
    from rlhp_jax.config_fields import field_docs, field_types
    from rlhp_jax.human.server import add_server_flags

    env = domain.default_env
    per_task = {t: presets.TASK_BUDGETS[t] for t in domain.tasks() if t in presets.TASK_BUDGETS}
    others = "other tasks " if per_task else ""
    labels, steps = presets.BUDGETS[domain.backend]
    labels_help = ", ".join([*(f"{t} {b[0]}" for t, b in per_task.items()), f"{others}{labels}"])
    steps_help = ", ".join([*(f"{t} {b[1]}" for t, b in per_task.items()), f"{others}{steps}"])
    ibarz_values, ibarz_docs = {}, {}
    if domain.offers_dqfd:
        IbarzConfig, SETUPS = _ibarz_classes()
        ibarz_values = presets.ibarz_values(env)
        ibarz_docs = field_docs(IbarzConfig)
        dq_labels = ibarz_values.get("labels", IbarzConfig.labels)
        dq_steps = ibarz_values.get("total_steps", IbarzConfig.total_steps)
        labels_help += f"; --agent dqfd: {dq_labels}"
        steps_help += f"; --agent dqfd: {dq_steps}"

    p = argparse.ArgumentParser(
        prog=domain.prog, description=domain.doc, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False, usage="%(prog)s [-h] [--env TASK] [--labels N] [--steps N] [--seed N] [--agent NAME] "
                                  "[--out DIR | --resume RUN_DIR] [FLAG ...]",
        epilog=textwrap.fill(
            f"Every flag after the first group sets the config field it is named after (--ensemble.num-members: "
            f"ensemble.num_members; --x / --no-x for a True/False field; 'none' for an optional one; a value that "
            f"starts with '-' and is no number takes '=', as in --teacher.skip-below=-inf). A flag left out keeps "
            f"the preset's value, shown as the default for {env}. From Python: RunConfig.paper(TASK, labels, seed, "
            f"**fields) builds the same config (rlhp_jax.presets).", 100))
    p.add_argument("--env", metavar="TASK", default=env,
                   help=f"task (default {env}): {', '.join(domain.tasks())}")
    p.add_argument("--labels", metavar="N", type=int, default=None,
                   help=f"label budget (default per task: {labels_help})")
    p.add_argument("--steps", metavar="N", type=int, default=None,
                   help=f"environment steps of RL, total_steps (default per task: {steps_help})")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="random seed (default 0)")
    agents = AGENTS + (("dqfd",) if domain.offers_dqfd else ())
    p.add_argument("--agent", choices=agents, default=domain.default_agent,
                   help=f"RL algorithm (default {domain.default_agent})"
                        + ("; dqfd runs Ibarz et al. 2018's protocol (flags below)" if domain.offers_dqfd else ""))
    p.add_argument("--agent-config", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override fields of the agent's preset, e.g. --agent-config lr=3e-4 ent_coef=0.01")
    p.add_argument("--teacher", choices=["synthetic", "human"], default="synthetic",
                   help="who labels (label_source): the synthetic oracle (the true reward, optionally noisy: "
                        "--teacher.* below), or people in a browser (human: a labeling page is served while the "
                        "agent trains)")
    p.add_argument("--ablation", choices=sorted(ABLATIONS), default=None,
                   help="Christiano §3.3 ablation: " + "; ".join(f"{k}: {v}" for k, v in ABLATIONS.items()))
    p.add_argument("--baseline", action="store_true", help="train the same agent on the true reward instead")
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"output directory (default {presets.OUT_ROOTS[domain.backend]}/ENV-AGENT-...-seedN)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a run from its newest checkpoint, with its saved configuration (a run stopped "
                        "before its first checkpoint starts again from it)")
    p.add_argument("--pause-at", metavar="ITERATION", type=int, default=None,
                   help="stop once that iteration's checkpoint is written, leaving the run to --resume (no "
                        "summary yet): a long run in parts, or its reward model read part-way "
                        "(experiments.reward_diagnostics)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compile_cache_flag(p)

    run = p.add_argument_group("run (RunConfig fields; with --agent dqfd those IbarzConfig has too)"
                               if domain.offers_dqfd else "run (RunConfig fields)")
    ens = p.add_argument_group("reward-model ensemble (RunConfig.ensemble)")
    teacher = p.add_argument_group("synthetic teacher (RunConfig.teacher" +
                                   (", IbarzConfig.teacher)" if domain.offers_dqfd else ")"))
    human = p.add_argument_group("human labels (--teacher human" +
                                 ("; --agent dqfd: IbarzConfig.wait_for_labels)" if domain.offers_dqfd else ")"))
    add_server_flags(human)
    groups = {"ensemble": ens, "teacher": teacher}
    if domain.offers_dqfd:
        groups.update(
            ibarz=p.add_argument_group(
                "Ibarz et al. 2018 (--agent dqfd; IbarzConfig fields)",
                "setups (Ibarz §3):\n" + "\n".join(f"  {k}: {v}" for k, v in SETUPS.items())),
            replay=p.add_argument_group("prioritized replay (--agent dqfd; IbarzConfig.replay)"),
            reward_model=p.add_argument_group("reward model (--agent dqfd; IbarzConfig.reward_model)"))

    preset = RunConfig.paper(env)
    for flag in field_flags(domain):
        path = flag.christiano or flag.ibarz
        owner, _, field = path.rpartition(".")
        if flag.christiano:
            cls = RunConfig if not owner else type(_value_at(preset, owner))
            doc = field_docs(cls).get(field, "")
            shown = _show(_value_at(preset, flag.christiano))
            group = groups.get(owner, human if path in HUMAN_FIELDS else run)
            if flag.ibarz:
                value = _ibarz_value(ibarz_values, flag.ibarz)
                if _show(value) != shown:
                    shown += f"; --agent dqfd: {_show(value)}"
        else:
            cls = field_types(IbarzConfig).get(owner) if owner else IbarzConfig
            doc = field_docs(cls).get(field, "")
            shown = _show(_ibarz_value(ibarz_values, flag.ibarz))
            group = groups.get(owner, human if path in HUMAN_FIELDS else groups.get("ibarz"))
        doc = "; ".join(filter(None, (EXTRA_HELP.get(field), doc or ibarz_docs.get(field, ""))))
        names = [flag.name]
        if flag.hint is bool:
            names.append(flag.negative)
            group.add_argument(*names, dest=flag.dest, action=_Toggle, default=argparse.SUPPRESS,
                               help=_help(doc, shown))
        else:
            group.add_argument(flag.name, dest=flag.dest, type=_text_type(flag.hint, flag.name),
                               default=argparse.SUPPRESS, metavar=_metavar(flag.hint), help=_help(doc, shown))
    for old, new in RENAMED.items():
        p.add_argument(old, action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def _metavar(hint) -> str:
    from rlhp_jax.config_fields import optional_type

    inner = optional_type(hint)
    base = inner if inner is not None else hint
    name = {int: "INT", float: "X", str: "TEXT"}.get(base, "LITERAL")
    return f"{name}|none" if inner is not None else name


def _ibarz_value(values: dict, path: str):
    from rlhp_jax.config_fields import field_default

    IbarzConfig = _ibarz_classes()[0]
    head, _, rest = path.partition(".")
    value = values.get(head, field_default(IbarzConfig, head))
    return _value_at(value, rest) if rest else value


def given_fields(args: argparse.Namespace, domain: Domain) -> list[tuple[FieldFlag, Any]]:
    """The generated flags given on the command line, with their values."""
    given = vars(args)
    return [(f, given[f.dest]) for f in field_flags(domain) if f.dest in given]


# ------------------------------------------------------------------ configs
def agent_changes(cls, overrides: list[str]) -> dict:
    """``--agent-config FIELD=VALUE ...`` as changes to an agent config of class ``cls``: Python
    literals, except for text fields, which take VALUE as written.  The agent config checks the
    values itself when they are applied (declared types, ranges:
    ``rlhp_jax.agents.common.check_config``), so a value of the wrong kind is a ValueError naming
    the field, raised before anything is built."""
    from rlhp_jax.config_fields import field_types, optional_type

    types = field_types(cls)
    changes = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in types:
            raise ValueError(f"--agent-config expects FIELD=VALUE with FIELD one of: {', '.join(types)}; got {item!r}")
        if types[name] is str or (optional_type(types[name]) is str and value != "None"):  # text as written
            changes[name] = value
            continue
        try:
            changes[name] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"--agent-config {name}: cannot parse {value!r} (a Python literal: 3e-4, (64, 64), "
                             "True, None)") from None
    return changes


DOMAIN_PROGS = {"gymnax": "python -m experiments.classic", "atari": "python -m experiments.atari",
                "mujoco": "python -m experiments.mujoco"}  # the command that runs each backend's tasks


def _check_env(args: argparse.Namespace, domain: Domain) -> None:
    """``--env`` as the task registry spells it (any spelling ``tasks.find`` reads: ``hopper``,
    ``Hopper-v4``, ``PongNoFrameskip-v4``), refused where this command does not run that task."""
    from rlhp_jax import tasks

    task = tasks.find(args.env)
    if task is None or task.backend != domain.backend:
        elsewhere = f": {task.name} runs with {DOMAIN_PROGS[task.backend]}" if task is not None else ""
        raise ValueError(f"Unknown environment {args.env!r} for {domain.prog}{elsewhere}. "
                         f"Supported: {', '.join(domain.tasks())}.")
    args.env = task.name


def ibarz_config_from_args(args: argparse.Namespace, domain: Domain):
    """The Ibarz protocol's config (``--agent dqfd``) from the command line: ``presets.ibarz``."""
    from rlhp_jax import presets
    from rlhp_jax.agents.dqfd import DQfDConfig

    _check_env(args, domain)
    given = given_fields(args, domain)
    christiano_only = [flag for flag, on in (("--baseline", args.baseline), ("--ablation", args.ablation)) if on]
    christiano_only += [f.name for f, _ in given if f.ibarz is None and f.dest != "label_horizon"]
    human_only = [name for name in christiano_only if name.removeprefix("--").replace("-", "_") in HUMAN_FIELDS]
    if human_only:
        raise ValueError(f"{' '.join(human_only)} belong{'s' if len(human_only) == 1 else ''} to Christiano et al.'s "
                         "human runs; with --agent dqfd people label the clips of each iteration in a batch, the "
                         "first batch is always awaited, and --no-wait-for-labels lets training go on with r̂ as it "
                         "is while they label the later ones.")
    if christiano_only:
        raise ValueError(f"{' '.join(christiano_only)} belong{'s' if len(christiano_only) == 1 else ''} to "
                         "Christiano et al.'s setup; with --agent dqfd choose a --setup (Ibarz uses a single reward "
                         "model and uniformly chosen clips).")
    if any(f.dest == "label_horizon" for f, _ in given):
        raise ValueError("--label-horizon applies to Christiano et al.'s schedule; Ibarz's protocol spends its "
                         "budget by the run's end (A.3's rate ∝ 5e6/(T + 5e6); --rate-constant changes c).")
    IbarzConfig = _ibarz_classes()[0]
    agent = agent_changes(DQfDConfig, args.agent_config) if args.agent_config else None
    cfg = presets.ibarz(IbarzConfig, args.env, args.labels, args.seed, steps=args.steps, out=args.out,
                        agent_config=agent, label_source=args.teacher, **{f.ibarz: value for f, value in given})
    return cfg if args.out else dataclasses.replace(cfg, out=_fresh_dir(cfg.out))


def config_from_args(args: argparse.Namespace, domain: Domain):
    """Christiano et al.'s config from the command line: ``RunConfig.paper``."""
    from rlhp_jax.agents import default_config
    from rlhp_jax.config import RunConfig

    _check_env(args, domain)
    given = given_fields(args, domain)
    ibarz_only = [f.name for f, _ in given if f.christiano is None]
    if ibarz_only:
        raise ValueError(f"{' '.join(ibarz_only)} belong(s) to Ibarz et al.'s protocol: add --agent dqfd.")
    agent = agent_changes(type(default_config(args.agent, args.env)), args.agent_config)
    cfg = RunConfig.paper(args.env, args.labels, args.seed, steps=args.steps, agent=args.agent,
                          baseline=args.baseline, ablation=args.ablation, out=args.out, agent_config=agent,
                          label_source=args.teacher, **{f.christiano: value for f, value in given})
    return cfg if args.out else dataclasses.replace(cfg, out=_fresh_dir(cfg.out))


def _fresh_dir(path: str) -> str:
    """The default output directory, or ``path-2``, ``path-3``… if a run is already there (an
    explicit --out that holds a run is refused instead, so nothing is ever overwritten)."""
    candidate, n = path, 1
    while Path(candidate, "checkpoints").exists():
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def add_compile_cache_flag(p: argparse.ArgumentParser) -> None:
    from rlhp_jax import compile_cache

    p.add_argument("--no-compile-cache", action="store_true",
                   help=f"compile every program afresh instead of loading it from JAX's persistent cache "
                        f"({compile_cache.default_directory()}, or ${compile_cache.ENV}; =off turns it off too)")


def exit_script(code: int | None) -> NoReturn:
    """``sys.exit(code)`` for an entry point run as a script, without the interpreter's last
    garbage collections walking every object the run still holds (traced programs, XLA
    executables, the label set): ``gc.freeze()`` first.  Exit handlers and module teardown still
    run; only cyclic garbage is left to the process's end, so a run closes what it writes before
    it returns (the driver closes its metrics, checkpoints, event files and label store).  The
    README job's exit took 0.9-1.3 s, 0.3-0.5 s with this (2-core Xeon; BUILD_NOTES).  Not for
    ``main()`` called in a longer-lived process (the tests): frozen objects are never collected."""
    gc.freeze()
    sys.exit(code)


def start_compile_cache(args: argparse.Namespace) -> None:
    """The persistent compilation cache for this command (before anything compiles), unless
    ``--no-compile-cache``."""
    from rlhp_jax import compile_cache

    if not args.no_compile_cache:  # the executables this command's last run used are read ahead
        compile_cache.enable(workload=f"{sys.argv[0]} {getattr(args, 'resume', None) or getattr(args, 'env', '')}")


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The flags given on the command line (other than --resume, --pause-at, --no-progress, --no-compile-cache
    and the page's):
    the generated ones present at all, the others different from their defaults."""
    defaults = vars(parser.parse_args([]))
    return [flag_name(dest, value) for dest, value in vars(args).items()
            if dest not in ("resume", "pause_at", "no_progress", "no_compile_cache") + SERVER_FLAGS
            and not (dest in defaults and defaults[dest] == value)]


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the host or the device ran out of memory (NumPy's MemoryError, XLA's
    RESOURCE_EXHAUSTED)."""
    return isinstance(e, MemoryError) or (type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
                                          and "RESOURCE_EXHAUSTED" in str(e))


def main(domain: Domain, argv=None) -> int:
    parser = build_parser(domain)
    args = parser.parse_args(argv)
    start_compile_cache(args)
    from rlhp_jax.config import RunConfig
    from rlhp_jax.driver import PreferenceRun
    from rlhp_jax.runs import read_run_config

    try:
        if args.resume:
            flags = given_flags(parser, args)
            if flags:
                raise ValueError(f"--resume continues a run with its saved configuration; drop {' '.join(flags)}.")
            cfg = read_run_config(args.resume)
        elif args.agent == "dqfd":
            cfg = ibarz_config_from_args(args, domain)
        else:
            cfg = config_from_args(args, domain)
        from rlhp_jax.human.server import check_binding
        from rlhp_jax.refusal import check_out_directory
        from rlhp_jax.runs import claimed

        check_out_directory(cfg.out)
        check_binding(args.host, args.token)
        if isinstance(cfg, RunConfig):
            run = PreferenceRun(cfg, progress=not args.no_progress, resume=bool(args.resume), pause_at=args.pause_at)
            asks_people = cfg.label_source == "human" and cfg.reward_source == "model"
        else:  # Ibarz et al.'s protocol (it refuses --teacher human where it asks for no labels)
            from rlhp_jax.ibarz import IbarzRun

            if args.pause_at is not None:
                raise ValueError("--pause-at stops Christiano runs only; an --agent dqfd run is stopped by a kill "
                                 "and continued with --resume")
            run = IbarzRun(cfg, progress=not args.no_progress, resume=bool(args.resume))
            asks_people = cfg.label_source == "human"
        # this process's alone from here (the page's label store lives there too)
        with claimed(cfg.out, "--resume" if args.resume else "--out"):
            server = None
            if asks_people:  # the page, from a thread of this process
                from rlhp_jax.human.server import start_page
                from rlhp_jax.human.store import LabelStore

                server = start_page(LabelStore(cfg.out), cfg.env, args)
            try:
                summary = run.run()
            finally:
                if server is not None:
                    server.stop()
    except (ValueError, OSError) as e:  # a CheckpointError and a DemoError are ValueErrors
        return refuse(e)
    except Exception as e:  # noqa: BLE001 — only running out of memory is refused here; the rest is raised
        if not out_of_memory(e):
            raise
        return refuse(f"out of memory ({' '.join(str(e).split())[:160]}): the run asks for more than this machine "
                      "holds; choose smaller sizes (--agent-config num_envs=..., --eval-episodes, --label-capacity, "
                      "--segment-length, --ensemble.batch-size)")
    if summary.get("paused_at") is not None:
        print(f"paused at iteration {summary['paused_at']} of {summary['iterations']} (its checkpoint is written); "
              f"continue with: --resume {cfg.out}")
        return 0
    print(json.dumps(summary, indent=2))
    print(f"metrics, plots, TensorBoard events and checkpoints in {cfg.out}/")
    return 0
