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
every array it holds) keys a serialized ``jax.export`` of its lowering, stored beside JAX's entries
(``-exported``, bounded with them).  A hit skips the lowering; the deserialized program is the same StableHLO, so a run's
results are the same to the bit.  Nothing outside the traced program enters it (no source hash,
no config): a program that computes anything differently traces to a different jaxpr, and what
lowering depends on besides the jaxpr (JAX's version, the backend and device, JAX's options) is
in the key too.  A program that cannot be exported (a host callback) runs as plain ``jax.jit``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

ENV = "RLHP_JAX_COMPILE_CACHE"
OFF = ("", "0", "off", "none", "false", "no")
MAX_BYTES = 2 << 30  # 2 GiB
PRUNE_TO = 0.75  # a pruned directory keeps this share of MAX_BYTES, so the next starts need not prune again
ENTRY, STAMP = "-cache", "-atime"  # JAX's names: an entry, and the access stamp its bounded mode writes
EXPORTED = "-exported"  # this module's entries: a traced program's serialized lowering (see jit)
_log = logging.getLogger(__name__)
_exports: Path | None = None  # where jit() keeps its entries: the cache's directory once enable() ran


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


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Turn the cache on for this process (``path``, else :func:`directory`); returns where it is,
    or None when it stays off (also, with a warning, when the directory cannot be made: a run
    never fails for want of its cache).  Call before the first compilation."""
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
    prune(where)
    global _exports
    _exports = where
    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_compilation_cache_max_size", -1)  # unbounded for JAX: prune() bounds it
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
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
                if not e.name.endswith((ENTRY, EXPORTED)):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                entries.append((max(st.st_atime_ns, st.st_mtime_ns), st.st_size, e.path))
    except FileNotFoundError:
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
def jit(fn: Callable, *, static_argnums: int | tuple[int, ...] = ()) -> "Program":
    """``jax.jit(fn, static_argnums=...)`` whose lowering is kept in the cache (module docstring):
    for the host driver's programs, called with arrays (or nested containers of them) as
    positional arguments.  Called while the cache is off, from inside another program, or with
    keyword arguments, it is plain ``jax.jit``; ``lower``, ``trace`` and the rest are jax.jit's."""
    return Program(fn, static_argnums)


_UNBUILT = object()


class Program:
    """See :func:`jit`.  One compiled callable per call signature (the static arguments, the
    arguments' tree and each leaf's shape, dtype and weak type), built at its first call."""

    def __init__(self, fn: Callable, static_argnums):
        import jax

        self._fn = fn
        self._static = (static_argnums,) if isinstance(static_argnums, int) else tuple(sorted(static_argnums))
        self._jit = jax.jit(fn, static_argnums=static_argnums)
        self._built: dict[Any, tuple[Callable, Any] | None] = {}
        self.__name__ = getattr(fn, "__name__", "program")

    def __getattr__(self, name):  # lower, trace, eval_shape, ...: jax.jit's
        return getattr(self._jit, name)

    def __call__(self, *args, **kwargs):
        if _exports is None or kwargs:
            return self._jit(*args, **kwargs)
        import jax

        statics = tuple(args[i] for i in self._static)
        leaves, tree = jax.tree.flatten([a for i, a in enumerate(args) if i not in self._static])
        signature = _signature(statics, tree, leaves)
        if signature is None:  # a tracer (called inside another program) or an unhashable static
            return self._jit(*args)
        built = self._built.get(signature, _UNBUILT)
        if built is _UNBUILT:
            built = self._built[signature] = self._build(statics, tree, leaves, len(args))
        if built is None:  # not exportable: plain jax.jit
            return self._jit(*args)
        call, out_tree = built
        return out_tree.unflatten(call(*leaves))

    def _build(self, statics, tree, leaves, nargs):
        """(compiled callable over the leaves, output tree), or None where the program cannot be
        exported.  A program that fails to trace returns None too: plain jax.jit then raises the
        same error, as it would have without this tier."""
        import jax
        from jax import export as jax_export

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
        jitted = jax.jit(flat)
        try:
            traced = jitted.trace(*leaves)
            path = _exports / (program_key(traced.jaxpr) + EXPORTED)
            exported = _load(path, len(traced.out_info)) if path.exists() else None
            if exported is None:
                exported = jax_export.export(jitted)(*leaves)
                _store(path, exported.serialize())
        except Exception as e:  # a host callback, an unsupported custom call, a tracing error
            _log.debug("program %s runs as plain jax.jit: %s", self.__name__, e)
            return None

        def call(*xs):
            return exported.call(*xs)

        call.__name__ = call.__qualname__ = self.__name__
        return jax.jit(call), out_trees[0]


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


def _lowering_context() -> bytes:
    """What lowering depends on besides the traced program: JAX's and jaxlib's versions, the
    backend and its device kind, and every JAX option except those that only log, profile or name
    caches (an option left in costs a miss, never a wrong program).  Read at each key: an option
    may change while a process runs."""
    import jax
    import jaxlib

    quiet = ("log", "cache", "traceback", "explain", "profil", "pgle", "topology_timeout", "mock_gpu")
    options = sorted((k, repr(v)) for k, v in jax.config.values.items() if not any(q in k for q in quiet))
    return repr((jax.__version__, jaxlib.__version__, jax.default_backend(), jax.devices()[0].device_kind,
                 options)).encode()


def program_key(closed_jaxpr) -> str:
    """The cache key of a traced program: its jaxpr as JAX prints it (every equation with its
    parameters, the arguments' and results' types, scalar literals' values), the dtype, shape and
    bytes of every array it holds that the print elides (its constants, those of the programs
    nested in it, array literals and array parameters), and :func:`_lowering_context`."""
    h = hashlib.sha256(_lowering_context())
    h.update(str(closed_jaxpr.jaxpr).encode())
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


def _load(path: Path, num_outputs: int):
    """The exported program stored at ``path``, or None if it cannot be read back whole (another
    process pruning or writing it, a different serialization): the caller exports it again."""
    from jax import export as jax_export

    try:
        exported = jax_export.deserialize(bytearray(path.read_bytes()))
    except Exception as e:
        _log.debug("unreadable %s: %s", path, e)
        return None
    return exported if len(exported.out_avals) == num_outputs else None


def _store(path: Path, blob: bytes) -> None:
    """Write ``blob`` whole or not at all (a temporary file renamed into place), so a reader never
    meets half an entry; a failed write (a full disk, a directory removed meanwhile) leaves the run
    as it was.  No fsync: an entry lost to a crash costs one lowering, never a wrong program."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        temporary.write_bytes(blob)
        os.replace(temporary, path)
    except OSError as e:
        _log.debug("not stored %s: %s", path, e)
        temporary.unlink(missing_ok=True)
