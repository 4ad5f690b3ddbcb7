"""The factory named by the ``vllm`` component: picks colocated or server mode."""

from __future__ import annotations

from rlcore.interfaces import BuildContext
from rlcore_rollout_vllm.options import VLLMOptions


def build(options: VLLMOptions, context: BuildContext | None = None):
    if options.mode == "server":
        from rlcore_rollout_vllm.server import VLLMServerEngine

        return VLLMServerEngine(options, context)
    from rlcore_rollout_vllm.colocated import VLLMColocatedEngine

    return VLLMColocatedEngine(options, context)
