"""Rough edges of the command line a newcomer hit (issue 17): closed pipes, several manifests,
piped output, located errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlcore.cli import main


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """``rlcore ARGS | head`` where head has already gone: stdout is a pipe whose reader is closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "rlcore", *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("schema",), ("plugins",), ("plugins", "--json"), ("plugins", "--verbose")])
def test_a_closed_pipe_ends_the_command_quietly(args):
    proc = _run_into_closed_pipe(*args)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "unexpected error" not in proc.stderr
    assert proc.returncode != 0  # the output did not all arrive


def _starter(path) -> str:
    assert main(["init", str(path)]) == 0
    return str(path)


def test_validate_accepts_several_manifests_and_reports_each(tmp_path, capsys):
    good, other = _starter(tmp_path / "a.toml"), _starter(tmp_path / "b.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nsteps = 0\n")
    assert main(["validate", good, other]) == 0
    out = capsys.readouterr().out
    assert f"ok {good}" in out and f"ok {other}" in out

    assert main(["validate", good, str(bad), other]) == 2
    out = capsys.readouterr().out
    assert f"ok {good}" in out and f"ok {other}" in out  # the one after the bad one is checked too
    assert f"{bad}:2: [trainer.steps]" in out
    assert "1 of 3 manifests are invalid" in out and str(bad) in out.splitlines()[-1]
