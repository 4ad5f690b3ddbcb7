"""Rule-based reward functions for rlcore (registered by :mod:`rlcore_reward_rule.plugin`)."""

__version__ = "0.1.0"
