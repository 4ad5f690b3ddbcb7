"""DAPO (Yu et al., 2025) batch shaping for rlcore: a batch filter and a score shaper."""
