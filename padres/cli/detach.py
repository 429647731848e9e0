"""``--detach``: run a broker, a database node or a subscriber in the background, and return
once it is ready, so that the next command of a script finds it in place.

The command starts itself again without ``--detach``, in a session of its own, and waits for
the child to say it is ready on a pipe whose descriptor it finds in ``PADRES_READY_FD``; it
then prints what the child said with its process id and exits 0. A child that ends first, or
stays silent for ``WAIT`` seconds, makes it exit 1 saying so. A detached node writes its
output and its log to a file; a detached subscriber prints its deliveries where the command's
output went.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
from collections.abc import Sequence
from typing import Final

__all__ = ["ENV", "WAIT", "add_detach_option", "announce", "detach", "detached"]

ENV: Final = "PADRES_READY_FD"
WAIT: Final = 60.0


def add_detach_option(p: argparse.ArgumentParser, ready: str, log: str | None = None) -> None:
    """``--detach`` for a command that is ready once ``ready``; a node's standard error goes
    to the file ``log`` names (its arguments formatted in, ``{id}.log``)."""
    where = f"; it logs to {log.replace('{id}', 'ID')}" if log else ""
    p.add_argument(
        "--detach",
        action="store_true",
        help=f"run in the background and return once {ready}, printing its process id "
        f"(kill PID stops it){where}",
    )
    p.set_defaults(detach_log=log)


def detached() -> bool:
    """Whether this process was started by ``--detach`` and has yet to say it is ready."""
    return ENV in os.environ


def announce(text: str) -> None:
    """Tell the command that detached this process that it is ready (once; nothing when it
    was not detached)."""
    fd = os.environ.pop(ENV, None)
    if fd is None:
        return
    try:
        with os.fdopen(int(fd), "wb") as pipe:
            pipe.write(text.encode())
    except OSError:  # the command stopped waiting: nobody to tell
        pass


def detach(args: argparse.Namespace, words: Sequence[str], wait: float = WAIT) -> int:
    """Start ``padres WORDS`` (less ``--detach``) in the background; wait until it is ready."""
    log_name = args.detach_log.format(**vars(args)) if args.detach_log else None
    read, write = os.pipe()
    log = open(log_name, "ab") if log_name else None  # noqa: SIM115 - the child's from now on
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "padres.cli", *(w for w in words if w != "--detach")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write,),
            env={**os.environ, ENV: str(write), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    finally:
        os.close(write)
        if log is not None:
            log.close()
    said = _read(read, wait)
    where = f", log {log_name}" if log_name else ""
    if said:
        print(f"{said} (pid {child.pid}{where})", flush=True)
        return 0
    try:  # silent for too long (None), or closed the pipe without a word: it is ending
        code = child.wait(0 if said is None else 10)
    except subprocess.TimeoutExpired:
        print(
            f"padres {args.command}: not ready after {wait:g} s; still running as pid "
            f"{child.pid}{where}",
            file=sys.stderr,
        )
        return 1
    see = f"; see {log_name}" if log_name else ""
    print(
        f"padres {args.command}: it ended before it was ready (exit status {code}{see})",
        file=sys.stderr,
    )
    return code or 1


def _read(fd: int, wait: float) -> str | None:
    """What the child writes on ``fd`` until it closes it, or None after ``wait`` seconds
    of silence."""
    chunks: list[bytes] = []
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while select.select([pipe], [], [], wait)[0]:
            chunk = pipe.read(4096)
            if not chunk:
                return b"".join(chunks).decode(errors="replace").strip()
            chunks.append(chunk)
    return None
