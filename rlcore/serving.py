"""What serving a manifest's rollout engine needs from the core: the engine and tokenizer built as
a run builds them, with the manifest's defaults for a request.

``rlcore serve`` (the ``rlcore-serve`` plugin) and any other server plugin call
:func:`build_served_engine` instead of reaching into the manifest loader, the registry and the
trainer's model loading, which stay internal. In the plugin API. Importing this module is light;
building imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ServedEngine:
    """A manifest's rollout engine, ready to generate, and what a server needs beside it.

    engine:     the built :class:`rlcore.interfaces.RolloutEngine` (``[rollout] engine``).
    tokenizer:  the run's transformers tokenizer (``[model]``).
    model_name: ``[run] name``, the model id a server reports by default.
    max_tokens: ``[data] max_response_tokens``, a request's default budget.
    stop:       ``[rollout] stop``, the stop strings a run samples with.
    closers:    what :meth:`close` calls: a split engine's process, the process group.
    """

    engine: Any
    tokenizer: Any
    model_name: str
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop what building the engine started (when the server stops)."""
        for close in self.closers:
            close()


def build_served_engine(manifest_path: str | Path, overrides: Sequence[str] = ()) -> ServedEngine:
    """Load and validate ``manifest_path`` (with ``--set``-style ``overrides``), then build what
    serving needs as a run builds it (``build_roles(manifest, "serve")``): the tokenizer and the
    rollout engine on the run's device, computing in the run's compute dtype; an engine that
    generates with the policy's module (``hf``) gets it loaded in that dtype, in eval mode (a
    server needs no optimizer nor float32 master weights). Invalid manifests raise
    :class:`rlcore.errors.RlcoreError` with located messages, as ``rlcore validate`` reports them."""
    from rlcore.manifest.loader import load_manifest
    from rlcore.registry import Registry
    from rlcore.trainer.roles import build_roles

    resolved = load_manifest(str(manifest_path), list(overrides), registry=Registry.discover())
    cfg = resolved.core
    roles = build_roles(resolved, "serve")
    return ServedEngine(
        engine=roles.engine,
        tokenizer=roles.tokenizer,
        model_name=cfg.run.name,
        max_tokens=cfg.data.max_response_tokens,
        stop=list(cfg.rollout.stop),
        closers=roles.closers(),
    )
