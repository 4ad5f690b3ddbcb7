"""The README's "write your own plugin" section works as written: its files, installed with pip,
give a plugin that `rlcore plugins` lists and whose own test passes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from rlcore.testing.runs import run_cli

ROOT = Path(__file__).resolve().parents[1]  # the repository


def _block(readme: str, marker: str) -> str:
    for body in re.findall(r"```\w*\n(.*?)```", readme, re.S):
        if marker in body:
            return textwrap.dedent(body)
    raise AssertionError(f"no code block with {marker!r} in the README")


def test_the_plugin_tutorial(tmp_path):
    readme = (ROOT / "README.md").read_text()
    project = tmp_path / "rlcore-short"
    (project / "src" / "rlcore_short").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "pyproject.toml").write_text(_block(readme, 'name = "rlcore-short"'))
    (project / "src" / "rlcore_short" / "__init__.py").write_text("")
    (project / "src" / "rlcore_short" / "plugin.py").write_text(_block(readme, "class ShortOptions"))
    (project / "src" / "rlcore_short" / "reward.py").write_text(_block(readme, "def build(options, context)"))
    (project / "tests" / "test_short.py").write_text(_block(readme, "def test_short"))
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(project),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": str(site)}
    proc = run_cli("plugins", "--json", env=env)
    plugins = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert plugins["short"]["components"] == {"reward_function": ["short"]}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=project,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_plugin_tutorial_names_the_venv_programs_and_pytest():
    """The set-up's .venv is never activated: a bare `pip` or `rlcore` is another environment's (or
    none). And a plugin's tests need pytest, which its `[test]` extra brings."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Write your own plugin") : readme.index("## Layout")]
    shell = [
        line.strip()
        for body in re.findall(r"```bash\n(.*?)```", section, re.S)
        for line in body.splitlines()
        if line.strip()
    ]
    assert shell and all(line.startswith((".venv/bin/", "./scripts/")) for line in shell), shell
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    installs = [c for c in re.findall(r"`([^`\n]*)`", prose) if "pip install" in c or "pytest " in c]
    assert installs and all(c.startswith((".venv/bin/", "./scripts/")) for c in installs), installs
    assert ".venv/bin/pip install -e '../rlcore-short[test]'" in section
    assert ".venv/bin/rlcore plugins" in section
    assert ".venv/bin/python -m pytest ../rlcore-short/tests" in section
    pyproject = _block(readme, 'name = "rlcore-short"')
    import tomllib

    assert tomllib.loads(pyproject)["project"]["optional-dependencies"]["test"] == ["pytest>=8"]
