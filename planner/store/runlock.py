"""One run per output folder: an advisory OS lock held for the whole run.

Two `pack` runs writing the same --out would interleave their plans into one mixed run that nothing
flags. The lock is fcntl.flock on OUT/.hydraplan.lock: the kernel drops it when the holder's last file
descriptor closes, so it cannot outlive a killed run (a marker file would). The file only names the
holder (pid and command) for the refusal message; it is kept, since unlinking a lock file races with
the next holder.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UserError(f"{what} {folder}: cannot create the lock file {path.name}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise UserError(f"{what} {folder}: in use by {holder}; wait for it to finish or choose another {what}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])})\n".encode(), 0)
        yield folder
    finally:
        os.close(fd)  # releases the lock
