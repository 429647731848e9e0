"""Files that hold publications, journals or credentials: readable by their owner only.

They are made with mode 0600 (directories 0700) whatever the umask; SQLite gives the files it
makes beside a database (``-wal``, ``-shm``, ``-journal``) the database file's mode. One that
exists already keeps its mode, with a warning if others may read it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["private_directory", "private_file"]

log = logging.getLogger("padres.security")


def private_file(path: str | Path) -> None:
    """Make the empty file ``path``, for its owner only, unless it exists (see the module
    docstring)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        _check(Path(path))
        return
    try:
        os.fchmod(fd, 0o600)  # whatever the umask took away or left
    finally:
        os.close(fd)


def private_directory(path: str | Path) -> Path:
    """Make the directory ``path`` (and its parents), for its owner only, unless it exists."""
    directory = Path(path)
    if directory.is_dir():
        _check(directory)
    else:
        directory.mkdir(mode=0o700, parents=True)
        directory.chmod(0o700)
    return directory


def _check(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning(
            "%s may be read by other users of this machine (mode %03o): it holds publications "
            "or credentials; chmod %s it",
            path,
            mode,
            "700" if path.is_dir() else "600",
        )
