"""Reinforcement learning actually learns: the reward of a tiny model rises within CI's time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing.runs import train_rows, write_run_manifest

ROOT = Path(__file__).resolve().parents[1]  # the repository


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    """A random 2-layer Llama over a 600-token byte-level vocabulary (ChatML template), where a
    sampled response of 8 tokens holds a digit about one time in five."""
    from rlcore.testing.models import make_tiny_model
    from rlcore.testing.tools import make_chat_tokenizer

    return make_tiny_model(tmp_path_factory.mktemp("small-vocab"), tokenizer=make_chat_tokenizer(), seed=1)


@pytest.mark.slow
def test_grpo_raises_a_dense_reward(tmp_path, small_vocab_model):
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    manifest = write_run_manifest(
        tmp_path,
        small_vocab_model,
        data={"prompts_per_step": 8, "max_response_tokens": 8, "val": None},
        rollout={"samples_per_prompt": 4, "temperature": 1.0},
        reward={"function": "python:dense_rewards.py:digits", "method": None},
        algorithm={"advantage": "grpo"},
        trainer={"steps": 14, "lr": 1e-2},
    )
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    scores = [r["critic/score/mean"] for r in train_rows(tmp_path / "run")]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    print("reward per step:", [round(s, 3) for s in scores])
    assert last > max(2 * first, 0.2), scores
