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

Two runs may share the directory: the cache is size-bounded (``MAX_BYTES``, least recently used
entries go first), and in that mode JAX reads and writes every entry under a file lock
(``filelock``), so no process reads an entry another is still writing.  Every program is stored,
however fast it compiles (a run's few dozen small ones add up to seconds; a threshold on
compile time would also make what is stored depend on the machine's load).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

ENV = "RLHP_JAX_COMPILE_CACHE"
OFF = ("", "0", "off", "none", "false", "no")
MAX_BYTES = 2 << 30  # 2 GiB


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
    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return where
