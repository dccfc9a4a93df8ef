"""Writing a file whole or not at all (layer 0): the one home of the project's atomic writes.

A reader, or a run resumed after a crash, meets either the old file or the new one, never half of
either: the content goes to a temporary file beside the target (a dot-name ending in ``.tmp``),
which is flushed, fsynced and renamed over the target.  ``durable`` (the default) also fsyncs the
directory, so the rename itself survives a power cut; a cache entry, which a crash may lose at the
price of recomputing it, skips both fsyncs.  A failed write (a full disk, an exception in the
writer) removes the temporary file and leaves the target as it was.  (``render.video.encode_mp4``
keeps the same rule where ffmpeg, not Python, writes the temporary file.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: str | os.PathLike) -> None:
    """Persist a directory's entries (a rename or a new file in it) on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, content: bytes | str | Callable[[IO[bytes]], None], *,
                 durable: bool = True) -> Path:
    """Replace ``path`` by ``content`` in one step: bytes, text (UTF-8), or a function that writes
    the open binary file.  Returns ``path``; the parent directory must exist."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path
