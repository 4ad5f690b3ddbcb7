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
