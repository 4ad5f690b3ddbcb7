"""Algorithm building blocks shared by every algorithm plugin (and by third parties).

Each module imports torch; this package's ``__init__`` imports nothing, so that naming a
factory such as ``rlcore.algorithms.losses:build_ppo_clip`` costs nothing until a run builds it.

- :mod:`~rlcore.algorithms.masked`: masked mean / variance / whitening and loss aggregation
  (per-token weights, the one aggregation of the trainer and of :func:`aggregate`).
- :mod:`~rlcore.algorithms.objective`: the actor's objective, one pure function from a
  micro-batch's log-probs, advantages and token weights to its loss and metrics.
- :mod:`~rlcore.algorithms.logits`: entropy and log-probabilities from logits.
- :mod:`~rlcore.algorithms.kl`: per-token KL estimators (k1, k2, k3).
- :mod:`~rlcore.algorithms.losses`: the PPO clipped surrogate (builtin ``ppo_clip``).
- :mod:`~rlcore.algorithms.importance`: the rollout/trainer log-prob gap, measured and corrected.
- :mod:`~rlcore.algorithms.returns`: per-token discounted returns and group statistics.
- :mod:`~rlcore.algorithms.value`: the critic model and its clipped value loss.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> module; resolved on first access (PEP 562), so this package stays import-free.
_EXPORTS = {
    "AGG_MODES": "masked",
    "aggregate": "masked",
    "mask_totals": "masked",
    "token_weights": "masked",
    "ObjectiveInput": "objective",
    "ObjectiveOptions": "objective",
    "aggregation_of": "objective",
    "policy_objective": "objective",
    "masked_mean": "masked",
    "masked_sum": "masked",
    "masked_var": "masked",
    "masked_whiten": "masked",
    "entropy_from_logits": "logits",
    "logprobs_from_logits": "logits",
    "KL_ESTIMATORS": "kl",
    "kl_penalty": "kl",
    "build_ppo_clip": "losses",
    "ppo_clip_loss": "losses",
    "CORRECTIONS": "importance",
    "correction_weights": "importance",
    "mismatch_sums": "importance",
    "merge_mismatch": "importance",
    "mismatch_metrics": "importance",
    "credit_masked_rewards": "returns",
    "discounted_returns": "returns",
    "group_stats": "returns",
    "CriticModel": "value",
    "clipped_value_loss": "value",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlcore.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rlcore.algorithms.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
