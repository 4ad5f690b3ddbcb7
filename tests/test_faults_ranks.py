"""A rank's death in a run of several ranks (issue 28, item 2d), as torchrun-style ranks on one
machine with gloo (what SLURM's srun starts, one task per rank): the survivor says in one line
that another rank died, with no gloo traceback on the console (it is in its own log), points
to its own run.rankN.log, and each rank's log says which host and rank it is."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.faults import env
from rlcore.testing.runs import TINY_RUN_PLUGINS, write_run_manifest

require_plugins(*TINY_RUN_PLUGINS)
pytestmark = pytest.mark.slow


def test_a_dead_rank_leaves_one_line_on_the_survivor_and_logs_that_name_their_host(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path, tiny_model, data={"val": None}, trainer={"steps": 3, "save_every": 1}
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    procs = []
    for rank in range(2):
        rank_env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **env("update@2=sigkill:rank=0"),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(run_dir)],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[0].returncode == -9, outputs[0][-2000:]
    survivor = outputs[1]
    assert procs[1].returncode == 1, survivor[-3000:]
    assert "Traceback" not in survivor and "pair.cc" not in survivor, survivor[-3000:]
    assert "collective failed (" in survivor and "by peer" in survivor, survivor[-3000:]  # closed or reset
    assert "rank 1: another rank of this run died, so a collective failed" in survivor, survivor[-3000:]
    assert f"see {run_dir / 'run.rank1.log'}" in survivor and f"see {run_dir / 'run.log'}" not in survivor
    own = (run_dir / "run.rank1.log").read_text()
    assert "Traceback" in own and "by peer" in own  # kept where it belongs
    assert f"this process: rank 1 of 2, host {socket.gethostname()}" in own
    assert f"this process: rank 0 of 2, host {socket.gethostname()}" in (run_dir / "run.log").read_text()
