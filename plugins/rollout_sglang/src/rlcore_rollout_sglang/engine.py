"""The factory named by the ``sglang`` component: picks colocated or server mode."""

from __future__ import annotations

from rlcore.interfaces import BuildContext
from rlcore_rollout_sglang.options import SGLangOptions


def build(options: SGLangOptions, context: BuildContext | None = None):
    if options.mode == "server":
        from rlcore_rollout_sglang.server import SGLangServerEngine

        return SGLangServerEngine(options, context)
    from rlcore_rollout_sglang.colocated import SGLangColocatedEngine

    return SGLangColocatedEngine(options, context)
