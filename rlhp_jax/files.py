"""Writing a file whole or not at all (layer 0): the one home of the project's atomic writes.

A reader, or a run resumed after a crash, meets either the old file or the new one, never half of
either: the content goes to a temporary file beside the target (a dot-name ending in ``.tmp``),
which is flushed, fsynced and renamed over the target.  ``durable`` (the default) also fsyncs the
directory, so the rename itself survives a power cut; a cache entry, which a crash may lose at the
price of recomputing it, skips both fsyncs.  A failed write (a full disk, an exception in the
writer) removes the temporary file and leaves the target as it was.  (``render.video.encode_mp4``
keeps the same rule where ffmpeg, not Python, writes the temporary file.)

A process killed mid-write (SIGKILL, a power cut) cannot remove its temporary file.  Each one
names its writer's process id (:func:`temporary_path`), so a run that takes its directory back
(``runs.claimed``) removes those a dead process left (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import errno
import os
import re
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


_TEMPORARY = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp(\.[A-Za-z0-9]+)?$")


def temporary_path(path: str | os.PathLike, suffix: str = "") -> Path:
    """Where a write of ``path`` puts its content before the rename: a dot-name beside it that
    names this process (``.NAME.PID.HEX.tmp``, then ``suffix``, e.g. ``.mp4`` for a program that
    picks the format by the extension)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp{suffix}")


def remove_stale_temporaries(directory: str | os.PathLike, depth: int = 3) -> list[Path]:
    """Removes, in ``directory`` and up to ``depth`` folders below it (a run's deepest writes are
    ``checkpoints/STEP/``'s), the temporary files of writes whose process is gone (killed before its
    rename or its clean-up); returns them.  A live process's are kept, so this is safe beside any
    writer; a process id the system reused keeps a stale file, which is harmless.  Best effort: a
    file or folder it may not remove or read (another user's) is left as it is."""
    removed = []
    top = os.path.normpath(directory)
    for root, dirs, names in os.walk(top):
        if os.path.relpath(root, top).count(os.sep) + (root != top) >= depth:
            dirs.clear()  # deeper than any write of a run: not walked (a mistaken --out ~ stays quick)
        for name in names:
            m = _TEMPORARY.match(name)
            if m and not _alive(int(m.group(1))):
                path = Path(root) / name
                try:
                    path.unlink()
                except OSError:  # gone meanwhile, or not ours to remove
                    continue
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False  # no process's (and kill(0, 0) would signal this process group)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's process
    return True


class ForeignLink(ValueError):
    """A folder or store of a run is a symbolic link: reading or writing through it would act on
    whatever it points at (another run's checkpoints, a file of the user's)."""


def own_folder(path: str | os.PathLike) -> Path:
    """``path`` as a folder a run writes in (its checkpoints, TensorBoard events, clips, a sweep's
    lanes), made if missing: refused (:class:`ForeignLink`) where it is a symbolic link, which a run
    directory from someone else may hold (``checkpoints -> ../your-run/checkpoints``: pruning there
    deletes your run's steps), or anything but a folder."""
    path = Path(path)
    refuse_link(path, "folder")
    path.mkdir(parents=True, exist_ok=True)
    refuse_link(path, "folder")  # (made by someone else between the check and the mkdir)
    if not path.is_dir():
        raise ForeignLink(f"{path} is not a folder")
    return path


def refuse_link(path: str | os.PathLike, what: str = "file") -> None:
    """:class:`ForeignLink` where ``path`` is a symbolic link (dangling or not)."""
    if os.path.islink(path):
        raise ForeignLink(f"{path} is a symbolic link (to {os.readlink(path)}): a run's {what}s are its own, "
                          "never another place reached through a link; remove the link or choose another directory")


def write_atomic(path: str | os.PathLike, content: bytes | str | Callable[[IO[bytes]], None], *,
                 durable: bool = True, replace: bool = True) -> Path:
    """Replace ``path`` by ``content`` in one step: bytes, text (UTF-8), or a function that writes
    the open binary file.  Returns ``path``; the parent directory must exist.  ``replace=False``:
    the file is only ever placed where nothing is (a data file the command found new when it
    started, which another process may have written since): ``FileExistsError`` otherwise, and
    what is there (a file, a directory, a symlink) is left as it was."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            place_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def open_append(path: str | os.PathLike) -> IO[bytes]:
    """``path`` opened to append to (made where missing): a log kept across attempts.  A symlink
    left at its name (a folder someone else made) is replaced by an empty file of its own first
    (:func:`write_atomic`), so what it points at is never appended to; one planted between that and
    the open is refused (``O_NOFOLLOW``: an ``OSError``)."""
    path = Path(path)
    if path.is_symlink():
        write_atomic(path, b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    return os.fdopen(fd, "ab")


def place_new(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename ``tmp`` to ``path`` unless something is at ``path`` (``FileExistsError``): a hard link,
    which the kernel refuses to make over any existing name, then the temporary name removed.  (The
    last step of ``write_atomic(replace=False)``, and of the clip encoder's, whose file ffmpeg writes.)"""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: the check and the rename, a moment apart
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)
