"""Algorithm building blocks shared by every algorithm plugin (and by third parties).

Each module imports torch; this package's ``__init__`` imports nothing, so that naming a
factory such as ``rlcore.algorithms.losses:build_ppo_clip`` costs nothing until a run builds it.

- :mod:`~rlcore.algorithms.masked`: masked mean / variance / whitening and loss aggregation.
- :mod:`~rlcore.algorithms.logits`: entropy and log-probabilities from logits.
- :mod:`~rlcore.algorithms.kl`: per-token KL estimators (k1, k2, k3).
- :mod:`~rlcore.algorithms.losses`: the PPO clipped surrogate (builtin ``ppo_clip``).
- :mod:`~rlcore.algorithms.importance`: truncated importance sampling weights.
- :mod:`~rlcore.algorithms.returns`: per-token discounted returns and group statistics.
- :mod:`~rlcore.algorithms.value`: the critic model and its clipped value loss.
"""
