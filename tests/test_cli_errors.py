"""Bad input on the training and demo command lines: one line saying what is wrong, exit status 2,
and no file created or changed.

* ``--agent-config`` values of the wrong kind or out of range, refused by the agent configs
  themselves before the run directory exists;
* ``python -m rlhp_jax.demos_cli info`` on files that are not demo files;
* property-based: corrupted demo files (``rlhp_jax.demos.read_demos``) give a ``DemoError`` or a
  usable demo set, and corrupted ``config.json`` files of runs (``--resume``) give ``error: ...``,
  never a traceback and never a changed file.
* ``python -m experiments.bench_cnn`` with counts below one: one line, exit status 2.
* the training entry points, run as scripts, exit with that status through ``cli.exit_script``.

Everything runs in-process except a few subprocess checks of the real entry points; nothing here
trains or compiles (a corrupted config that the CLI accepted would fail the test instead of training).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from experiments import classic
from experiments.cli import build_parser, config_from_args, ibarz_config_from_args
from rlhp_jax import demos as D
from rlhp_jax import demos_cli
from rlhp_jax.agents.ppo import PPOConfig
from rlhp_jax.config import IbarzConfig, RunConfig, config_to_json
from rlhp_jax.config_fields import ADDED_FIELDS
from rlhp_jax.refusal import refuse

REPO = Path(__file__).resolve().parents[1]


def error_line(err: str) -> str:
    """The one line a refused command printed on stderr (fails if there is anything else)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under ``root`` with its content hash and modification time, and every directory."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_dir():
            out[rel] = ("dir",)
        else:
            out[rel] = (hashlib.sha1(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


# ------------------------------------------------------------------ --agent-config
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--agent-config", "lr=[1,2]"], "lr must be a float, got [1, 2]"),
        (["--agent-config", "hidden_sizes=5"], "hidden_sizes must be a tuple of ints, got 5"),
        (["--agent-config", "hidden_sizes=(64, 0)"], "hidden_sizes must hold widths of at least 1"),
        (["--agent-config", "activation=nosuch"], "activation must be one of"),
        (["--agent-config", "num_minibatches=0"], "num_minibatches must be at least 1, got 0"),
        (["--agent-config", "num_minibatches=3"], "num_minibatches (3) must divide the batch"),
        (["--agent-config", "lr=1e999"], "lr must be finite"),
        (["--agent-config", "gamma=1.5"], "gamma must be in [0, 1]"),
        (["--agent-config", "anneal_lr=2"], "anneal_lr must be True or False"),
        (["--agent-config", "lr=("], "--agent-config lr: cannot parse"),
        (["--agent", "a2c", "--agent-config", "num_envs=-1"], "num_envs must be at least 1"),
        (["--agent", "trpo", "--agent-config", "max_kl=0"], "max_kl must be > 0"),
        (["--agent", "dqfd", "--demos", "x.npz", "--agent-config", "batch_size=[32]"], "batch_size must be an int"),
        # CartPole's 75-step clips do not fit rollouts of 32 steps (8 environments: 256 steps a batch)
        (["--agent-config", "num_steps=32"], "give --iteration-steps 768 or more, or a shorter --segment-length"),
    ],
)
def test_bad_agent_config_is_one_line_and_makes_no_directory(argv, message, capsys, tmp_path):
    rc = classic.main(argv + ["--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    assert message in error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("below", [False, True])
def test_an_out_that_is_a_file_is_refused_naming_it(below, capsys, tmp_path, no_training):
    """``--out FILE`` (or a path below a file) is one line naming the file, not the OS's errno from
    inside the checkpointer; the file is left as it was."""
    from rlhp_jax.refusal import check_out_directory

    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    out = blocker / "run" if below else blocker
    assert classic.main(["--out", str(out), "--no-progress"]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"--out {out}" in line and "not a directory" in line and (not below or f"below {blocker}" in line)
    assert blocker.read_text() == "mine" and sorted(tmp_path.iterdir()) == [blocker]
    with pytest.raises(ValueError, match="not a directory"):
        check_out_directory(out)
    check_out_directory(tmp_path / "new" / "run")  # a path yet to be made is fine



def test_a_data_file_below_a_file_is_refused_before_any_work(capsys, tmp_path):
    """A data file's ``--out`` below an existing file (``notes.txt/demo.npz``) is refused with the
    other checks of its path, before anything is recorded or rendered: it used to pass them and
    fail only when the file was written (the render command with a traceback; a demo recording,
    perhaps an hour of a person's play, was lost at its save)."""
    from rlhp_jax.human.__main__ import main as human
    from rlhp_jax.human.store import LabelStore
    from rlhp_jax.refusal import check_new_file
    from rlhp_jax.render.__main__ import main as render

    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    LabelStore(tmp_path / "run").close()
    before = snapshot(tmp_path)
    for argv, run in ((["--env", "CartPole-v1", "--steps", "2", "--out", str(blocker / "clip.mp4")], render),
                      (["record", "--run", str(tmp_path / "run"), "--out", str(blocker / "d.npz")], demos_cli.main),
                      (["export", "--run", str(tmp_path / "run"), "--out", str(blocker / "x" / "l.jsonl")], human)):
        assert run(argv) == 2
        assert f"lies below {blocker}, which is a file" in error_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match=f"--out {blocker}/d.npz lies below {blocker}, which is a file"):
        D.new_demo_path(blocker / "d")  # what the play page and the MinAtar demonstrator record into
    assert snapshot(tmp_path) == before
    assert check_new_file(tmp_path / "new" / "d.npz", False) == tmp_path / "new" / "d.npz"  # a folder yet to be made

def test_agent_config_overrides_reach_the_dqfd_agent(tmp_path):
    args = build_parser(classic.DOMAIN).parse_args(["--agent", "dqfd", "--demos", "x.npz", "--agent-config",
                                                    "lr=1e-4", "hidden_sizes=[32]", "--out", str(tmp_path)])
    cfg = ibarz_config_from_args(args, classic.DOMAIN)
    assert cfg.agent_config.lr == 1e-4 and cfg.agent_config.hidden_sizes == (32,)


def test_agent_config_fields_take_their_declared_types():
    cfg = PPOConfig(lr=1, hidden_sizes=[32, 16], num_envs=np.int64(4))
    assert type(cfg.lr) is float and cfg.hidden_sizes == (32, 16) and type(cfg.num_envs) is int
    with pytest.raises(ValueError, match="update_epochs must be an int, got 2.5"):
        PPOConfig(update_epochs=2.5)


# ------------------------------------------------------------------ demo files
def small_demos(path: Path, stack: int = 1) -> Path:
    """A valid demo file built without any environment: two episodes of random frames
    (``stack`` > 1: uint8 frames stacked like Atari's, each new observation adding one frame)."""
    rng = np.random.default_rng(stack)
    if stack == 1:
        fmt = D.FrameFormat(env="Breakout-MinAtar", obs_shape=(4, 4, 2), frame_shape=(4, 4, 2), stack=1,
                            obs_dtype="float32", num_actions=3, mask_sha1="none")
    else:
        fmt = D.FrameFormat(env="Pong", obs_shape=(6, 6, stack), frame_shape=(6, 6), stack=stack,
                            obs_dtype="uint8", num_actions=6, mask_sha1="0" * 40)
    rec = D.DemoRecorder(fmt, source="test", fps=15.0)
    for length in (5, 3):
        obs = None
        for t in range(length):
            if stack == 1:
                obs = rng.random(fmt.obs_shape, np.float32)
            else:
                new = rng.integers(0, 255, (*fmt.frame_shape, 1), np.uint8)
                obs = np.repeat(new, stack, -1) if obs is None else np.concatenate([obs[..., 1:], new], -1)
            rec.add(obs, t % fmt.num_actions, float(t))
        rec.end_episode()
    return rec.save(path)


def rewrite(src: Path, dst: Path, meta=None, drop=(), **arrays) -> Path:
    """``src`` with meta fields changed (``meta``: a dict of changes, or the raw text for the record),
    arrays dropped or replaced."""
    with np.load(src) as z:
        data = {k: z[k] for k in z.files}
    if isinstance(meta, dict):
        record = json.loads(str(data["meta"]))
        for k, v in meta.items():
            if v is DROP:
                record.pop(k)
            else:
                record[k] = v
        data["meta"] = np.asarray(json.dumps(record))
    elif meta is not None:
        data["meta"] = np.asarray(meta)
    for k in drop:
        data.pop(k)
    data.update(arrays)
    return D.save_arrays(dst, data)


DROP = object()


@pytest.mark.parametrize("kind", ["npy", "no_stack", "meta_list"])
def test_demos_info_refuses_a_file_that_is_not_a_demo_set(kind, tmp_path, capsys):
    good = small_demos(tmp_path / "good.npz")
    if kind == "npy":
        path = tmp_path / "array.npy"
        np.save(path, np.zeros(3))
    elif kind == "no_stack":
        path = rewrite(good, tmp_path / "no_stack.npz", meta={"stack": DROP})
    else:
        path = rewrite(good, tmp_path / "meta_list.npz", meta="[1, 2, 3]")
    before = snapshot(tmp_path)
    assert demos_cli.main(["info", str(path)]) == 2
    assert str(path) in error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before


META_FIELDS = ["format", "env", "obs_shape", "frame_shape", "stack", "obs_dtype", "num_actions", "mask_sha1",
               "source", "fps", "created"]
ARRAYS = ["meta", "frames", "obs_frame", "actions", "rewards", "episode_lengths"]
ODD_VALUES = ["x", -1, 0, 1, 2, 2.5, None, [], [1, -2], [4, 4, 2], {"a": 1}, True, 10**12, "uint8", "float32"]


@st.composite
def demo_corruption(draw):
    """A description of one way to damage a demo file: (kind, arguments)."""
    kind = draw(st.sampled_from(["truncate", "flip", "meta_drop", "meta_set", "meta_text", "array_drop",
                                 "array_dtype", "array_shape", "foreign"]))
    if kind == "truncate":
        return kind, draw(st.floats(0.0, 0.999))
    if kind == "flip":
        return kind, draw(st.lists(st.tuples(st.floats(0.0, 0.999), st.integers(1, 255)), min_size=1, max_size=4))
    if kind == "meta_drop":
        return kind, draw(st.sampled_from(META_FIELDS))
    if kind == "meta_set":
        return kind, (draw(st.sampled_from(META_FIELDS)), draw(st.sampled_from(ODD_VALUES)))
    if kind == "meta_text":
        return kind, draw(st.sampled_from(["[1, 2]", "5", '"text"', "null", "{not json", ""]))
    if kind == "array_drop":
        return kind, draw(st.sampled_from(ARRAYS))
    if kind == "array_dtype":
        dtypes = ["float32", "float64", "int8", "uint8", "int64", "bool", "U3", "complex64"]
        return kind, (draw(st.sampled_from(ARRAYS)), draw(st.sampled_from(dtypes)))
    if kind == "array_shape":
        return kind, (draw(st.sampled_from(ARRAYS)), draw(st.sampled_from(["2d", "empty", "longer", "scalar"])))
    return kind, draw(st.sampled_from(["npy", "random", "text", "empty", "other_npz", "json"]))


def damage(good: Path, path: Path, how) -> None:
    kind, arg = how
    raw = good.read_bytes()
    if kind == "truncate":
        path.write_bytes(raw[: int(len(raw) * arg)])
    elif kind == "flip":
        data = bytearray(raw)
        for where, xor in arg:
            data[int(len(data) * where)] ^= xor
        path.write_bytes(bytes(data))
    elif kind == "meta_drop":
        rewrite(good, path, meta={arg: DROP})
    elif kind == "meta_set":
        rewrite(good, path, meta={arg[0]: arg[1]})
    elif kind == "meta_text":
        rewrite(good, path, meta=arg)
    elif kind == "array_drop":
        rewrite(good, path, drop=[arg])
    else:
        with np.load(good) as z:
            data = {k: z[k] for k in z.files}
        if kind == "array_dtype":
            name, dtype = arg
            if name in data:
                try:
                    data[name] = data[name].astype(dtype)
                except ValueError:  # text that is no number: an array of the same shape instead
                    data[name] = np.zeros(data[name].shape, dtype)
        elif kind == "array_shape":
            name, shape = arg
            if name in data:
                x = data[name]
                data[name] = {"2d": x.reshape(1, *x.shape) if x.ndim else x.reshape(1, 1),
                              "empty": x.reshape(-1)[:0], "scalar": x.reshape(-1)[:1].reshape(()),
                              "longer": np.concatenate([x.reshape(-1), x.reshape(-1)[:1]])}[shape]
        elif arg == "npy":
            np.save(path.with_suffix(".npy"), np.zeros((2, 3)))
            os.replace(path.with_suffix(".npy"), path)
            return
        elif arg == "random":
            path.write_bytes(np.random.default_rng(len(raw)).bytes(300))
            return
        elif arg == "text":
            path.write_text("frames, actions\n1, 2\n")
            return
        elif arg == "empty":
            path.write_bytes(b"")
            return
        elif arg == "json":
            path.write_text(json.dumps({"meta": {}}))
            return
        else:
            data = dict(x=np.zeros(3))
        D.save_arrays(path, data)


def usable(demos: D.Demos) -> None:
    """What a read demo set must support: the info summary, every observation, clips, a subset."""
    json.dumps(D.describe(demos), ensure_ascii=False)
    obs = demos.obs(np.arange(demos.num_steps))
    assert obs.shape == (demos.num_steps, *demos.meta["obs_shape"])
    clips = demos.segments(np.random.default_rng(0), 2, 1)
    assert clips["obs"].shape == (2, 1, *demos.meta["obs_shape"])
    demos.subset(0.5)


@pytest.fixture(scope="module")
def good_demo_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("good_demos")
    return [small_demos(root / "flat.npz"), small_demos(root / "stacked.npz", stack=4)]


def test_the_small_demo_files_are_valid(good_demo_files):
    for path in good_demo_files:
        usable(D.read_demos(path))


@given(base=st.integers(0, 1), how=demo_corruption())
@settings(max_examples=100)
def test_a_damaged_demo_file_gives_a_demo_error_or_a_usable_set(base, how, good_demo_files, tmp_path):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / "demos.npz"
    damage(good_demo_files[base], path, how)
    before = snapshot(folder)
    try:
        demos = D.read_demos(path)
    except D.DemoError as e:
        message = str(e)
        assert "\n" not in message and str(path) in message, message
    else:
        usable(demos)
    assert snapshot(folder) == before


# ------------------------------------------------------------------ config.json of --resume
def christiano_config(out: Path) -> dict:
    args = build_parser(classic.DOMAIN).parse_args(["--env", "CartPole-v1", "--labels", "20", "--steps", "4096",
                                                    "--out", str(out)])
    return config_to_json(config_from_args(args, classic.DOMAIN))


@pytest.fixture(scope="module")
def minatar_demo_file(tmp_path_factory) -> Path:
    """Demos that fit Breakout-MinAtar (random frames of its format: nothing is stepped or compiled),
    so that an Ibarz config the CLI accepted would get as far as training."""
    from rlhp_jax.envs import make_env

    fmt = D.frame_format(make_env("Breakout-MinAtar", 1))
    rec = D.DemoRecorder(fmt, source="test")
    rng = np.random.default_rng(0)
    for t in range(40):
        rec.add((rng.random(fmt.obs_shape) < 0.1).astype(np.float32), t % fmt.num_actions, 0.0)
    return rec.save(tmp_path_factory.mktemp("minatar") / "demos.npz")


def ibarz_config(out: Path, demos: Path) -> dict:
    args = build_parser(classic.DOMAIN).parse_args(["--env", "Breakout-MinAtar", "--agent", "dqfd", "--demos",
                                                    str(demos), "--out", str(out)])
    return config_to_json(ibarz_config_from_args(args, classic.DOMAIN))


def field_types(cls, nested: dict, prefix=()) -> list[tuple[tuple, object]]:
    """(path, declared type) of every field of a config, nested configs included (``nested``: the
    class of fields declared ``Any``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = nested.get(f.name, hints[f.name])
        out.append((prefix + (f.name,), hint))
        if dataclasses.is_dataclass(hint):
            out += field_types(hint, {}, prefix + (f.name,))
    return out


def required_paths(cls, nested: dict, prefix=()) -> list[tuple]:
    """The paths of ``field_types`` whose absence makes a config.json unusable: every field but those
    added later with the value older runs had (``config_fields.ADDED_FIELDS``: a file without one is
    an older run's, and reads; ``tests/test_transition_reward.py`` checks that)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = nested.get(f.name, hints[f.name])
        if (cls.__name__, f.name) not in ADDED_FIELDS:
            out.append(prefix + (f.name,))
        if dataclasses.is_dataclass(hint):
            out += required_paths(hint, {}, prefix + (f.name,))
    return out


def accepts(hint, value) -> bool:
    """Whether JSON ``value`` has the kind a field of type ``hint`` holds (values, not ranges)."""
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict) or (hint is PPOConfig and value is None)  # RunConfig.agent_config: null
    args = typing.get_args(hint)
    if type(None) in args:
        return value is None or accepts(next(a for a in args if a is not type(None)), value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return isinstance(value, list)  # tuples


WRONG = ["x", 2.5, True, None, [1, 2], {"a": 1}, 7]
PROTOCOLS = {"christiano": (RunConfig, {"agent_config": PPOConfig}), "ibarz": (IbarzConfig, {})}


@st.composite
def config_corruption(draw, protocol: str):
    """(kind, argument) of one way to damage a run's config.json; every one makes it unusable."""
    cls, nested = PROTOCOLS[protocol]
    fields = field_types(cls, nested)
    kind = draw(st.sampled_from(["drop", "wrong_type", "unknown_name", "cut", "not_utf8", "not_object"]))
    if kind == "drop":
        return kind, draw(st.sampled_from(required_paths(cls, nested)))
    if kind == "wrong_type":
        path, hint = draw(st.sampled_from(fields))
        return kind, (path, draw(st.sampled_from([v for v in WRONG if not accepts(hint, v)])))
    if kind == "unknown_name":
        return kind, draw(st.sampled_from([("env", "NoSuchEnv-v0"), ("agent", "nosuch"), ("protocol", "nosuch")]
                                          if protocol == "christiano" else
                                          [("env", "NoSuchEnv-v0"), ("setup", "nosuch"), ("protocol", "nosuch")]))
    if kind in ("cut", "not_utf8"):
        return kind, draw(st.floats(0.0, 0.999))
    return kind, draw(st.sampled_from([[1, 2], 5, "text", None]))


def corrupted(config: dict, how) -> bytes:
    kind, arg = how
    text = json.dumps(config, indent=2)
    if kind == "cut":
        return text[: int(len(text) * arg)].encode()
    if kind == "not_utf8":
        raw = text.encode()
        at = int(len(raw) * arg)
        return raw[:at] + b"\xff\xfe" + raw[at:]
    if kind == "not_object":
        return json.dumps(arg).encode()
    config = json.loads(text)
    if kind == "unknown_name":
        config[arg[0]] = arg[1]
    else:
        path = arg if kind == "drop" else arg[0]
        holder = config
        for k in path[:-1]:
            holder = holder[k]
        if kind == "drop":
            del holder[path[-1]]
        else:
            holder[path[-1]] = arg[1]
    return json.dumps(config, indent=2).encode()


@pytest.fixture
def no_training(monkeypatch):
    """A config the CLI accepted would start training: fail the test instead."""
    from rlhp_jax import driver, ibarz

    def refuse(self):
        raise AssertionError("a corrupted config.json was accepted")

    monkeypatch.setattr(driver.PreferenceRun, "run", refuse)
    monkeypatch.setattr(ibarz.IbarzRun, "run", refuse)


def resume_refused(config: dict, how, root: Path, capsys) -> None:
    run = Path(tempfile.mkdtemp(dir=root))
    (run / "config.json").write_bytes(corrupted(config, how))
    (run / "metrics.jsonl").write_text('{"iteration": 1, "env_steps": 2048}\n')
    before = snapshot(run)
    assert classic.main(["--resume", str(run), "--no-progress"]) == 2
    error_line(capsys.readouterr().err)
    assert snapshot(run) == before


@given(data=st.data())
@settings(max_examples=40)
def test_a_corrupted_christiano_config_json_is_refused_in_one_line(data, tmp_path, capsys, no_training):
    resume_refused(christiano_config(tmp_path), data.draw(config_corruption("christiano")), tmp_path, capsys)


@given(data=st.data())
@settings(max_examples=30)
def test_a_corrupted_ibarz_config_json_is_refused_in_one_line(data, tmp_path, capsys, no_training,
                                                             minatar_demo_file):
    resume_refused(ibarz_config(tmp_path, minatar_demo_file), data.draw(config_corruption("ibarz")), tmp_path,
                   capsys)


def test_every_field_of_a_saved_config_is_required(tmp_path, capsys, no_training):
    """A config.json written by another version (a field missing) is refused, not filled in with
    today's defaults: the resumed run would not be the run that was started."""
    resume_refused(christiano_config(tmp_path), ("drop", ("labels",)), tmp_path, capsys)
    resume_refused(christiano_config(tmp_path), ("drop", ("agent_config", "lr")), tmp_path, capsys)


# ------------------------------------------------------------------ the real entry points
def test_every_command_refuses_through_one_function():
    """One home for how a command refuses its input (``rlhp_jax.refusal.refuse``): no module prints
    an ``error: …`` line of its own, so the format and the exit status cannot drift apart."""
    own = re.compile(r"""print\(\s*f?["']error: """)
    offenders = [f"{path.relative_to(REPO)}:{n}" for folder in ("rlhp_jax", "experiments")
                 for path in sorted((REPO / folder).rglob("*.py")) if path.name != "refusal.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if own.search(line) and "status['error']" not in line]  # the play session's own outcome, exit 1
    assert offenders == []


def test_refuse_prints_one_line_on_stderr_and_gives_2(capsys):
    assert refuse(ValueError("--labels must be at least 1")) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == "error: --labels must be at least 1\n"


def test_entry_points_print_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes(b"\xff\xfe{}")
    np.save(tmp_path / "array.npy", np.zeros(3))
    before = snapshot(tmp_path)
    for cmd in ([sys.executable, "-m", "experiments.classic", "--resume", str(run), "--no-progress"],
                [sys.executable, "-m", "rlhp_jax.demos_cli", "info", str(tmp_path / "array.npy")]):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        error_line(proc.stderr)
    assert snapshot(tmp_path) == before


HOLD = """import sys, time
from rlhp_jax.runs import claimed
with claimed(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_directory_in_use_is_refused_until_its_holder_dies(tmp_path, capsys):
    """Two processes never write one run directory: while another process holds it (a run training
    there), a run and a sweep given it are refused in one line and write nothing there; once that
    process is killed (SIGKILL: no clean-up of its own) the directory is free again, and no lock
    file is left in it."""
    from experiments import sweep
    from rlhp_jax.runs import claimed

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(tmp_path)
        assert classic.main(["--env", "CartPole-v1", "--out", str(out), "--no-progress"]) == 2
        assert "in use by another process" in error_line(capsys.readouterr().err)
        with pytest.raises(ValueError, match=f"{out} is in use by another process.*choose another --out"):
            sweep.run(["--env", "CartPole-v1", "--seeds", "1", "--out", str(out), "--no-progress"])
        assert snapshot(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    with claimed(out):  # the kernel dropped the killed holder's lock
        with claimed(out):  # and a process may nest its own claims (a command, then its driver)
            assert list(out.iterdir()) == []


def test_a_fresh_run_or_sweep_never_writes_over_the_others_files(tmp_path, capsys):
    """A run started fresh in a sweep's directory would have replaced its config.json and emptied
    its metrics.jsonl (it had no checkpoints, so nothing refused it), a sweep in the directory of a
    run killed mid-way would have done the same to the run, and --resume of a sweep's directory
    trained a run into it: all three are refused, every byte kept."""
    from experiments import sweep

    swept = tmp_path / "sweep"
    swept.mkdir()
    run_fields = config_to_json(RunConfig.paper("CartPole-v1"))  # a sweep's config.json is a run's, and its flags
    (swept / "config.json").write_text(json.dumps(dict(run_fields, sweep={"seeds": 8})))
    (swept / "metrics.jsonl").write_text('{"seed": 0, "iteration": 1}\n')
    (swept / "summary.json").write_text("{}")
    killed = tmp_path / "run"
    (killed / "checkpoints").mkdir(parents=True)
    (killed / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    before = snapshot(tmp_path)
    assert classic.main(["--env", "CartPole-v1", "--out", str(swept), "--no-progress"]) == 2
    assert (f"{swept} already holds another run's or a sweep's config.json and metrics.jsonl and summary.json: "
            "choose another --out") in error_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match="holds a training run .*, not a sweep: choose another --out"):
        sweep.run(["--env", "CartPole-v1", "--seeds", "1", "--out", str(killed), "--no-progress"])
    # nor is a sweep "resumed" as a run: its config.json holds a run's fields, so --resume trained into it
    assert classic.main(["--resume", str(swept), "--no-progress"]) == 2
    assert f"{swept} is a sweep's directory (python -m experiments.sweep), not a run's" in error_line(
        capsys.readouterr().err)
    from rlhp_jax.human.__main__ import main as human

    assert human(["stats", "--run", str(swept)]) == 2  # and no label store is made in it
    assert "is not a run directory" in error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before


def test_a_killed_sweep_runs_again_only_with_its_own_settings(tmp_path, capsys, monkeypatch):
    """A killed sweep's directory was taken over by any later sweep, of any settings, without a word
    (its config.json rewritten from --seeds 2 --labels 20 to --seeds 5 --labels 40).  Its own command
    (how it runs aside: --no-progress, --pass-at, devices) runs it again and says so; others are refused."""
    from experiments import sweep

    class Killed(Exception):
        pass

    def killed(*a, **k):
        raise Killed

    monkeypatch.setattr("rlhp_jax.compiled.CompiledRun", killed)
    out = tmp_path / "sweep"
    argv = ["--env", "CartPole-v1", "--seeds", "2", "--labels", "20", "--out", str(out)]
    with pytest.raises(Killed):
        sweep.run(argv)
    config = (out / "config.json").read_text()
    for other in (["--seeds", "5"], ["--labels", "40"], ["--first-seed", "3"], ["--ensemble.num-members", "5"]):
        changed = argv + other
        with pytest.raises(ValueError, match="holds a killed sweep of other settings .*choose another --out"):
            sweep.run(changed)
        assert (out / "config.json").read_text() == config
    capsys.readouterr()
    with pytest.raises(Killed):
        sweep.run(argv + ["--no-progress", "--pass-at", "100"])
    assert "holds this sweep, killed before it ended" in capsys.readouterr().out


@pytest.mark.parametrize("held", ["metrics.jsonl", "metrics.csv"])
def test_a_fresh_run_or_sweep_keeps_a_folder_s_metrics_files(tmp_path, capsys, monkeypatch, held):
    """A folder that is no run's and no sweep's but holds a metrics.jsonl or metrics.csv (copied
    there for analysis, another tool's): a sweep given it as --out truncated the metrics.jsonl
    as it started (it only looked for a config.json or summary.json), and a run (or a sweep)
    replaced the metrics.csv when it ended.  Both are refused, every byte kept."""
    from experiments import sweep

    folder = tmp_path / "analysis"
    folder.mkdir()
    (folder / held).write_text("someone's rows\n")
    (folder / "notes.md").write_text("mine")
    monkeypatch.setattr("rlhp_jax.compiled.CompiledRun", lambda *a, **k: pytest.fail("the sweep started"))
    before = snapshot(tmp_path)
    assert classic.main(["--env", "CartPole-v1", "--out", str(folder), "--no-progress"]) == 2
    assert f"{folder} already holds another run's or a sweep's {held}" in error_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match=f"{held}.*choose another --out"):
        sweep.run(["--env", "CartPole-v1", "--seeds", "1", "--out", str(folder), "--no-progress"])
    assert snapshot(tmp_path) == before

@pytest.mark.parametrize("argv, message", [(["--members", "1", "0"], "--members must be at least 1"),
                                           (["--steps", "0"], "--steps must be at least 1"),
                                           (["--repeats", "-2"], "--repeats must be at least 1"),
                                           (["--torch-seconds", "0"], "--torch-seconds must be positive")])
def test_the_cnn_benchmark_refuses_counts_below_one(argv, message, capsys):
    from experiments import bench_cnn

    with pytest.raises(SystemExit) as exit_:
        bench_cnn.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("module", ["classic", "atari", "mujoco"])
def test_the_training_entry_points_leave_through_exit_script(module, tmp_path):
    """Run as scripts, they exit with main()'s status through ``cli.exit_script``: the objects
    alive at the end are frozen (the interpreter's last collections skip them), and the exit
    handlers still run.  A ``sitecustomize`` on the path reports both from an exit handler."""
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0, flush=True))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", "--env", "Nope"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Unknown environment 'Nope'" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "frozen at exit: True"


def _entry_points():
    import pkgutil

    import experiments

    return sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if m.name not in ("cli", "figures", "grid"))


@pytest.mark.parametrize("name", _entry_points())
def test_every_entry_point_prints_its_help(name, capsys):
    """``--help`` of every ``python -m experiments.X``: ``reproduce_ibarz``'s crashed with a
    ``TypeError`` (a setup's name, ``20%demos+prefs``, read as a %-format by argparse)."""
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"experiments.{name}").main(["--help"])
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage:")
