"""Fixtures of the sandbox tests: a small virtual environment every user can read, with a package
that exists only there (to show that the sandbox runs the configured interpreter and its packages)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MARKER = "rlcore_sandbox_marker"


def _readable_by_others(path: str) -> bool:
    """Every directory on the way to ``path`` is searchable by other users (the sandbox's uid)."""
    current = Path("/")
    for part in Path(os.path.realpath(path)).parts[1:]:
        if not current.stat().st_mode & stat.S_IXOTH:
            return False
        current = current / part
    return True


def _base_interpreters() -> list[str]:
    found = [os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)]
    found += [
        p
        for p in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3")
        if p and os.path.exists(p)
    ]
    return list(dict.fromkeys(found))


def _stdlib(python: str) -> str:
    return subprocess.run(
        [python, "-I", "-c", "import os; print(os.path.dirname(os.__file__))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()


@pytest.fixture(scope="session")
def reachable_venv():
    """A virtual environment (python, prefix) in a world-readable directory, made from a base
    interpreter the sandbox's unprivileged uid can read, holding the package ``rlcore_sandbox_marker``."""
    base = None
    for candidate in _base_interpreters():
        lib = _stdlib(candidate)
        if lib and (os.geteuid() != 0 or (_readable_by_others(candidate) and _readable_by_others(lib))):
            base = candidate
            break
    if base is None:
        pytest.skip("no Python installation here that an unprivileged user can read")
    root = Path(tempfile.mkdtemp(prefix="rlcore-test-venv-"))
    os.chmod(root, 0o755)
    venv = root / "venv"
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    package = Path(purelib) / MARKER
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHERE = 'the test venv'\n")
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644 | (path.stat().st_mode & 0o111))
    yield python, str(venv)
    shutil.rmtree(root, ignore_errors=True)
