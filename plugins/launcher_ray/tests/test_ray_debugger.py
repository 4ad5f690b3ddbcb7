"""Ray's debugger on the ray launcher's ranks (docs/debugging.md): ``RAY_DEBUG=legacy`` and
``breakpoint()`` in a rank, ``ray debug`` attaching from another process, all on loopback; and
``rlcore.debug.breakpoint`` in a ``python:`` reward of a rank under Ray."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomli_w

pytest.importorskip("ray")
pytest.importorskip("torch")

from rlcore.testing import require_plugins  # noqa: E402
from rlcore.testing.runs import TINY_RUN, deep_update, train_rows  # noqa: E402

require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")

RAY_BIN = str(Path(sys.executable).with_name("ray"))

# A batched reward: score_batch runs in the rank's own process (a Ray actor), where Ray's
# breakpoint hook is set.
BATCHED_REWARD = '''
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
'''

PYTHON_REWARD = '''
import os

from rlcore.debug import breakpoint


def score(data_source, solution_str, ground_truth, extra_info=None):
    secret = f"rank{os.environ['RANK']}-answer{ground_truth}"
    marker = os.path.join(os.environ["MARKERS"], "stopped-rank" + os.environ["RANK"])
    try:  # stop once per rank (the reward runs in several worker processes)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        first = True
    except FileExistsError:
        first = False
    if first:
        breakpoint(rank=1)
    return float(len(solution_str) % 3)
'''


class Output:
    """A process's output, read in a thread, so the test can wait for text with a deadline."""

    def __init__(self, stream) -> None:
        self.chunks: queue.Queue[str] = queue.Queue()
        self.text = ""

        def pump() -> None:
            while chunk := stream.read(1):
                self.chunks.put(chunk)

        threading.Thread(target=pump, daemon=True).start()

    def until(self, pattern: str, timeout: float, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while not (found := re.compile(pattern).search(self.text, start)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{pattern!r} not seen within {timeout:g} s; got:\n{self.text[-4000:]}")
            try:
                self.text += self.chunks.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
        return found


def _manifest(tmp_path: Path, model: Path, address: str, reward: dict, env_vars: dict | None = None) -> Path:
    doc = deep_update(TINY_RUN, {
        "model": {"path": str(model)},
        "reward": reward,
        "data": {"prompts_per_step": 4},
        "trainer": {"steps": 2, "loggers": ["jsonl"]},
    })
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
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait(10)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_DEBUG", "RLCORE_DEBUG_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", **extra}


@pytest.mark.slow
def test_ray_debug_attaches_to_a_breakpoint_in_rank_1(ray_cluster, tiny_model, tmp_path):
    (tmp_path / "scores.py").write_text(BATCHED_REWARD)
    manifest = _manifest(tmp_path, tiny_model, ray_cluster.address,
                         {"function": "python:scores.py:scores"})
    env = _env(RAY_DEBUG="legacy")
    run = _start_run(manifest, tmp_path, env)
    debug = subprocess.Popen(
        [RAY_BIN, "debug", "--address", ray_cluster.address], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
    )
    try:
        run_out, out = Output(run.stdout), Output(debug.stdout)
        # `ray debug` lists the breakpoints registered with the cluster; Enter refreshes the list.
        deadline = time.monotonic() + 120
        while True:
            try:
                index = out.until(r"\n\s*(\d+)\s*\|[^\n]*scores\.py", 2).group(1)
                break
            except AssertionError:
                if time.monotonic() > deadline or run.poll() is not None:
                    raise AssertionError(f"no breakpoint listed:\n{out.text[-2000:]}\nrun:\n{run_out.text[-3000:]}") from None
                debug.stdin.write("\n")
                debug.stdin.flush()
        debug.stdin.write(index + "\n")
        debug.stdin.flush()
        at = out.until(r"\(Pdb\) ", 60).end()
        debug.stdin.write("p secret\n")
        debug.stdin.flush()
        found = out.until(r"\(Pdb\) ", 30, at)
        assert "'rank1-call1'" in out.text[at:found.end()], out.text[-2000:]
        debug.stdin.write("c\n")
        debug.stdin.flush()
        assert run.wait(120) == 0, run_out.text[-3000:]
    finally:
        _kill(run)
        _kill(debug)
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.slow
def test_rlcore_debug_breakpoint_in_a_reward_worker_of_a_ray_rank(ray_cluster, tiny_model, tmp_path):
    """A ``python:`` reward runs in a reward worker forked from the rank's actor; rlcore.debug's
    loopback pdb reaches it there, and the reward's 2 s time limit does not kill it while stopped."""
    (tmp_path / "reward.py").write_text(PYTHON_REWARD)
    (tmp_path / "markers").mkdir()
    manifest = _manifest(tmp_path, tiny_model, ray_cluster.address,
                         {"function": "python:reward.py:score", "timeout_s": 2}, {"MARKERS": str(tmp_path / "markers")})
    env = _env(RLCORE_DEBUG_DIR=str(tmp_path / "debug"))  # forwarded to the ranks by the launcher
    run = _start_run(manifest, tmp_path, env)
    client = subprocess.Popen(
        [sys.executable, "-m", "rlcore.debug", "--wait", "120"], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
    )
    try:
        run_out, out = Output(run.stdout), Output(client.stdout)
        at = out.until(r"\(Pdb\) ", 120).end()
        assert "rank 1" in out.text and "reward.py" in out.text
        client.stdin.write("p secret\n")
        client.stdin.flush()
        found = out.until(r"\(Pdb\) ", 30, at)
        assert "'rank1-answer" in out.text[at:found.end()], out.text[-2000:]
        time.sleep(3)  # past the reward's time limit
        client.stdin.write("c\n")
        client.stdin.flush()
        assert client.wait(30) == 0, out.text[-2000:]
        assert run.wait(120) == 0, run_out.text[-3000:]
    finally:
        _kill(run)
        _kill(client)
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/timeouts"] == 0 for r in rows), rows
