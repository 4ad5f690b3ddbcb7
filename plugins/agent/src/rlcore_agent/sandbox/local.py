"""Running untrusted Python on this machine, as contained as the system allows.

Layers, outermost first:

* **bubblewrap** (``bwrap``): new network, PID, IPC and UTS namespaces (no network at all; every
  process dies with the sandbox), a read-only view of only the system directories and the Python
  installation, a private ``/tmp``, and the execution's own directory as ``/sandbox``, the only
  writable place. Other executions' directories are not visible.
* **a private user id per concurrent slot** (when rlcore runs as root): the code runs as a uid no
  other process uses, so the process limit counts only its own processes, it cannot read another
  slot's files (each directory is mode 700), and every leftover process is killed by uid afterwards.
* **rlimits**: CPU time, address space (memory), processes, file size; a wall-clock timeout; output
  read up to a byte limit, after which the program is stopped.

Without bwrap (isolation ``none``, or ``auto`` where it is not installed) the rlimits, the private
uid and the private directory remain, and a warning says that the file system is not hidden (and
the network is cut only where ``unshare --net`` works).
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loguru import logger

from rlcore.errors import UsageError

SANDBOX_DIR = "/sandbox"


def _base_interpreter() -> str:
    """The real interpreter behind this (possibly virtual) environment.

    Model-written code needs only the standard library; the base interpreter lives outside the
    sandbox's private /tmp even when the virtual environment is under /tmp (a CI checkout).
    """
    base = getattr(sys, "_base_executable", None) or sys.executable
    real = os.path.realpath(base)
    return real if os.path.exists(real) else sys.executable


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_processes: int = 16
    max_output_bytes: int = 1_000_000
    max_file_mb: int = 64


@dataclass
class RunResult:
    """One execution, in sandbox-fusion's terms: status is Finished, TimeLimitExceeded or Error."""

    status: str
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float
    output_truncated: bool = False
    message: str = ""
    files: dict[str, bytes] | None = None


def _bwrap_works(bwrap: str) -> bool:
    try:
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--dev", "/dev", "--proc", "/proc", "--", "true"],
            capture_output=True,
            timeout=20,
        )
        return probe.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class LocalSandbox:
    def __init__(
        self,
        limits: Limits | None = None,
        python: str | None = None,
        isolation: Literal["auto", "bwrap", "none"] = "auto",
        max_concurrency: int = 32,
    ):
        self.limits = limits or Limits()
        self.python = python or _base_interpreter()
        self.max_concurrency = max(1, min(int(max_concurrency), 128))
        self.as_root = os.geteuid() == 0
        bwrap = shutil.which("bwrap")
        if isolation == "bwrap" and (bwrap is None or not _bwrap_works(bwrap)):
            raise UsageError(
                "python tool: isolation = 'bwrap' but bubblewrap is not installed or cannot create namespaces "
                "here; install it (apt-get install -y bubblewrap) or set isolation = 'auto'"
            )
        if isolation == "auto":
            isolation = "bwrap" if bwrap is not None and _bwrap_works(bwrap) else "none"
            if isolation == "none":
                logger.warning(
                    "bubblewrap is unavailable: sandboxed code runs as a plain subprocess with rlimits; "
                    "it can read the host's files{}. Install bubblewrap (apt-get install -y bubblewrap).",
                    "" if self._can_unshare_net() else " and use the network",
                )
        self.isolation = isolation
        self.bwrap = bwrap
        self.root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-"))
        os.chmod(self.root, 0o711)
        self._uid_base = 1_500_000 + (os.getpid() % 4000) * 128
        self._free = list(range(self.max_concurrency))
        self._slot_lock = threading.Lock()
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    # ------------------------------------------------------------------ helpers

    def _can_unshare_net(self) -> bool:
        return self.as_root and shutil.which("unshare") is not None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(id(loop))
        if sem is None:
            sem = self._semaphores[id(loop)] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def _take_slot(self) -> int:
        with self._slot_lock:
            return self._free.pop()

    def _give_slot(self, slot: int) -> None:
        with self._slot_lock:
            self._free.append(slot)

    def _ro_binds(self) -> list[str]:
        args: list[str] = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        if Path("/etc").is_dir():
            args += ["--ro-bind", "/etc", "/etc"]
        made: set[str] = {"/", "/usr", "/etc", "/tmp", "/dev", "/proc", SANDBOX_DIR}
        exe = Path(self.python)
        paths = {sys.prefix, sys.base_prefix, str(exe.parent), str(exe.resolve().parent.parent)}
        for path in sorted(paths):
            p = Path(path)
            if str(p).startswith("/usr/") or str(p) == "/usr" or not p.exists():
                continue
            for parent in reversed(p.parents):
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            if str(p) not in made:
                made.add(str(p))
                args += ["--ro-bind", str(p), str(p)]
        return args

    def _command(self, workdir: Path, uid: int) -> tuple[list[str], str, dict[str, str]]:
        """argv, cwd and environment of one execution."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": SANDBOX_DIR if self.isolation == "bwrap" else str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        python = [self.python, "-I", "-u", "main.py"]
        drop = (
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
            if self.as_root
            else []
        )
        if self.isolation == "bwrap":
            assert self.bwrap is not None
            argv = [self.bwrap, *self._ro_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
            argv += ["--bind", str(workdir), SANDBOX_DIR, "--chdir", SANDBOX_DIR]
            argv += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
            if not self.as_root:
                argv += ["--unshare-user"]
            argv += ["--die-with-parent", "--new-session", "--clearenv"]
            for key, value in env.items():
                argv += ["--setenv", key, value]
            return [*argv, "--", *drop, *python], str(workdir), env
        prefix = ["unshare", "--net", "--"] if self._can_unshare_net() else []
        return [*prefix, *drop, *python], str(workdir), env

    def _preexec(self, lim: Limits) -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
        mem = lim.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        size = lim.max_file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.as_root:
            # Counted per (private) uid once setpriv has switched to it; root itself is exempt.
            resource.setrlimit(resource.RLIMIT_NPROC, (lim.max_processes, lim.max_processes))
        else:
            # Best effort: the count includes this user's other processes.
            own = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
            n = own + lim.max_processes
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))

    def _kill_uid(self, uid: int) -> None:
        """Kill every process of a slot's private uid (escaped daemons, fork-bomb leftovers)."""
        if not self.as_root:
            return
        pid = os.fork()
        if pid == 0:  # child: become the uid and signal everything it owns, itself included
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    # ------------------------------------------------------------------ running

    async def run(
        self,
        code: str,
        stdin: str = "",
        limits: Limits | None = None,
        files: dict[str, bytes] | None = None,
        fetch_files: list[str] | None = None,
    ) -> RunResult:
        async with self._semaphore():
            slot = self._take_slot()
            try:
                return await self._run(code, stdin, limits or self.limits, slot, files or {}, fetch_files or [])
            finally:
                self._give_slot(slot)

    async def _run(
        self, code: str, stdin: str, limits: Limits, slot: int, files: dict[str, bytes], fetch: list[str]
    ) -> RunResult:
        uid = self._uid_base + slot
        workdir = Path(tempfile.mkdtemp(prefix=f"run{slot}-", dir=self.root))
        try:
            for rel, data in files.items():
                target = _inside(workdir, rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (workdir / "main.py").write_text(code, encoding="utf-8")
            if self.as_root:
                for path in [workdir, *workdir.rglob("*")]:
                    os.chown(path, uid, uid)
            os.chmod(workdir, 0o700)
            argv, cwd, env = self._command(workdir, uid)
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    preexec_fn=functools.partial(self._preexec, limits),
                    start_new_session=True,
                )
            except OSError as exc:
                return RunResult("Error", None, "", "", 0.0, message=f"could not start the sandbox: {exc}")
            result = await self._collect(proc, stdin, limits, started, uid)
            if fetch:
                result.files = {}
                for rel in fetch:
                    try:
                        target = _inside(workdir, rel)
                        if target.is_file() and target.stat().st_size <= limits.max_output_bytes:
                            result.files[rel] = target.read_bytes()
                    except (OSError, ValueError):
                        continue
            return result
        finally:
            await asyncio.to_thread(self._kill_uid, uid)
            shutil.rmtree(workdir, ignore_errors=True)

    async def _collect(self, proc: asyncio.subprocess.Process, stdin: str, limits: Limits, started: float, uid: int) -> RunResult:
        out, err = bytearray(), bytearray()
        total = 0
        overflow = asyncio.Event()

        async def pump(stream: asyncio.StreamReader | None, sink: bytearray) -> None:
            nonlocal total
            if stream is None:
                return
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                room = limits.max_output_bytes - total
                sink.extend(chunk[: max(room, 0)])
                total += len(chunk)
                if total > limits.max_output_bytes:
                    # Keep draining (and discarding): a pipe nobody reads is never seen to close,
                    # and asyncio's proc.wait() returns only once the pipes have closed.
                    overflow.set()

        async def feed() -> None:
            if proc.stdin is None:
                return
            try:
                if stdin:
                    proc.stdin.write(stdin.encode())
                    await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass

        pumps = asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err), feed())
        waiter = asyncio.ensure_future(proc.wait())
        overflowed = asyncio.ensure_future(overflow.wait())
        done, _ = await asyncio.wait({waiter, overflowed}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not done
        truncated = overflow.is_set()
        if waiter not in done:
            self._kill(proc, uid)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 10)
            except asyncio.TimeoutError:  # killed, but not seen to exit: never hang the caller
                waiter.cancel()
        overflowed.cancel()
        try:
            await asyncio.wait_for(pumps, 5)
        except asyncio.TimeoutError:  # a grandchild holds the pipes open: it was killed by uid
            pumps.cancel()
        elapsed = time.monotonic() - started
        rc = proc.returncode
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        cpu_killed = rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL) and not truncated
        if timed_out or (cpu_killed and rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU)):
            status = "TimeLimitExceeded"
        else:
            status = "Finished"
        message = ""
        if timed_out:
            message = f"stopped after {limits.wall_s:g} s of wall-clock time"
        elif truncated:
            message = f"stopped: the output exceeded {limits.max_output_bytes} bytes"
        elif rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            message = f"stopped after {limits.cpu_s} s of CPU time"
        return RunResult(status, rc, stdout, stderr, elapsed, output_truncated=truncated, message=message)

    def _kill(self, proc: asyncio.subprocess.Process, uid: int) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        self._kill_uid(uid)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __del__(self) -> None:  # best effort: the directory is empty unless a run was interrupted
        try:
            shutil.rmtree(self.root, ignore_errors=True)
        except Exception:  # noqa: BLE001
            pass


def _owner(proc_dir: Path) -> int:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return -1


def _inside(root: Path, rel: str) -> Path:
    """``root/rel``, refusing paths that leave ``root``."""
    target = (root / rel).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise ValueError(f"path {rel!r} leaves the sandbox directory")
    return target
