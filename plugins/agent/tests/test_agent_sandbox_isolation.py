"""Secure by default (issue 17): the python tool refuses to run untrusted code without bubblewrap
unless the manifest opts into isolation = "process"; that mode leaves nothing behind and hides the
host's files where the kernel allows; both modes run the configured interpreter with its
packages; and a call waiting for a free slot is never timed out for waiting."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest
from loguru import logger
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.python_tool import PythonTool
from rlcore_agent.sandbox import landlock
from rlcore_agent.sandbox.local import SHARED_WRITABLE, LocalSandbox

from rlcore.errors import UsageError
from rlcore.registry import Registry

LIMITS = dict(timeout_s=5.0, cpu_time_s=3, memory_mb=512, max_processes=8, max_output_bytes=200_000)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agent_python_tool.toml"


def run(tool, code: str):
    return asyncio.run(tool.execute("t", {"code": code}))


def _path_without_bwrap(tmp_path: Path, fake_bwrap: str | None = None) -> str:
    """A PATH with the tools the sandbox uses (setpriv, unshare) but no real bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("setpriv", "unshare"):
        real = subprocess.run(
            ["sh", "-c", f"command -v {name}"], capture_output=True, text=True
        ).stdout.strip()
        if real:
            (bin_dir / name).symlink_to(real)
    if fake_bwrap is not None:
        (bin_dir / "bwrap").write_text(fake_bwrap)
        (bin_dir / "bwrap").chmod(0o755)
    return str(bin_dir)


# ----------------------------------------------------------------------------- 1. no silent fallback


def test_missing_bwrap_is_refused_with_the_option_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path))
    with pytest.raises(UsageError) as refused:
        PythonTool(PythonToolOptions(**LIMITS))
    message = str(refused.value)
    assert "[tools.python] isolation" in message and "bwrap is not installed" in message
    assert "apt-get install -y bubblewrap" in message and 'isolation = "process"' in message


def test_bwrap_without_namespaces_is_refused(tmp_path, monkeypatch):
    script = "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path, fake_bwrap=script))
    with pytest.raises(UsageError) as refused:
        PythonTool(PythonToolOptions(**LIMITS))
    message = str(refused.value)
    assert "cannot create namespaces" in message and "No permissions to create new namespace" in message
    assert 'isolation = "process"' in message


def test_the_weaker_mode_is_an_explicit_choice(reachable_venv):
    python, _ = reachable_venv
    assert PythonToolOptions().isolation == "bubblewrap"
    process = PythonTool(PythonToolOptions(isolation="process", python=python, **LIMITS))
    assert process.sandbox.isolation == "process"
    assert run(process, "print(6 * 7)").text == "42"
    for gone in ("auto", "none", "bwrap"):
        with pytest.raises(ValueError, match="process"):
            PythonToolOptions(isolation=gone)
    description = PythonToolOptions.model_fields["isolation"].description
    assert "RISK" in description and "world-readable" in description


def _validate(manifest: Path, path_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path_env}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from rlcore.cli import main; sys.exit(main())",
            "validate",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_options_flag_missing_bwrap(tmp_path, monkeypatch):
    """What `rlcore validate` shows: validating the options warns, without running anything."""
    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path))
    seen: list[str] = []
    handler = logger.add(seen.append, level="WARNING", format="{message}")
    try:
        PythonToolOptions()
        PythonToolOptions(sandbox_url="http://127.0.0.1:9")  # runs elsewhere: nothing to flag
        PythonToolOptions(isolation="process")  # chosen explicitly
    finally:
        logger.remove(handler)
    assert len(seen) == 1 and "bwrap is not installed on this machine" in seen[0]


def test_validate_flags_missing_bwrap_and_old_values(tmp_path):
    registry = Registry.discover()
    needed = (("rollout_engine", "hf"), ("reward_function", "math"), ("advantage_estimator", "grpo"))
    missing = [f"{kind} {name!r}" for kind, name in needed if name not in registry.components(kind)]
    if missing:
        pytest.skip("the example manifest needs " + ", ".join(missing) + " (plugins not installed here)")
    manifest = tmp_path / "agent.toml"
    text = EXAMPLE.read_text().replace("../runs", str(tmp_path / "runs"))
    manifest.write_text(text)
    flagged = _validate(manifest, _path_without_bwrap(tmp_path))
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert (
        "bwrap is not installed on this machine" in flagged.stderr
        and 'isolation = "process"' in flagged.stderr
    )
    old = tmp_path / "old.toml"
    old.write_text(text.replace("[tools.python]\n", '[tools.python]\nisolation = "auto"\n'))
    refused = _validate(old, os.environ.get("PATH", ""))
    line = text.splitlines().index("[tools.python]") + 2
    assert refused.returncode != 0 and "Traceback" not in refused.stdout + refused.stderr
    assert (
        f"old.toml:{line}:" in refused.stdout
        and "tools.python.isolation" in refused.stdout
        and "'process'" in refused.stdout
    )


# ----------------------------------------------------------------------------- 2. the process mode


@pytest.fixture(scope="module")
def process_tool(reachable_venv):
    return PythonTool(PythonToolOptions(isolation="process", python=reachable_venv[0], **LIMITS))


LITTER = (
    "import os, tempfile\n"
    "names = {names!r}\n"
    "for path in names:\n"
    "    try:\n"
    "        open(path, 'w').write('left')\n"
    "    except OSError as exc:\n"
    "        print('refused', path, exc.errno)\n"
    "fd, spare = tempfile.mkstemp()\n"
    "open(os.path.expanduser('~/in-home'), 'w').write('x')\n"
    "print(spare, os.environ.get('TMPDIR'), os.path.expanduser('~'), os.getcwd(), sep='\\n')\n"
)


def _litter_names() -> list[str]:
    tag = uuid.uuid4().hex[:10]
    return [f"{d}/rlcore-litter-{tag}" for d in SHARED_WRITABLE if os.path.isdir(d)]


def _leaves_nothing(tool) -> None:
    names = _litter_names()
    result = run(tool, LITTER.format(names=names))
    assert not result.error, result.text
    spare, tmpdir, home, cwd = result.text.splitlines()[-4:]
    assert [n for n in [*names, spare] if os.path.lexists(n)] == []  # nothing left in the shared directories
    assert tmpdir == home == cwd and spare.startswith(cwd + "/")  # one private directory for everything
    assert Path(cwd).parent == tool.sandbox.root
    assert not Path(cwd).exists() and list(tool.sandbox.root.iterdir()) == []  # removed afterwards


def test_process_mode_leaves_nothing_behind(process_tool):
    _leaves_nothing(process_tool)


@pytest.mark.skipif(os.geteuid() != 0, reason="sweeping a private uid's files needs root")
def test_process_mode_without_landlock_sweeps_what_the_uid_left(reachable_venv, monkeypatch):
    """Where the kernel has no Landlock the code can write into /tmp; as root its private uid's
    files are found and removed after the run."""
    monkeypatch.setattr(landlock, "abi", lambda: 0)
    tool = PythonTool(PythonToolOptions(isolation="process", python=reachable_venv[0], **LIMITS))
    assert tool.sandbox.landlock_abi == 0 and "no Landlock" in tool.sandbox.describe_process_isolation()
    _leaves_nothing(tool)


@pytest.mark.skipif(
    not landlock.abi(), reason="the kernel has no Landlock: the process mode cannot hide files"
)
def test_process_mode_hides_the_hosts_files(process_tool, tmp_path):
    fd, secret = tempfile.mkstemp(prefix="rlcore-planted-secret-", dir="/tmp")
    try:
        os.write(fd, b"TOPSECRET")
        os.close(fd)
        os.chmod(secret, 0o644)  # world-readable, as in the report
        code = (
            "import glob, os\nfound = []\n"
            "for path in glob.glob('/tmp/rlcore-planted-secret-*') + [" + repr(secret) + "]:\n"
            "    try:\n        found.append(open(path).read())\n    except OSError as exc:\n        found.append(exc.errno)\n"
            "print(found)\nprint(len(open('/etc/hostname').read()) > 0 if os.path.exists('/etc/hostname') else True)\n"
            f"os.listdir({str(Path.home())!r})\n"
        )
        result = run(process_tool, code)
        assert "TOPSECRET" not in result.text and "[13" in result.text  # EACCES
        assert "PermissionError" in result.text  # the home directory cannot be listed either
        assert "True" in result.text  # system files still read
    finally:
        os.unlink(secret)


# ----------------------------------------------------------------------------- 3. the intended interpreter


REPORT = (
    "import json, sys\nimport {package} as p\nprint(json.dumps([sys.executable, sys.prefix, p.__file__]))\n"
)


@pytest.mark.parametrize("isolation", ["bubblewrap", "process"])
def test_the_configured_interpreter_and_its_packages(isolation, reachable_venv):
    python, prefix = reachable_venv
    tool = PythonTool(PythonToolOptions(isolation=isolation, python=python, **LIMITS))
    result = run(tool, REPORT.format(package="rlcore_sandbox_marker"))
    assert not result.error, result.text
    executable, inside_prefix, where = json.loads(result.text)
    assert (executable, inside_prefix) == (python, prefix) and where.startswith(prefix + "/")


def _installed_in(purelib: str) -> str | None:
    """A package of this test run that lives in the interpreter's own site-packages."""
    for name in ("loguru", "httpx", "pydantic", "fastapi"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and spec.origin.startswith(purelib + "/"):
            return name
    return None


def test_the_default_is_the_interpreter_running_rlcore():
    """Not its base installation: the virtual environment, with the packages installed in it."""
    package = _installed_in(sysconfig.get_path("purelib"))
    if package is None:
        pytest.skip(
            "none of loguru, httpx, pydantic, fastapi is installed in this interpreter's site-packages"
        )
    tool = PythonTool(PythonToolOptions(**LIMITS))
    result = run(tool, REPORT.format(package=package))
    assert not result.error, result.text
    executable, prefix, where = json.loads(result.text)
    assert (executable, prefix) == (sys.executable, sys.prefix) and where == importlib.util.find_spec(
        package
    ).origin


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as its own uid only under root")
def test_an_interpreter_the_sandbox_user_cannot_read_is_refused(reachable_venv, tmp_path):
    """A virtual environment under a mode-700 directory: its uid would get another Python (the
    system's standard library, none of the packages); refused at start-up, naming the directory."""
    hidden = Path(tempfile.mkdtemp(prefix="rlcore-private-"))  # mode 700
    try:
        base = subprocess.run(
            [reachable_venv[0], "-I", "-c", "import sys; print(sys._base_executable)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        subprocess.run(
            [base, "-m", "venv", "--without-pip", str(hidden / "venv")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with pytest.raises(UsageError) as refused:
            PythonTool(
                PythonToolOptions(isolation="process", python=str(hidden / "venv/bin/python"), **LIMITS)
            )
        message = str(refused.value)
        assert "[tools.python] python" in message and f"{hidden} is not searchable by other users" in message
        with pytest.raises(UsageError, match="cannot run it as a Python"):
            PythonTool(
                PythonToolOptions(isolation="process", python=str(tmp_path / "no-such-python"), **LIMITS)
            )
    finally:
        import shutil

        shutil.rmtree(hidden, ignore_errors=True)


# ----------------------------------------------------------------------------- 4. queueing is not a timeout


def test_the_wall_limit_counts_from_the_start_of_the_process():
    """Straight on the sandbox (one slot): queued runs are not charged for the wait."""
    sandbox = LocalSandbox(max_concurrency=1)
    from rlcore_agent.sandbox.local import Limits

    limits = Limits(wall_s=1.5, cpu_s=5)

    async def many():
        return await asyncio.gather(
            *(sandbox.run("import time\ntime.sleep(0.4)\nprint('ok')", limits=limits) for _ in range(5))
        )

    results = asyncio.run(many())
    assert [r.status for r in results] == ["Finished"] * 5 and all(r.execution_time < 1.5 for r in results)
    stuck = asyncio.run(sandbox.run("import time\ntime.sleep(60)", limits=limits))
    assert stuck.status == "TimeLimitExceeded" and "wall-clock" in stuck.message
