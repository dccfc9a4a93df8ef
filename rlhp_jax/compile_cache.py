"""JAX's persistent compilation cache for the entry points: a second run of the same experiment
loads its programs from disk instead of compiling them again.

    from rlhp_jax import compile_cache
    compile_cache.enable()          # at the start of a command, before anything is compiled

The cache lives in ``$RLHP_JAX_COMPILE_CACHE`` if set, else ``$XDG_CACHE_HOME/rlhp_jax/jax`` (by
default ``~/.cache/rlhp_jax/jax``); ``RLHP_JAX_COMPILE_CACHE=off`` (or ``0``, ``none``) turns it off,
as does the entry points' ``--no-compile-cache``.  JAX keys each entry on the program, the
compiler options, the device and the JAX version, so a stale entry is never used; a cached program
is the same executable, and a run's results are identical to the bit (BUILD_NOTES, "compilation
cache").

The directory is bounded by this module, not by JAX: :func:`enable` deletes the least recently used
entries (by access or write time, whichever is later) until it holds at most ``MAX_BYTES``, once per
process.  JAX's own bound (``jax_compilation_cache_max_size``) globs the whole directory and reads
one timestamp file per entry on every write, under a file lock: with a thousand entries each
compilation paid ~0.4 s more, and a day of runs (or the test suite) builds thousands.  So JAX runs
unbounded here (``-1``: no scan, no lock).  Two runs may still share the directory: an entry is
written in one call after its program compiled, and a reader that meets one half-written, or one
another process just pruned, fails to decompress it or to find it; JAX then warns and compiles the
program itself, so a shared cache can cost a compilation, never a wrong program.  Every program is
stored, however fast it compiles (a run's few dozen small ones add up to seconds; a threshold on
compile time would also make what is stored depend on the machine's load).

JAX keys its cache by the lowered program, so even a warm start traces every program and lowers
it to StableHLO before it can look it up: on the README's job the lowering alone was ~2.6 s of a
~15 s warm run on a 2-core CPU (BUILD_NOTES, "Traced programs").  :func:`jit` adds a tier in front
of that for the host driver's programs: the traced program (its jaxpr, printed, and the bytes of
every array it holds) keys the serialized executable compiled from it, stored beside JAX's entries
(``-executable``, bounded with them).  A hit skips the lowering, JAX's own key and its cache read:
the executable is loaded as it was stored, so a run's results are the same to the bit.  Nothing
outside the traced program enters the key (no source hash, no config): a program that computes
anything differently traces to a different jaxpr, and what compiling depends on besides the jaxpr
(JAX's version, the backend, its devices and the CPU's features, ``XLA_FLAGS``, JAX's options) is in
the key too.  A program whose executable another process could not run as it is (a host callback,
an effect, an envpool environment's custom call) is compiled and run, but not kept.  JAX's own
cache gets no entry for a kept program (see :func:`_compile`).  An entry point names its workload
(:func:`enable`), and the executables its last run used are read in on a thread while the next run
starts.  Like JAX's own entries, a stored executable is machine code this process will run, so an
entry is read only if it belongs to the user running the command and no one else may write it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import logging
import os
import re
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlhp_jax.files import write_atomic

ENV = "RLHP_JAX_COMPILE_CACHE"
OFF = ("", "0", "off", "none", "false", "no")
MAX_BYTES = 2 << 30  # 2 GiB
PRUNE_TO = 0.75  # a pruned directory keeps this share of MAX_BYTES, so the next starts need not prune again
ENTRY, STAMP = "-cache", "-atime"  # JAX's names: an entry, and the access stamp its bounded mode writes
EXECUTABLE = "-executable"  # this module's entries: a traced program's serialized executable (see jit)
EXPORTED = "-exported"  # what earlier versions stored (a serialized lowering): never read, so pruned early
PROGRAMS = "-programs"  # a workload's list of the entries its last run used, in order (see enable)
# XLA:CPU options for a program that runs once or costs little to run (``jit(..., quick=True)``): a
# lower LLVM level, no expensive LLVM passes, and the older per-fusion code generation instead of the
# fusion emitters.  They cut a program's compile time by about half; the code they give runs slower,
# which only matters for a program run often on much data (BUILD_NOTES, "Quick programs").  The test
# suite compiles every program with them (tests/conftest.py).
QUICK_COMPILE = {"xla_backend_optimization_level": 1, "xla_llvm_disable_expensive_passes": True,
                 "xla_cpu_use_fusion_emitters": False}
_log = logging.getLogger(__name__)
_kept_in: Path | None = None  # where jit() keeps its entries: the cache's directory once enable() ran
_workload: Path | None = None  # this process's list of entries used, when enable() was given a workload
_used: dict[str, None] = {}  # the entries this process used (loaded or stored), in order of first use
_ahead: dict[str, "concurrent.futures.Future"] = {}  # entries being read ahead (see _start_workload)


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlhp_jax" / "jax"


def directory() -> Path | None:
    """Where the cache is, or None when the environment turns it off."""
    value = os.environ.get(ENV)
    if value is None:
        return default_directory()
    if value.strip().lower() in OFF:
        return None
    return Path(value).expanduser()


def enable(path: str | os.PathLike | None = None, workload: str | None = None) -> Path | None:
    """Turn the cache on for this process (``path``, else :func:`directory`); returns where it is,
    or None when it stays off (also, with one warning, when the directory cannot be made or
    written in: a run never fails for want of its cache).  Call before the first compilation.

    ``workload`` names what this process is about to run (an entry point and its task): the
    executables its last run used are read into memory on a thread from here on, while this
    process imports, builds its environments and traces, and the list is written again at exit
    (BUILD_NOTES, "Executables kept and read ahead").  A program whose entry was not read ahead is read
    when it is first called, as without a workload."""
    import jax

    where = Path(path) if path is not None else directory()
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warnings.warn(f"no compilation cache: cannot create {where} ({e.strerror or e}); set {ENV} to a "
                      f"writable directory, or to off", stacklevel=2)
        return None
    try:  # a directory that takes no file (read-only, another user's): JAX would warn at every program
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        warnings.warn(f"no compilation cache: cannot write in {where} ({e.strerror or e}); set {ENV} to a "
                      f"writable directory, or to off", stacklevel=2)
        return None
    prune(where)
    global _kept_in
    _kept_in = where
    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_compilation_cache_max_size", -1)  # unbounded for JAX: prune() bounds it
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _start_workload(where, workload)
    return where


def prune(where: str | os.PathLike, max_bytes: int = MAX_BYTES) -> int:
    """Bound the cache directory ``where``: if its entries hold more than ``max_bytes``, delete the
    least recently used ones (access or write time, whichever is later) until they hold at most
    ``PRUNE_TO`` of it; access stamps left by JAX's bounded mode go with their entries.  One scan of
    the directory.  Another process may delete or write entries meanwhile (a file already gone is
    skipped).  Returns the number of entries deleted."""
    entries = []
    try:
        with os.scandir(where) as it:
            for e in it:
                if not e.name.endswith((ENTRY, EXECUTABLE, EXPORTED, PROGRAMS)):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                entries.append((max(st.st_atime_ns, st.st_mtime_ns), st.st_size, e.path))
    except OSError:  # gone, or not listable (write-only: JAX still finds its entries by name): nothing pruned
        return 0
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return 0
    deleted = 0
    for _, size, path in sorted(entries):
        if total <= PRUNE_TO * max_bytes:
            break
        for name in (path, path[: -len(ENTRY)] + STAMP) if path.endswith(ENTRY) else (path,):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        total -= size
        deleted += 1
    return deleted


# --------------------------------------------------------------------- traced programs
def jit(fn: Callable, *, static_argnums: int | tuple[int, ...] = (), quick: bool = False) -> "Program":
    """``jax.jit(fn, static_argnums=...)`` whose executable is kept in the cache (module docstring):
    for the host driver's programs, called with arrays (or nested containers of them) as
    positional arguments.  Called while the cache is off, from inside another program, or with
    keyword arguments, it is plain ``jax.jit``; ``lower``, ``trace`` and the rest are jax.jit's.

    ``quick``: on a CPU, compiled with :data:`QUICK_COMPILE`, for a program whose compilation costs
    more than all its runs (one that runs once, or small bookkeeping); the same options whether the
    cache is on or off, so they never change a run's results between the two."""
    return Program(fn, static_argnums, quick)


_UNBUILT = object()


class Program:
    """See :func:`jit`.  One compiled callable per call signature (the static arguments, the
    arguments' tree and each leaf's shape, dtype and weak type), built at its first call."""

    def __init__(self, fn: Callable, static_argnums, quick: bool = False):
        self._fn = fn
        self._static = (static_argnums,) if isinstance(static_argnums, int) else tuple(sorted(static_argnums))
        self._quick = quick
        self._built: dict[Any, tuple[Callable, Any, Any] | None] = {}  # signature -> _build's result
        self.__name__ = getattr(fn, "__name__", "program")

    @functools.cached_property
    def _options(self) -> dict | None:
        """The compiler options this program is built with (read at its first use, not when it is
        defined: a module-level program must not start JAX's backend at import)."""
        return compiler_options(self._quick)

    @functools.cached_property
    def _jit(self):
        """Plain jax.jit, for a call inside another program (JAX takes compiler options only at the top)."""
        import jax

        return jax.jit(self._fn, static_argnums=self._static)

    @functools.cached_property
    def _top(self):
        """Plain jax.jit with this program's compiler options, for a call of its own."""
        import jax

        return jax.jit(self._fn, static_argnums=self._static, compiler_options=self._options) \
            if self._options else self._jit

    def __getattr__(self, name):  # lower, trace, eval_shape, ...: jax.jit's
        if name.startswith("_") and not name.startswith("__"):  # this object's own, not set (yet)
            raise AttributeError(name)
        return getattr(self._top, name)

    def __call__(self, *args, **kwargs):
        if _kept_in is None or kwargs:
            return self._plain(args, kwargs)
        import jax

        statics = tuple(args[i] for i in self._static)
        leaves, tree = jax.tree.flatten([a for i, a in enumerate(args) if i not in self._static])
        signature = _signature(statics, tree, leaves)
        if signature is None:  # a tracer (called inside another program) or an unhashable static
            return self._jit(*args)
        built = self._built.get(signature, _UNBUILT)
        if built is _UNBUILT:
            built = self._built[signature] = self._build(statics, tree, leaves, len(args))
        if built is None:  # failed to trace or compile: jax.jit raises the error
            return self._plain(args, {})
        call, out_tree, _ = built
        return out_tree.unflatten(call(*leaves))

    def ahead_of_time(self, *args):
        """This program built now for arguments like ``args`` (arrays, or ``jax.ShapeDtypeStruct``\ s
        of them; none static), so a caller can time compiling apart from running: a callable of
        such arrays, with ``out_info`` (its results' shapes and dtypes).  Loaded from the cache, or
        compiled and kept, as a first call would; with the cache off, compiled by ``jax.jit``."""
        import jax

        if self._static:
            raise TypeError("ahead_of_time builds a program without static arguments")
        if _kept_in is not None:
            leaves, tree = jax.tree.flatten(list(args))
            built = self._build((), tree, leaves, len(args))
            if built is not None:
                compiled, out_tree, out_avals = built
                return _Built(lambda *xs: out_tree.unflatten(compiled(*jax.tree.leaves(list(xs)))),
                              out_tree.unflatten(out_avals))
        traced = self._top.trace(*args)  # the cache off, or a failure (jax.jit raises its error)
        return _Built(traced.lower().compile(), traced.out_info)

    def _plain(self, args, kwargs):
        """Plain jax.jit: with this program's options, unless it is called inside another program
        (its arguments are walked for tracers only when it has options)."""
        if self._options:
            import jax
            from jax.core import Tracer

            if not any(isinstance(x, Tracer) for x in jax.tree.leaves((args, kwargs))):
                return self._top(*args, **kwargs)
        return self._jit(*args, **kwargs)

    def _build(self, statics, tree, leaves, nargs):
        """(compiled callable over the leaves, output tree, the results' abstract values), loaded
        from the cache or compiled and stored (unless :func:`_serialize` refuses it).  None for a
        program that fails to trace or compile: plain jax.jit then raises the same error, as it
        would have without this tier."""
        import jax

        out_trees = []
        static = self._static

        def flat(*xs):
            dynamic = iter(tree.unflatten(xs))
            given = iter(statics)
            out = self._fn(*(next(given) if i in static else next(dynamic) for i in range(nargs)))
            out_leaves, out_tree = jax.tree.flatten(out)
            out_trees.append(out_tree)
            return out_leaves

        flat.__name__ = flat.__qualname__ = self.__name__
        try:
            traced = jax.jit(flat).trace(*leaves)
            key = program_key(traced.jaxpr, self._options)
            ahead = _ahead.pop(key, None)
            path = _kept_in / (key + EXECUTABLE)
            if ahead is not None and not ahead.cancel():  # being read, or read: wait for it
                compiled = ahead.result()
            else:  # not read ahead, or not reached yet (then the thread skips it)
                compiled = _read(path) if path.exists() else None
            if compiled is not None and not _fits(compiled, traced):
                compiled = None
            if compiled is None:
                compiled, keep = _compile(traced, self._options)
                blob = _serialize(compiled, traced) if keep else None
                if blob is None:  # runs here, as compiled, but is not kept
                    return compiled, out_trees[0], traced.jaxpr.out_avals
                _store(path, blob)
            _used[key] = None
        except Exception as e:  # a tracing error, a compiler error (jax.jit raises it again)
            _log.debug("program %s runs as plain jax.jit: %s", self.__name__, e)
            return None
        return compiled, out_trees[0], traced.jaxpr.out_avals


class _Built:
    """A program built by :meth:`Program.ahead_of_time`: called with its arguments as the program
    is; ``out_info``, its results' shapes, dtypes and weak types."""

    def __init__(self, call, out_info):
        import jax

        self._call = call
        self.out_info = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type), out_info)

    def __call__(self, *args):
        return self._call(*args)


def _signature(statics, tree, leaves):
    from jax.core import Tracer

    described = []
    for x in leaves:
        if isinstance(x, Tracer):
            return None
        aval = getattr(x, "aval", None)  # a jax.Array's shape, dtype and weak type (hashable)
        if aval is not None:
            described.append(aval)
        elif isinstance(x, (np.ndarray, np.generic)):
            described.append((x.shape, x.dtype))
        else:  # a Python scalar: its type is its (weak) dtype
            described.append(type(x))
    signature = (statics, tree, tuple(described))
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


def _compile_context() -> bytes:
    """What compiling depends on besides the traced program: JAX's and jaxlib's versions, every JAX
    option except those that only log, profile or name caches (an option left in costs a miss, never
    a wrong program), and :func:`_machine`.  Read at each key: an option may change while a
    process runs."""
    import jax

    quiet = ("log", "cache", "traceback", "explain", "profil", "pgle", "topology_timeout", "mock_gpu")
    options = sorted((k, repr(v)) for k, v in jax.config.values.items() if not any(q in k for q in quiet))
    return repr((_machine(), options)).encode()


@functools.cache
def _machine() -> tuple:
    """What an executable is compiled for: the versions, the backend (platform, its version, the
    devices' kinds and count), the compiler's flags (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``) and, on a
    CPU, the instruction-set extensions the host reports (XLA compiles for the host it runs on: a cache shared by two kinds of machine must not
    hand one the other's code).  Fixed once the backend is up, so read once per process."""
    import jax
    import jaxlib

    devices = jax.devices()
    client = devices[0].client
    cpu_flags = ""
    if client.platform == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                cpu_flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
        except OSError:
            import platform

            cpu_flags = platform.processor() or platform.machine()
    return (jax.__version__, jaxlib.__version__, client.platform, client.platform_version,
            sorted({d.device_kind for d in devices}), len(devices), os.environ.get("XLA_FLAGS", ""),
            os.environ.get("LIBTPU_INIT_ARGS", ""), cpu_flags)


def compiler_options(quick: bool) -> dict | None:
    """The compiler options of a program: :data:`QUICK_COMPILE` for a quick one on a CPU backend,
    else None (XLA's defaults)."""
    if not quick:
        return None
    import jax

    return dict(QUICK_COMPILE) if jax.default_backend() == "cpu" else None


def program_key(closed_jaxpr, options: dict | None = None) -> str:
    """The cache key of a traced program: its jaxpr as JAX prints it (every equation with its
    parameters, the arguments' and results' types, scalar literals' values), the arguments' and
    results' abstract values (their weak types are not printed), the dtype, shape and
    bytes of every array it holds that the print elides (its constants, those of the programs
    nested in it, array literals and array parameters), the compiler ``options`` it is built with,
    and :func:`_compile_context`."""
    h = hashlib.sha256(_compile_context())
    if options:  # (none: the key as it was before options existed)
        h.update(repr(sorted(options.items())).encode())
    h.update(str(closed_jaxpr.jaxpr).encode())
    h.update(repr((closed_jaxpr.in_avals, closed_jaxpr.out_avals)).encode())  # weak types: not printed above
    for c in _arrays_in(closed_jaxpr):
        a = np.asarray(c)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _arrays_in(value):
    """Every array a (closed) jaxpr holds, depth first: constants, array literals, and arrays among
    the equations' parameters, nested programs included."""
    from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

    if isinstance(value, ClosedJaxpr):
        yield from value.consts
        yield from _arrays_in(value.jaxpr)
    elif isinstance(value, Jaxpr):
        for eqn in value.eqns:
            for v in eqn.invars:
                if isinstance(v, Literal) and np.shape(v.val):  # printed as "[...]"
                    yield v.val
            for param in eqn.params.values():
                yield from _arrays_in(param)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _arrays_in(item)
    elif isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "dtype")
                                           and hasattr(value, "__array__")):
        yield value


_LAPACK = re.compile(r"lapack_\w+_ffi")  # XLA:CPU's LAPACK calls (QR for orthogonal initializers)
_HEADER = re.compile(rb"rlhp-exec-2 lapack=([01]) in=(\d+) out=(\d+)\n")
_compiling = threading.local()  # whether this thread's compilation was served by JAX's cache
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_NEVER = 1 << 62  # bytes: a JAX cache entry's least size while a kept program compiles (none is written)


def _compile(traced, options: dict | None = None):
    """(the program compiled, whether it can be kept).  An executable JAX loads from its own cache
    serializes without its kernels (a fresh process then fails with "Function ... not found"), so
    JAX writes no entry for a program this module keeps (its least entry size is set out of reach
    while it compiles: JAX reads the option at each write), and a program JAX's cache served anyway
    (an entry of an earlier version, or of a program that lowers to the same module) is run but not
    kept, as JAX's monitoring events tell.  Another thread compiling meanwhile would write no JAX
    entry either, once."""
    import jax

    _listen_for_cache_hits()
    lowered = traced.lower()
    _compiling.hit = False
    least = jax.config.jax_persistent_cache_min_entry_size_bytes
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", _NEVER)
    try:
        compiled = lowered.compile(options)
    finally:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", least)
    return compiled, not _compiling.hit


@functools.cache
def _listen_for_cache_hits() -> None:
    """Mark this thread's compilation when JAX's cache serves it (once per process)."""
    import jax

    jax.monitoring.register_event_listener(
        lambda event, **_: setattr(_compiling, "hit", True) if event == _CACHE_HIT else None)


def _serialize(compiled, traced) -> bytes | None:
    """The executable's bytes, or None where loading them into another process would not give the
    same program: one with effects (callbacks, ordered effects, mutable arrays), or a custom call
    other than XLA's TopK and LAPACK (callbacks into this process; an envpool environment's calls,
    named after its object's address in the process that built it).  The header says whether it
    calls LAPACK (:func:`_read` binds it first: its routines are bound by a lowering, and a call
    into an unbound one crashed a fresh process) and how many arrays go in and out."""
    from jax.experimental import serialize_executable

    if traced.jaxpr.effects:
        return None
    calls = set(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text()))
    if any(c != "TopK" and not _LAPACK.fullmatch(c) for c in calls):
        return None
    try:
        blob, in_tree, out_tree = serialize_executable.serialize(compiled)
    except Exception as e:  # NotImplementedError (constants as arguments), a backend without it
        _log.debug("not serializable: %s", e)
        return None
    n_in, n_out = in_tree.num_leaves, out_tree.num_leaves
    if (in_tree, out_tree) != _trees(n_in, n_out):  # not a flat program: not one of jit()'s
        return None
    lapack = int(any(_LAPACK.fullmatch(c) for c in calls))
    return f"rlhp-exec-2 lapack={lapack} in={n_in} out={n_out}\n".encode() + blob


def _trees(n_in: int, n_out: int):
    """The argument and result trees of a flat program (``Program._build``'s): ``n_in`` arrays in,
    a list of ``n_out`` out."""
    import jax

    return jax.tree.structure(((0,) * n_in, {})), jax.tree.structure([0] * n_out)


@functools.cache
def _bind_lapack() -> None:
    """Bind XLA:CPU's LAPACK routines as JAX does: by lowering a program that calls one.  JAX reads
    their addresses from SciPy's two Cython modules, loaded here without the rest of
    ``scipy.linalg`` (``deferred.load_extensions``: 5 ms instead of ~0.15 s)."""
    import jax
    import jax.numpy as jnp

    from rlhp_jax.deferred import load_extensions

    load_extensions("scipy.linalg", ("cython_blas", "cython_lapack"))
    jax.jit(jnp.linalg.qr).lower(jax.ShapeDtypeStruct((2, 2), jnp.float32))


def _read(path: Path):
    """The executable stored at ``path``, loaded, or None if it cannot be read back whole (another
    process pruning or writing it, another format) or is not this user's alone (it is machine
    code, and unpickling it runs code: a file another user owns or can write is never read): the
    caller compiles it again.  Safe on any thread."""
    from jax.experimental import serialize_executable

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if (hasattr(os, "geteuid") and st.st_uid != os.geteuid()) or st.st_mode & 0o022:
                raise PermissionError("not this user's alone: another user could have written it")
            data = f.read()
        header = _HEADER.match(data)
        lapack, n_in, n_out = (int(g) for g in header.groups())
        if lapack:
            _bind_lapack()
        return serialize_executable.deserialize_and_load(data[header.end():], *_trees(n_in, n_out))
    except Exception as e:
        _log.debug("unreadable %s: %s", path, e)
        return None


def _fits(compiled, traced) -> bool:
    """Whether the loaded executable takes the traced program's arguments and gives its results."""
    import jax

    described = lambda info: [(a.shape, a.dtype) for a in jax.tree.leaves(info)]
    return compiled.in_tree == traced.in_tree and described(compiled.out_info) == described(traced.out_info)


# --------------------------------------------------------------------- reading ahead
def _start_workload(where: Path, workload: str | None) -> None:
    """Read ahead, on a thread, the entries ``workload``'s last run used (its ``-programs`` list),
    in the order it used them; the list is written again at exit.  A second call (tests start
    several runs in one process) writes the previous workload's list first."""
    global _workload
    _finish_workload()
    _used.clear()
    _ahead.clear()
    if workload is None:
        return
    _workload = where / (hashlib.sha256(workload.encode()).hexdigest()[:40] + PROGRAMS)
    try:
        keys = [k for k in _workload.read_text().split() if len(k) == 64]
    except (OSError, UnicodeDecodeError):
        keys = []
    futures = [(k, _ahead.setdefault(k, concurrent.futures.Future())) for k in keys]

    def read_all():
        for key, future in futures:
            if not threading.main_thread().is_alive():  # the process is exiting
                return
            if future.set_running_or_notify_cancel():  # else the program read it itself
                future.set_result(_read(where / (key + EXECUTABLE)))

    if futures:
        threading.Thread(target=read_all, name="compile_cache-read-ahead", daemon=False).start()


@atexit.register
def _finish_workload() -> None:
    """Write the workload's list of entries used, if this process used any."""
    global _workload
    if _workload is not None and _used:
        _store(_workload, ("\n".join(_used) + "\n").encode())
    _workload = None


def _store(path: Path, blob: bytes) -> None:
    """Write ``blob`` whole or not at all (a temporary file renamed into place), so a reader never
    meets half an entry; a failed write (a full disk, a directory removed meanwhile) leaves the run
    as it was.  No fsync: an entry lost to a crash costs one lowering, never a wrong program."""
    try:
        write_atomic(path, blob, durable=False)
    except OSError as e:
        _log.debug("not stored %s: %s", path, e)
