"""Critic-free advantage estimators and the GSPO policy loss for rlcore."""
