"""The reference role: the policy the KL penalty holds the actor to. With LoRA it is the actor
with its adapters disabled, at no extra memory; with full fine-tuning a frozen copy of the
initial weights, loaded only when a KL term needs it."""

from __future__ import annotations

import contextlib

from rlcore.manifest.schema import ModelTable
from rlcore.trainer.models import load_causal_lm


class Reference:
    """Log-probs under the reference policy."""

    def __init__(self, actor, frozen=None):
        self.actor, self.frozen = actor, frozen

    @contextlib.contextmanager
    def policy(self):
        if self.frozen is not None:
            yield self.frozen
        else:  # LoRA: the base model is the reference
            with self.actor.disable_adapter():
                yield self.actor


def build_reference(actor, model: ModelTable, device: str, compute_dtype: str) -> Reference:
    """The frozen copy is loaded in the compute dtype: it is never updated, so it needs no
    float32 master."""
    if model.lora is not None:
        return Reference(actor)
    frozen = load_causal_lm(model, device, dtype=compute_dtype)
    frozen.eval().requires_grad_(False)
    return Reference(actor, frozen)
