"""Ray's debugger on the ray launcher's ranks (docs/debugging.md): ``RAY_DEBUG=legacy`` and
``breakpoint()`` in a rank, found and attached from another process the way ``ray debug`` does it;
and ``rlcore.debug.breakpoint`` in a ``python:`` reward of a rank under Ray.

All traffic stays on 127.0.0.1: the runs use the loopback-only ``ray_cluster`` of conftest.py,
and their drivers inherit its single-host setting (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, see
conftest.py). ``ray debug --address 127.0.0.1:P`` would still dial the GCS at the host's IP, so
the breakpoints are read from the GCS with a plain ``GcsClient`` (no rewrite there) instead."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

pytest.importorskip("ray")
pytest.importorskip("torch")

from rlcore.testing import require_plugins  # noqa: E402
from rlcore.testing.debugging import BREAKPOINT_REWARD, DebugClient, Output, continue_from_rank_1, kill_group  # noqa: E402
from rlcore.testing.runs import TINY_RUN, deep_update, train_rows  # noqa: E402

require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")

# A batched reward: score_batch runs in the rank's own process (a Ray actor), where Ray's
# breakpoint hook is set.
BATCHED_REWARD = """
import os


class Scores:
    batched = True

    def __init__(self):
        self.calls = 0

    def score_batch(self, items):
        self.calls += 1
        secret = f"rank{os.environ['RANK']}-call{self.calls}"
        if self.calls == 1 and os.environ["RANK"] == "1":
            breakpoint()
        return [float(len(item.response) % 3) for item in items]


scores = Scores()
"""


def _waiting_breakpoint(
    address: str, filename: str, run: subprocess.Popen, run_out: Output, timeout: float
) -> dict:
    """What ``ray debug`` lists: the RAY_PDB_* entries of the GCS's KV (ray/util/rpdb.py writes one
    per waiting breakpoint, with its pdb_address), read with a GcsClient on the loopback address."""
    from ray._private import ray_constants
    from ray._raylet import GcsClient

    client = GcsClient(address=address)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        for key in client.internal_kv_keys(b"RAY_PDB_", namespace=ray_constants.KV_NAMESPACE_PDB, timeout=10):
            if key.startswith(b"RAY_PDB_CONTINUE_"):
                continue
            value = client.internal_kv_get(key, namespace=ray_constants.KV_NAMESPACE_PDB, timeout=10)
            if value and (session := json.loads(value))["filename"].endswith(filename):
                return session
        time.sleep(0.5)
    raise AssertionError(f"no breakpoint in {filename} registered; run:\n{run_out.text[-3000:]}")


class PdbSocket:
    """A telnet-like client for Ray's remote pdb."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.text = ""

    def until_prompt(self) -> str:
        start = len(self.text)
        while "(Pdb) " not in self.text[start:]:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise AssertionError(f"pdb closed the connection; got:\n{self.text[-2000:]}")
            self.text += chunk.decode(errors="replace")
        return self.text[start:]

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r\n")


def _manifest(tmp_path: Path, model: Path, address: str, reward: dict, env_vars: dict | None = None) -> Path:
    doc = deep_update(
        TINY_RUN,
        {
            "model": {"path": str(model)},
            "reward": reward,
            "data": {"prompts_per_step": 4},
            "trainer": {"steps": 2, "loggers": ["jsonl"]},
        },
    )
    doc["reward"].pop("method", None)
    doc["data"].pop("val", None)
    doc["launcher"] = {"name": "ray", "address": address, "workers": 2}
    if env_vars:
        doc["launcher"]["runtime_env"] = {"env_vars": env_vars}
    path = tmp_path / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def _start_run(manifest: Path, tmp_path: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(tmp_path / "run")],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _env(**extra: str) -> dict:
    """The run's environment: this one (with conftest.py's LOOPBACK_ENV) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_DEBUG", "RLCORE_DEBUG_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_ray_legacy_debugger_attaches_to_a_breakpoint_in_rank_1(ray_cluster, tiny_model, tmp_path):
    """``RAY_DEBUG=legacy``: ``breakpoint()`` in rank 1's actor opens Ray's remote pdb and registers
    it in the GCS; we find it as ``ray debug`` does and talk to the pdb socket on 127.0.0.1."""
    (tmp_path / "scores.py").write_text(BATCHED_REWARD)
    manifest = _manifest(tmp_path, tiny_model, ray_cluster.address, {"function": "python:scores.py:scores"})
    run = _start_run(manifest, tmp_path, _env(RAY_DEBUG="legacy"))
    pdb = None
    try:
        run_out = Output(run.stdout)
        session = _waiting_breakpoint(ray_cluster.address, "scores.py", run, run_out, timeout=90)
        host, port = session["pdb_address"].rsplit(":", 1)
        assert host in ("localhost", "127.0.0.1"), session  # not --ray-debugger-external: loopback only
        pdb = PdbSocket(int(port))
        assert "score_batch()" in pdb.until_prompt(), pdb.text  # pdb shows the stopped frame
        pdb.send("p secret")
        assert "'rank1-call1'" in pdb.until_prompt(), pdb.text[-2000:]
        pdb.send("c")
        assert run.wait(120) == 0, run_out.text[-3000:]
    finally:
        if pdb is not None:
            pdb.sock.close()
        kill_group(run)
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.slow
def test_rlcore_debug_breakpoint_in_a_reward_worker_of_a_ray_rank(ray_cluster, tiny_model, tmp_path):
    """A ``python:`` reward runs in a reward worker forked from the rank's actor; rlcore.debug's
    loopback pdb reaches it there, and the reward's 2 s time limit does not kill it while stopped."""
    (tmp_path / "reward.py").write_text(BREAKPOINT_REWARD)
    (tmp_path / "markers").mkdir()
    manifest = _manifest(
        tmp_path,
        tiny_model,
        ray_cluster.address,
        {"function": "python:reward.py:score", "timeout_s": 2},
        {"MARKERS": str(tmp_path / "markers")},
    )
    env = _env(RLCORE_DEBUG_DIR=str(tmp_path / "debug"))  # forwarded to the ranks by the launcher
    run = _start_run(manifest, tmp_path, env)
    client = DebugClient(env, wait_s=120)
    try:
        run_out = Output(run.stdout)
        continue_from_rank_1(client, run, run_out, attach_s=120)
    finally:
        kill_group(run)
        client.kill()
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/timeouts"] == 0 for r in rows), rows
