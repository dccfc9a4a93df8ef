"""The papers' presets (``rlhp_jax/presets.py``) and the flags generated from the config fields
(``experiments/cli.py``): ``RunConfig.paper(task)`` is what the entry point builds for every task,
so the two cannot drift; every flag sets a real field, and every field has a flag or a reason not to."""

from __future__ import annotations

import dataclasses
import math

import pytest

from experiments import atari, classic, mujoco
from experiments.cli import (NOT_FLAGS, RENAMED, build_parser, config_from_args, field_flags, flag_name,
                             ibarz_config_from_args)
from rlhp_jax import presets, tasks
from rlhp_jax.config import RunConfig
from rlhp_jax.config_fields import field_paths, type_at, with_changes
from rlhp_jax.ensemble import EnsembleConfig

from rlhp_jax.config import IbarzConfig

DOMAINS = {"atari": atari.DOMAIN, "mujoco": mujoco.DOMAIN, "classic": classic.DOMAIN}
TASKS = [(name, task) for name, domain in DOMAINS.items() for task in domain.tasks()]


@pytest.fixture(autouse=True)
def fresh_cwd(tmp_path, monkeypatch):
    """Default output directories are relative: in an empty directory none holds a run already."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def parsers():
    return {name: build_parser(domain) for name, domain in DOMAINS.items()}


def cli(parsers, name: str, argv: list[str]):
    args = parsers[name].parse_args(argv)
    build = ibarz_config_from_args if args.agent == "dqfd" else config_from_args
    return build(args, DOMAINS[name])


@pytest.mark.parametrize("name, task", TASKS)
def test_the_paper_preset_is_what_the_entry_point_builds(parsers, name, task):
    assert RunConfig.paper(task) == cli(parsers, name, ["--env", task])


@pytest.mark.parametrize("name, task", [(n, t) for n, t in TASKS if n != "mujoco"])
def test_the_ibarz_preset_is_what_agent_dqfd_builds(parsers, name, task):
    got = cli(parsers, name, ["--env", task, "--agent", "dqfd", "--demos", "d.npz"])
    assert got == IbarzConfig.paper(task, demos="d.npz") == presets.ibarz(IbarzConfig, task, demos="d.npz")
    assert got.out == f"{presets.OUT_ROOTS[DOMAINS[name].backend]}/{task}-dqfd-demos+prefs" \
        + ("-680labels" if name == "classic" else "") + "-seed0"


def test_budgets_seeds_options_and_field_changes_match_the_command_line(parsers):
    assert RunConfig.paper("HalfCheetah", labels=1400, seed=1) == cli(
        parsers, "mujoco", ["--labels", "1400", "--seed", "1"])
    cheetah = RunConfig.paper("HalfCheetah", labels=1400, seed=1)
    assert (cheetah.labels, cheetah.seed, cheetah.total_steps, cheetah.agent) == (1400, 1, 1_000_000, "trpo")
    assert cheetah.out == "runs/mujoco/HalfCheetah-trpo-1400labels-seed1"
    assert RunConfig.paper("Hopper", baseline=True) == cli(parsers, "mujoco", ["--env", "Hopper", "--baseline"])
    assert RunConfig.paper("Hopper", baseline=True).agent_config.ent_coef == 0.0  # A.1: the bonus is for r̂ only
    pong = RunConfig.paper("Pong", 1000, 2, steps=10_000, ablation="random_queries", segment_length=30,
                           ensemble=dict(num_members=5, adaptive_l2=False), teacher={"mistake_rate": 0.1},
                           agent_config=dict(num_envs=2))
    assert pong == cli(parsers, "atari", [
        "--labels", "1000", "--seed", "2", "--steps", "10000", "--ablation", "random_queries", "--segment-length", "30",
        "--ensemble.num-members", "5", "--ensemble.no-adaptive-l2", "--teacher.mistake-rate", "0.1",
        "--agent-config", "num_envs=2"])
    assert (pong.selection, pong.ensemble.num_members, pong.ensemble.adaptive_l2, pong.teacher.mistake_rate,
            pong.agent_config.num_envs, pong.out) == ("random", 5, False, 0.1, 2,
                                                      "runs/atari/Pong-a2c-1000labels-random_queries-seed2")
    assert pong == RunConfig.paper("Pong", 1000, 2, steps=10_000, ablation="random_queries", segment_length=30,
                                   agent_config=dict(num_envs=2), **{"ensemble.num_members": 5,
                                                                     "ensemble.adaptive_l2": False,
                                                                     "teacher.mistake_rate": 0.1})
    human = RunConfig.paper("CartPole-v1", 100, label_source="human", wait_for_initial_labels=False)
    assert human == cli(parsers, "classic", ["--teacher", "human", "--labels", "100", "--no-wait-for-initial-labels"])
    assert human.out == "runs/classic/CartPole-v1-ppo-100labels-human-seed0" and not human.wait_for_initial_labels


def test_cartpoles_oracle_preset_mirrors_and_shows_one_and_a_half_second_clips(parsers):
    """The README job's r̂ is invariant to the track's reflection and fitted to 1.5 s clips, 5 pairs
    a batch (presets.TASK_CHANGES); a flag or a change overrides each, other changes to the ensemble
    keep them, and people's runs keep the task's defaults."""
    readme = cli(parsers, "classic", [])
    assert readme == RunConfig.paper("CartPole-v1") and readme.ensemble.mirror
    assert (readme.segment_length, readme.ensemble.batch_size) == (75, 5)
    assert tasks.TASKS["CartPole-v1"].segment_length == 25  # the task's own clips: 0.5 s at 50 fps
    five = cli(parsers, "classic", ["--ensemble.num-members", "5"])
    assert five.ensemble.mirror and five.ensemble.batch_size == 5 and five.segment_length == 75
    assert not cli(parsers, "classic", ["--ensemble.no-mirror"]).ensemble.mirror
    assert cli(parsers, "classic", ["--segment-length", "25"]).segment_length == 25
    assert cli(parsers, "classic", ["--ensemble.batch-size", "16"]).ensemble.batch_size == 16
    assert not RunConfig.paper("CartPole-v1", ensemble=dict(mirror=False)).ensemble.mirror
    human = cli(parsers, "classic", ["--teacher", "human"])
    assert not human.ensemble.mirror and human.segment_length is None and human.ensemble.batch_size == 16
    assert not RunConfig.paper("Pendulum-v1").ensemble.mirror  # reflections declared, not used
    assert cli(parsers, "classic", ["--env", "Pendulum-v1", "--ensemble.mirror"]).ensemble.mirror


def test_overriding_fields_replace_the_preset_field_they_override(parsers):
    """A.2's count of initial labels would override a fraction given; a fraction given wins (and a
    count of none falls back to the fraction); both at once are refused."""
    pong = cli(parsers, "atari", ["--initial-label-fraction", "0.5"])
    assert (pong.initial_label_fraction, pong.initial_label_count) == (0.5, None)
    assert cli(parsers, "atari", ["--initial-label-count", "none"]).initial_label_count is None
    assert RunConfig.paper("Pong", initial_label_fraction=0.5) == pong
    with pytest.raises(ValueError, match="--initial-label-fraction and --initial-label-count"):
        cli(parsers, "atari", ["--initial-label-fraction", "0.5", "--initial-label-count", "10"])
    with pytest.raises(ValueError, match="--pretrain-steps and --pretrain-epochs"):
        RunConfig.paper("Pong", pretrain_steps=3, pretrain_epochs=1.0)


def test_python_changes_are_checked_like_flags():
    with pytest.raises(ValueError, match="RunConfig has no field 'num_members'"):
        RunConfig.paper("Pong", num_members=5)
    with pytest.raises(ValueError, match="ensemble.num_members must be an int, got 2.5"):
        RunConfig.paper("Pong", ensemble=dict(num_members=2.5))
    with pytest.raises(ValueError, match="total_steps is set by steps="):
        RunConfig.paper("Pong", total_steps=10)
    with pytest.raises(ValueError, match="no_segments ablation is defined for the robotics tasks only"):
        RunConfig.paper("Pong", ablation="no_segments")
    with pytest.raises(ValueError, match="Unknown task|NoSuchTask"):
        RunConfig.paper("NoSuchTask")
    # a whole nested config, then a field of it (the field wins)
    got = with_changes(RunConfig, {}, {"ensemble": EnsembleConfig(num_members=7, batch_size=8),
                                       "ensemble.batch_size": 4})
    assert (got["ensemble"].num_members, got["ensemble"].batch_size) == (7, 4)
    assert RunConfig.paper("Pong", rate_constant=1).rate_constant == 1.0  # conformed: an int for a float


@pytest.mark.parametrize("name", DOMAINS)
def test_every_generated_flag_sets_a_real_field_and_every_field_has_one(parsers, name):
    flags = field_flags(DOMAINS[name])
    assert len({f.name for f in flags}) == len(flags)
    for f in flags:
        assert f.christiano or f.ibarz
        if f.christiano:
            assert type_at(RunConfig, f.christiano) == f.hint
            assert f.name == flag_name(f.christiano)
        if f.ibarz:
            type_at(IbarzConfig, f.ibarz)
        text = "none" if "None" in str(f.hint) else {int: "1", float: "1", str: "x"}.get(f.hint, "()")
        args = parsers[name].parse_args([f.name] if f.hint is bool else [f.name, text])
        assert f.dest in vars(args)
    christiano = {f.christiano for f in flags if f.christiano}
    assert christiano == {p for p, _ in field_paths(RunConfig, skip=NOT_FLAGS)}
    ibarz = {f.ibarz for f in flags if f.ibarz}
    assert ibarz == ({p for p, _ in field_paths(IbarzConfig, skip=NOT_FLAGS)} if DOMAINS[name].offers_dqfd else set())
    assert all(not old.startswith(tuple(f.name for f in flags)) for old in RENAMED)


def _as_text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value) if isinstance(value, (float, tuple)) else str(value)


@pytest.mark.parametrize("name", DOMAINS)
def test_each_flag_given_its_preset_value_changes_nothing(parsers, name):
    """Every flag's value is read in its field's type: the preset's own value, written out, builds
    the preset again (the paired fields aside: giving one clears the other)."""
    preset = RunConfig.paper(DOMAINS[name].default_env)
    paired = ("initial_label_fraction", "pretrain_steps")
    for f in field_flags(DOMAINS[name]):
        if not f.christiano or f.christiano in paired:
            continue
        value = preset
        for part in f.christiano.split("."):
            value = getattr(value, part)
        argv = [flag_name(f.dest, value)] if f.hint is bool else [f"{f.name}={_as_text(value)}"]  # "=": -inf
        assert cli(parsers, name, argv) == preset, argv


def test_flags_of_the_other_protocol_and_old_names_are_refused(parsers, capsys):
    with pytest.raises(ValueError, match="--replay.capacity belong.* add --agent dqfd"):
        cli(parsers, "classic", ["--replay.capacity", "10"])
    with pytest.raises(ValueError, match="--pretrain-epochs --ensemble.num-members belong to Christiano"):
        cli(parsers, "classic", ["--agent", "dqfd", "--demos", "d.npz", "--ensemble.num-members", "2",
                                 "--pretrain-epochs", "3"])
    ibarz = cli(parsers, "classic", ["--env", "Breakout-MinAtar", "--agent", "dqfd", "--demos", "d.npz",
                                     "--initial-label-count", "40", "--replay.capacity", "10", "--num-envs", "2",
                                     "--reward-model.input-noise", "0.2", "--no-checkpoint-replay"])
    assert (ibarz.initial_labels, ibarz.replay.capacity, ibarz.num_envs, ibarz.reward_model.input_noise,
            ibarz.checkpoint_replay) == (40, 10, 2, 0.2, False)
    assert ibarz.reward_model.num_members == 1  # the rest of Ibarz's reward model is untouched
    for old, new in (("--members", "--ensemble.num-members"), ("--initial-labels", "--initial-label-fraction"),
                     ("--no-wait", "--no-wait-for-initial-labels"), ("--mistake-rate", "--teacher.mistake-rate")):
        with pytest.raises(SystemExit):
            parsers["classic"].parse_args([old, "1"])
        assert f"{old} is now {new}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no abbreviations: one name per setting
        parsers["classic"].parse_args(["--segment", "3"])
    capsys.readouterr()


def test_resume_refuses_generated_flags(tmp_path, capsys):
    assert classic.main(["--resume", str(tmp_path), "--ensemble.no-bootstrap", "--segment-length", "none"]) == 2
    assert "drop --ensemble.no-bootstrap --segment-length" in capsys.readouterr().err


def test_help_reads_every_field_comment(capsys):
    for domain in DOMAINS.values():
        with pytest.raises(SystemExit):
            build_parser(domain).parse_args(["--help"])
        text = capsys.readouterr().out
        assert "--ensemble.num-members" in text and "an ensemble of 3 predictors" in text
        assert ("--replay.capacity" in text) == domain.offers_dqfd
    assert dataclasses.is_dataclass(IbarzConfig)


def test_the_cartpole_agent_keeps_its_step_size_to_the_last_update():
    """r̂ changes until a preference run's last iteration, so the README job's PPO does not anneal
    its learning rate to zero (BUILD_NOTES: 40 of 128 seeds reach >= 475 against 21 annealed); both
    arms run the same agent.  A task without a preset keeps the annealed default."""
    from rlhp_jax.agents.ppo import PPO
    from rlhp_jax.envs import make_env

    spec = lambda task: make_env(task, 1).spec
    for baseline in (False, True):
        cfg = RunConfig.paper("CartPole-v1", baseline=baseline)
        agent = PPO(spec("CartPole-v1"), cfg.agent_config, total_updates=30)
        assert not callable(agent._lr) and agent._lr == cfg.agent_config.lr
    acrobot = RunConfig.paper("Acrobot-v1").agent_config
    assert callable(PPO(spec("Acrobot-v1"), acrobot, total_updates=30)._lr)
