"""Breakpoints in any rank: pdb over a loopback TCP socket (standard library only).

A rank started by torchrun, SLURM or Ray may have no usable terminal, and a ``python:`` reward
function runs in a reward worker process whose stdin is ``/dev/null`` (multiprocessing closes it),
so ``breakpoint()`` and ``torch.distributed.breakpoint()`` cannot read your commands there.
:func:`breakpoint` works in all of them::

    from rlcore.debug import breakpoint
    breakpoint(rank=1)          # stops on rank 1 only; every other rank goes on (to its next collective)

The process that stops listens on ``127.0.0.1`` (an ephemeral port, or ``RLCORE_DEBUG_PORT`` +
rank), prints one line on stderr saying where, and records the session in a directory of this
machine (``RLCORE_DEBUG_DIR``, by default ``$TMPDIR/rlcore-debug-UID``). Attach from a shell on
that machine::

    python -m rlcore.debug              # lists waiting breakpoints, attaches to the oldest (waits for one)
    python -m rlcore.debug PID          # or HOST:PORT

``c`` ends the session (the socket closes, the client exits) and the process runs on; breakpoints
set with ``b`` keep the session open for the next stop. While a reward worker is stopped, the
reward runner does not count its time limit (it would otherwise kill the worker).

Plain ``breakpoint()`` calls come here with ``PYTHONBREAKPOINT=rlcore.debug.breakpoint``;
``RLCORE_DEBUG_RANK=N`` then limits them to rank N.
"""

from __future__ import annotations

import argparse
import json
import os
import pdb
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["breakpoint", "session_dir", "sessions", "stopped", "attach", "announce_on"]

# Where a stopped breakpoint says how to attach: the process's stderr, unless its stderr is being
# captured (a reward worker's is, to bound what a reward prints), when the capture keeps the
# console's own stream here so the line still reaches the person waiting for it.
_announcements = None


def announce_on(stream) -> None:
    """Say where breakpoints stopped on ``stream`` rather than on ``sys.stderr``."""
    global _announcements
    _announcements = stream


ENV_RANK, ENV_PORT, ENV_DIR = "RLCORE_DEBUG_RANK", "RLCORE_DEBUG_PORT", "RLCORE_DEBUG_DIR"


def session_dir() -> Path:
    """Where waiting breakpoints are recorded, one JSON file each (``PID-PORT.json``)."""
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / f"rlcore-debug-{os.getuid()}")


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sessions() -> list[dict]:
    """The breakpoints waiting (or attached) on this machine, oldest first; records of processes
    that no longer exist are removed."""
    out = []
    for path in sorted(session_dir().glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not _alive(int(record.get("pid", -1))):
            path.unlink(missing_ok=True)
            continue
        out.append(record)
    return sorted(out, key=lambda r: r.get("time", 0.0))


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped at (or attached to) a breakpoint of this module."""
    return any(session_dir().glob(f"{pid}-*.json"))


class _SocketPdb(pdb.Pdb):
    """pdb reading and writing one accepted connection; the session ends at ``c`` (without
    breakpoints set), ``q`` or the client's end of input."""

    def __init__(self, listener: socket.socket, conn: socket.socket, record: Path) -> None:
        self._listener, self._conn, self._record = listener, conn, record
        self._io = conn.makefile("rw", encoding="utf-8", errors="replace", newline="\n")
        super().__init__(stdin=self._io, stdout=self._io, nosigint=True)
        self.use_rawinput = False
        self._ended = False

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        for close in (self._io.flush, self._io.close, self._conn.close, self._listener.close):
            try:
                close()
            except OSError:
                pass
        self._record.unlink(missing_ok=True)

    def do_continue(self, arg):
        result = super().do_continue(arg)
        if not self.breaks:  # with breakpoints set, keep the connection for the next stop
            self.end()
        return result

    do_c = do_cont = do_continue

    def do_quit(self, arg):
        result = super().do_quit(arg)
        self.end()
        return result

    do_q = do_exit = do_quit

    def do_EOF(self, arg):
        result = super().do_EOF(arg)
        self.end()
        return result


def _listen(host: str, port: int | None) -> socket.socket:
    wanted = port
    if wanted is None and os.environ.get(ENV_PORT, "").strip():
        wanted = int(os.environ[ENV_PORT]) + _rank()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, wanted or 0))
    except OSError:
        if port is not None:  # asked for by the caller: say so
            listener.close()
            raise
        listener.bind((host, 0))  # RLCORE_DEBUG_PORT's port is taken (another stop on this rank)
    listener.listen(1)
    return listener


def breakpoint(rank: int | None = None, *, port: int | None = None, host: str = "127.0.0.1") -> None:  # noqa: A001
    """Stop here in pdb, served on ``host:port`` (loopback, an ephemeral port by default), and wait
    for ``python -m rlcore.debug`` to attach. ``rank``: stop only on that rank (``RANK``; default:
    ``RLCORE_DEBUG_RANK``, else every rank). Other ranks are not stopped: they wait in their next
    collective, for at most the process group's timeout (``RLCORE_DIST_TIMEOUT_S``, 900 s)."""
    if rank is None and os.environ.get(ENV_RANK, "").strip():
        rank = int(os.environ[ENV_RANK])
    if rank is not None and _rank() != rank:
        return
    frame = sys._getframe().f_back
    listener = _listen(host, port)
    bound_host, bound_port = listener.getsockname()[:2]
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    record = {
        "pid": os.getpid(),
        "rank": _rank(),
        "host": bound_host,
        "port": bound_port,
        "where": where,
        "function": frame.f_code.co_name if frame is not None else "?",
        "time": time.time(),
    }
    directory = session_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{os.getpid()}-{bound_port}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(path)
    print(
        f"rlcore.debug: rank {record['rank']} (pid {record['pid']}) stopped at {where}; "
        f"attach with: {Path(sys.executable).name} -m rlcore.debug {bound_host}:{bound_port}",
        file=_announcements or sys.stderr,
        flush=True,
    )
    try:
        conn, _ = listener.accept()
    except BaseException:
        listener.close()
        path.unlink(missing_ok=True)
        raise
    debugger = _SocketPdb(listener, conn, path)
    debugger.message(
        f"rlcore.debug: rank {record['rank']}, pid {record['pid']}, in {record['function']} ({where})"
    )
    debugger.set_trace(frame)


# ----------------------------------------------------------------------------- the client


def attach(host: str, port: int, stdin=None, stdout=None) -> None:
    """Relay a terminal (or ``stdin``/``stdout``) to the pdb served at ``host:port`` until the
    session ends."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    conn = socket.create_connection((host, port))
    done = threading.Event()

    def relay_out() -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            stdout.write(data.decode("utf-8", errors="replace"))
            stdout.flush()
        done.set()

    reader = threading.Thread(target=relay_out, daemon=True)
    reader.start()
    tty = hasattr(stdin, "isatty") and stdin.isatty()
    if tty:
        try:
            __import__("readline")  # line editing and history for input()
        except ImportError:
            pass
    lines: list[str | None] = []

    def relay_in() -> None:
        while True:
            try:
                line = input() + "\n" if tty else stdin.readline()
            except EOFError:
                line = ""
            lines.append(line)
            if not line:
                break
            try:
                conn.sendall(line.encode("utf-8"))
            except OSError:
                break
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=relay_in, daemon=True).start()  # a thread: input() blocks past the session's end
    done.wait()
    conn.close()


def _choose(target: str | None, wait_s: float) -> tuple[str, int]:
    if target and ":" in target:
        host, _, port = target.rpartition(":")
        return host or "127.0.0.1", int(port)
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        found = [s for s in sessions() if target is None or str(s["pid"]) == target]
        if found:
            break
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"rlcore.debug: no breakpoint {'of pid ' + target + ' ' if target else ''}is waiting "
                f"in {session_dir()}"
            )
        if not announced:
            print(
                f"rlcore.debug: waiting for a breakpoint (in {session_dir()}); Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            announced = True
        time.sleep(0.2)
    if len(found) > 1:
        print("rlcore.debug: waiting breakpoints (attaching to the first):", file=sys.stderr)
        for s in found:
            print(
                f"  pid {s['pid']}  rank {s['rank']}  {s['host']}:{s['port']}  {s['where']}", file=sys.stderr
            )
    first = found[0]
    return first["host"], int(first["port"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcore.debug", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "target", nargs="?", help="PID or HOST:PORT of a waiting breakpoint (default: the oldest)"
    )
    parser.add_argument("--list", action="store_true", help="list the waiting breakpoints and exit")
    parser.add_argument(
        "--wait",
        type=float,
        default=float("inf"),
        metavar="SECONDS",
        help="how long to wait for a breakpoint to be hit (default: until one is)",
    )
    args = parser.parse_args(argv)
    if args.list:
        for s in sessions():
            print(f"pid {s['pid']}  rank {s['rank']}  {s['host']}:{s['port']}  {s['where']}")
        return 0
    try:
        host, port = _choose(args.target, args.wait)
        attach(host, port)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
