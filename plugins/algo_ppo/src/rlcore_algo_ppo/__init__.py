"""Generalized advantage estimation (GAE) for PPO with a critic."""
