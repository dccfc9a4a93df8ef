"""Shared test configuration.

* A hypothesis profile with no deadline (the first example of a property test may compile a
  JAX function) and few, derandomized examples, so every run draws the same examples.
* Child processes (CLIs, killed trainers, writers) import this checkout's ``rlhp_jax`` whether or
  not it is pip-installed: the repository root goes first on their ``PYTHONPATH``.
* Session-scoped, jitted functions for the preference-learning core, so each of them is
  compiled once however many tests use it.  Tests keep their array shapes fixed (see the
  constants below) so the compiled functions are reused.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

# XLA:CPU options that cut compile time about in half for the MLP and by ~3x for the CNN
# (measured on the 2-core CI box) with no measurable loss of speed on these small programs.
# Compilation dominates the suite's run time.  (Level 0 compiles a little faster still but
# runs several times slower.)  Set in XLA_FLAGS before JAX starts, so that every program of the
# suite gets them: the workers' own, the entry points a test runs in-process, and every child
# process a test starts (they inherit the environment).  A user's own XLA_FLAGS come first and
# are kept.  (test_experiments.py alone: 85.6 s -> 75.4 s, 2026-11-26.)
#
# XLA:CPU's newer fusion emitters are off as well (``xla_cpu_use_fusion_emitters``): the older
# per-fusion code generation compiles the same programs in ~40 % less time (a tiny CartPole run's
# 40 programs 16.7-17.7 s -> 9.8-11.0 s, a tiny Pong run's 50 programs 13.3 -> 7.9 s; the same
# returns to the last digit; 2026-11-26, 2-core Xeon), and compilation is ~40 % of the suite's CPU time.
# The options are the entry points' own for their quick programs (``compile_cache.QUICK_COMPILE``:
# programs that run once); here every program gets them.
from rlhp_jax.compile_cache import QUICK_COMPILE as FAST_COMPILE  # noqa: E402  (imports no JAX)

_flags = os.environ.get("XLA_FLAGS", "").split()  # a pytest-xdist worker inherits its controller's
os.environ["XLA_FLAGS"] = " ".join([*_flags, *(flag for flag in (f"--{k}={str(v).lower()}" for k, v in FAST_COMPILE.items())
                                               if flag not in _flags)])

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from rlhp_jax import compile_cache
from rlhp_jax import labels as labels_lib
from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
from rlhp_jax.metrics import read_jsonl
from rlhp_jax.reward_models import RewardModelSpec

# Ctrl-C for the CLIs a test stops with SIGINT (label and play servers): a suite started in the
# background of a non-interactive shell inherits SIGINT ignored, and every child would inherit that
# too, so the servers would never see the test's SIGINT and hang until its timeout.  A handler here
# (not SIG_IGN) is reset to the default in each child at exec, where Python turns it into
# KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)

_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

# JAX's persistent compilation cache (rlhp_jax/compile_cache.py) in a directory of this session,
# shared by this process, the pytest-xdist workers it starts (they inherit the variable) and every
# CLI a test starts: the same program built by two tests, two workers or two child processes
# compiles once.  Never the user's cache: the suite starts cold and leaves nothing.  Only the
# process that made the directory removes it.
_CACHE = os.environ.get(_SUITE_CACHE := "RLHP_JAX_TEST_SUITE_CACHE")
if _CACHE is None or not os.path.isdir(_CACHE):
    _CACHE = tempfile.mkdtemp(prefix="rlhp_jax_test_cache_")
    os.environ[_SUITE_CACHE] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ[compile_cache.ENV] = _CACHE
compile_cache.enable(_CACHE)

# Under pytest-xdist (the README's ``-n auto``; ``--dist loadfile --no-loadscope-reorder`` in
# pyproject.toml) each file runs whole on one worker, in the order collected: the slowest files go
# first so the workers end together instead of one finishing a long file alone.  Seconds of each
# file in one process on the 2-core CPU (2026-11-25, ``--durations=0``); files not listed follow in
# name order.  A stale figure costs balance, never a test.
SLOW_FILES = {"test_ibarz.py": 258, "test_compiled.py": 252, "test_experiments.py": 121, "test_ibarz_human.py": 99,
              "test_human_loop.py": 94, "test_ensemble.py": 60, "test_reproduce_atari.py": 60, "test_queries.py": 45,
              "test_trpo.py": 46, "test_ppo.py": 41, "test_compile_cache.py": 40, "test_reproduce_ibarz.py": 34,
              "test_demos.py": 33, "test_human_cli.py": 33, "test_driver.py": 29, "test_falls.py": 28,
              "test_checkpoint.py": 27, "test_human_browser.py": 27, "test_atari_fidelity.py": 25}


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -SLOW_FILES.get(item.path.name, 0))  # stable: within a file, its own order


def pytest_sessionfinish(session):
    """One garbage collection, then freeze what is left.  At its end pytest collects five times more
    (to surface exceptions raised in finalizers); over a worker's heap of JAX objects each pass
    took ~1 s, so a worker was still collecting 5 s after xdist asked it to stop, and execnet then
    sent it a SIGINT (the ``KeyboardInterrupt`` in hypothesis's GC callback that ended some runs).
    The collection here still finds every garbage cycle the tests left; frozen survivors are only
    skipped by the passes after it."""
    import gc

    gc.collect()
    gc.freeze()


settings.register_profile(
    "rlhp",
    deadline=None,
    max_examples=30,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("rlhp")


# --------------------------------------------------------------------- a finished run's outputs
def run_outputs_ok(out: Path, iterations: int):
    """A finished run's directory holds what every entry point writes: one metrics row per
    iteration (JSON lines and CSV), the learning curve, TensorBoard events, the last iteration's
    checkpoint and the summary.  Returns (metrics rows, summary)."""
    from rlhp_jax.checkpoint import Checkpointer  # orbax: 0.26 s more to import, only where used

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(1, iterations + 1))
    assert (out / "metrics.csv").read_text().startswith("iteration,env_steps")
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert Checkpointer(out / "checkpoints").latest_step() == iterations
    summary = json.loads((out / "summary.json").read_text())
    return rows, summary


@pytest.fixture
def kept_compiles(monkeypatch):
    """The names of the programs ``compile_cache.jit`` compiles during the test, in order (the ones
    it loads from the cache are not listed)."""
    names, compile_ = [], compile_cache._compile
    monkeypatch.setattr(compile_cache, "_compile", lambda traced, *a: names.append(traced.fun_name) or compile_(traced, *a))
    return names


# --------------------------------------------------------------------- the small MLP problem
# obs in R^3, 2 discrete actions, clips of 5 steps, a buffer of 256 labels.  Every MLP
# ensemble test uses exactly these shapes.
OBS_DIM = 3
NUM_ACTIONS = 2
SEGMENT_LENGTH = 5
CAPACITY = 256
MLP_SPEC = RewardModelSpec("mlp", (OBS_DIM,), (), "int32", NUM_ACTIONS, True)
TRUE_W = np.array([1.0, -0.5, 0.3], np.float32)
ACTION_BONUS = np.array([0.0, 0.5], np.float32)


def true_reward(obs, action):
    """The known reward the learning tests recover: linear in obs plus an action bonus."""
    return obs @ TRUE_W + ACTION_BONUS[action]


def random_pairs(seed, num_pairs, length=SEGMENT_LENGTH):
    """Random clip pairs [P, 2, L, ...] with their true per-step rewards (NumPy: test inputs
    are built on the host, so they cost no XLA compilations)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(num_pairs, 2, length, OBS_DIM)).astype(np.float32)
    act = rng.integers(0, NUM_ACTIONS, (num_pairs, 2, length)).astype(np.int32)
    return labels_lib.SegmentPairs(obs=obs, action=act, true_reward=true_reward(obs, act))


def oracle_mu(pairs):
    ret = np.asarray(pairs.true_reward).sum(-1)
    return np.where(ret[:, 0] > ret[:, 1], 1.0, np.where(ret[:, 0] < ret[:, 1], 0.0, 0.5)).astype(np.float32)


def fast_jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


class Compiled:
    """One ensemble configuration and its jitted entry points."""

    def __init__(self, spec, config):
        self.ens = RewardEnsemble(spec, config)
        self.init = fast_jit(self.ens.init)
        self.train_step = fast_jit(self.ens.train_step)
        self.fit = fast_jit(self.ens.fit, static_argnums=3)
        self.predict_reward = fast_jit(self.ens.predict_reward)
        self.member_rewards = fast_jit(self.ens.member_rewards)
        self.update_normalization = fast_jit(self.ens.update_normalization)
        self.update_input_statistics = fast_jit(self.ens.update_input_statistics)
        self.evaluate = fast_jit(self.ens.evaluate)

    def empty_buffer(self, capacity=CAPACITY, segment_length=SEGMENT_LENGTH):
        return self.ens.empty_buffer(capacity, segment_length)


@pytest.fixture(scope="session")
def add_labels():
    """Jitted ``labels.add_labels`` (eager dispatch of its many small ops is slow on CPU)."""
    return fast_jit(labels_lib.add_labels, static_argnames=("heldout_fraction",))


@pytest.fixture(scope="session")
def ens3():
    """The default 3-member MLP ensemble, members walked sequentially (``lax.map``)."""
    return Compiled(MLP_SPEC, EnsembleConfig(num_members=3, member_axis="map"))


@pytest.fixture(scope="session")
def ens3_vmap():
    """Same configuration as ``ens3`` with the member axis vmapped."""
    return Compiled(MLP_SPEC, EnsembleConfig(num_members=3, member_axis="vmap"))


@pytest.fixture(scope="session")
def ens3_unroll():
    """Same configuration as ``ens3`` with the member axis unrolled."""
    return Compiled(MLP_SPEC, EnsembleConfig(num_members=3, member_axis="unroll"))


@pytest.fixture(scope="session")
def ens1():
    """A single member with ``ens3``'s training hyperparameters (for the member-alone check)."""
    return Compiled(MLP_SPEC, EnsembleConfig(num_members=1, member_axis="map"))


@pytest.fixture(scope="session")
def ens1_noreg():
    """One member, no adaptive L2, rewards scaled to std 2 (normalization and ablation tests)."""
    return Compiled(MLP_SPEC, EnsembleConfig(num_members=1, adaptive_l2=False, reward_std=2.0,
                                             member_axis="map"))


@pytest.fixture(scope="session")
def learning_buffer(add_labels):
    """A full buffer of 256 oracle-labeled random clip pairs, labeled by the true return."""
    pairs = random_pairs(101, CAPACITY)
    buf = labels_lib.empty_label_buffer(CAPACITY, 3, SEGMENT_LENGTH, (OBS_DIM,), (), jnp.float32, jnp.int32)
    return add_labels(buf, jax.random.key(102), pairs, oracle_mu(pairs), np.ones(CAPACITY, bool))
