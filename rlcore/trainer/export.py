"""Export of a trained actor as a plain Hugging Face directory (LoRA adapters merged)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loguru import logger


def export_model(actor, tokenizer, target: str | Path, state_dict=None) -> Path:
    """Write ``actor`` (merged when it carries LoRA adapters) and ``tokenizer`` to ``target``;
    ``state_dict``: the full weights of an FSDP-sharded actor (gathered by the caller).

    Written into a temporary directory first and renamed, so a crash never leaves half a model.
    """
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = actor
    if hasattr(actor, "merge_and_unload"):
        import copy

        model = copy.deepcopy(actor).merge_and_unload()
    model.save_pretrained(
        tmp, safe_serialization=True, **({"state_dict": state_dict} if state_dict is not None else {})
    )
    tokenizer.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    logger.info("exported the model to {}", target)
    return target
