"""The rlcore-serve distribution: its entry point registers the ``serve`` command lazily, the
command's arguments come from its configure, and bad arguments or manifests are located
one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

from rlcore.testing.runs import discover_registry, run_cli, run_in_process


def test_the_entry_point_registers_serve_by_name_only():
    commands = {c.name: c for c in discover_registry().commands()}
    serve = commands["serve"]
    assert serve.distribution == "rlcore-serve"
    assert (serve.configure, serve.run) == ("rlcore_serve.cli:configure", "rlcore_serve.cli:run")


def test_help_lists_serve_without_importing_it_or_anything_heavy():
    code = (
        "import sys, json; from rlcore.cli import main; rc = main(['--help']); "
        "print(json.dumps({'rc': rc, 'loaded': sorted(m for m in sys.modules if m.startswith('rlcore_serve.')"
        " or m.split('.')[0] in ('fastapi', 'uvicorn', 'torch', 'transformers'))}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == {"rc": 0, "loaded": ["rlcore_serve.plugin"]}, proc.stdout + proc.stderr
    assert "serve" in proc.stdout and "OpenAI-compatible" in proc.stdout


def test_serve_help_comes_from_its_configure():
    proc = run_cli("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--model-name", "--max-tokens-limit", "--batch-size", "--host", "--port", "--set"):
        assert option in proc.stdout, option


def test_bad_arguments_and_manifests_are_located_errors_before_anything_loads(tmp_path, capsys):
    assert run_in_process("serve", str(tmp_path / "missing.toml")) == 2
    out = capsys.readouterr().out
    assert "missing.toml" in out and "Traceback" not in out
    assert run_in_process("serve", "x.toml", "--batch-size", "0") == 2
    assert "--batch-size must be at least 1, got 0" in capsys.readouterr().out
    assert run_in_process("serve", "x.toml", "--max-tokens-limit", "0") == 2
    assert "--max-tokens-limit must be at least 1, got 0" in capsys.readouterr().out
