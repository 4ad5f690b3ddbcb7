"""Checks a run passes before its first step: what would otherwise fail mid-run (and again at
every resume), refused at start-up with the manifest's keys named. They need what only set-up
has (the number of ranks, the loaded models), so they are not part of ``rlcore validate``."""

from __future__ import annotations

from typing import Any

from rlcore.errors import UsageError


def batch_divides(manifest, world: int) -> None:
    """Each rank takes an equal share of every mini-batch's prompts."""
    cfg = manifest.core
    if cfg.data.prompts_per_step % (world * cfg.algorithm.mini_batches):
        raise UsageError(
            f"{manifest.path}: [data] prompts_per_step = {cfg.data.prompts_per_step} must be divisible by the number of "
            f"ranks ({world}) times [algorithm] mini_batches ({cfg.algorithm.mini_batches})"
        )
    if cfg.data.gen_batch_size % world:
        raise UsageError(
            f"{manifest.path}: [data] gen_batch_size = {cfg.data.gen_batch_size} must be divisible by the number of "
            f"ranks ({world}): each rank generates an equal share of every round"
        )


def context_fits(manifest, model: Any) -> None:
    """A prompt and its response together fit the model's positions."""
    d = manifest.core.data
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and d.max_prompt_tokens + d.max_response_tokens > positions:
        raise UsageError(
            f"{manifest.path}: [data] max_prompt_tokens = {d.max_prompt_tokens} + max_response_tokens = "
            f"{d.max_response_tokens} = {d.max_prompt_tokens + d.max_response_tokens} tokens, more than the model's "
            f"context of {positions} positions (max_position_embeddings of {manifest.core.model.path}); lower them so "
            f"that they add up to {positions} at most"
        )


def critic_vocabulary(manifest, critic: Any, tokenizer: Any) -> None:
    """A critic of its own ([critic] path) reads the actor's token ids: its embeddings must cover them."""
    config = getattr(getattr(critic, "backbone", None), "config", None)
    size = getattr(config, "vocab_size", None)
    if manifest.core.critic.path and isinstance(size, int) and size < len(tokenizer):
        raise UsageError(
            f"{manifest.path}: [critic] path = {manifest.core.critic.path} has a vocabulary of {size} tokens, fewer "
            f"than the actor's tokenizer ({len(tokenizer)}): a critic must share the actor's tokenizer"
        )
