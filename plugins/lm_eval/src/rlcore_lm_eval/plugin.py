"""Registers the ``lm_eval`` evaluation harness. Imports nothing heavy (lm_eval loads when it runs)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

import rlcore
from rlcore.components import Component, Options


class LmEvalOptions(Options):
    tasks: list[str] = Field(
        ..., min_length=1, description="lm-eval task (or group) names: --tasks gsm8k,my_task"
    )
    include_path: str | None = Field(None, description="a directory of your own task YAMLs, beside lm-eval's")
    include_defaults: bool = Field(
        True,
        description="index lm-eval's own tasks too (false: only include_path's, which starts much faster)",
    )
    num_fewshot: int | None = Field(None, ge=0, description="few-shot examples (default: each task's own)")
    limit: float | None = Field(
        None, gt=0, description="at most this many documents per task (below 1: a fraction)"
    )
    apply_chat_template: bool = Field(False, description="render prompts with the tokenizer's chat template")
    fewshot_as_multiturn: bool = Field(
        False, description="with the chat template: few-shot examples as turns"
    )
    system_instruction: str | None = Field(None, description="a system message before every prompt")
    max_gen_toks: int = Field(256, ge=1, description="generation length when a task does not set one")
    batch_size: int = Field(32, ge=1, description="requests handed to the engine at once")
    log_samples: bool = Field(
        True, description="write each document's prompt and response (samples_TASK.jsonl)"
    )
    seed: int = Field(0, ge=0, description="lm-eval's random seeds (few-shot sampling) and the engine's")
    confirm_run_unsafe_code: bool = Field(False, description="allow tasks that execute model-written code")
    metadata: dict[str, Any] = Field(default_factory=dict, description="task metadata some tasks require")


@rlcore.hookimpl
def rlcore_eval_harnesses():
    return [
        Component(
            name="lm_eval",
            factory="rlcore_lm_eval.harness:build",
            options=LmEvalOptions,
            description="lm-evaluation-harness tasks on the run's engine and actor (rlcore eval --harness lm_eval)",
        )
    ]
