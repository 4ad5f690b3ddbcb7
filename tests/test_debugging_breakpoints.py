"""Stopping in one rank of a several-rank run (docs/debugging.md): ``rlcore.debug.breakpoint(rank=1)``
in a ``python:`` reward, two CPU ranks started by torchrun, the debugger driven through
``python -m rlcore.debug`` as a user would from a second terminal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from rlcore.testing.debugging import BREAKPOINT_REWARD, DebugClient, Output, continue_from_rank_1, kill_group
from rlcore.testing.runs import train_rows, write_run_manifest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_breakpoint_on_rank_1_of_two_torchrun_ranks(tmp_path, tiny_model):
    (tmp_path / "reward.py").write_text(BREAKPOINT_REWARD)
    markers = tmp_path / "markers"
    markers.mkdir()
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        reward={"function": "python:reward.py:score", "method": None, "timeout_s": 2},
        data={"val": None},
        trainer={"steps": 2},
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MARKERS": str(markers),
        "RLCORE_DEBUG_DIR": str(tmp_path / "debug"),
    }
    env.pop("RLCORE_DEBUG_RANK", None)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            "-m",
            "rlcore",
            "run",
            str(manifest),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    client = DebugClient(env, wait_s=90)
    try:
        run_out = Output(run.stdout)
        # The rank says where it stopped, and how to attach.
        run_out.until(r"rlcore\.debug: rank 1 \(pid", 90)
        assert "rlcore.debug: rank 0" not in run_out.text
        continue_from_rank_1(client, run, run_out, attach_s=30, also=(("p os.environ['RANK']", "'1'"),))
    finally:
        kill_group(run)
        client.kill()
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/timeouts"] == 0 and r["reward/errors"] == 0 for r in rows), rows
    assert not list((tmp_path / "debug").glob("*.json"))  # the session's record is gone
