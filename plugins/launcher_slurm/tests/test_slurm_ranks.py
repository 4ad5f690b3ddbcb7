"""Several nodes, several ranks each, on the real two-node test cluster: `rlcore run` starts one
training rank per task with srun, the ranks train like one process, a rank that dies fails the job
with its name, and `--resume` continues from the last checkpoint, where USR1 stops every rank at
the same step."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tomli_w
from rlcore_launcher_slurm import slurm

from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN, deep_update, run_cli, train_rows, wait_for

# The runs use the hf engine and the reinforce_pp estimator, of plugins this one does not depend on.
require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES, RANKS_PER_NODE = 2, 2

REWARD = '''
def spread(item):
    """A dense score that differs between prompts even when a random model's greedy responses are
    all alike, so the advantages, losses and gradients are not all zero."""
    return float(item.ground_truth) / 18 + sum(map(ord, item.response)) % 17 / 17
'''

# The test cluster's two nodes share this host's two cores: one thread per rank.
SLURM = {
    "name": "slurm",
    "nodes": NODES,
    "ranks_per_node": RANKS_PER_NODE,
    "cpus_per_task": 1,
    "network_interface": "lo",
    "time": "10",
    "poll_interval": 0.5,
}


def write_manifest(directory: Path, model_dir: Path, launcher: dict, **tables) -> Path:
    """A tiny run on which one and four ranks must agree: greedy rollouts (the samples do not
    depend on how prompts are split), a dense reward, batch-whitened advantages; 4 prompts a step,
    so each of the 4 ranks rolls out one."""
    (directory / "reward.py").write_text(REWARD)
    doc = deep_update(
        deep_update(
            TINY_RUN,
            {
                "run": {"name": "slurm-ranks"},
                "model": {"path": str(model_dir)},
                "rollout": {"samples_per_prompt": 1, "temperature": 0.0},
                "reward": {"function": "python:reward.py:spread", "method": None},
                "algorithm": {"advantage": "reinforce_pp"},
                "data": {"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
                "trainer": {"steps": 3, "lr": 1e-2, "loggers": ["jsonl", "console"]},
            },
        ),
        tables,
    )
    doc["launcher"] = launcher
    path = directory / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def two_nodes(slurm_cluster) -> None:
    if slurm_cluster < NODES:
        pytest.skip("the test cluster has one node (RLCORE_SLURM_NODES=1)")


class Follower:
    """`rlcore run` in a subprocess, its output collected line by line as it follows the job."""

    def __init__(self, *args: str):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def job(self) -> str:
        return wait_for(
            lambda: (m := re.search(r"submitted job (\d+)", self.out)) and m.group(1), 60, "the job id"
        )

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code, self.out


def rank_pid(job: str, rank: int) -> int | None:
    """The pid of rank ``rank``'s driver in ``job`` (all nodes of the test cluster are this host):
    the process started with RANK set whose parent is the task's wrapper, not the rank itself."""

    def env(pid: str) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return {}
        return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)

    for pid in filter(str.isdigit, os.listdir("/proc")):
        e = env(pid)
        if e.get("SLURM_JOB_ID") == job and e.get("RANK") == str(rank):
            try:
                parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            except OSError:
                continue
            if env(parent).get("RANK") != str(rank):  # the wrapper's own environment has no RANK
                return int(pid)
    return None


def test_two_nodes_of_two_ranks_train_like_one_process(two_nodes, tmp_path, tiny_model):
    one = write_manifest(tmp_path, tiny_model, {"name": "local"})
    proc = run_cli(
        "run", str(one), "--run-dir", str(tmp_path / "one"), env={"OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    four = write_manifest(tmp_path, tiny_model, SLURM)
    proc = run_cli("run", str(four), "--run-dir", str(tmp_path / "four"), timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-3000:]
    assert "[rlcore] 4 rank(s), 2 on each of 2 node(s)" in out
    assert re.search(r"\[rlcore\] rendezvous at 127\.0\.0\.1:\d+ on rlcore1", out), out
    assert "[rlcore] ranks exited with status 0" in out
    # Every rank ran, on its node: rank 0 writes run.log, the others run.rank<N>.log.
    for rank in (1, 2, 3):
        assert (tmp_path / "four" / f"run.rank{rank}.log").exists()
    a, b = train_rows(tmp_path / "one"), train_rows(tmp_path / "four")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    # The tolerance of tests/test_trainer_distributed.py: the same samples, so the same scores;
    # losses, entropies and gradient norms agree to 1e-3 relative (sums in another order: FSDP's
    # reduce-scatter, per-rank partial sums, then amplified by Adam's first, nearly sign-like steps).
    for x, y in zip(a, b):
        assert x["critic/score/mean"] == pytest.approx(y["critic/score/mean"], abs=1e-6)
        assert x["response_length/mean"] == y["response_length/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isclose(x[key], y[key], rel_tol=1e-3, abs_tol=1e-6), (key, x[key], y[key])
    assert any(r["actor/grad_norm"] > 0 for r in a)
    # The checkpoint holds every rank's optimizer shard.
    assert (tmp_path / "four" / "checkpoints" / "step_000003" / "optimizers-rank3.pt").exists()


def test_a_dead_rank_fails_the_job_and_resume_continues(two_nodes, tmp_path, tiny_model):
    manifest = write_manifest(tmp_path, tiny_model, SLURM, trainer={"steps": 50, "save_every": 1})
    run_dir = tmp_path / "run"
    latest = run_dir / "checkpoints" / "latest"
    follower = Follower(str(manifest), "--run-dir", str(run_dir))
    try:
        job = follower.job()
        wait_for(lambda: latest.exists() or follower.proc.poll() is not None, 240, "the first checkpoint")
        assert follower.proc.poll() is None, follower.out[-5000:]
        # Rank 3 (the second rank of the second node) dies as a killed or crashed process does.
        os.kill(wait_for(lambda: rank_pid(job, 3), 10, "rank 3's process"), 9)
        code, out = follower.finish()
    finally:
        if follower.proc.poll() is None:
            subprocess.run(["scancel", follower.job()], check=False)
    # The first error names the rank and its node; srun then ends the other ranks.
    first_error = next(line for line in out.splitlines() if "error" in line.lower())
    assert (
        first_error
        == "[rlcore] error: rank 3 (local rank 1 on node rlcore2) exited with status 137 (signal 9)"
    ), out[-5000:]
    assert "srun: error: rlcore2: task 3: Exited with exit code 137" in out
    assert "[rlcore] ranks exited with status 137" in out
    assert code == 137 and f"job {job} FAILED with exit code 137" in out
    saved = int(latest.read_text().strip().split("_")[1])
    assert f"[rlcore] the latest checkpoint is step_{saved:06d}" in out

    # --resume continues from that checkpoint on all four ranks; USR1 (what SLURM sends ahead of
    # the time limit) then reaches every rank, and they all stop after the same step with a checkpoint.
    follower = Follower(str(manifest), "--run-dir", str(run_dir), "--resume")
    try:
        job = follower.job()
        # This run's own console line (metrics.jsonl may still hold the killed run's later rows).
        wait_for(
            lambda: (
                re.search(rf"^step {saved + 1}/50 \|", follower.out, re.M) or follower.proc.poll() is not None
            ),
            240,
            f"step {saved + 1} of the resumed run",
        )
        assert follower.proc.poll() is None, follower.out[-5000:]
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
        code, out = follower.finish()
    finally:
        if follower.proc.poll() is None:
            subprocess.run(["scancel", job], check=False)
    assert "[rlcore] USR1 received" in out, out[-5000:]
    assert "[rlcore] ranks exited with status 138" in out, out[-5000:]
    assert code != 0
    steps = [r["step"] for r in train_rows(run_dir)]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > saved, steps
    assert latest.read_text().strip() == f"step_{steps[-1]:06d}"
    assert (run_dir / "checkpoints" / f"step_{steps[-1]:06d}" / "optimizers-rank3.pt").exists()
    for rank in (1, 2, 3):  # each rank got the signal and stopped for it
        log = (run_dir / f"run.rank{rank}.log").read_text()
        assert "received SIGUSR1" in log and "stopped by SIGUSR1" in log, (rank, log[-2000:])
    assert slurm.job_status(job).state == "FAILED"


def test_a_dead_node_ends_the_job_naming_it(two_nodes, slurm_launcher, launch_request, tmp_path, capsys):
    """A node that SLURM finds dead (set DOWN here, as slurmctld does when a node stops answering)
    ends the job as NODE_FAIL, not a requeue that would rerun it without --resume; srun's line in
    the streamed log names the node. The ranks are stand-ins that wait (no training needed)."""
    fake = tmp_path / "rank-python"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\n'
        'echo "rank $SLURM_PROCID on $SLURMD_NODENAME: waiting"\nexec sleep 300\n'
    )
    fake.chmod(0o755)
    launcher = slurm_launcher(nodes=2, python=str(fake), job_name="node-death")
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=launcher.launch(launch_request())))
    thread.start()
    job = None
    try:
        job = wait_for(
            lambda: next((j.job_id for j in slurm.list_jobs() if j.name == "rlcore-node-death"), None),
            60,
            "the job",
        )
        log = tmp_path / "run" / "launch" / f"slurm-{job}.log"
        wait_for(lambda: log.exists() and "rank 1 on rlcore2: waiting" in log.read_text(), 60, "both ranks")
        subprocess.run(
            ["scontrol", "update", "nodename=rlcore2", "state=down", "reason=rlcore test: a node dies"],
            check=True,
            capture_output=True,
        )
        thread.join(60)
    finally:
        if thread.is_alive() and job:
            subprocess.run(["scancel", job], check=False)
            thread.join(30)
        # The test cluster returns a node that answers to service (ReturnToService=2); make sure.
        subprocess.run(
            ["scontrol", "update", "nodename=rlcore2", "state=resume"], check=False, capture_output=True
        )
        wait_for(
            lambda: (
                "down"
                not in subprocess.run(
                    ["sinfo", "-h", "-n", "rlcore2", "-o", "%T"], capture_output=True, text=True
                ).stdout
            ),
            30,
            "rlcore2 back up",
        )
    out = capsys.readouterr().out
    assert result["code"] == 1, out
    assert "srun: error: Node failure on rlcore2" in out
    assert f"job {job} NODE_FAIL: a node of the job failed" in out
    assert slurm.job_status(job).state == "NODE_FAIL"
