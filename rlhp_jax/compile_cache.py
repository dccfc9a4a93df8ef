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
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

ENV = "RLHP_JAX_COMPILE_CACHE"
OFF = ("", "0", "off", "none", "false", "no")
MAX_BYTES = 2 << 30  # 2 GiB
PRUNE_TO = 0.75  # a pruned directory keeps this share of MAX_BYTES, so the next starts need not prune again
ENTRY, STAMP = "-cache", "-atime"  # JAX's names: an entry, and the access stamp its bounded mode writes


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
                if not e.name.endswith(ENTRY):
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
        for name in (path, path[: -len(ENTRY)] + STAMP):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        total -= size
        deleted += 1
    return deleted
