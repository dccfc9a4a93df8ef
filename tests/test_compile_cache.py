"""JAX's persistent compilation cache for the entry points (rlhp_jax/compile_cache.py): where it is,
how it is turned off, and that a second run loads every program from it and computes the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.same_results import compare, read_rows
from rlhp_jax import compile_cache

ROOT = Path(__file__).resolve().parents[1]
TINY = ["-m", "experiments.classic", "--env", "CartPole-v1", "--labels", "8", "--steps", "2048", "--no-progress",
        "--seed", "3"]


@pytest.mark.parametrize("value", ["off", "0", "none", "False", "", "  NO "])
def test_the_environment_turns_it_off(monkeypatch, value):
    monkeypatch.setenv(compile_cache.ENV, value)
    assert compile_cache.directory() is None


def test_where_it_is(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "c"))
    assert compile_cache.directory() == tmp_path / "c"
    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.directory() == tmp_path / "xdg" / "rlhp_jax" / "jax"


def test_a_directory_that_cannot_be_made_leaves_it_off_with_a_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="no compilation cache"):
        assert compile_cache.enable(blocker / "cache") is None


def _run(out: Path, cache: Path, *flags: str) -> None:
    env = dict(os.environ, **{compile_cache.ENV: str(cache)})
    proc = subprocess.run([sys.executable, *TINY, "--out", str(out), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _entries(cache: Path) -> set[str]:
    return {p.name for p in cache.glob("*-cache")} if cache.exists() else set()


def test_a_second_run_loads_every_program_and_computes_the_same(tmp_path):
    cache = tmp_path / "cache"
    _run(tmp_path / "first", cache)
    stored = _entries(cache)
    assert stored, "the first run stored no program"
    _run(tmp_path / "second", cache)
    assert _entries(cache) == stored  # every program of the second run came from the cache
    difference, rounding = compare(read_rows(tmp_path / "first"), read_rows(tmp_path / "second"))
    assert difference is None and rounding == {}


@pytest.mark.parametrize("flag, stored", [([], True), (["--no-compile-cache"], False)])
def test_the_flag_turns_it_off(tmp_path, flag, stored):
    """What the entry points do with their flags, then one compilation."""
    code = ("import sys, jax\n"
            "from experiments.classic import DOMAIN\n"
            "from experiments.cli import build_parser, start_compile_cache\n"
            "start_compile_cache(build_parser(DOMAIN).parse_args(sys.argv[1:]))\n"
            "jax.jit(lambda x: x * 3 + 1)(2.0).block_until_ready()\n")
    env = dict(os.environ, **{compile_cache.ENV: str(tmp_path / "cache")})
    subprocess.run([sys.executable, "-c", code, *flag], cwd=ROOT, env=env, check=True, timeout=300)
    assert bool(_entries(tmp_path / "cache")) == stored
