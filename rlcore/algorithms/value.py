"""The critic for PPO: a transformer backbone with a scalar value head, and its clipped loss."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlcore.algorithms.masked import aggregate, as_bool_mask, masked_fill_zero, masked_mean

VALUE_HEAD_INIT_STD = 1e-3


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, aggregated to a scalar.

    ``v_clip = old + clamp(v - old, -clip, clip)``;
    per token ``0.5 * max((v - R)^2, (v_clip - R)^2)``. The clip keeps the critic from moving far
    from the values the advantages were computed with. Metrics: ``critic/vf_loss``,
    ``critic/vf_clipfrac`` (share of tokens where the clipped term was larger),
    ``critic/vpred_mean``.
    """
    m = as_bool_mask(mask)
    # Zero masked positions first, so NaN there reaches neither the loss nor the gradient.
    values = masked_fill_zero(values, m)
    old = masked_fill_zero(old_values.detach(), m)
    target = masked_fill_zero(returns.detach(), m)
    v_clipped = old + (values - old).clamp(-clip, clip)
    unclipped = (values - target).square()
    clipped = (v_clipped - target).square()
    per_token = 0.5 * torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, m, agg_mode)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": loss.detach(),
            "critic/vf_clipfrac": masked_mean((clipped > unclipped).float(), m),
            "critic/vpred_mean": masked_mean(values.detach().float(), m),
        }
    return loss, metrics


def _backbone_of(model: nn.Module) -> nn.Module:
    """The base transformer of a causal LM (without its LM head), or the model itself."""
    base = getattr(model, "base_model_prefix", "")
    inner = getattr(model, base, None) if base else None
    return inner if isinstance(inner, nn.Module) else model


class CriticModel(nn.Module):
    """A transformer backbone plus a linear value head: ``values[b, i]`` is the value of the
    prefix ending at token ``i`` (the trainer picks the positions of response tokens).

    The head is initialised with small weights (std 1e-3) and zero bias so that initial values
    are near 0 and early advantages are dominated by rewards, not by noise.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int | None = None):
        super().__init__()
        self.backbone = backbone
        hidden = hidden_size or backbone.config.hidden_size
        self.value_head = nn.Linear(hidden, 1)
        nn.init.normal_(self.value_head.weight, std=VALUE_HEAD_INIT_STD)
        nn.init.zeros_(self.value_head.bias)
        param = next(backbone.parameters(), None)
        if param is not None:
            self.value_head.to(device=param.device, dtype=param.dtype)

    @property
    def config(self) -> Any:
        return self.backbone.config

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        gguf_file: str | None = None,
        torch_dtype: torch.dtype | str | None = None,
        **kwargs: Any,
    ) -> CriticModel:
        """Load the backbone like the actor (a directory or hub id, optionally a GGUF file in it).

        The causal LM is loaded and its LM head dropped, so every architecture (and GGUF
        checkpoint) that loads as an actor also loads as a critic.
        """
        from transformers import AutoModelForCausalLM

        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
        if torch_dtype is not None:
            kwargs["dtype"] = torch_dtype
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        lm = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        return cls(_backbone_of(lm))

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> CriticModel:
        """A randomly initialised critic of the given (causal LM or base) config, for tests."""
        from transformers import AutoModel

        return cls(AutoModel.from_config(config, **kwargs))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
