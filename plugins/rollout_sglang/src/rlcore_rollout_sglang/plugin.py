"""Registers the ``sglang`` rollout engine. Imports nothing heavy (no torch, no sglang)."""

from __future__ import annotations

from rlcore import Component, hookimpl
from rlcore_rollout_sglang import SGLANG_VERSION
from rlcore_rollout_sglang.options import SGLangOptions


@hookimpl
def rlcore_rollout_engines():
    return [
        Component(
            name="sglang",
            factory="rlcore_rollout_sglang.engine:build",
            options=SGLangOptions,
            description=f"SGLang {SGLANG_VERSION}: in-process with memory release and weight sync, or over HTTP to SGLang servers",
        )
    ]
