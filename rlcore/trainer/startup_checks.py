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


def checkpoint_matches(manifest, checkpoint, state: dict[str, Any], dist: Any) -> None:
    """A checkpoint resumes on as many ranks as wrote it, with FSDP as it was written: its
    optimizer states are per rank, and sharded ones differ in kind from unsharded ones."""
    from rlcore.errors import RlcoreError

    written_by = int(state.get("world_size", 1))
    if written_by != dist.world:
        raise RlcoreError(
            f"checkpoint {checkpoint} was written by {written_by} ranks; resume it with as many"
        )
    if bool(state.get("fsdp", written_by > 1)) != dist.sharded:
        said = "with" if dist.sharded else "without"
        raise UsageError(
            f"{manifest.path}: checkpoint {checkpoint} was written {'without' if dist.sharded else 'with'} "
            f"FSDP and this run trains {said} it ([trainer] fsdp_offload): their optimizer states differ in "
            "kind; resume with the fsdp_offload setting it was written with"
        )


def filters_select_groups(manifest, filters: Any) -> None:
    """``[data] gen_batch_size`` above ``prompts_per_step`` needs a batch filter that selects
    groups; without one every generated group would train."""
    d = manifest.core.data
    if (
        d.gen_batch_size
        and d.gen_batch_size != d.prompts_per_step
        and not any(hasattr(f, "select") for f in filters)
    ):
        raise UsageError(
            f"{manifest.path}: [data] gen_batch_size = {d.gen_batch_size} differs from prompts_per_step = "
            f"{d.prompts_per_step}, and with no batch filter selecting groups ([filters.dynamic_sampling]) every "
            "generated group would train; set prompts_per_step to the groups a step trains on"
        )


def engine_device(manifest, dist: Any, device: str) -> str:
    """Where this rank's split engine runs: ``[rollout] engine_device``, one device per local
    rank when it is a list, else the rank's own device. Each rank drives its own engine
    (data-parallel rollout), as engines holding their own weights do with several ranks."""
    wanted = manifest.core.rollout.engine_device
    if wanted is None:
        return device
    if isinstance(wanted, str):
        if dist.world > 1 and wanted.startswith("cuda"):
            raise UsageError(
                f"{manifest.path}: [rollout] engine_device = {wanted!r} would put every rank's engine on one "
                'GPU; give one device per local rank (engine_device = ["cuda:4", "cuda:5", ...]) or leave '
                "it out (each engine on its rank's GPU)"
            )
        return wanted
    if dist.local_rank >= len(wanted):
        raise UsageError(
            f"{manifest.path}: [rollout] engine_device lists {len(wanted)} device(s), and local rank "
            f"{dist.local_rank} needs one; list one per rank on a node"
        )
    return wanted[dist.local_rank]


def engine_takes_lora(manifest, engine: Any, dist: Any) -> None:
    """An engine holding its own weights under FSDP gets them gathered from the shards, which is
    not done for LoRA adapters."""
    if dist.sharded and not engine.shares_actor and manifest.core.model.lora is not None:
        raise UsageError(
            f"{manifest.path}: rollout engine {manifest.component('rollout.engine').component.name!r} "
            "holds its own weights, and with FSDP (several training ranks, or [trainer] fsdp_offload) they are "
            "gathered from the shards for it, which is not done for LoRA adapters yet; train the LoRA run on one "
            "rank without fsdp_offload, or use the hf engine sharing the actor"
        )


def background_engine(manifest, engine: Any) -> None:
    """Background rollouts (``[rollout] max_staleness``) need an engine with weights of its own."""
    if manifest.core.rollout.max_staleness is not None and engine.shares_actor:
        name = manifest.component("rollout.engine").component.name
        raise UsageError(
            f"{manifest.path}: [rollout] max_staleness: the {name!r} engine shares the actor's module, so it "
            "cannot generate while the trainer trains; use an engine that holds its own weights"
        )


def source_weights_cover(manifest, sources: list[str], train_source: str) -> None:
    """``[data] source_weights`` weighs every data source of ``data.train`` and names no other."""
    weights = manifest.core.data.source_weights
    unweighted = sorted(set(sources) - set(weights))
    missing = sorted(set(weights) - set(sources))
    if unweighted or missing:
        problems = (
            [f"the sources {unweighted} of data.train have no weight (0 leaves one out)"]
            if unweighted
            else []
        )
        problems += [f"{missing} are not data sources of data.train"] if missing else []
        raise UsageError(
            f"{manifest.path}: [data] source_weights: "
            + "; ".join(problems)
            + f"; the sources of {train_source}: {sorted(sources)}"
        )
