"""JAX's persistent compilation cache for the entry points (rlhp_jax/compile_cache.py): where it is,
how it is turned off, and that a second run loads every program from it and computes the same."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_jax_runs_the_cache_unbounded_so_a_write_never_scans_the_directory():
    """JAX's own bound globs every entry and reads its stamp on each write (0.4 s per compile at a
    thousand entries); compile_cache.prune bounds the directory once per process instead."""
    import jax

    assert jax.config.jax_compilation_cache_max_size == -1  # conftest's compile_cache.enable


def _fill(cache: Path, entries: list[tuple[int, int, int]]) -> None:
    """Entries ``(size, written, read)`` (seconds since the epoch) named e0-cache, e1-cache, ..."""
    cache.mkdir(parents=True, exist_ok=True)
    for i, (size, written, read) in enumerate(entries):
        p = cache / f"e{i}{compile_cache.ENTRY}"
        p.write_bytes(b"x" * size)
        (cache / f"e{i}{compile_cache.STAMP}").write_bytes(b"t")
        os.utime(p, (read, written))


@settings(max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 10**6), st.integers(1, 10**6)), max_size=12),
       st.integers(1, 1500))
def test_prune_keeps_the_most_recently_used_entries_within_the_bound(entries, max_bytes):
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d) / "cache"
        _fill(cache, entries)
        (cache / "unrelated").write_text("kept")
        deleted = compile_cache.prune(cache, max_bytes)
        kept = {int(p.name[1:-len(compile_cache.ENTRY)]) for p in cache.glob(f"*{compile_cache.ENTRY}")}
        total = sum(size for size, _, _ in entries)
        assert deleted == len(entries) - len(kept) and (cache / "unrelated").exists()
        if total <= max_bytes:
            assert deleted == 0
        else:
            assert sum(entries[i][0] for i in kept) <= compile_cache.PRUNE_TO * max_bytes
            last_use = lambda i: max(entries[i][1], entries[i][2])
            gone = set(range(len(entries))) - kept
            assert all(last_use(k) >= last_use(g) for k in kept for g in gone)  # least recently used go first
            # stamps go with their entries; the entry deleted last was needed to reach the bound
            assert {p.name for p in cache.glob(f"*{compile_cache.STAMP}")} == {f"e{i}{compile_cache.STAMP}" for i in kept}
            newest_gone = max(gone, key=lambda i: (last_use(i), entries[i][0]))  # ties: the larger goes last
            assert sum(entries[i][0] for i in kept) + entries[newest_gone][0] > compile_cache.PRUNE_TO * max_bytes


def test_prune_of_a_missing_directory_or_a_vanishing_entry(tmp_path, monkeypatch):
    assert compile_cache.prune(tmp_path / "none") == 0
    _fill(tmp_path / "c", [(100, 1, 1), (100, 2, 2), (100, 3, 3)])
    real = os.unlink

    def another_process_got_there_first(path, *a, **k):
        real(path, *a, **k)
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "unlink", another_process_got_there_first)
    assert compile_cache.prune(tmp_path / "c", 200) == 2
    assert [p.name for p in (tmp_path / "c").glob("*-cache")] == ["e2-cache"]
