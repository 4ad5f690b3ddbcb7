"""The critic role (PPO's GAE): a value model of its own, trained beside the actor."""

from __future__ import annotations

import torch

from rlcore.manifest.schema import Manifest, ModelTable
from rlcore.trainer import precision
from rlcore.trainer.batch import RolloutBatch
from rlcore.trainer.batching import Batching
from rlcore.trainer.distributed import Distributed, fsdp_wrap
from rlcore.trainer.optim import adamw, warmup
from rlcore.trainer.updating import run_updates


class Critic(precision.TrainedRole):
    def __init__(
        self,
        cfg: Manifest,
        model_cfg: ModelTable,
        prec: precision.Precision,
        dist: Distributed,
        device: str,
        batching: Batching,
    ):
        from rlcore.algorithms.value import CriticModel

        # The value model keeps transformers' attention, which knows no prompt-sharing layout.
        self.cfg, self.dist, self.device, self.batching = cfg, dist, device, batching.unshared()
        # A value model of its own ([critic] path), or the policy's weights with a value head.
        path, gguf_file = (
            (cfg.critic.path, None) if cfg.critic.path else (model_cfg.path, model_cfg.gguf_file)
        )
        self.module = CriticModel.from_pretrained(
            path, gguf_file=gguf_file, torch_dtype=precision.torch_dtype(prec.storage)
        ).to("cpu" if cfg.trainer.fsdp_offload else device)  # offloaded shards live in CPU memory (actor.py)
        self.masters = None
        if prec.mixed and not dist.sharded:
            self.masters = precision.MasterWeights(self.module, precision.torch_dtype(prec.compute))
        if dist.sharded:
            fsdp_wrap(
                self.module,
                lambda model: self.dummy_forward(),
                precision.fsdp_policy(prec),
                offload=cfg.trainer.fsdp_offload,
            )
        if model_cfg.gradient_checkpointing:
            self.module.gradient_checkpointing_enable()
        self.params = (
            self.masters.params if self.masters else [p for p in self.module.parameters() if p.requires_grad]
        )
        # torch's AdamW default weight decay (0.01), as the critic has always had.
        self.optimizer = adamw(self.params, cfg.critic.lr, cfg.trainer.betas, weight_decay=0.01)
        self.scheduler = warmup(self.optimizer, cfg.critic.warmup_steps)

    def dummy_forward(self) -> torch.Tensor:
        """A forward whose loss is 0 but reaches every parameter (keeps ranks in step)."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        return self.module(input_ids=ids).float().sum() * 0.0

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        return self.batching.per_token(
            batch,
            lambda micro: self.module(input_ids=micro.input_ids, position_ids=micro.position_ids)[0][
                micro.select
            ],
            self.dummy_forward,
        )

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """Clipped value-loss steps over the same mini-batches as the actor's."""
        from rlcore.algorithms.value import clipped_value_loss

        c = self.cfg.critic

        def mini_batch(rows: list[int], tokens: float):
            tokens = max(tokens, 1.0)

            def micro_step(micro):
                values = self.module(input_ids=micro.input_ids, position_ids=micro.position_ids)[0][
                    micro.select
                ]
                sel = micro.rows
                values = micro.scatter(values.float(), batch.width)
                dev = values.device
                mask = batch.response_mask[sel].to(dev)
                loss, vm = clipped_value_loss(
                    values,
                    batch.tensors["values"][sel].to(dev),
                    batch.tensors["returns"][sel].to(dev),
                    mask,
                    c.value_clip,
                    "token-mean",
                )
                share = float(mask.sum()) / tokens
                shares = {
                    "critic/vf_loss": float(loss.detach()) * share,
                    "critic/vf_clipfrac": float(vm.get("critic/vf_clipfrac", 0.0)) * share,
                }
                return loss * share * c.value_coef, shares

            return micro_step

        return run_updates(
            self,
            batch,
            epochs=self.cfg.algorithm.ppo_epochs,
            batching=self.batching,
            dist=self.dist,
            grad_clip=self.cfg.trainer.grad_clip,
            mini_batch=mini_batch,
            prefix="critic",
        )
