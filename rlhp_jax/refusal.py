"""How every command of this project refuses what it was given (a missing or damaged file, a flag
value out of range, a run directory of another run): one line ``error: <reason>`` on stderr and exit
status 2, argparse's own for a bad flag, never a traceback.  Commands catch the exceptions that
mean bad input (``ValueError``, ``OSError`` and the project's own kinds) and return
``refuse(e)``; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXIT_REFUSED = 2  # the exit status of a refused command (argparse exits with 2 on a bad flag too)


def refuse(reason: object) -> int:
    """Print ``error: <reason>`` on stderr; returns :data:`EXIT_REFUSED` for ``main()`` to return."""
    print(f"error: {reason}", file=sys.stderr)
    return EXIT_REFUSED


def _file_in_the_way(path: Path) -> Path | None:
    """The existing file that ``path`` is or lies below (so no directory can be made there), or None."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def check_out_directory(out: str | os.PathLike, flag: str = "--out") -> None:
    """Refuses an output path that cannot become a directory: an existing file, or a path below
    one (``--out /etc/passwd``), naming the path in the way and the ``flag`` that gave it, instead
    of the OS's ``[Errno 17] File exists`` from deep inside the checkpointer or a grid's launch."""
    out = Path(out)
    blocker = _file_in_the_way(out)
    if blocker is not None:
        where = "is a file" if blocker == out else f"lies below {blocker}, which is a file"
        raise ValueError(f"{flag} {out} {where}, not a directory: choose another {flag}.")


def check_new_file(path: str | os.PathLike, overwrite: bool, flag: str = "--out") -> Path:
    """``path`` as the data file a command is about to write (recorded demonstrations, exported
    labels), refused before any work where it is a directory, lies below a file (its folder could
    never be made: a recording would be lost at its save), or already exists and ``overwrite``
    (the command's ``--overwrite``) is false: no one's data is replaced by a mistyped path."""
    path = Path(path)
    blocker = _file_in_the_way(path.parent)
    if blocker is not None:
        raise ValueError(f"{flag} {path} lies below {blocker}, which is a file: choose another {flag}.")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; {flag} names the file to write")
    if (path.exists() or path.is_symlink()) and not overwrite:  # a link, even one to nothing, is someone's
        raise ValueError(f"{path} already exists: choose another {flag}, or pass --overwrite to replace it")
    return path
