"""`rlcore run` on the tiny model with each model-based reward: two steps on the CPU, finite
scores, the reward's own metrics in metrics.jsonl."""

from __future__ import annotations

import math
import shutil

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

pytestmark = pytest.mark.slow


def run_two_steps(tmp_path, tiny_model, reward):
    require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")  # the engine and estimator of the tiny run
    manifest = write_run_manifest(tmp_path, tiny_model, reward={"method": None, **reward})
    check = run_cli("validate", str(manifest))
    assert check.returncode == 0, check.stdout + check.stderr
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 2
    assert all(
        math.isfinite(r["critic/score/mean"]) and r["reward/errors"] == 0 and r["reward/timeouts"] == 0
        for r in rows
    )
    return rows, proc.stdout + proc.stderr


def test_a_run_scored_by_a_reward_model_plus_a_rule(tmp_path, tiny_model, tiny_rm):
    shutil.copytree(tiny_rm, tmp_path / "rm")  # paths relative to the manifest
    (tmp_path / "rules.py").write_text(
        "def short(item):\n    return 1.0 if len(item.response) < 10 else 0.0\n"
    )
    rows, _ = run_two_steps(
        tmp_path,
        tiny_model,
        {
            "function": "reward_model",
            "path": "rm",
            "batch_size": 3,
            "rule": "rules.py:short",
            "rule_weight": 0.5,
            "model_weight": 2.0,
            "batch_timeout_s": 60,
        },
    )
    for r in rows:
        assert math.isfinite(r["reward/rm_score"]) and r["reward/rm_truncated"] == 0
        assert r["critic/score/mean"] == pytest.approx(
            2.0 * r["reward/rm_score"] + 0.5 * r["reward/rule_score"], abs=1e-4
        )


def test_a_run_scored_by_a_judge(tmp_path, tiny_model, judge_server):
    server = judge_server(lambda body, n: (200, "Fine.\nScore: 7", 0.0) if n % 4 else (500, "hiccup", 0.0))
    rows, log = run_two_steps(
        tmp_path,
        tiny_model,
        {
            "function": "judge",
            "base_url": server.url,
            "model": "grader",
            "max_score": 10,
            "prompt_template": "Question: {prompt}\nAnswer: {response}\nScore 0-10:",
            "backoff_s": 0.01,
            "concurrency": 4,
            "request_timeout_s": 20,
            "batch_timeout_s": 60,
        },
    )
    for r in rows:
        assert r["critic/score/mean"] == pytest.approx(0.7) and r["reward/judge_failed"] == 0
    assert sum(r["reward/judge_retries"] for r in rows) > 0  # every fourth request met a 500 and was retried
    assert "batch time limit 60 s" in log  # it stops short of [reward] batch_timeout_s
    first = server.bodies[0]["messages"][0]["content"]
    assert first.startswith("Question: ") and "<|im_start|>" not in first  # the question without the template
