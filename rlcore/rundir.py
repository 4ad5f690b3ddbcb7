"""The run directory: one live run at a time, and what refuses a run there.

A run (rank 0 of it) holds an exclusive lock on ``<run_dir>/.lock`` from the moment it prepares the
directory until it ends; a second run on the same directory is refused with a message naming the
holder (its pid, host and start time are written into the lock file). Two runs on one directory
would otherwise corrupt each other: each rewrites ``metrics.jsonl``, and one's checkpoint save
prunes the other's temporary directory.

The lock is a POSIX record lock (``fcntl.lockf``), not ``flock``: the kernel drops it when the
holding process dies, however it dies, so a stale lock file never blocks a later run (a run that
ends cleanly removes the file); it is not
inherited by forked children (reward workers), so a worker outliving a killed trainer cannot keep
it; and NFS (a SLURM cluster's shared directory) implements it across machines. Its one trap --
closing *any* descriptor of the file in the holding process releases the lock -- is avoided by
remembering the locks this process holds and never opening their file again.

Nothing here imports torch: launchers (and ``rlcore run --dry-run``) call :func:`run_dir_problems`
through :mod:`rlcore.launching`.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError, UsageError

LOCK_FILE = ".lock"
_HELD: dict[str, RunDirLock] = {}  # the locks this process holds, by resolved lock-file path
_BUSY = (errno.EACCES, errno.EAGAIN)  # what a refused non-blocking lock raises


def _key(path: Path) -> str:
    return str(path.resolve())


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host node1, started 2026-12-01 10:48:51 UTC`` (what the lock file says)."""
    if not holder.get("pid"):
        return "a live process (the lock file does not say which)"
    text = f"pid {holder['pid']}"
    if holder.get("host"):
        text += f" on host {holder['host']}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    return text


def in_use_message(run_dir: str | Path, holder: dict[str, Any]) -> str:
    run_dir = Path(run_dir)
    return (
        f"the run directory {run_dir} is in use by another run: {describe_holder(holder)} holds its lock "
        f"({run_dir / LOCK_FILE}); wait for that run to end or stop it, or choose another run directory "
        "(--run-dir, or [run] name)"
    )


def holds_checkpoints_message(run_dir: str | Path) -> str:
    return (
        f"the run directory {run_dir} already holds checkpoints; pass --resume to continue that run, "
        "or change [run] name (or --run-dir) to start a new one"
    )


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 65536, 0)
        holder = json.loads(data.decode("utf-8")) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class RunDirLock:
    """The exclusive lock of a run directory, for the life of a run::

    lock = RunDirLock(run_dir).acquire()   # UsageError naming the holder if another run has it
    try:
        ...
    finally:
        lock.release()
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.info: dict[str, Any] = {}
        self._fd: int | None = None
        self._key: str | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunDirLock:
        """Take the lock without waiting. Raises :class:`UsageError` (exit code 2) when a live
        process holds it. Where the filesystem cannot lock at all, warns and goes on unlocked."""
        import fcntl

        from loguru import logger

        self.run_dir.mkdir(parents=True, exist_ok=True)
        key = _key(self.path)
        if key in _HELD:  # this process runs there already (never open the file again: see above)
            raise UsageError(in_use_message(self.run_dir, _HELD[key].info))
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise RlcoreError(
                    f"cannot open the lock file of the run directory {self.run_dir}: {exc}"
                ) from None
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd) if exc.errno in _BUSY else {}
                os.close(fd)
                if exc.errno in _BUSY:
                    raise UsageError(in_use_message(self.run_dir, holder)) from None
                logger.warning(
                    "cannot lock the run directory {} ({}); a second run on it would not be detected",
                    self.run_dir,
                    exc,
                )
                return self
            if _same_file(fd, self.path):
                break
            # The run that held it removed the file as it ended (see release) after this one opened
            # it: the lock taken is on a file no one else will open. Take the one at the path now.
            os.close(fd)
        previous = _read_holder(fd)
        if previous.get("pid"):
            logger.debug(
                "the lock of {} was left by {}, which has ended", self.run_dir, describe_holder(previous)
            )
        self.info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "argv": sys.argv,
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(self.info) + "\n").encode("utf-8"), 0)
            os.fsync(fd)
        except OSError as exc:  # the lock holds even if its description cannot be written (a full disk)
            logger.warning("could not write the holder into {}: {}", self.path, exc)
        self._fd, self._key = fd, key
        _HELD[key] = self
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        fd, self._fd = self._fd, None
        _HELD.pop(self._key, None)
        try:
            os.ftruncate(fd, 0)  # no stale description left behind
        except OSError:
            pass
        # Removed while still locked, so a clean exit leaves no .lock behind; a run that opened the
        # file meanwhile sees that its path names another file, or none, once it has the lock (acquire).
        try:
            if _same_file(fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def lock_holder(run_dir: str | Path) -> dict[str, Any] | None:
    """Who holds the run directory's lock: the holder's description (``pid``, ``host``,
    ``started``; possibly empty of them when it could not be read), or None when no live process
    holds it (a lock file left by a dead process included). Creates nothing."""
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    try:
        key = _key(path)
    except OSError:
        return None
    if key in _HELD:
        return dict(_HELD[key].info)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file (no run ever held it), or not readable
        return None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # conflicts with a holder's exclusive lock
        except OSError as exc:
            if exc.errno in _BUSY:
                return _read_holder(fd) or {"pid": None}
            return None  # the filesystem cannot lock: nothing to say
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def has_checkpoints(run_dir: str | Path) -> bool:
    """Whether the run directory holds a complete checkpoint (intact or not)."""
    from rlcore.checkpoint import Checkpointer  # torch-free to import

    return bool(Checkpointer(run_dir).complete())


def run_dir_problems(run_dir: str | Path, resume: bool) -> list[str]:
    """Why a run on ``run_dir`` would be refused now ([] when it would start): another live run
    holds the directory, it holds checkpoints and ``resume`` is off, or ``resume`` is on and
    every checkpoint there is damaged."""
    problems = []
    holder = lock_holder(run_dir)
    if holder is not None:
        problems.append(in_use_message(run_dir, holder))
    if not resume and has_checkpoints(run_dir):
        problems.append(holds_checkpoints_message(run_dir))
    if resume:
        from rlcore.checkpoint import Checkpointer  # torch-free to import

        try:
            Checkpointer(run_dir).latest()  # None (a fresh start) or an intact checkpoint
        except RlcoreError as exc:  # complete checkpoints, none intact: the run would stop at once
            problems.append(str(exc))
    return problems
