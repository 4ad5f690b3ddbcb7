"""What serving a manifest's rollout engine needs from the core: the engine and tokenizer built as
a run builds them, with the manifest's defaults for a request.

``rlcore serve`` (the ``rlcore-serve`` plugin) and any other server plugin call
:func:`build_served_engine` instead of reaching into the manifest loader, the registry and the
trainer's model loading, which stay internal. In the plugin API. Importing this module is light;
building imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """

    engine: Any
    tokenizer: Any
    model_name: str
    max_tokens: int
    stop: list[str] = field(default_factory=list)


def build_served_engine(manifest_path: str | Path, overrides: Sequence[str] = ()) -> ServedEngine:
    """Load and validate ``manifest_path`` (with ``--set``-style ``overrides``), then build its
    tokenizer and rollout engine on the run's device, computing in the run's compute dtype (a
    server needs no float32 master weights). An engine that needs the actor (``hf``) gets the
    model loaded for it, in eval mode. Invalid manifests raise :class:`rlcore.errors.RlcoreError`
    with located messages, as ``rlcore validate`` reports them."""
    from rlcore.interfaces import BuildContext
    from rlcore.manifest.loader import load_manifest
    from rlcore.registry import Registry

    resolved = load_manifest(str(manifest_path), list(overrides), registry=Registry.discover())
    cfg = resolved.core
    from rlcore.trainer import models
    from rlcore.trainer.precision import resolve

    device = models.resolve_device(cfg.run.device)
    compute_dtype = resolve(cfg.model, device).compute
    tokenizer = models.load_tokenizer(cfg.model)
    selected = resolved.component("rollout.engine")
    actor = None
    if "actor_model" in selected.component.needs:
        actor = models.load_causal_lm(cfg.model, device, dtype=compute_dtype)
        actor.eval()
    context = BuildContext.from_manifest(resolved, dtype=compute_dtype, device=device, tokenizer=tokenizer, actor=actor)
    engine = selected.component.build(selected.options, context)
    return ServedEngine(engine=engine, tokenizer=tokenizer, model_name=cfg.run.name,
                        max_tokens=cfg.data.max_response_tokens, stop=list(cfg.rollout.stop))
