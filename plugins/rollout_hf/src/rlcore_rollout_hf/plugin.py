"""Registers the ``hf`` rollout engine. Imports nothing heavy."""

from __future__ import annotations

from rlcore import Component, hookimpl
from rlcore_rollout_hf.options import HFEngineOptions


@hookimpl
def rlcore_rollout_engines():
    return [
        Component(
            name="hf",
            factory="rlcore_rollout_hf.engine:build",
            options=HFEngineOptions,
            description="embedded transformers engine: batched KV-cached sampling, shares the actor's weights",
            needs={"actor_model", "tokenizer"},
            default=True,  # [rollout] engine left out
        )
    ]
