"""One live run per run directory: a second `rlcore run` (or its --dry-run) on a directory another
live run holds is refused, naming the directory and the holder; a holder killed with SIGKILL
leaves nothing that blocks the next run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from rlcore.errors import UsageError
from rlcore.launching import RunDirLock, lock_holder, run_dir_problems
from rlcore.testing.runs import run_cli, train_rows, wait_for, write_run_manifest

HOLDER = """
import os, sys, time
from rlcore.launching import RunDirLock
RunDirLock(sys.argv[1]).acquire()
child = os.fork()  # like a reward worker: a forked child must not keep the lock alive
if child == 0:
    time.sleep(600)
    os._exit(0)
print(os.getpid(), child, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_held_lock_refuses_others_and_a_killed_holder_frees_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        pid, child = map(int, proc.stdout.readline().split())
        assert pid == proc.pid
        holder = lock_holder(run_dir)
        assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        with pytest.raises(UsageError) as caught:
            RunDirLock(run_dir).acquire()
        message = str(caught.value)
        assert (
            f"the run directory {run_dir} is in use by another run: pid {proc.pid} on host {socket.gethostname()}"
            in message
        )
        assert str(run_dir / ".lock") in message and "started " in message
        assert run_dir_problems(run_dir, resume=True) == [message]

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert _alive(child)  # the forked child lives on (for now), holding the lock file open
        assert lock_holder(run_dir) is None  # the stale lock file blocks nothing
        assert run_dir_problems(run_dir, resume=True) == []
        with RunDirLock(run_dir) as lock:
            assert lock.held and lock_holder(run_dir)["pid"] == os.getpid()
        assert lock_holder(run_dir) is None
    finally:
        proc.kill()
        proc.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_one_process_cannot_hold_a_run_directory_twice_and_asking_keeps_its_lock(tmp_path):
    run_dir = tmp_path / "run"
    lock = RunDirLock(run_dir).acquire()
    try:
        with pytest.raises(UsageError, match=f"pid {os.getpid()}"):
            RunDirLock(run_dir).acquire()
        assert lock_holder(run_dir)["pid"] == os.getpid()
        # Asking in the holding process must not drop the lock (a POSIX lock goes with any close).
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from rlcore.launching import lock_holder; print(lock_holder(sys.argv[1]))",
                str(run_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"'pid': {os.getpid()}" in probe.stdout, probe.stdout + probe.stderr
    finally:
        lock.release()
    assert lock_holder(run_dir) is None
    RunDirLock(run_dir).acquire().release()


def _rlcore(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.mark.slow
def test_a_second_run_on_a_live_runs_directory_is_refused_until_the_first_dies(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={"steps": 2000, "save_every": 1, "loggers": ["jsonl"]},
        data={"val": None},
    )
    run_dir = tmp_path / "run"
    first = _rlcore("run", str(manifest), "--run-dir", str(run_dir))
    try:
        wait_for(
            lambda: first.poll() is not None or (run_dir / "checkpoints" / "latest").exists(),
            600,
            "the first run's first checkpoint",
        )
        assert first.poll() is None, "the first run ended early"
        assert lock_holder(run_dir)["pid"] == first.pid
        metrics = (run_dir / "metrics.jsonl").stat()

        second = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--resume", timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        said = " ".join(second.stdout.split())  # rich may wrap the long line
        assert (
            f"the run directory {run_dir} is in use by another run: pid {first.pid} on host {socket.gethostname()}"
            in said
        )
        assert "Traceback" not in second.stdout + second.stderr
        # The refused run touched nothing of the live one's.
        assert (run_dir / "metrics.jsonl").stat().st_ino == metrics.st_ino
        assert first.poll() is None

        # A dry run reports both refusals instead of saying all is well.
        dry = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--dry-run", timeout=300)
        assert dry.returncode == 2, dry.stdout + dry.stderr
        said = " ".join(dry.stdout.split())
        assert "would train" in said and "the run would be refused:" in said
        assert f"is in use by another run: pid {first.pid}" in said
        assert f"the run directory {run_dir} already holds checkpoints; pass --resume" in said
        dry = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--dry-run", "--resume", timeout=300)
        assert (
            dry.returncode == 2
            and "in use by another run" in dry.stdout
            and "holds checkpoints" not in dry.stdout
        )

        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=60) == -signal.SIGKILL
    finally:
        first.kill()
        first.wait()

    dry = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--dry-run", "--resume", timeout=300)
    assert dry.returncode == 0 and "refused" not in dry.stdout, dry.stdout + dry.stderr
    step = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    resumed = run_cli(
        "run",
        str(manifest),
        "--run-dir",
        str(run_dir),
        "--resume",
        "--set",
        f"trainer.steps={step + 1}",
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in train_rows(run_dir)] == list(range(1, step + 2))
    assert lock_holder(run_dir) is None
