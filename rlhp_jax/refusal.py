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


def check_new_file(path: str | os.PathLike, overwrite: bool, flag: str = "--out") -> Path:
    """``path`` as the data file a command is about to write (recorded demonstrations, exported
    labels), refused before any work where it is a directory, or already exists and ``overwrite``
    (the command's ``--overwrite``) is false: no one's data is replaced by a mistyped path."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; {flag} names the file to write")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: choose another {flag}, or pass --overwrite to replace it")
    return path
