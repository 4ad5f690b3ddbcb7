"""Running untrusted Python on this machine, contained.

Two isolations, chosen by the manifest (``[tools.python] isolation``) and never silently swapped:

* ``bubblewrap`` (the default): ``bwrap`` gives the code new network, PID, IPC and UTS namespaces (no
  network at all; every process dies with the sandbox), a read-only view of only the system
  directories and the interpreter's installation, a private ``/tmp`` and the execution's own
  directory as ``/sandbox``, the only writable place. Where bubblewrap is missing or cannot create
  namespaces, the sandbox refuses to start (:class:`~rlcore.errors.UsageError`).
* ``process`` (explicit opt-in, weaker): no namespaces. The code runs in a private directory (its
  cwd, ``HOME`` and ``TMPDIR``, removed afterwards) under Landlock where the kernel has it: it reads
  only the system directories and the interpreter, writes only its directory, and cannot open TCP
  connections (ABI 4+). The network is cut entirely where ``unshare --net`` works (root). As root,
  after each run every file its private uid left in the shared writable directories (``/tmp``,
  ``/var/tmp``, ``/dev/shm``, ``/run/lock``) is removed. What remains is logged at start-up.

Both add, when rlcore runs as root, **a private user id per concurrent slot** (the process limit
counts only its own processes, slots cannot read each other, leftovers are killed by uid), and
**rlimits** (CPU time, address space, processes, file size), a wall-clock limit counted from the
moment the sandboxed process started (time spent queued for a slot never counts), and output read
up to a byte limit.

The interpreter is the configured one (default: the one running rlcore, virtual environment and
packages included), and a start-up probe checks that the sandbox really runs it (same
``sys.executable``, ``sys.prefix``, standard library): a Python that silently fell back to another
installation is refused, naming the cause.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import resource
import shutil
import signal
import stat
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
from rlcore_agent.sandbox import landlock

SANDBOX_DIR = "/sandbox"
ISOLATIONS = ("bubblewrap", "process")
Isolation = Literal["bubblewrap", "process"]
INSTALL_BWRAP = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; Fedora/RHEL: dnf install -y bubblewrap)"
PROCESS_RISKS = (
    'isolation = "process" runs model-written code without namespaces: without Landlock it can read every '
    "world-readable file on this machine and, unless running as root, write into /tmp"
)
# Directories every process may write to: the process isolation sweeps them for a slot's leftovers.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# What the process isolation lets the code read under Landlock (besides the interpreter).
SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
    "/sys/devices/system/cpu",
    "/proc/sys/kernel/cap_last_cap",
)  # setpriv reads the last one
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

_PROBE = (
    "import json, os, sys, sysconfig\n"
    "print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
    " 'exec_prefix': sys.exec_prefix, 'base_exec_prefix': sys.base_exec_prefix,"
    " 'stdlib': os.path.dirname(os.__file__), 'purelib': sysconfig.get_path('purelib'),"
    " 'platlib': sysconfig.get_path('platlib'), 'version': sys.version}))\n"
)
_COMPARED = ("executable", "prefix", "base_prefix", "stdlib", "version")


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
    """One execution, in sandbox-fusion's terms: status is Finished, TimeLimitExceeded or Error.
    execution_time counts from the moment the sandboxed process started."""

    status: str
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float
    output_truncated: bool = False
    message: str = ""
    files: dict[str, bytes] | None = None


@dataclass(frozen=True)
class Interpreter:
    """What ``python -I`` reports about itself when run directly on the host."""

    info: dict[str, str]

    @property
    def executable(self) -> str:
        return self.info["executable"]

    def dirs(self) -> list[str]:
        """The installation's directories outside the system ones: what the sandbox must expose."""
        exe = self.info["executable"]
        wanted = {os.path.dirname(exe), os.path.dirname(os.path.realpath(exe))}
        wanted |= {
            self.info[k]
            for k in (
                "prefix",
                "base_prefix",
                "exec_prefix",
                "base_exec_prefix",
                "stdlib",
                "purelib",
                "platlib",
            )
        }
        paths = sorted({os.path.realpath(p) for p in wanted if p} | {os.path.abspath(p) for p in wanted if p})
        paths = [p for p in paths if p != "/" and os.path.exists(p) and not _under(p, SYSTEM_DIRS)]
        return [p for p in paths if not any(p != q and _under(p, (q,)) for q in paths)]


def _under(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def describe_interpreter(python: str, where: str) -> Interpreter:
    """Run ``python`` directly (not sandboxed) and ask where it lives; a located error if it cannot run."""
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60)
        info = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        done, info = None, None
        error = str(exc)
    else:
        error = (done.stderr or "").strip()[-500:] or f"exit code {done.returncode}"
    if not isinstance(info, dict):
        raise UsageError(f"{where} python = {python!r}: cannot run it as a Python 3 interpreter ({error})")
    return Interpreter(info)


def _untraversable(path: str) -> str | None:
    """The first directory on the way to ``path`` that other users cannot search, if any."""
    current = Path("/")
    for part in Path(os.path.realpath(path)).parts[1:]:
        try:
            mode = current.stat().st_mode
        except OSError:
            return str(current)
        if not mode & stat.S_IXOTH:
            return str(current)
        current = current / part
    return None


def _bwrap_error(bwrap: str) -> str | None:
    """None when bwrap can create the namespaces the sandbox uses, else why not."""
    args = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--unshare-net",
        "--unshare-pid",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    if os.geteuid() != 0:
        args.append("--unshare-user")
    try:
        probe = subprocess.run([*args, "--", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if probe.returncode == 0 else (probe.stderr.strip()[-400:] or f"exit code {probe.returncode}")


def _unshare_net_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    try:
        return (
            subprocess.run(["unshare", "--net", "--", "true"], capture_output=True, timeout=20).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def default_concurrency() -> int:
    """Two executions per available CPU core (at most 32): more would only share the cores and
    stretch every run's wall-clock time, while a queued call costs nothing against its limit."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(2, min(32, 2 * cores))


class LocalSandbox:
    def __init__(
        self,
        limits: Limits | None = None,
        python: str | None = None,
        isolation: str = "bubblewrap",
        max_concurrency: int | None = None,
        where: str = "[tools.python]",
    ):
        """``where`` names the configuration in error messages ("[tools.python]", "rlcore sandbox serve")."""
        if isolation not in ISOLATIONS:
            raise UsageError(
                f"{where} isolation = {isolation!r}: expected one of {', '.join(map(repr, ISOLATIONS))}"
            )
        self.limits = limits or Limits()
        self.where = where
        self.isolation: Isolation = isolation  # type: ignore[assignment]
        self.max_concurrency = max(1, min(int(max_concurrency or default_concurrency()), 128))
        self.as_root = os.geteuid() == 0
        self.bwrap = shutil.which("bwrap")
        self.landlock_abi = 0
        self.unshare_net = False
        if isolation == "bubblewrap":
            if self.bwrap is None:
                raise UsageError(
                    f'{where} isolation = "bubblewrap" (the default), but bwrap is not installed here: {INSTALL_BWRAP}. '
                    f'Or, accepting the risks, set isolation = "process" ({PROCESS_RISKS})'
                )
            why = _bwrap_error(self.bwrap)
            if why is not None:
                raise UsageError(
                    f'{where} isolation = "bubblewrap": bwrap ({self.bwrap}) cannot create namespaces here: {why}. '
                    "Allow them (a container needs --privileged or a seccomp profile that permits unshare; a host "
                    "needs unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1, and on Ubuntu "
                    "kernel.apparmor_restrict_unprivileged_userns=0), or run rlcore as root. Or, accepting the "
                    f'risks, set isolation = "process" ({PROCESS_RISKS})'
                )
        else:
            self.landlock_abi = landlock.abi()
            self.unshare_net = _unshare_net_works()
        self.interpreter = describe_interpreter(python or sys.executable or "python3", where)
        self.python = self.interpreter.executable
        self._exposed = self.interpreter.dirs()
        self.root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-"))
        os.chmod(self.root, 0o711)
        self._uid_base = 1_500_000 + (os.getpid() % 4000) * 128
        self._free = list(range(self.max_concurrency))
        self._slot_lock = threading.Lock()
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        try:
            self._check_interpreter(python)
        except BaseException:
            self.close()
            raise
        self._semaphores.clear()  # the probe's event loop is gone
        if isolation == "process":
            logger.warning("{} {}", where, self.describe_process_isolation())

    # ------------------------------------------------------------------ start-up checks

    def describe_process_isolation(self) -> str:
        """What the process isolation does here, and what it leaves open."""
        done = ["rlimits", "a private working directory (cwd, HOME, TMPDIR) removed after each run"]
        left = []
        if self.as_root:
            done.append(
                "a private uid per slot; its leftovers in "
                + ", ".join(SHARED_WRITABLE)
                + " are removed after each run"
            )
        if self.landlock_abi:
            done.append(
                f"Landlock (ABI {self.landlock_abi}): reads only system directories and the interpreter, writes only its directory"
            )
        else:
            left.append(
                "no Landlock in this kernel: the code reads every world-readable file"
                + ("" if self.as_root else " and writes into /tmp, /var/tmp, /dev/shm")
            )
        if self.unshare_net:
            done.append("no network (unshare --net)")
        elif self.landlock_abi >= 4:
            done.append("no TCP (Landlock)")
            left.append("UDP is open (no network namespace)")
        else:
            left.append("the network is open (no network namespace, no Landlock ABI 4)")
        left.append("processes of other users are visible (no PID namespace)")
        return (
            'isolation = "process" (no namespaces): '
            + "; ".join(done)
            + ". Remains: "
            + "; ".join(left)
            + f'. For full isolation, {INSTALL_BWRAP} and use isolation = "bubblewrap"'
        )

    def _check_interpreter(self, configured: str | None) -> None:
        """Run the probe inside the sandbox: it must report the same Python as on the host."""
        result = _run_blocking(
            self.run(
                _PROBE,
                limits=Limits(
                    wall_s=max(self.limits.wall_s, 60.0),
                    cpu_s=max(self.limits.cpu_s, 30),
                    memory_mb=self.limits.memory_mb,
                    max_processes=self.limits.max_processes,
                    max_output_bytes=100_000,
                    max_file_mb=1,
                ),
            )
        )
        what = (
            f"{self.where} python = {configured!r}"
            if configured
            else f"{self.where} (the interpreter running rlcore, {self.python})"
        )
        try:
            inside = (
                json.loads(result.stdout) if result.status == "Finished" and result.return_code == 0 else None
            )
        except ValueError:
            inside = None
        if not isinstance(inside, dict):
            details = (result.stderr or result.message or result.stdout).strip()[-600:]
            raise UsageError(
                f"{what}: the sandbox ({self.isolation}) could not run the interpreter: {details}{self._reach_hint()}"
            )
        differ = [
            f"{k} is {inside.get(k)!r}, not {self.interpreter.info[k]!r}"
            for k in _COMPARED
            if inside.get(k) != self.interpreter.info[k]
        ]
        if differ:
            raise UsageError(
                f"{what}: inside the sandbox ({self.isolation}) a different Python runs: "
                + "; ".join(differ)
                + self._reach_hint()
            )

    def _reach_hint(self) -> str:
        if self.isolation != "process" or not self.as_root:
            return ""
        for path in [self.python, *self._exposed]:
            blocked = _untraversable(path)
            if blocked:
                return (
                    f". The sandbox's unprivileged user cannot reach {os.path.realpath(path)}: {blocked} is not searchable by other users. "
                    'Point python at an interpreter (or virtual environment) that every user can read, or use isolation = "bubblewrap"'
                )
        return ""

    # ------------------------------------------------------------------ helpers

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
        for path in self._exposed:
            for parent in reversed(Path(path).parents):
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            if path not in made:
                made.add(path)
                args += ["--ro-bind", path, path]
        return args

    def _command(self, workdir: Path, uid: int) -> tuple[list[str], str, dict[str, str]]:
        """argv, cwd and environment of one execution."""
        home = SANDBOX_DIR if self.isolation == "bubblewrap" else str(workdir)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": "/tmp" if self.isolation == "bubblewrap" else home,
            "TMP": "/tmp" if self.isolation == "bubblewrap" else home,
            "TEMP": "/tmp" if self.isolation == "bubblewrap" else home,
            "XDG_CACHE_HOME": f"{home}/.cache",
            "MPLCONFIGDIR": f"{home}/.config/matplotlib",
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        python = [self.python, "-I", "-u", "main.py"]
        drop = (
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
            if self.as_root
            else []
        )
        if self.isolation == "bubblewrap":
            assert self.bwrap is not None
            # The private /tmp first: binds that follow may lie under /tmp (a virtual environment in a CI checkout).
            argv = [self.bwrap, "--tmpfs", "/tmp", *self._ro_binds(), "--proc", "/proc", "--dev", "/dev"]
            argv += ["--bind", str(workdir), SANDBOX_DIR, "--chdir", SANDBOX_DIR]
            argv += [
                "--unshare-net",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
            if not self.as_root:
                argv += ["--unshare-user"]
            argv += ["--die-with-parent", "--new-session", "--clearenv"]
            for key, value in env.items():
                argv += ["--setenv", key, value]
            return [*argv, "--", *drop, *python], str(workdir), env
        prefix = ["unshare", "--net", "--"] if self.unshare_net else []
        return [*prefix, *drop, *python], str(workdir), env

    def _ruleset(self, workdir: Path) -> int | None:
        """The Landlock ruleset of one process-isolated execution (None: no Landlock here)."""
        if self.isolation != "process" or not self.landlock_abi:
            return None
        read = [*SYSTEM_READ, *self._exposed, self.python]
        return landlock.ruleset(self.landlock_abi, read, [str(workdir), "/dev/null"])

    def _preexec(self, lim: Limits, ruleset: int | None) -> None:
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
        if ruleset is not None:
            landlock.restrict_self(ruleset)  # raises (the child never runs) if it cannot

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

    def _sweep_uid(self, uid: int) -> None:
        """Remove what a slot's private uid left in the shared writable directories (process isolation)."""
        if self.isolation != "process" or not self.as_root:
            return
        todo = [(Path(d), 0) for d in SHARED_WRITABLE]
        while todo:
            directory, depth = todo.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_uid == uid:
                    if stat.S_ISDIR(info.st_mode):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
                elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and depth < 4:
                    todo.append((Path(entry.path), depth + 1))  # another world-writable directory

    # ------------------------------------------------------------------ running

    async def run(
        self,
        code: str,
        stdin: str = "",
        limits: Limits | None = None,
        files: dict[str, bytes] | None = None,
        fetch_files: list[str] | None = None,
    ) -> RunResult:
        """Run ``code``. Waiting for a free slot does not count against ``limits.wall_s``."""
        async with self._semaphore():
            slot = self._take_slot()
            try:
                return await self._run(
                    code, stdin, limits or self.limits, slot, files or {}, fetch_files or []
                )
            finally:
                self._give_slot(slot)

    async def _run(
        self, code: str, stdin: str, limits: Limits, slot: int, files: dict[str, bytes], fetch: list[str]
    ) -> RunResult:
        uid = self._uid_base + slot
        workdir = Path(tempfile.mkdtemp(prefix=f"run{slot}-", dir=self.root))
        ruleset = None
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
            try:
                ruleset = self._ruleset(workdir)
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    preexec_fn=functools.partial(self._preexec, limits, ruleset),
                    start_new_session=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return RunResult("Error", None, "", "", 0.0, message=f"could not start the sandbox: {exc}")
            started = time.monotonic()  # the wall-clock limit counts from here
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
            if ruleset is not None:
                os.close(ruleset)
            await asyncio.to_thread(self._kill_uid, uid)
            await asyncio.to_thread(self._sweep_uid, uid)
            shutil.rmtree(workdir, ignore_errors=True)

    async def _collect(
        self, proc: asyncio.subprocess.Process, stdin: str, limits: Limits, started: float, uid: int
    ) -> RunResult:
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
        done, _ = await asyncio.wait(
            {waiter, overflowed}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED
        )
        timed_out = not done
        truncated = overflow.is_set()
        if waiter not in done:
            self._kill(proc, uid)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 10)
            except TimeoutError:  # killed, but not seen to exit: never hang the caller
                waiter.cancel()
        overflowed.cancel()
        try:
            await asyncio.wait_for(pumps, 5)
        except TimeoutError:  # a grandchild holds the pipes open: it was killed by uid
            pumps.cancel()
        elapsed = time.monotonic() - started
        rc = proc.returncode
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        cpu_killed = (
            rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL)
            and not truncated
        )
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


def _run_blocking(coro):
    """Run a coroutine to completion from synchronous code, even when called inside an event loop."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="rlcore-sandbox-probe")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


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
