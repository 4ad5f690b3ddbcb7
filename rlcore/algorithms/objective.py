"""The actor's objective: one pure function from a micro-batch's log-probs to its loss and metrics.

Everything the policy update optimises is here, apart from the workers that run it (as verl keeps
``core_algos`` apart from its actor): the policy loss plugin's per-token loss, the rollout
correction (the trainer/engine importance weights), the aggregation by per-token weights, the
entropy bonus and the KL loss against the reference policy. The actor only runs forward passes,
calls :func:`policy_objective` per micro-batch and steps the optimizer, so a new loss term is one
change here, testable against a hand computation without a model.

The token weights come from :func:`rlcore.algorithms.masked.token_weights` over the whole
mini-batch, so summing a micro-batch's ``(per_token_loss * weights)`` over micro-batches (and
ranks) gives the mini-batch's aggregated loss, however it is split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlcore.algorithms.importance import correction_weights
from rlcore.algorithms.masked import AGG_MODES
from rlcore.interfaces import PolicyLoss, PolicyLossInput


@dataclass(frozen=True)
class ObjectiveOptions:
    """The ``[algorithm]`` keys the objective reads (see :meth:`from_algorithm`)."""

    loss_agg_mode: str = "token-mean"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # weight of the KL loss term; 0 (or the KL in the reward) leaves it out
    kl_estimator: str = "k3"
    rollout_correction: str = "none"
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_lower: float | None = None  # default 1 / rollout_is_threshold

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(
                f"unknown loss aggregation mode {self.loss_agg_mode!r}; expected one of {', '.join(AGG_MODES)}"
            )

    @classmethod
    def from_algorithm(cls, algo: Any, policy_loss: PolicyLoss | None = None) -> ObjectiveOptions:
        """From an ``[algorithm]`` table. A policy loss that is defined with its own aggregation
        (its ``loss_agg_mode`` attribute, as GSPO's is) takes it over the table's; the KL loss term
        is left out when the KL goes into the reward instead (``kl_in_reward``)."""
        return cls(
            loss_agg_mode=aggregation_of(policy_loss, algo.loss_agg_mode),
            entropy_coef=algo.entropy_coef,
            kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef,
            kl_estimator=algo.kl_estimator,
            rollout_correction=algo.rollout_correction,
            rollout_is_threshold=algo.rollout_is_threshold,
            rollout_is_threshold_lower=algo.rollout_is_threshold_lower,
        )

    @property
    def kl_loss(self) -> bool:
        return self.kl_coef > 0


def aggregation_of(policy_loss: PolicyLoss | None, default: str) -> str:
    """The aggregation a policy loss is defined with (its ``loss_agg_mode`` attribute), else ``default``."""
    own = getattr(policy_loss, "loss_agg_mode", None)
    return own if isinstance(own, str) and own else default


@dataclass
class ObjectiveInput:
    """One micro-batch, as [rows, T] tensors on one device."""

    logprobs: torch.Tensor  # the current policy's, with gradient
    old_logprobs: torch.Tensor  # the PPO ratio's old policy (detached)
    advantages: torch.Tensor
    response_mask: torch.Tensor
    token_weights: torch.Tensor  # this micro-batch's rows of the mini-batch's weights (masked.token_weights)
    rollout_logprobs: torch.Tensor  # the engine's, for the rollout correction
    ref_logprobs: torch.Tensor | None = None  # the reference policy's, for the KL loss term
    entropy: torch.Tensor | None = None  # per-token entropy (with gradient when entropy_coef > 0)


def policy_objective(
    policy_loss: PolicyLoss, batch: ObjectiveInput, options: ObjectiveOptions
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's share of the mini-batch loss, and its share of each metric.

    ``loss = sum(w * c * pg) - entropy_coef * sum(w * H) + kl_coef * sum(w * KL(pi, ref))`` with
    ``pg`` the policy loss plugin's per-token loss, ``c`` the rollout correction's weights (1 with
    ``rollout_correction = "none"``) and ``w`` the token weights. The metrics (0-dim tensors, left
    on the device) add up over micro-batches and ranks: ``actor/pg_loss``, ``actor/kl_loss``,
    ``actor/entropy`` are sums with the token weights; the plugin's metrics (``actor/<name>``) and
    the correction's statistics are its per-micro-batch means weighted by the micro-batch's share
    of the weights.
    """
    weights = batch.token_weights
    mask = batch.response_mask
    pg, pg_metrics = policy_loss(
        PolicyLossInput(
            logprobs=batch.logprobs,
            old_logprobs=batch.old_logprobs,
            advantages=batch.advantages,
            response_mask=mask,
            rollout_logprobs=batch.rollout_logprobs,
        )
    )
    share = weights.sum()  # this micro-batch's share of the mini-batch
    metrics: dict[str, torch.Tensor] = {}
    if options.rollout_correction != "none":
        lower = options.rollout_is_threshold_lower or 1.0 / options.rollout_is_threshold
        correction, correction_stats = correction_weights(
            batch.old_logprobs,
            batch.rollout_logprobs,
            mask,
            options.rollout_correction,
            options.rollout_is_threshold,
            lower,
        )
        pg = pg * correction
        for key, value in correction_stats.items():
            metrics[key] = value * share
    loss = (pg * weights).sum()
    metrics["actor/pg_loss"] = loss.detach()
    if options.entropy_coef > 0:
        if batch.entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy")
        loss = loss - options.entropy_coef * (batch.entropy * weights).sum()
    if options.kl_loss:
        if batch.ref_logprobs is None:
            raise ValueError("a KL loss term needs the reference policy's log-probs")
        from rlcore.algorithms.kl import kl_penalty

        kl_loss = (kl_penalty(batch.logprobs, batch.ref_logprobs, options.kl_estimator) * weights).sum()
        loss = loss + options.kl_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
    if batch.entropy is not None:
        metrics["actor/entropy"] = (batch.entropy.detach() * weights).sum()
    for key, value in pg_metrics.items():
        metrics[f"actor/{key}"] = (value.detach() if torch.is_tensor(value) else value) * share
    return loss, metrics
