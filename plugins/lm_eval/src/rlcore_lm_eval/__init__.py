"""lm-evaluation-harness for rlcore: ``rlcore eval --harness lm_eval --tasks ...``."""
