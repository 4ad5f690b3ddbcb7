"""Registers the ``vllm`` rollout engine. Imports nothing heavy (no torch, no vllm)."""

from __future__ import annotations

from rlcore import Component, hookimpl
from rlcore_rollout_vllm.options import VLLMOptions


@hookimpl
def rlcore_rollout_engines():
    return [
        Component(
            name="vllm",
            factory="rlcore_rollout_vllm.engine:build",
            options=VLLMOptions,
            description="vLLM 0.26-0.33: in-process with sleep/wake and weight sync, or over HTTP to vLLM servers",
        )
    ]
