"""The python tool's sandbox: hostile programs are stopped or refused, the host is unaffected and
the model gets an error message; many executions run correctly at once; the HTTP service mode."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.python_tool import PythonTool

from rlcore.testing.tools import assert_tool_conforms

LIMITS = dict(timeout_s=4.0, cpu_time_s=3, memory_mb=512, max_processes=8, max_output_bytes=200_000)


@pytest.fixture(scope="module")
def tool():
    return PythonTool(PythonToolOptions(**LIMITS))


def run(tool, code: str):
    return asyncio.run(tool.execute("t", {"code": code}))


def test_conforms_and_runs_code(tool):
    result = assert_tool_conforms(tool, {"code": "print(sum(range(10)))"})
    assert result.text == "45" and not result.error
    bad = run(tool, "1/0")
    assert bad.error and "ZeroDivisionError" in bad.text and "Traceback" in bad.text
    assert run(tool, "").error and "needs" in run(tool, "").text


def test_infinite_loop_is_stopped(tool):
    started = time.monotonic()
    result = run(tool, "while True:\n    pass")
    assert result.error and ("CPU time" in result.text or "wall-clock" in result.text)
    assert time.monotonic() - started < 15


def test_sleeping_past_the_limit_is_stopped(tool):
    started = time.monotonic()
    result = run(tool, "import time\nprint('start', flush=True)\ntime.sleep(60)")
    assert result.error and "wall-clock" in result.text and "start" in result.text
    assert time.monotonic() - started < 15


def _sandbox_uids() -> set[int]:
    uids = set()
    for entry in Path("/proc").iterdir():
        try:
            uid = entry.stat().st_uid if entry.name.isdigit() else None
        except FileNotFoundError:  # the process ended while we looked
            continue
        if uid is not None and 1_500_000 <= uid < 2_100_000:
            uids.add(uid)
    return uids


def test_fork_bomb_is_contained(tool):
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(10000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print('forked', n)\n"
    )
    result = run(tool, code)
    forked = int(result.text.split("forked")[1].split()[0])
    assert forked < LIMITS["max_processes"]  # the process limit refused further forks
    if os.geteuid() == 0:  # every process of the sandbox's private uid is gone afterwards
        # Killed children linger a moment as zombies until init reaps them: allow it 10 s.
        deadline = time.monotonic() + 10
        while _sandbox_uids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _sandbox_uids()
    assert run(tool, "print('still fine')").text == "still fine"


def test_memory_bomb_is_refused(tool):
    result = run(tool, "x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert result.error and "MemoryError" in result.text and "allocated" not in result.text


def test_huge_output_is_cut_and_stopped(tool):
    started = time.monotonic()
    result = run(tool, "import sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)")  # 100 MB
    assert result.error and "output exceeded" in result.text
    assert len(result.text) <= PythonToolOptions().max_output_chars + 200
    assert time.monotonic() - started < 15


def test_network_is_unreachable(tool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(3)

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    )
    result = run(tool, code)
    thread.join()
    server.close()
    assert result.error and "connected" not in result.text and not accepted
    outside = run(
        tool, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\nprint('connected')"
    )
    assert outside.error and "connected" not in outside.text.replace("Error", "")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap for a hidden file system")
def test_file_system_is_read_only_and_private(tool, tmp_path):
    target = tmp_path / "escape.txt"
    result = run(tool, f"open({str(target)!r}, 'w').write('x')\nprint('wrote')")
    assert result.error and not target.exists()
    result = run(tool, "open('/usr/escape.txt', 'w').write('x')")
    assert result.error and ("Read-only" in result.text or "Permission" in result.text)
    assert not Path("/usr/escape.txt").exists()
    assert run(tool, "open('note.txt', 'w').write('mine')\nprint(open('note.txt').read())").text == "mine"


def test_sandboxes_cannot_read_each_other(tool):
    """A program that lingers with a secret file cannot be read by a concurrent one."""
    holder = "import os, time\nopen('secret.txt', 'w').write('TOPSECRET')\nprint(os.getcwd(), flush=True)\ntime.sleep(3)"
    host_dir = str(tool.sandbox.root)  # where the holder's directory lives on the host
    snoop = (
        "import glob, os, time\ntime.sleep(1)\nfound = []\n"
        f"for pattern in ['/tmp/**/secret.txt', '/sandbox/secret.txt', '{host_dir}/*/secret.txt', '/tmp/rlcore-sandbox-*/*/secret.txt']:\n"
        "    for path in glob.glob(pattern, recursive=True):\n"
        "        try:\n            found.append(open(path).read())\n        except OSError:\n            pass\n"
        "print('found', found)"
    )

    async def both():
        return await asyncio.gather(tool.execute("a", {"code": holder}), tool.execute("b", {"code": snoop}))

    _, snooped = asyncio.run(both())
    assert "TOPSECRET" not in snooped.text and "found []" in snooped.text


def test_64_concurrent_executions():
    # Generous time limits: 64 interpreters start at once on a small (possibly shared) CI machine.
    tool = PythonTool(PythonToolOptions(timeout_s=120, cpu_time_s=60, max_concurrency=64))

    async def many():
        return await asyncio.gather(
            *(tool.execute(f"t{i}", {"code": f"print({i} * {i})"}) for i in range(64))
        )

    results = asyncio.run(many())
    assert [r.text for r in results] == [str(i * i) for i in range(64)]
    assert not any(r.error for r in results)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sandbox_service_and_http_mode():
    import httpx

    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcore_agent.sandbox.cli",
            "serve",
            "--port",
            str(port),
            "--timeout-s",
            "3",
            "--memory-mb",
            "512",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(url + "/health", timeout=1).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("the sandbox service did not start: " + proc.stdout.read1().decode())
        raw = httpx.post(
            url + "/run_code",
            json={"code": "print(input() * 2)", "language": "python", "stdin": "ab"},
            timeout=30,
        ).json()
        assert raw["status"] == "Success" and raw["run_result"]["status"] == "Finished"
        assert raw["run_result"]["stdout"] == "abab\n" and raw["run_result"]["return_code"] == 0
        slow = httpx.post(
            url + "/run_code", json={"code": "import time; time.sleep(30)", "run_timeout": 1}, timeout=30
        ).json()
        assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
        other = httpx.post(url + "/run_code", json={"code": "x", "language": "cobol"}, timeout=30).json()
        assert other["status"] == "SandboxError" and "cobol" in other["message"]

        remote = PythonTool(PythonToolOptions(sandbox_url=url))
        result = assert_tool_conforms(remote, {"code": "import math\nprint(math.factorial(10))"})
        assert result.text == "3628800" and not result.error
        failed = asyncio.run(remote.execute("t", {"code": "raise ValueError('bad')"}))
        assert failed.error and "ValueError: bad" in failed.text
    finally:
        proc.terminate()
        proc.wait(10)
    down = asyncio.run(
        PythonTool(PythonToolOptions(sandbox_url=f"http://127.0.0.1:{port}")).execute(
            "t", {"code": "print(1)"}
        )
    )
    assert down.error and "sandbox" in down.text


def test_process_isolation_keeps_the_limits(reachable_venv):
    """isolation = "process" (no namespaces, an explicit choice): rlimits, the private uid and
    directory, and no network (`unshare --net` as root, Landlock's TCP rules otherwise)."""
    fallback = PythonTool(PythonToolOptions(isolation="process", python=reachable_venv[0], **LIMITS))
    assert run(fallback, "print(2 ** 10)").text == "1024"
    assert "MemoryError" in run(fallback, "x = bytearray(4 * 1024**3)").text
    result = run(fallback, "while True:\n    pass")
    assert result.error and ("CPU time" in result.text or "wall-clock" in result.text)
    assert (
        "output exceeded" in run(fallback, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)").text
    )
    if os.geteuid() == 0 or fallback.sandbox.landlock_abi >= 4:
        blocked = run(
            fallback,
            "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\nprint('connected')",
        )
        assert blocked.error and "connected" not in blocked.text.replace("Error", "")
    if os.geteuid() == 0:
        own = run(fallback, "import os\nprint(os.getuid())")
        assert int(own.text) >= 1_500_000  # a private uid, not root


@pytest.mark.parametrize("isolation", ["process", "bubblewrap"])
def test_output_overflow_never_hangs(isolation, reachable_venv):
    """The output cap stops the run, and the pipes are drained until they close: asyncio's wait()
    returns only then (unread pipes once left a run waiting forever, about one time in ten)."""
    flood = PythonTool(PythonToolOptions(isolation=isolation, python=reachable_venv[0], **LIMITS))

    async def many():
        for _ in range(12):
            result = await asyncio.wait_for(
                flood.execute("t", {"code": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"}), 30
            )
            assert result.error and "output exceeded" in result.text

    asyncio.run(many())
