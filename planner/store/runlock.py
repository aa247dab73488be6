"""One run per output folder: an advisory OS lock held for the whole run.

Two `pack` runs writing the same --out would interleave their plans into one mixed run that nothing
flags. The lock is fcntl.flock on OUT/.hydraplan.lock: the kernel drops it when the holder's last file
descriptor closes, so it cannot outlive a killed run (a marker file would). The file names the holder (pid
and command) for the refusal message, and the holder removes it when the run ends, successful or not (a
killed run leaves it, unlocked and harmless). Removing a lock file races with a process that opened it just
before: that process would lock the removed file while a third locks a new one. So a process that gets the
lock checks that the path still names the file it locked, and opens it again otherwise.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from hydraplan.core.errors import UserError
from hydraplan.store.fileio import ensure_folder

LOCK_NAME = ".hydraplan.lock"


@contextmanager
def locked_folder(folder: Path, what: str) -> Iterator[Path]:
    """Create `folder` and hold its lock until the block ends; a UserError naming the holder if another
    process holds it. The descriptor is close-on-exec, so no child process keeps the lock alive."""
    ensure_folder(folder, what)
    path = folder / LOCK_NAME
    fd = _lock(path, folder, what)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])})\n".encode(), 0)
        yield folder
    finally:
        with suppress(OSError):  # removed while still locked: see the module docstring
            os.unlink(path)
        os.close(fd)  # releases the lock


def _lock(path: Path, folder: Path, what: str) -> int:
    """A descriptor of `path` holding its lock, the file still at `path`."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(f"{what} {folder}: cannot create the lock file {path.name}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"{what} {folder}: in use by {holder}; wait for it to finish or choose another {what}") from None
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # the holder removed it between our open and our lock: lock the new one
