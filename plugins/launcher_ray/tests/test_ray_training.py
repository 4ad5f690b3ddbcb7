"""Real training runs through the ray launcher on the loopback cluster: ranks agree with one
process (on one node, and one rank on each of two nodes), job mode, and a rank killed mid-run
leaves a checkpoint that --resume continues."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

pytest.importorskip("ray")
pytest.importorskip("torch")

from rlcore.checkpoint import STATE_FILE  # noqa: E402
from rlcore.cli import main as rlcore_main  # noqa: E402
from rlcore.testing import require_plugins  # noqa: E402
from rlcore.testing.runs import TINY_RUN, deep_update, train_rows  # noqa: E402

# The runs use the hf engine and the reinforce_pp estimator, of plugins this one does not depend on.
require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")

REWARD = '''
def spread(item):
    """A dense score that differs between prompts even when a random model's greedy responses are
    all alike, so the advantages, losses and gradients are not all zero."""
    return float(item.ground_truth) / 18 + sum(map(ord, item.response)) % 17 / 17
'''


def write_manifest(directory: Path, model_dir: Path, launcher: dict, **tables) -> Path:
    """A tiny run on which one and two ranks must agree: greedy rollouts (the samples do not
    depend on how prompts are split), a dense reward, batch-whitened advantages."""
    (directory / "reward.py").write_text(REWARD)
    doc = deep_update(
        TINY_RUN,
        {
            "model": {"path": str(model_dir)},
            "rollout": {"samples_per_prompt": 1, "temperature": 0.0},
            "reward": {"function": "python:reward.py:spread"},
            "algorithm": {"advantage": "reinforce_pp"},
            "data": {"prompts_per_step": 4, "max_response_tokens": 6},
            "trainer": {"steps": 2, "lr": 1e-2, "loggers": ["jsonl", "console"]},
            **tables,
        },
    )
    doc["reward"].pop("method", None)
    doc["data"].pop("val", None)
    doc["launcher"] = launcher
    path = directory / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def rlcore_run(manifest: Path, run_dir: Path, *extra: str) -> int:
    return rlcore_main(["run", str(manifest), "--run-dir", str(run_dir), *extra])


@pytest.mark.slow
def test_ray_two_workers_train_like_one_process(ray_cluster, tiny_model, tmp_path, capfd):
    one = write_manifest(tmp_path, tiny_model, {"name": "local"})
    assert rlcore_run(one, tmp_path / "one") == 0
    two = write_manifest(tmp_path, tiny_model, {"name": "ray", "address": ray_cluster.address, "workers": 2})
    assert rlcore_run(two, tmp_path / "two") == 0, capfd.readouterr().out[-3000:]
    assert_trains_alike(tmp_path / "one", tmp_path / "two")
    workers = json.loads((tmp_path / "two" / "launch" / "workers.json").read_text())
    assert [w["env"]["RANK"] for w in workers] == ["0", "1"]
    assert (tmp_path / "two" / "run.rank1.log").exists()  # rank 1 really trained, in another process


def assert_trains_alike(one: Path, two: Path) -> None:
    a, b = train_rows(one), train_rows(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    # Stated tolerances (those of tests/test_trainer_distributed.py): the same samples give the same
    # scores, up to float32 rounding of the mean (its per-rank parts are summed in another order: 1e-6
    # relative); losses and gradient norms agree to 1e-3 relative (per-rank partial sums, FSDP's
    # reduce-scatter).
    for x, y in zip(a, b):
        assert math.isclose(x["critic/score/mean"], y["critic/score/mean"], rel_tol=1e-6), (
            x["critic/score/mean"],
            y["critic/score/mean"],
        )
        assert (
            x["critic/score/max"] == y["critic/score/max"] and x["critic/score/min"] == y["critic/score/min"]
        )
        assert x["response_length/mean"] == y["response_length/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isclose(x[key], y[key], rel_tol=1e-3, abs_tol=1e-6), (key, x[key], y[key])
    assert any(r["actor/grad_norm"] > 0 for r in a)


@pytest.mark.slow
def test_ray_two_nodes_train_like_one_process(ray_two_nodes, tiny_model, tmp_path, capfd, monkeypatch):
    """One rank on each of two Ray nodes (a head and a worker raylet on loopback), the cluster
    found through RAY_ADDRESS, trains like one process."""
    one = write_manifest(tmp_path, tiny_model, {"name": "local"})
    assert rlcore_run(one, tmp_path / "one") == 0
    monkeypatch.setenv("RAY_ADDRESS", ray_two_nodes.address)
    two = write_manifest(
        tmp_path, tiny_model, {"name": "ray", "workers": 2, "placement_strategy": "STRICT_SPREAD"}
    )
    assert rlcore_run(two, tmp_path / "two") == 0, capfd.readouterr().out[-3000:]
    captured = capfd.readouterr()
    out = captured.out
    assert f"connecting to the Ray cluster at {ray_two_nodes.address}" in out
    # Both raylets watch one session directory; rank 0's last step line still appears once.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err)
    assert len(re.findall(r"\(rank0 pid=\d+\).*step 2/2 \|", plain)) == 1, plain[-3000:]
    assert_trains_alike(tmp_path / "one", tmp_path / "two")
    workers = json.loads((tmp_path / "two" / "launch" / "workers.json").read_text())
    assert len({w["node_id"] for w in workers}) == 2, workers  # one rank per node
    assert [(w["env"]["RANK"], w["env"]["NODE_RANK"], w["env"]["LOCAL_RANK"]) for w in workers] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
    ]
    assert {w["env"]["MASTER_ADDR"] for w in workers} == {"127.0.0.1"}  # both nodes on this host: loopback
    assert (tmp_path / "two" / "run.rank1.log").exists()


@pytest.mark.slow
def test_ray_job_mode_runs_the_manifest_as_a_ray_job(ray_cluster, tiny_model, tmp_path, capfd):
    manifest = write_manifest(
        tmp_path, tiny_model, {"name": "ray", "address": ray_cluster.dashboard, "job": True}
    )
    assert rlcore_run(manifest, tmp_path / "run") == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", capfd.readouterr().out)
    job_id = re.search(r"submitted Ray job (rlcore-t-\S+) to http://127\.0\.0\.1:\d+", out)
    assert job_id, out[-3000:]
    assert f"Ray job {job_id.group(1)} SUCCEEDED" in out
    # The job's own logs, streamed here: the driver started a rank on the cluster and trained.
    assert "(rank0 pid=" in out and re.search(r"step 2/2 \|", out), out[-3000:]
    assert [r["step"] for r in train_rows(tmp_path / "run")] == [1, 2]
    # The job's driver ran the ray launcher again, on the job's own cluster and without submitting.
    job_manifest = tomllib.loads((tmp_path / "run" / "launch" / "job" / "manifest.toml").read_text())
    assert job_manifest["launcher"] == {"name": "ray"}


@pytest.mark.slow
def test_ray_job_mode_failure_is_the_exit_code(ray_cluster, tiny_model, tmp_path, capfd):
    manifest = write_manifest(
        tmp_path, tiny_model, {"name": "ray", "address": ray_cluster.dashboard, "job": True}
    )
    (tmp_path / "run" / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_000001" / STATE_FILE).write_text("{}")
    assert rlcore_run(manifest, tmp_path / "run") == 2  # the driver refuses: a usage error
    out = capfd.readouterr().out
    assert "already holds checkpoints" in out and re.search(r"Ray job rlcore-t-\S+ FAILED", out), out[-3000:]


@pytest.mark.slow
def test_ray_killed_rank_mid_run_leaves_a_checkpoint_that_resumes(ray_cluster, tiny_model, tmp_path, capfd):
    launcher = {"name": "ray", "address": ray_cluster.address, "workers": 2, "failure_grace": 5}
    manifest = write_manifest(tmp_path, tiny_model, launcher, trainer={"steps": 60, "save_every": 1})
    run_dir = tmp_path / "run"
    killed: list[int] = []

    def kill_rank_1_after_a_checkpoint():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run_dir / "checkpoints" / "latest").exists():
            time.sleep(0.2)
        pid = json.loads((run_dir / "launch" / "workers.json").read_text())[1]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_rank_1_after_a_checkpoint, daemon=True)
    killer.start()
    started = time.monotonic()
    assert rlcore_run(manifest, run_dir) == 1
    killer.join(5)
    elapsed = time.monotonic() - started
    out = capfd.readouterr()
    text = out.out + out.err
    assert killed and re.search(rf"rank 1 \(pid {killed[0]} on .*\) died: ", text), text[-3000:]
    match = re.search(
        r"The last checkpoint \((\S+step_(\d+))\) is intact: `rlcore run --resume` continues from it", text
    )
    assert match, text[-3000:]
    assert elapsed < 240  # rank 0 did not hang in its next collective
    saved = int(match.group(2))
    assert saved < 60
    # The checkpoint is complete, and a 2-rank run resumes from it.
    resumed = write_manifest(tmp_path, tiny_model, launcher, trainer={"steps": saved + 1, "save_every": 1})
    assert rlcore_run(resumed, run_dir, "--resume") == 0
    rows = train_rows(run_dir)
    assert rows[-1]["step"] == saved + 1


@pytest.mark.slow
def test_ray_job_mode_ctrl_c_stops_the_job(ray_cluster, tiny_model, tmp_path, capfd):
    from ray.job_submission import JobSubmissionClient

    manifest = write_manifest(
        tmp_path,
        tiny_model,
        {"name": "ray", "address": ray_cluster.dashboard, "job": True},
        trainer={"steps": 500},
    )
    run_dir = tmp_path / "run"
    client = JobSubmissionClient(ray_cluster.dashboard)
    interrupted: list[str] = []

    def interrupt_once_training():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not interrupted:
            for job in client.list_jobs():
                if (job.metadata or {}).get("rlcore_run_dir") == str(run_dir) and str(job.status) in (
                    "RUNNING",
                    "JobStatus.RUNNING",
                ):
                    if (run_dir / "metrics.jsonl").exists():  # the driver is training
                        interrupted.append(job.submission_id)
                        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does
            time.sleep(0.5)

    threading.Thread(target=interrupt_once_training, daemon=True).start()
    assert rlcore_run(manifest, run_dir) == 130
    out = capfd.readouterr().out
    assert interrupted, out[-3000:]
    assert f"interrupted: stopping Ray job {interrupted[0]}" in out
    assert f"Ray job {interrupted[0]} is STOPPED" in out, out[-3000:]
    assert str(client.get_job_status(interrupted[0])) in ("STOPPED", "JobStatus.STOPPED")
