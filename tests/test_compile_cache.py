"""JAX's persistent compilation cache for the entry points (rlhp_jax/compile_cache.py): where it is,
how it is turned off, that a second run loads every program from it and computes the same, and
the traced programs' executables kept in front of it (``compile_cache.jit``), read ahead for a workload
run again."""

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
    stored, kept = _entries(cache), _entries(cache, compile_cache.EXECUTABLE)
    assert stored, "the first run stored no program"
    assert len(kept) >= 10, kept  # the driver's programs, traced and their executables kept
    (listed,) = cache.glob(f"*{compile_cache.PROGRAMS}")  # what to read ahead next time
    assert set(listed.read_text().split()) == {name[: -len(compile_cache.EXECUTABLE)] for name in kept}
    _run(tmp_path / "second", cache)
    assert _entries(cache) == stored  # every program of the second run came from the cache
    assert _entries(cache, compile_cache.EXECUTABLE) == kept  # and every traced one found its executable
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


def test_prune_of_a_directory_it_cannot_list_deletes_nothing(tmp_path, monkeypatch):
    """A cache directory with write but not read permission (mode 0333): JAX still finds its entries
    by name, and prune, which cannot list them, must not end the run in a PermissionError."""
    _fill(tmp_path / "c", [(100, 1, 1), (100, 2, 2)])

    def unlistable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", unlistable)
    assert compile_cache.prune(tmp_path / "c", 1) == 0


# --------------------------------------------------------------------- traced programs (compile_cache.jit)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A fresh directory for jit()'s entries, as ``enable`` would set it."""
    monkeypatch.setattr(compile_cache, "_kept_in", tmp_path)
    return tmp_path


def _state_step(state, x, scale):
    """A pytree in, a pytree out, a static argument (``scale``)."""
    return {"w": state["w"] * scale + x, "n": state["n"] + 1}, jnp.sum(state["w"] * x)


STATE = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(4)}


def _compiles(monkeypatch) -> list:
    """Every compilation of a traced program from here on (jax.jit's own calls do not go through
    ``Traced.lower``)."""
    calls = []
    lower = jax.stages.Traced.lower
    monkeypatch.setattr(jax.stages.Traced, "lower", lambda self, *a, **k: calls.append(1) or lower(self, *a, **k))
    return calls


def test_a_traced_program_is_kept_and_its_copy_computes_what_jit_computes(kept, monkeypatch):
    want = jax.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 3.0)
    got = compile_cache.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 3.0)
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 1
    chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
    chex_equal(got, want)
    assert jax.tree.structure(got) == jax.tree.structure(want)

    compiles = _compiles(monkeypatch)
    again = compile_cache.jit(_state_step, static_argnums=2)  # another process's program object
    chex_equal(again(STATE, jnp.float32(0.5), 3.0), want)
    assert compiles == [] and None not in again._built.values()  # loaded, not compiled nor plain jit
    # another static value or shape is another program
    chex_equal(again(STATE, jnp.float32(0.5), 2.0), jax.jit(_state_step, static_argnums=2)(STATE, jnp.float32(0.5), 2.0))
    wide = {"w": jnp.ones((2, 4)), "n": jnp.int32(0)}
    chex_equal(again(wide, jnp.float32(1.0), 2.0), _state_step(wide, jnp.float32(1.0), 2.0))
    assert len(compiles) == 2 and len(_entries(kept, compile_cache.EXECUTABLE)) == 3


@pytest.mark.parametrize("kind", ["array", "array literal", "scalar"])
def test_programs_that_differ_only_in_what_they_capture_are_different_entries(kept, kind):
    """What a closure captures is in the traced program (a constant's bytes, a literal's value), so
    a program built around other data never finds this one's executable.  (With JAX's simplified
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
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 2
    for c, out in zip(captured, outs):
        np.testing.assert_array_equal(out, np.asarray(jax.jit(make(c))(x)))
    assert not np.array_equal(outs[0], outs[1])


def test_a_weakly_typed_argument_is_another_entry(kept):
    """``y * 2`` prints the same jaxpr for a Python float and a float32; its result is weakly typed
    for the first only, which changes how later arithmetic promotes it."""
    double = lambda y: y * 2
    for arg in (2.0, jnp.float32(2.0), 3.0):
        got = compile_cache.jit(double)(arg)  # a fresh program object each time: from the entries
        assert got.aval == jax.jit(double)(arg).aval, arg


def test_a_program_with_a_host_callback_runs_as_plain_jit(kept):
    seen = []

    def noisy(x):
        jax.debug.callback(lambda v: seen.append(float(v)), x.sum())
        return x * 2

    np.testing.assert_array_equal(compile_cache.jit(noisy)(jnp.ones(3)), 2 * np.ones(3))
    assert seen == [3.0] and not _entries(kept, compile_cache.EXECUTABLE)


def test_an_unreadable_entry_is_compiled_again_and_replaced(kept):
    f = lambda x: jnp.cumsum(x) - 1
    x = jnp.arange(4.0)
    compile_cache.jit(f)(x)
    (entry,) = kept.glob(f"*{compile_cache.EXECUTABLE}")
    whole = entry.read_bytes()
    for broken in (whole[:40], whole[whole.index(b"\n") + 1:], b"\x00" * 100):  # cut short, another format
        entry.write_bytes(broken)
        np.testing.assert_array_equal(compile_cache.jit(f)(x), jnp.cumsum(x) - 1)
        assert compile_cache._read(entry) is not None  # written whole again
    assert not list(kept.glob("*.tmp"))


def test_jax_cache_keeps_no_copy_of_a_kept_program_and_one_it_serves_is_not_kept(kept, monkeypatch):
    """An executable JAX loads from its own cache serializes without its kernels: kept, it failed in
    the next process with "Function ... not found".  So JAX's cache (the suite's, on since conftest)
    gets no entry for a kept program, and one it serves anyway (an earlier version's entry) is run
    but not kept."""
    salt = float(np.random.default_rng().integers(1 << 20))  # a program no other test compiled
    x = jnp.linspace(-2.0, 2.0, 7)
    jax_dir = Path(jax.config.jax_compilation_cache_dir)

    def kept_not_jaxs(v):  # JAX names its entries after the function (other workers write theirs meanwhile)
        return jnp.tanh(v).astype(jnp.int32) * 3 + salt

    got = compile_cache.jit(kept_not_jaxs)(x)
    np.testing.assert_array_equal(got, np.tanh(np.asarray(x)).astype(np.int32) * 3 + salt)
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 1
    assert not [e for e in _entries(jax_dir) if "kept_not_jaxs" in e]

    compile = jax.stages.Lowered.compile

    def served_by_jax(self, *a, **k):
        jax.monitoring.record_event(compile_cache._CACHE_HIT)
        return compile(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", served_by_jax)
    got = compile_cache.jit(lambda v: jnp.cos(v) * 2 + salt)(x)
    np.testing.assert_allclose(got, np.cos(np.asarray(x)) * 2 + salt, rtol=1e-6)
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 1


def test_an_entry_someone_else_can_write_is_never_loaded(kept, monkeypatch):
    """A kept executable is machine code, unpickled: one that another user can write (or owns)
    could be anyone's.  It is compiled again and replaced by this user's own."""
    f = lambda x: jnp.sqrt(x) + 7
    x = jnp.arange(3.0)
    compile_cache.jit(f)(x)
    (entry,) = kept.glob(f"*{compile_cache.EXECUTABLE}")
    entry.chmod(0o666)
    compiles = _compiles(monkeypatch)
    np.testing.assert_array_equal(compile_cache.jit(f)(x), jnp.sqrt(x) + 7)
    assert len(compiles) == 1 and not entry.stat().st_mode & 0o022
    assert compile_cache._read(entry) is not None


_CUSTOM = 'custom-call(f32[2]{{0}} %p), custom_call_target="{}", api_version=API_VERSION_TYPED_FFI'


@pytest.mark.parametrize("targets, stored", [((), True), (("TopK",), True), (("lapack_sgeqrf_ffi", "TopK"), True),
                                             (("GymHopperGymnasiumEnvPool_139827833410128_recv",), False),
                                             (("TopK", "xla_python_cpu_callback"), False)])
def test_only_custom_calls_another_process_can_run_are_kept(kept, monkeypatch, targets, stored):
    """An envpool environment's custom calls are named after its object in the process that built
    them; LAPACK's are bound by the lowering of a program that uses them, so an entry says it needs
    them (a fresh process's call into an unbound one crashed)."""
    traced = jax.jit(lambda x: [x + 1]).trace(jnp.ones(2))
    compiled = traced.lower().compile()
    text = compiled.as_text() + "".join(_CUSTOM.format(t) for t in targets)
    monkeypatch.setattr(type(compiled), "as_text", lambda self: text)
    blob = compile_cache._serialize(compiled, traced)
    assert (blob is not None) == stored
    if stored:
        lapack = any(t.startswith("lapack") for t in targets)
        assert blob.startswith(f"rlhp-exec-2 lapack={int(lapack)} in=1 out=1\n".encode())


def test_a_program_calling_lapack_runs_from_the_cache_in_a_fresh_process(tmp_path):
    """Flax's orthogonal initializer (the agents' networks) calls LAPACK's QR.  Loaded from the
    cache, the program's LAPACK is bound without running ``scipy.linalg``'s package (only its two
    Cython modules, ``deferred.load_extensions``), and the package still works when imported later."""
    script = (f"import sys, jax, jax.numpy as jnp; from rlhp_jax import compile_cache as c; "
              f"c._kept_in = __import__('pathlib').Path({str(tmp_path)!r}); "
              f"print(float(c.jit(lambda k: jax.nn.initializers.orthogonal()(k, (8, 8)).sum())(jax.random.key(1)))); "
              f"print(type(sys.modules['scipy.linalg']).__name__); "
              f"import scipy.linalg; print(scipy.linalg.solve([[2.0, 0.0], [0.0, 4.0]], [1.0, 1.0]).tolist())")
    outs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout.split())
    (entry,) = tmp_path.glob(f"*{compile_cache.EXECUTABLE}")
    assert entry.read_bytes().startswith(b"rlhp-exec-2 lapack=1 ") and outs[0][0] == outs[1][0]
    # compiled: JAX's lowering imported scipy.linalg whole; loaded: it stood deferred until used
    assert outs[0][1:] == ["module", "[0.5,", "0.25]"] and outs[1][1:] == ["Deferred", "[0.5,", "0.25]"]


def test_a_workload_reads_its_last_runs_executables_ahead(kept, monkeypatch):
    f, g = (lambda x: jnp.sin(x) * 3), (lambda x: jnp.cos(x) + 1)
    x = jnp.linspace(0.0, 1.0, 5)
    try:
        compile_cache._start_workload(kept, "job")
        compile_cache.jit(f)(x), compile_cache.jit(g)(x)
        compile_cache._start_workload(kept, None)  # the process ends: its list is written
        (listed,) = kept.glob(f"*{compile_cache.PROGRAMS}")
        keys = listed.read_text().split()
        assert len(keys) == 2 and {k + compile_cache.EXECUTABLE for k in keys} == \
            _entries(kept, compile_cache.EXECUTABLE)
        (kept / (keys[1] + compile_cache.EXECUTABLE)).unlink()  # pruned meanwhile: compiled again

        compile_cache._start_workload(kept, "job")  # the next run of it
        assert [compile_cache._ahead[k].result(timeout=60) is not None for k in keys] == [True, False]
        monkeypatch.setattr(compile_cache, "_read", lambda path: pytest.fail(f"read again: {path}"))
        compiles = _compiles(monkeypatch)
        np.testing.assert_array_equal(compile_cache.jit(f)(x), jnp.sin(x) * 3)
        assert compiles == []  # read ahead
        np.testing.assert_array_equal(compile_cache.jit(g)(x), jnp.cos(x) + 1)
        assert len(compiles) == 1 and (kept / (keys[1] + compile_cache.EXECUTABLE)).exists()
        compile_cache._start_workload(kept, "another job")  # its own list, none yet: nothing read
        assert compile_cache._ahead == {} and listed.read_text().split() == keys
    finally:
        compile_cache._start_workload(kept, None)


def test_inside_another_program_with_keywords_or_with_the_cache_off_it_is_jax_jit(kept, monkeypatch):
    inner = compile_cache.jit(lambda x, y=1.0: x + y)
    outer = jax.jit(lambda x: inner(x) * 2)
    np.testing.assert_array_equal(outer(jnp.ones(2)), 4 * np.ones(2))
    np.testing.assert_array_equal(inner(jnp.ones(2), y=2.0), 3 * np.ones(2))
    assert not _entries(kept, compile_cache.EXECUTABLE)  # neither was kept
    monkeypatch.setattr(compile_cache, "_kept_in", None)
    np.testing.assert_array_equal(inner(jnp.ones(2)), 2 * np.ones(2))
    assert not _entries(kept, compile_cache.EXECUTABLE)
    assert inner.lower(jnp.ones(2)).as_text()  # jax.jit's AOT API is there too


def test_a_quick_program_compiles_with_quick_options_under_its_own_key(kept, monkeypatch):
    """``quick=True``: XLA:CPU's quick options wherever it compiles (kept, with the cache off, never
    inside another program, where JAX refuses options), and an entry of its own."""
    options, jits = [], []
    compile_ = jax.stages.Lowered.compile
    monkeypatch.setattr(jax.stages.Lowered, "compile",
                        lambda self, opts=None: options.append(opts) or compile_(self, opts))
    fn = lambda x: jnp.tanh(x) * 2 + 1
    quick, default = compile_cache.jit(fn, quick=True), compile_cache.jit(fn)
    x = jnp.linspace(-1.0, 1.0, 8)
    np.testing.assert_allclose(quick(x), default(x), rtol=1e-6)
    assert options == [compile_cache.QUICK_COMPILE, None]
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 2  # the options are in the key
    np.testing.assert_allclose(jax.jit(lambda y: quick(y) - 1)(x), default(x) - 1, rtol=1e-6)
    monkeypatch.setattr(compile_cache, "_kept_in", None)  # the cache off: plain jax.jit, with the options
    jit_ = jax.jit
    monkeypatch.setattr(jax, "jit", lambda *a, **k: jits.append(k.get("compiler_options")) or jit_(*a, **k))
    off = compile_cache.jit(fn, quick=True)
    np.testing.assert_allclose(off(x), default(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda y: off(y))(x), default(x), rtol=1e-6)  # inside: no options
    assert jits.count(compile_cache.QUICK_COMPILE) == 1  # its own call; inside, plain jax.jit


def test_ahead_of_time_builds_from_shapes_and_a_second_build_loads(kept, monkeypatch):
    """``ahead_of_time``: built before it runs, from arrays or only their shapes (the compiled
    loop's blocks), with its results' shapes; a second program of the same function loads it."""
    shapes = ({"w": jax.ShapeDtypeStruct((2, 3), jnp.float32), "n": jax.ShapeDtypeStruct((), jnp.int32)},
              jax.ShapeDtypeStruct((2, 3), jnp.float32))
    calls = _compiles(monkeypatch)
    step = lambda state, x: _state_step(state, x, 2.0)
    first = compile_cache.jit(step).ahead_of_time(*shapes)
    assert len(calls) == 1 and len(_entries(kept, compile_cache.EXECUTABLE)) == 1
    assert jax.tree.map(lambda a: (a.shape, a.dtype, a.weak_type), first.out_info) == \
        jax.tree.map(lambda a: (a.shape, a.dtype, a.weak_type), jax.eval_shape(step, *shapes))
    x = jnp.ones((2, 3))
    second = compile_cache.jit(step).ahead_of_time(STATE, x)
    assert len(calls) == 1  # loaded
    for got in (first(STATE, x), second(STATE, x)):
        jax.tree.map(np.testing.assert_array_equal, got, jax.jit(step)(STATE, x))
    monkeypatch.setattr(compile_cache, "_kept_in", None)  # the cache off: jax.jit's own compilation
    jax.tree.map(np.testing.assert_array_equal, compile_cache.jit(step).ahead_of_time(*shapes)(STATE, x),
                 first(STATE, x))
    with pytest.raises(TypeError, match="static"):
        compile_cache.jit(_state_step, static_argnums=2).ahead_of_time(STATE, x, 2.0)


def test_the_hosts_key_splits_are_kept_programs_that_split_as_jax_random_does(kept):
    from rlhp_jax.loop import fold_in, split_keys

    key = jax.random.key(11)
    for num in (2, 5):
        want = jax.random.split(key, num)
        for got in (split_keys(key, num), jax.jit(lambda k: split_keys(k, num))(key)):  # host, in a program
            assert isinstance(got, tuple) and len(got) == num
            np.testing.assert_array_equal(jax.random.key_data(jnp.stack(got)), jax.random.key_data(want))
    np.testing.assert_array_equal(jax.random.key_data(fold_in(key, 3)),
                                  jax.random.key_data(jax.random.fold_in(key, 3)))
    assert len(_entries(kept, compile_cache.EXECUTABLE)) == 3  # the host's calls: kept


def test_prune_bounds_kept_executables_and_lists_with_jax_entries(tmp_path):
    _fill(tmp_path, [(100, 1, 1), (100, 5, 5)])
    for name, t, kind in (("old", 2, compile_cache.EXPORTED), ("list", 3, compile_cache.PROGRAMS),
                          ("older", 4, compile_cache.EXECUTABLE), ("new", 6, compile_cache.EXECUTABLE)):
        p = tmp_path / f"{name}{kind}"
        p.write_bytes(b"x" * 100)
        os.utime(p, (t, t))
    assert compile_cache.prune(tmp_path, 250) == 5  # to 0.75 × 250: the newest entry alone
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(compile_cache.STAMP)) == \
        [f"new{compile_cache.EXECUTABLE}"]


@pytest.fixture
def jax_cache_setting():
    """Puts JAX's cache directory and this module's back as they were (the suite's, since conftest)."""
    import jax

    before = jax.config.jax_compilation_cache_dir, compile_cache._kept_in
    yield
    jax.config.update("jax_compilation_cache_dir", before[0])
    compile_cache._kept_in = before[1]


@pytest.mark.skipif(not os.path.isdir("/proc/1"), reason="needs Linux's /proc")
def test_a_directory_that_cannot_be_written_leaves_it_off_with_one_warning(jax_cache_setting):
    """A cache directory that exists but takes no file (read-only, another user's; /proc/1 here,
    which not even root can write in): turned on, JAX warned at every program it failed to store
    (15 two-line warnings on the README's CartPole job); off, with one warning, the run compiles."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compile_cache.enable("/proc/1") is None
    assert [str(w.message).split(":")[0] for w in caught] == ["no compilation cache"]
    assert "cannot write in /proc/1" in str(caught[0].message)
