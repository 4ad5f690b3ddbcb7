"""The training driver: set-up, the RL loop, checkpoints and export. Imports torch."""
