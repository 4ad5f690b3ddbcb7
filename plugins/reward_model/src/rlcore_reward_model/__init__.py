"""Model-based rewards for rlcore: ``reward_model`` (a sequence classifier) and ``judge`` (an LLM endpoint)."""
