"""JAX's persistent compilation cache for the entry points (rlhp_jax/compile_cache.py): where it is,
how it is turned off, that a second run loads every program from it and computes the same, and
the traced programs' tier in front of it (``compile_cache.jit``)."""

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


def _entries(cache: Path, kind: str = compile_cache.ENTRY) -> set[str]:
    return {p.name for p in cache.glob(f"*{kind}")} if cache.exists() else set()


def test_a_second_run_loads_every_program_and_computes_the_same(tmp_path):
    cache = tmp_path / "cache"
    _run(tmp_path / "first", cache)
    stored, exported = _entries(cache), _entries(cache, compile_cache.EXPORTED)
    assert stored, "the first run stored no program"
    assert len(exported) >= 10, exported  # the driver's programs, traced and kept lowered
    _run(tmp_path / "second", cache)
    assert _entries(cache) == stored  # every program of the second run came from the cache
    assert _entries(cache, compile_cache.EXPORTED) == exported  # and every traced one found its lowering
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


# --------------------------------------------------------------------- traced programs (compile_cache.jit)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


@pytest.fixture
def exports(tmp_path, monkeypatch):
    """A fresh directory for jit()'s entries, as ``enable`` would set it."""
    monkeypatch.setattr(compile_cache, "_exports", tmp_path)
    return tmp_path


def _state_step(state, x, scale):
    """A pytree in, a pytree out, a static argument (``scale``)."""
    return {"w": state["w"] * scale + x, "n": state["n"] + 1}, jnp.sum(state["w"] * x)


STATE = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(4)}


def test_a_traced_program_is_kept_and_its_copy_computes_what_jit_computes(exports, monkeypatch):
    want = jax.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 3.0)
    got = compile_cache.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 3.0)
    assert len(_entries(exports, compile_cache.EXPORTED)) == 1
    chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
    chex_equal(got, want)
    assert jax.tree.structure(got) == jax.tree.structure(want)

    from jax import export as jax_export

    def no_lowering(*a, **k):
        raise AssertionError("exported again: the kept lowering was not found")

    monkeypatch.setattr(jax_export, "export", no_lowering)
    again = compile_cache.jit(_state_step, static_argnums=2)  # another process's program object
    chex_equal(again(STATE, jnp.float32(0.5), 3.0), want)
    # another static value or shape is another program
    monkeypatch.undo()
    monkeypatch.setattr(compile_cache, "_exports", exports)
    chex_equal(again(STATE, jnp.float32(0.5), 2.0), jax.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 2.0))
    wide = {"w": jnp.ones((2, 4)), "n": jnp.int32(0)}
    chex_equal(again(wide, jnp.float32(1.0), 2.0), _state_step(wide, jnp.float32(1.0), 2.0))
    assert len(_entries(exports, compile_cache.EXPORTED)) == 3


@pytest.mark.parametrize("kind", ["array", "array literal", "scalar"])
def test_programs_that_differ_only_in_what_they_capture_are_different_entries(exports, kind):
    """What a closure captures is in the traced program (a constant's bytes, a literal's value), so
    a program built around other data never finds this one's lowering.  (With JAX's simplified
    constants an array is a literal that the jaxpr prints as "[...]".)"""
    base = np.linspace(0.0, 1.0, 5, dtype=np.float32)
    if kind.startswith("array"):
        other = base.copy()
        other[3] = np.nextafter(other[3], np.float32(2))  # one ulp
        make = lambda c: (lambda x: x * jnp.asarray(c))
        captured = (base, other)
    else:
        make = lambda c: (lambda x: x * c)
        captured = (0.1, float(np.nextafter(np.float32(0.1), np.float32(1))))  # one float32 ulp
    x = jnp.arange(5.0, dtype=jnp.float32) + 1e7
    previous = jax.config.jax_use_simplified_jaxpr_constants
    jax.config.update("jax_use_simplified_jaxpr_constants", kind == "array literal")
    try:
        assert ("[...]" in str(jax.jit(make(base)).trace(x).jaxpr)) == (kind == "array literal")
        outs = [np.asarray(compile_cache.jit(make(c))(x)) for c in captured]
    finally:
        jax.config.update("jax_use_simplified_jaxpr_constants", previous)
    assert len(_entries(exports, compile_cache.EXPORTED)) == 2
    for c, out in zip(captured, outs):
        np.testing.assert_array_equal(out, np.asarray(jax.jit(make(c))(x)))
    assert not np.array_equal(outs[0], outs[1])


def test_a_program_with_a_host_callback_runs_as_plain_jit(exports):
    seen = []

    def noisy(x):
        jax.debug.callback(lambda v: seen.append(float(v)), x.sum())
        return x * 2

    np.testing.assert_array_equal(compile_cache.jit(noisy)(jnp.ones(3)), 2 * np.ones(3))
    assert seen == [3.0] and not _entries(exports, compile_cache.EXPORTED)


def test_an_unreadable_entry_is_lowered_again_and_replaced(exports):
    f = lambda x: jnp.cumsum(x) - 1
    x = jnp.arange(4.0)
    compile_cache.jit(f)(x)
    (entry,) = exports.glob(f"*{compile_cache.EXPORTED}")
    entry.write_bytes(entry.read_bytes()[:40])  # a writer killed mid-file, or another format
    np.testing.assert_array_equal(compile_cache.jit(f)(x), jnp.cumsum(x) - 1)
    assert compile_cache._load(entry, 1) is not None  # written whole again
    assert not list(exports.glob("*.tmp"))


def test_inside_another_program_with_keywords_or_with_the_cache_off_it_is_jax_jit(exports, monkeypatch):
    inner = compile_cache.jit(lambda x, y=1.0: x + y)
    outer = jax.jit(lambda x: inner(x) * 2)
    np.testing.assert_array_equal(outer(jnp.ones(2)), 4 * np.ones(2))
    np.testing.assert_array_equal(inner(jnp.ones(2), y=2.0), 3 * np.ones(2))
    assert not _entries(exports, compile_cache.EXPORTED)  # neither was kept
    monkeypatch.setattr(compile_cache, "_exports", None)
    np.testing.assert_array_equal(inner(jnp.ones(2)), 2 * np.ones(2))
    assert not _entries(exports, compile_cache.EXPORTED)
    assert inner.lower(jnp.ones(2)).as_text()  # jax.jit's AOT API is there too


def test_prune_bounds_exported_programs_with_jax_entries(tmp_path):
    _fill(tmp_path, [(100, 1, 1), (100, 5, 5)])
    for name, t in (("old", 2), ("new", 6)):
        p = tmp_path / f"{name}{compile_cache.EXPORTED}"
        p.write_bytes(b"x" * 100)
        os.utime(p, (t, t))
    assert compile_cache.prune(tmp_path, 250) == 3  # to 0.75 × 250: the newest entry alone
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(compile_cache.STAMP)) == \
        [f"new{compile_cache.EXPORTED}"]
