"""The task's run script, executed here as SkyPilot executes it on a node: SKYPILOT_* variables
set by hand for one node with two ranks, the workdir at ~/sky_workdir, commands run there. The
ranks really train a tiny model together on CPU (gloo), and a failing rank is named and ends the
node's other ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN, deep_update, train_rows

REWARD = '''
def spread(item):
    """A dense score that differs between prompts even when a random model's greedy responses are all alike."""
    return float(item.ground_truth) / 18 + sum(map(ord, item.response)) % 17 / 17
'''


def node(home: Path, workdir: Path | None, script: str, timeout: float, **env) -> subprocess.CompletedProcess:
    """Run ``script`` as SkyPilot runs a task's commands on node 0 of one: in ~/sky_workdir (the
    synced workdir), with SkyPilot's variables."""
    cwd = home
    if workdir is not None:
        cwd = home / "sky_workdir"
        cwd.symlink_to(workdir, target_is_directory=True)
    full = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1\n",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "GLOO_SOCKET_IFNAME": "lo",
        **env,
    }
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout
    )


def render(sky_launcher, request, capsys, **options) -> dict:
    assert sky_launcher(**options).launch(request) == 0
    out = capsys.readouterr().out
    return yaml.safe_load(
        "".join(line + "\n" for line in out.splitlines() if not line.startswith("[rlcore skypilot]"))
    )


def test_two_ranks_on_a_node_train_together(sky_launcher, launch_request, capsys, tmp_path, request):
    require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")
    tiny_model = request.getfixturevalue("tiny_model")  # after the check: building it takes seconds
    project = tmp_path / "project"
    project.mkdir()
    (project / "reward.py").write_text(REWARD)
    manifest = deep_update(
        TINY_RUN,
        {
            "run": {"name": "sky-ranks", "output_dir": str(tmp_path / "outputs")},
            "model": {"path": str(tiny_model)},
            "rollout": {"samples_per_prompt": 1, "temperature": 0.0},
            "reward": {"function": f"python:{project / 'reward.py'}:spread", "method": None},
            "algorithm": {"advantage": "reinforce_pp"},
            "data": {"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
            "trainer": {"steps": 2, "loggers": ["jsonl"]},
            "launcher": {"name": "local"},
        },
    )
    run_dir = tmp_path / "node-run"
    home = tmp_path / "home"
    home.mkdir()
    config = render(
        sky_launcher,
        launch_request(manifest=manifest, dry_run=True),
        capsys,
        ranks_per_node=2,
        python=sys.executable,
        workdir=str(project),
        remote_run_dir=str(run_dir),
        file_mounts={str(tiny_model): str(tiny_model)},
        master_port=29731,
    )
    proc = node(home, project, config["run"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[rlcore] node 0 of 1: 2 rank(s) of 2; rendezvous at 127.0.0.1:29731" in proc.stdout
    # The driver manifest was written on the node, with the workdir's file at the node's copy.
    written = (home / ".rlcore" / "launch" / "rlcore-sky-ranks" / "manifest.toml").read_text()
    assert f'function = "python:{home}/sky_workdir/reward.py:spread"' in written
    assert f'output_dir = "{tmp_path}"' in written
    rows = train_rows(run_dir)
    assert [row["step"] for row in rows] == [1, 2]
    # Rank 1 really ran, as the second rank of two: its own log, and its optimizer state in the checkpoint.
    assert (run_dir / "run.rank1.log").exists()
    assert (
        sorted(p.name for p in run_dir.glob("checkpoints/*/optimizers-rank*.pt")).count("optimizers-rank1.pt")
        >= 1
    )


def test_a_failing_rank_is_named_and_ends_the_others(sky_launcher, launch_request, capsys, tmp_path):
    """Rank 3's interpreter fails as soon as rank 2 has started (a marker file: on a loaded machine
    rank 2 may otherwise be stopped before it prints); rank 2's would run for a minute: the node
    exits with rank 3's status within seconds, the log naming it."""
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/bash\necho "rank $RANK of $WORLD_SIZE (local $LOCAL_RANK of $LOCAL_WORLD_SIZE), '
        'master $MASTER_ADDR:$MASTER_PORT, node $NODE_RANK, threads $OMP_NUM_THREADS: $*"\n'
        f"touch {tmp_path}/started-$RANK\n"
        f'if [ "$RANK" = 3 ]; then for i in $(seq 100); do [ -e {tmp_path}/started-2 ] && break; sleep 0.1; done; exit 7; fi\n'
        "sleep 60\n"
    )
    fake.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    config = render(
        sky_launcher,
        launch_request(dry_run=True),
        capsys,
        ranks_per_node=2,
        nodes=2,
        python=str(fake),
        remote_run_dir=str(tmp_path / "run"),
        file_mounts={"/ckpt": "gs://b"},
    )
    started = time.monotonic()
    proc = node(
        home,
        None,
        config["run"],
        timeout=60,
        SKYPILOT_NODE_RANK="1",
        SKYPILOT_NUM_NODES="2",
        SKYPILOT_NODE_IPS="10.0.0.5\n10.0.0.6\n",
    )
    assert time.monotonic() - started < 20
    assert proc.returncode == 7, proc.stdout + proc.stderr
    manifest = str(home / ".rlcore" / "launch" / "rlcore-gsm8k-grpo" / "manifest.toml")
    driver = f"-m rlcore run {manifest} --run-dir {tmp_path / 'run'}"
    # torchrun's variables, from SkyPilot's: node 1 of 2 holds ranks 2 and 3; the head node is the rendezvous.
    assert f"rank 2 of 4 (local 0 of 2), master 10.0.0.5:29500, node 1, threads 1: {driver}" in proc.stdout
    assert f"rank 3 of 4 (local 1 of 2), master 10.0.0.5:29500, node 1, threads 1: {driver}" in proc.stdout
    assert "[rlcore] error: rank 3 (local rank 1 on node 1, " in proc.stderr
    assert "exited with status 7" in proc.stderr
    assert "[rlcore] a rank failed: stopping the other ranks of node 1" in proc.stderr
    assert "[rlcore] node 1: ranks exited with status 7" in proc.stdout


def test_a_recovered_managed_task_resumes_and_a_new_one_does_not(
    sky_launcher, launch_request, capsys, tmp_path
):
    """SkyPilot reruns a recovered managed job's run script with the same SKYPILOT_TASK_ID: with
    the checkpoints of its first start there, the driver gets --resume; a new task does not."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\necho "rank $RANK: $*"\n')
    fake.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    run_dir = tmp_path / "run"
    config = render(
        sky_launcher,
        launch_request(dry_run=True),
        capsys,
        python=str(fake),
        managed=True,
        remote_run_dir=str(run_dir),
    )

    def start(task_id: str) -> str:
        proc = node(home, None, config["run"], timeout=30, SKYPILOT_TASK_ID=task_id)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return next(line for line in proc.stdout.splitlines() if line.startswith("rank 0: "))

    first = start("sky-managed-7")
    assert first.endswith(f"--run-dir {run_dir}")
    assert (run_dir / "launch" / "skypilot-task-id").read_text() == "sky-managed-7\n"
    assert start("sky-managed-7").endswith(f"--run-dir {run_dir}")  # no checkpoint yet: a fresh start again
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest").write_text("step_000002\n")
    assert start("sky-managed-7").endswith(f"--run-dir {run_dir} --resume")  # recovered
    assert start("sky-managed-8").endswith(f"--run-dir {run_dir}")  # another job: the trainer refuses it
