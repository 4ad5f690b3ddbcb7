"""The actor role: the policy being trained.

It owns the model (LoRA, compiled layers, FSDP shards, float32 masters under mixed precision), its
optimizer and schedule, the log-probs of a batch under it (or under the reference, which shares
its machinery), the policy update, and its weights as an engine that holds its own copy needs
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from loguru import logger

from rlcore.algorithms.importance import merge_mismatch, mismatch_metrics, mismatch_sums
from rlcore.algorithms.masked import mask_totals, token_weights
from rlcore.algorithms.objective import ObjectiveInput, ObjectiveOptions, policy_objective
from rlcore.checkpoint import load_actor_weights
from rlcore.manifest.schema import Manifest, ModelTable
from rlcore.trainer import compiling, models, precision
from rlcore.trainer.batch import RolloutBatch
from rlcore.trainer.batching import Batching
from rlcore.trainer.distributed import Distributed, fsdp_wrap, unsharded
from rlcore.trainer.logprobs import TokenLogprobs, token_logprobs
from rlcore.trainer.optim import adamw, train_temperature, warmup
from rlcore.trainer.updating import run_updates


class Actor(precision.TrainedRole):
    def __init__(
        self,
        cfg: Manifest,
        model_cfg: ModelTable,
        prec: precision.Precision,
        dist: Distributed,
        device: str,
        batching: Batching,
        checkpoint: Path | None,
        train: bool = True,
    ):
        """``train``: build the optimizer and its schedule (not for a policy only evaluated or served)."""
        self.cfg, self.dist, self.device, self.batching = cfg, dist, device, batching
        # Offloaded shards live in CPU memory: load there, and FSDP copies one layer at a time to the
        # device as it shards (the whole model never has to fit on the device).
        offload = cfg.trainer.fsdp_offload
        module = models.load_causal_lm(model_cfg, device, place="cpu" if offload else None)
        self.module = models.prepare_actor(module, model_cfg)
        if checkpoint is not None:
            load_actor_weights(self.module, checkpoint)
        # Mixed precision: one process keeps float32 masters beside a compute-dtype module; FSDP2
        # keeps float32 shards and gathers them in the compute dtype (precision.py).
        self.masters = None
        if prec.mixed and not dist.sharded:
            self.masters = precision.MasterWeights(self.module, precision.torch_dtype(prec.compute))
        compile_wanted = compiling.wanted(model_cfg.compile, device, dist.world, sharded=dist.sharded)
        compiling.enable_kernels(compile_wanted)
        if compile_wanted:
            layers = compiling.compile_decoder_layers(self.module)
            logger.info("torch.compile: {} decoder layers and the log-prob head ([model] compile)", layers)
        self.policy = TokenLogprobs(self.module)
        if dist.sharded:
            fsdp_wrap(
                self.policy,
                lambda model: self.dummy_forward(model),
                precision.fsdp_policy(prec),
                offload=offload,
            )
        # What the optimizer steps: the float32 masters, or the module's own trainable parameters.
        self.params = (
            self.masters.params if self.masters else [p for p in self.module.parameters() if p.requires_grad]
        )
        t = cfg.trainer
        self.optimizer = adamw(self.params, t.lr, t.betas, t.weight_decay) if train else None
        self.scheduler = warmup(self.optimizer, t.warmup_steps) if train else None

    def dummy_forward(self, model=None) -> torch.Tensor:
        """A forward whose loss is 0 but reaches every parameter (keeps ranks in step)."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        one = torch.zeros(1, dtype=torch.long, device=self.device)
        model = model if model is not None else self.policy
        model = model if isinstance(model, TokenLogprobs) else TokenLogprobs(model)
        lp, _ = model(ids, torch.arange(2, device=self.device).unsqueeze(0), one, one)
        return lp.sum() * 0.0

    def logprobs(self, batch: RolloutBatch, temperature: float, model=None) -> torch.Tensor:
        """Log-probs of the batch's response tokens under ``model`` (default: the actor)."""
        model = model if model is not None else self.policy
        temperature = train_temperature(temperature)
        return self.batching.per_token(
            batch,
            lambda micro: token_logprobs(model, micro, temperature)[0],
            lambda: self.dummy_forward(model),
        )

    @property
    def parameter_count(self) -> int:
        """Every parameter of the model (frozen ones too: they take part in the forward and backward)."""
        if not hasattr(self, "_parameter_count"):
            self._parameter_count = sum(p.numel() for p in self.module.parameters())
        return self._parameter_count

    def gathered(self):
        """Inside: a sharded actor's parameters stay gathered (an engine generating with it)."""
        return unsharded(self.policy)

    # Set (to lora.adapter_spec) when the engine loads LoRA adapters itself: then only the adapter
    # tensors travel, with this spec as update_weights' ``lora``.
    engine_lora: dict | None = None

    def weights_to_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's weights under Hugging Face names (LoRA merged in), or only its LoRA adapter
        tensors (PEFT names) when ``engine_lora`` is set, produced lazily: an engine that shares
        the actor's parameters never iterates it. With several ranks each tensor is gathered
        from the FSDP shards (one rank's too, under fsdp_offload) as it is produced, one at a time, so no rank
        ever holds a second full copy; every rank must iterate to the end (each gather is a
        collective), which every rank's own engine does in ``update_weights``."""
        from torch.distributed.tensor import DTensor

        from rlcore.trainer.lora import adapter_state, merged_state

        for name, tensor in (adapter_state if self.engine_lora else merged_state)(self.module):
            yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)

    def update(
        self,
        batch: RolloutBatch,
        temperature: float,
        has_old: bool,
        policy_loss,
        objective: ObjectiveOptions,
        norm_length: float | None = None,
    ) -> dict[str, float]:
        """PPO epochs over mini-batches of ``batch``: one optimizer step each, on the objective of
        :func:`rlcore.algorithms.objective.policy_objective`. ``has_old``: the batch holds
        recomputed old log-probs (else the pass's own, detached, are the old ones);
        ``norm_length``: the constant length of ``seq-mean-token-sum-norm``."""
        temperature = train_temperature(temperature)
        need_entropy = True  # reported as actor/entropy even when it is not in the loss
        gap = None  # the rollout/trainer log-prob gap, measured on this pass when old log-probs were not recomputed

        def mini_batch(rows: list[int], tokens: float):
            mask_rows = batch.response_mask[rows]
            _, sequences = mask_totals(mask_rows)
            totals = (tokens, self.dist.sum(sequences))
            weights_all = token_weights(mask_rows, objective.loss_agg_mode, totals, norm_length)
            row_pos = {r: i for i, r in enumerate(rows)}

            def micro_step(micro):
                nonlocal gap
                lp, ent = token_logprobs(
                    self.policy,
                    micro,
                    temperature,
                    with_entropy=need_entropy,
                    entropy_grad=objective.entropy_coef > 0,
                )
                logprobs = micro.scatter(lp, batch.width)
                dev = logprobs.device
                sel = micro.rows
                mask = batch.response_mask[sel].to(dev)
                old = batch.tensors["old_logprobs"][sel].to(dev) if has_old else logprobs.detach()
                rollout_lp = batch.rollout_logprobs[sel].to(dev)
                if not has_old:
                    gap = merge_mismatch(gap, mismatch_sums(old, rollout_lp, mask))
                return policy_objective(
                    policy_loss,
                    ObjectiveInput(
                        logprobs=logprobs,
                        old_logprobs=old,
                        advantages=batch.tensors["advantages"][sel].to(dev),
                        response_mask=mask,
                        token_weights=weights_all[[row_pos[r] for r in sel]].to(dev),
                        rollout_logprobs=rollout_lp,
                        ref_logprobs=batch.tensors["ref_logprobs"][sel].to(dev)
                        if objective.kl_loss
                        else None,
                        entropy=micro.scatter(ent, batch.width),
                    ),
                    objective,
                )

            return micro_step

        out = run_updates(
            self,
            batch,
            epochs=self.cfg.algorithm.ppo_epochs,
            batching=self.batching,
            dist=self.dist,
            grad_clip=self.cfg.trainer.grad_clip,
            mini_batch=mini_batch,
            prefix="actor",
        )
        out.setdefault("actor/pg_loss", 0.0)  # a batch of padding only: nothing weighs in the loss
        if "actor/entropy" in out:
            out["actor/entropy_loss"] = out["actor/entropy"]  # verl's older name for the same mean entropy
        if gap is not None:
            out.update(mismatch_metrics(gap))
        return out
